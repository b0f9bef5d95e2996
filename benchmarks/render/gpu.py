"""The GPU blocks: ops against the roofline and the model of realistic size (gpu_ops.csv, gpu_model.csv)."""

from __future__ import annotations

from pathlib import Path

from .common import Rows, newest_run, num, read_csv, table


def _gpu_provenance(run: Rows, extra: str = "") -> str:
    r0 = run[0]
    return f"Measured on {r0['device']}; torch {r0['torch']}, CUDA {r0['cuda']}" + (f"; {extra}" if extra else "") + "."


def block_gpu_ops(results: Path) -> str:
    """The newest run of benchmarks/bench_gpu.py: every op's backends against the torch reference and the memory
    roofline of the same run."""
    run = newest_run(read_csv(results, "gpu_ops"), ("timestamp",))
    if not run:
        return "No GPU run recorded in `benchmarks/results/gpu_ops.csv`.\n"
    lines = [
        [f"`{r['op']}`", r["case"], r["backend"], num(r["median_ms"]), num(r["roofline_ms"])]
        + [f"{num(r['x_roofline'])}x", f"{num(r['speedup_vs_torch'])}x"]
        for r in run
    ]
    head = ["op", "case", "backend", "median ms", "roofline ms", "vs roofline", "speed-up vs torch"]
    copy = f"device-to-device copy {run[0]['copy_gbps']} GB/s (read + written)"
    return table(head, lines) + "\n\n" + _gpu_provenance(run, copy) + "\n"


def block_gpu_model(results: Path) -> str:
    """The newest run of benchmarks/bench_gpu_model.py: a verification pass against a one-token step, and the CUDA
    kernels of one speculative round."""
    run = newest_run(read_csv(results, "gpu_model"), ("timestamp",))
    if not run:
        return "No GPU run recorded in `benchmarks/results/gpu_model.csv`.\n"
    one = next((float(r["value"]) for r in run if r["case"] == "pass n=1"), float("nan"))
    lines = []
    for r in run:
        ratio = f"{num(float(r['value']) / one)}x" if r["case"].startswith("pass ") else "-"
        lines.append([r["case"], f"{num(r['value'])} {r['unit']}", ratio])
    r0 = run[0]
    extra = f"{r0['model']} ({num(float(r0['params']) / 1e9)}B parameters), context {r0['context']} tokens"
    return table(["case", "value", "vs n = 1"], lines) + "\n\n" + _gpu_provenance(run, extra) + "\n"
