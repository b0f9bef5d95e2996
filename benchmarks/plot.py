"""Plots of the kernel microbenchmarks: benchmarks/results/<op>.csv -> benchmarks/results/<op>.png.

Per op, the newest run (``--all-cases``: the newest row of every case ever measured): the left panel shows the
median time per call with the 10-90 % range (log scale), the right panel the achieved GB/s of each backend next to
the GB/s of a plain memory copy of the same bytes measured in the same run (the roofline the DESIGN asks for).
A summary figure (summary.png) shows each case's speedup of the cpu backend over the torch reference, and
step_overhead.png the share of a decoding step outside the model forwards (benchmarks/bench_step_overhead.py).
Run: python benchmarks/plot.py [--ops verify_tree,gumbel_topk] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
COLORS = {"cpu": "tab:blue", "torch": "tab:gray", "triton": "tab:orange", "cuda": "tab:green"}


def read_rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def newest_run(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows of the newest run (one timestamp per benchmark invocation), in file order."""
    stamp = max(r["timestamp"] for r in rows)
    return [r for r in rows if r["timestamp"] == stamp]


def latest_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The newest row of every (case, backend), in the order the cases first appear in the newest runs."""
    best: dict[tuple[str, str], tuple[int, dict[str, str]]] = {}
    for i, row in enumerate(rows):
        key = (row["case"], row["backend"])
        if key not in best or row["timestamp"] >= best[key][1]["timestamp"]:
            best[key] = (i, row)
    return [row for _, row in sorted(best.values(), key=lambda ir: (ir[1]["timestamp"], ir[0]))]


def plot_op(op: str, rows: list[dict[str, str]], out_dir: str) -> str:
    cases = list(OrderedDict.fromkeys(r["case"] for r in rows))
    backends = [b for b in COLORS if any(r["backend"] == b for r in rows)]
    by = {(r["case"], r["backend"]): r for r in rows}
    height = max(3.5, 0.32 * len(cases) * max(1, len(backends)) + 1.8)
    fig, (ax_t, ax_g) = plt.subplots(1, 2, figsize=(15, height), sharey=True)
    bar = 0.8 / max(1, len(backends))
    for j, backend in enumerate(backends):
        ys, med, lo, hi, gbps = [], [], [], [], []
        for i, case in enumerate(cases):
            r = by.get((case, backend))
            if r is None:
                continue
            ys.append(i + (j - (len(backends) - 1) / 2) * bar)
            m = float(r["median_ms"])
            med.append(m)
            lo.append(m - float(r["p10_ms"]))
            hi.append(float(r["p90_ms"]) - m)
            gbps.append(float(r["gbps"]))
        color = COLORS[backend]
        ax_t.barh(ys, med, height=bar, xerr=[lo, hi], color=color, label=backend, capsize=2)
        ax_g.barh(ys, gbps, height=bar, color=color, label=backend)
    copy = [float(next(by[(c, b)] for b in backends if (c, b) in by)["copy_gbps"]) for c in cases]
    ax_g.scatter(copy, range(len(cases)), marker="|", s=400, color="black", label="memcpy of the same bytes", zorder=3)
    ax_t.set_xscale("log")
    ax_t.set_xlabel("median ms per call (10-90 % range)")
    ax_g.set_xlabel("GB/s of the bytes the op must read")
    ax_t.set_yticks(range(len(cases)))
    ax_t.set_yticklabels(cases, fontsize=8)
    ax_t.invert_yaxis()
    for ax in (ax_t, ax_g):
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    meta = rows[-1]
    fig.suptitle(
        f"{op}: {meta['machine']}, torch {meta['torch']}, rev {meta['git_rev']}, {meta['threads']} thread(s), "
        f"{meta['clock']} clock",
        fontsize=10,
    )
    fig.tight_layout()
    path = os.path.join(out_dir, f"{op}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_summary(all_rows: dict[str, list[dict[str, str]]], out_dir: str) -> str | None:
    labels, speedups = [], []
    for op, rows in all_rows.items():
        for r in rows:
            if r["backend"] == "cpu" and r["speedup_vs_torch"]:
                labels.append(f"{op}: {r['case']}")
                speedups.append(float(r["speedup_vs_torch"]))
    if not labels:
        return None
    fig, ax = plt.subplots(figsize=(11, max(3.0, 0.22 * len(labels) + 1.0)))
    ax.barh(range(len(labels)), speedups, color="tab:blue")
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speedup of the cpu backend over the torch reference (median time ratio, same run)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out_dir, "summary.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_step_overhead(rows: list[dict[str, str]], out_dir: str) -> str:
    """Stacked shares of a decoding step outside the model forwards (newest run of benchmarks/bench_step_overhead)."""
    rows = newest_run(rows)
    labels = [f"{r['method']} / {r['backend']}" for r in rows]
    kernels = [100 * float(r["ops_share_cpu"]) for r in rows]
    checks = [100 * (float(r["op_calls_share_cpu"]) - float(r["ops_share_cpu"])) for r in rows]
    glue = [100 * (float(r["outside_share_cpu"]) - float(r["op_calls_share_cpu"])) for r in rows]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.8))
    ys = range(len(rows))
    ax.barh(ys, kernels, color="tab:blue", label="specdec_kernels ops (kernels)")
    ax.barh(ys, checks, left=kernels, color="tab:orange", label="op validation + noise drawing")
    ax.barh(ys, glue, left=[a + b for a, b in zip(kernels, checks, strict=True)], color="tab:gray", label="driver glue")
    ax.axvline(5.0, color="red", lw=1, ls="--", label="goal 5 %")
    ax.set_yticks(list(ys))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("% of the generate call outside the model forwards (process CPU time)")
    ax.legend(fontsize=8, loc="lower right")
    meta = rows[0]
    ax.set_title(
        f"SmolLM2-135M-Instruct {meta['dtype']}, draft {meta['draft']}, {meta['threads']} thread(s), rev "
        f"{meta['git_rev']}",
        fontsize=9,
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out_dir, "step_overhead.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default="", help="comma-separated ops (default: every CSV in benchmarks/results)")
    ap.add_argument("--results", default=RESULTS, help="folder of the CSVs")
    ap.add_argument("--out", default=RESULTS, help="folder for the PNGs")
    ap.add_argument(
        "--all-cases", action="store_true", help="every case ever measured (newest row each), not just the newest run"
    )
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    wanted = [o for o in args.ops.split(",") if o]
    paths = sorted(glob.glob(os.path.join(args.results, "*.csv")))
    all_rows: dict[str, list[dict[str, str]]] = {}
    for path in paths:
        op = os.path.splitext(os.path.basename(path))[0]
        if wanted and op not in wanted:
            continue
        raw = read_rows(path)
        if not raw:
            continue
        if op == "step_overhead":
            print("wrote", os.path.relpath(plot_step_overhead(raw, args.out)))
            continue
        if "median_ms" not in raw[0]:
            continue  # not a kernel microbenchmark table
        rows = latest_rows(raw) if args.all_cases else newest_run(raw)
        all_rows[op] = rows
        print("wrote", os.path.relpath(plot_op(op, rows, args.out)))
    summary = plot_summary(all_rows, args.out)
    if summary:
        print("wrote", os.path.relpath(summary))


if __name__ == "__main__":
    main()
