"""Tensor parallelism against one process on the same machine (tensor_parallel.csv,
benchmarks/bench_tensor_parallel.py)."""

from __future__ import annotations

from pathlib import Path

from .common import newest_runs, num, provenance, read_csv, table

#: a run is one bench_tensor_parallel call's setting on one machine and CPU variant
RUN_KEY = ("machine", "cpu_isa", "model", "prompts", "num_prompts", "max_new_tokens", "temperature", "draft")


def _model(name: str) -> str:
    return "SmolLM2-135M-Instruct" if name == "smollm2" else f"Llama {name} (random weights)"


def block_tensor_parallel(results: Path) -> str:
    runs = list(newest_runs(read_csv(results, "tensor_parallel"), RUN_KEY).values())
    if not runs:
        return "No run recorded in `benchmarks/results/tensor_parallel.csv`.\n"
    out = []
    for run in runs:
        r0 = run[0]
        sampling = "greedy" if float(r0["temperature"]) == 0 else f"T = {float(r0['temperature']):g}"
        head = ["layout", "ranks x threads", "method", "tok/s", "vs one-process AR", "block eff.",
                "collectives / round / rank", "KiB / round / rank"]  # fmt: skip
        lines = []
        for r in sorted(run, key=lambda r: (r["round"], r["layout"] != "one process")):
            comm = r["bytes_per_round"]
            lines.append([
                r["layout"] + (f" (turn {int(r['round']) + 1})" if len({x["round"] for x in run}) > 1 else ""),
                f"{r['ranks']} x {r['threads_per_rank']}", r["label"], num(r["tokens_per_second"]),
                f"{float(r['vs_one_process_ar']):.2f}x" if r["vs_one_process_ar"] else "-",
                num(r["block_efficiency"]) if r["block_efficiency"] not in ("", "nan") else "-",
                num(r["calls_per_round"]) if r["calls_per_round"] else "-",
                num(float(comm) / 1024) if comm else "-",
            ])  # fmt: skip
        loads = [float(r["load"]) for r in run]
        title = (f"**{_model(r0['model'])}**, {r0['prompts']} ({r0['num_prompts']} prompts), "
                 f"{r0['max_new_tokens']} new tokens, {sampling}, draft {r0['draft']}")  # fmt: skip
        extra = f"CPU variant {r0['cpu_isa']}; load before each layout {min(loads):.2f}-{max(loads):.2f}"
        out.append(title + "\n\n" + table(head, lines) + "\n\n" + provenance(run, machine="machine", torch="torch",
                                                                               extra=extra))  # fmt: skip
    return "\n\n".join(out) + "\n"
