"""The kernel microbenchmarks' blocks (benchmarks/results/<op>.csv)."""

from __future__ import annotations

from pathlib import Path

from .common import Rows, newest_run, num, provenance, read_csv, table

#: kernel microbenchmarks shown in the README, in this order (first case of the newest run of each)
HEADLINE_OPS = (
    "verify_tree",
    "verify_chain",
    "gumbel_topk",
    "sbs_step",
    "spechub_sample",
    "process_logits",
    "skinny_linear",
    "decode_attention",
    "rms_norm",
    "rotary_embedding",
    "decoder_layer",
    "decoder_stack",
)

#: the kernel microbenchmark CSVs (written by benchmarks/_timing.py), in the order docs/benchmarks.md lists them
KERNEL_OPS = (
    "process_logits",
    "sample_categorical",
    "gumbel_topk",
    "sbs_step",
    "spechub_sample",
    "kseq_gamma",
    "verify_node",
    "verify_chain",
    "emission_law",
    "verify_tree",
    "tree_mask",
    "tree_positions",
    "filter_kv",
    "skinny_linear",
    "skinny_linear_int8",
    "decode_attention",
    "rms_norm",
    "rotary_embedding",
    "decoder_layer",
    "decoder_stack",
    "target_step",
)


def kernel_rows(rows: Rows, backends: tuple[str, ...] = ("cpu", "torch")) -> list[list[str]]:
    out = []
    for r in rows:
        if r["backend"] not in backends:
            continue
        speed = r["speedup_vs_torch"]
        out.append(
            [
                r["case"],
                r["backend"],
                num(r["median_ms"]),
                f"{num(r['p10_ms'])}-{num(r['p90_ms'])}",
                num(r["gbps"]),
                num(r["copy_gbps"]),
                f"{num(speed)}x" if speed else "",
            ]
        )
    return out


def kernel_provenance(rows: Rows) -> str:
    threads = ", ".join(dict.fromkeys(r["threads"] for r in rows))
    clock = ", ".join(dict.fromkeys(r["clock"] for r in rows))
    extra = f"{threads} thread(s), clock: {clock}"
    return provenance(rows, machine="machine", torch="torch", extra=extra)


def block_kernel_headline(results: Path) -> str:
    lines, used = [], []
    for op in HEADLINE_OPS:
        run = newest_run(read_csv(results, op), ("timestamp",))
        cpu = [r for r in run if r["backend"] == "cpu"]
        if not cpu:
            continue
        r = cpu[0]
        torch_row = next((t for t in run if t["backend"] == "torch" and t["case"] == r["case"]), None)
        used.append(r)
        lines.append(
            [
                f"`{op}`",
                r["case"],
                num(r["median_ms"]),
                num(torch_row["median_ms"]) if torch_row else "-",
                f"{num(r['speedup_vs_torch'])}x" if r["speedup_vs_torch"] else "-",
                f"{num(r['gbps'])} ({num(r['copy_gbps'])})",
            ]
        )
    if not lines:
        return "No kernel microbenchmark is recorded in benchmarks/results.\n"
    head = ["op", "case", "cpu ms", "torch ms", "speed-up", "cpu GB/s (memcpy GB/s)"]
    if len({r["machine"] for r in used}) > 1:  # each op's newest run: name where each row ran
        head.append("machine")
        lines = [[*line, r["machine"]] for line, r in zip(lines, used, strict=True)]
    return table(head, lines) + "\n\n" + kernel_provenance(used) + "\n"


def block_kernel_tables(results: Path) -> str:
    parts = []
    for op in KERNEL_OPS:
        rows = read_csv(results, op)
        run = newest_run(rows, ("timestamp",))
        if not run:
            parts.append(f"### `{op}`\n\nNo run recorded.\n")
            continue
        head = ["case", "backend", "median ms", "p10-p90 ms", "GB/s", "memcpy GB/s", "speed-up vs torch"]
        n_runs = len({r["timestamp"] for r in rows})
        parts.append(
            f"### `{op}`\n\n{table(head, kernel_rows(run))}\n\n{kernel_provenance(run)} "
            f"Newest of {n_runs} recorded run(s) in `benchmarks/results/{op}.csv`.\n"
        )
    return "\n".join(parts)
