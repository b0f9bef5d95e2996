"""Render every measured figure of the documentation from the recorded data.

The figures in README.md and docs/*.md are never typed by hand: each sits in a generated block

    <!-- report:begin NAME -->
    ...
    <!-- report:end -->

that this script rewrites from benchmarks/results/*.csv (and, for the shipped drafts, the manifests in
python_api/specdec/assets/*.json). Every table names the machine, CPU flags and torch version of the rows it
shows, or says which of those columns the CSV does not record. It also renders the PNGs next to the CSVs
(benchmarks/plot.py).

Run:  python benchmarks/report.py            # rewrite the blocks and the PNGs
      python benchmarks/report.py --no-png   # the blocks only
      python benchmarks/report.py --check    # exit 1 if a committed block differs from its rendering

tests/test_docs_rendered.py runs the check in memory, so a figure edited by hand, or a CSV changed without
re-rendering, fails the test suite.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
ASSETS = ROOT / "python_api" / "specdec" / "assets"
#: the files that hold generated blocks
DOCS = ("README.md", "docs/benchmarks.md", "docs/drafts.md", "benchmarks/results/csd.md")

BLOCK = re.compile(r"(<!-- report:begin ([a-z0-9_-]+) -->\n)(.*?)(<!-- report:end -->)", re.S)

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
#: a speed-up over AR larger than the block efficiency (tokens per target call) times this is not physical: a
#: verification pass costs at least one target step, so such a row measured machine load, not the decoder
PLAUSIBLE_SLACK = 1.05

Rows = list[dict[str, str]]


# --------------------------------------------------------------------------------------------------- reading


def read_csv(results: Path, name: str) -> Rows:
    path = results / f"{name}.csv"
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def newest_run(rows: Rows, keys: tuple[str, ...]) -> Rows:
    """The rows of the last run in the file: those whose ``keys`` equal the last row's (a run appends a block)."""
    if not rows:
        return []
    last = tuple(rows[-1].get(k, "") for k in keys)
    if "timestamp" in keys or "time" in keys:  # timestamps order runs even when files were merged out of order
        k = "timestamp" if "timestamp" in keys else "time"
        stamp = max(r[k] for r in rows)
        return [r for r in rows if r[k] == stamp]
    return [r for r in rows if tuple(r.get(k, "") for k in keys) == last]


def implausible(row: dict[str, str], speed: str, eff: str) -> bool:
    """True when the row's speed-up over AR exceeds its block efficiency (see PLAUSIBLE_SLACK)."""
    try:
        s, e = float(row[speed]), float(row[eff])
    except (KeyError, ValueError):
        return False
    return not math.isnan(s) and not math.isnan(e) and s > e * PLAUSIBLE_SLACK


# --------------------------------------------------------------------------------------------------- formatting


def num(value: str | float, digits: int = 3) -> str:
    """``digits`` significant digits, no exponent for the ranges these tables hold."""
    try:
        x = float(value)
    except ValueError:
        return str(value)
    if math.isnan(x):
        return "-"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    return f"{x:.{decimals}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(out)


def provenance(rows: Rows, *, machine: str, torch: str | None, extra: str = "") -> str:
    """One line naming where the rows come from; columns the CSV lacks are named as not recorded. The revision
    each row was measured at stays in the CSV (``git_rev``), not in the docs."""
    if not rows:
        return ""

    def values(col: str | None) -> str | None:
        if col is None or col not in rows[0]:
            return None
        found = ", ".join(dict.fromkeys(r[col] for r in rows if r[col]))
        return found or None  # a column added later is blank in older rows

    parts, missing = [], []
    for label, col in (("machine", machine), ("torch", torch)):
        v = values(col)
        if v is None:
            missing.append(label)
        else:
            parts.append(f"{label} {v}" if label != "machine" else v)
    flags = values("cpu_flags")
    if flags is None:
        missing.append("CPU flags")
    else:
        parts.append(f"CPU flags {flags}")
    line = "Measured on " + "; ".join(parts)
    if extra:
        line += "; " + extra
    line += "."
    if missing:
        line += f" Not recorded in the CSV: {', '.join(missing)}."
    return line


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


# --------------------------------------------------------------------------------------------------- blocks


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


def block_step_overhead(results: Path, *, brief: bool = False) -> str:
    rows = read_csv(results, "step_overhead")
    run = newest_run(rows, ("timestamp",))
    if not run:
        return "No run recorded in `benchmarks/results/step_overhead.csv`.\n"
    by = {(r["method"], r["backend"]): r for r in run}
    methods = list(dict.fromkeys(r["method"] for r in run))
    if brief:
        methods = [m for m in methods if m == "all"] or methods

    def pct(r: dict[str, str] | None, col: str) -> str:
        return "-" if r is None else f"{100 * float(r[col]):.1f} %"

    lines = []
    for m in methods:
        d, t = by.get((m, "default")), by.get((m, "torch"))
        if brief:
            lines.append([m, pct(d, "outside_share_cpu"), pct(t, "outside_share_cpu")])
        else:
            lines.append(
                [
                    m,
                    pct(d, "outside_share_cpu"),
                    pct(d, "ops_share_cpu"),
                    pct(d, "op_calls_share_cpu"),
                    pct(t, "outside_share_cpu"),
                    num(d["block_efficiency"]) if d else "-",
                ]
            )
    r0 = run[0]
    extra = (
        f"{r0['model']} {r0['dtype']}, draft {r0['draft']}, {r0['prompts']} prompts, {r0['threads']} thread(s), "
        "process CPU time"
    )
    if brief:
        label = ", ".join(m for m in dict.fromkeys(r["method"] for r in run) if m != "all")
        lines = [[label if row[0] == "all" else row[0], *row[1:]] for row in lines]
        head = ["methods", "outside the forwards, default backend", "same, torch reference backend"]
    else:
        head = ["method", "outside, default", "kernels", "all op calls", "outside, torch backend", "block eff."]
    prov = provenance(run, machine="machine", torch="torch", extra=extra)
    return table(head, lines) + "\n\n" + prov + "\n"


def _runs_by_isa(rows: Rows) -> list[Rows]:
    """The newest run of each (machine, CPU variant) in a kernel CSV, oldest variant first."""
    newest: dict[tuple[str, str], str] = {}
    for r in rows:
        key = (r["machine"], (r.get("cpu_isa") or "").split(" ")[0])  # a variant's newest run, whatever its path
        newest[key] = max(newest.get(key, ""), r["timestamp"])
    return [[r for r in rows if r["timestamp"] == stamp] for stamp in sorted(newest.values())]


def _variant_cell(isa: str, machine: str, several: bool) -> str:
    """A CPU variant's table cell; with runs of several machines in one table, it names the machine too."""
    return f"{isa} ({machine})" if several else isa


def _new_cells(by_n: dict[int, dict[str, str]], news: list[int]) -> list[str]:
    """Table cells of timings by token count: n = 1 in ms, every other n as a ratio to it ("-" where missing)."""
    one = float(by_n[1]["median_ms"])
    return [
        f"{num(one)} ms" if n == 1 else (f"{float(by_n[n]['median_ms']) / one:.2f}x" if n in by_n else "-")
        for n in news
    ]


def _share_cell(row: dict[str, str], base_ms: float) -> str:
    """A timed row as a share of ``base_ms``, with its own time: ``5.0 % (0.800 ms)``."""
    ms = float(row["median_ms"])
    return f"{100 * ms / base_ms:.1f} % ({num(ms)} ms)"


def block_target_step(results: Path) -> str:
    runs = [run for run in _runs_by_isa(read_csv(results, "target_step")) if run[0].get("cpu_isa")]
    if not runs:
        return "No target-step run with its CPU variant is recorded in `benchmarks/results/target_step.csv`.\n"
    steps = [[r for r in run if not r["case"].startswith(("draft ", "decoding ")) and " linears " not in r["case"]]
             for run in runs]  # fmt: skip
    alone = [{int(r["case"].rsplit(" ", 1)[1]): r for r in run if " linears new " in r["case"]} for run in runs]
    cached = [{int(r["case"].rsplit(" ", 1)[1]): r for r in run if " in cache " in r["case"]} for run in runs]
    drafts = [{r["case"].rsplit(" ", 1)[1]: r for r in run if r["case"].startswith("draft ")} for run in runs]
    # the draft's steps and the target's passes as a decoding ran them (bench_target_step --decode-prompts)
    decoding = [
        {r["case"].removeprefix("decoding "): r for r in run if r["case"].startswith("decoding ")} for run in runs
    ]
    news = sorted({int(r["case"].rsplit(" ", 1)[1]) for run in steps for r in run})
    with_draft, with_decoding = any(drafts), any(decoding)
    several = len({run[0]["machine"] for run in runs}) > 1  # then each variant's rows name their machine
    lines = []
    for run, draft, lin, arith, dec in zip(steps, drafts, alone, cached, decoding, strict=True):
        label = _variant_cell(run[0]["cpu_isa"], run[0]["machine"], several)
        cpu = {int(r["case"].rsplit(" ", 1)[1]): r for r in run if r["backend"] == "cpu"}
        torch_rows = {int(r["case"].rsplit(" ", 1)[1]): r for r in run if r["backend"] == "torch"}
        if 1 not in cpu:
            continue
        one = float(cpu[1]["median_ms"])
        floor = sum(int(r["bytes"]) / float(r["copy_gbps"]) / 1e6 for r in run) / len(run)
        cells = _new_cells(cpu, news)
        t1 = torch_rows.get(1)
        torch_cell = f"{num(t1['median_ms'])} ms" if t1 else "-"
        # a draft step as a share of the one-token target step of the same run ("step" = after a target step)
        draft_cells = [_share_cell(draft[k], one) if k in draft else "-" for k in ("step", "repeated")]
        # the decoding's target pass, and a draft step in decoding as a share of it
        passed = dec.get("target pass")
        dec_cells = ["-"] * 3
        if passed is not None:
            base = float(passed["median_ms"])
            dec_cells = [f"{num(base)} ms"]
            dec_cells += [_share_cell(dec[k], base) if k in dec else "-" for k in ("draft first", "draft later")]
        lines.append([label, f"{num(floor)} ms", *cells, torch_cell, *(draft_cells if with_draft else []),
                      *(dec_cells if with_decoding else [])])  # fmt: skip
        blank = ["-"] * (2 * with_draft + 3 * with_decoding)
        if 1 in lin:  # the same run's linears alone, from memory
            lines.append([f"{label}: linears alone", "-", *_new_cells(lin, news), "-", *blank])
        if arith:  # the same run's compute floor: the pass's multiply-adds on a weight in cache, in ms
            cells = [f"{num(arith[n]['median_ms'])} ms" if n in arith else "-" for n in news]
            lines.append([f"{label}: linears in cache", "-", *cells, "-", *blank])
    head = ["CPU variant", "memory floor", *[f"n = {n}" for n in news], "torch n = 1"]
    if with_draft:
        name = next(iter(next(d for d in drafts if d).values()))["case"].split(" ")[1]
        head += [f"draft step ({name}), after a target step", "draft step, repeated"]
    if with_decoding:
        head += ["target pass in decoding", "draft step in decoding, first of a round", "later in a round"]
    r0 = runs[-1][0]
    extra = f"{r0['threads']} thread(s), clock: {r0['clock']}; n = 1 in ms, n > 1 as a ratio to n = 1"
    if any(cached):
        extra += "; 'linears in cache': the pass's multiply-adds on one weight in cache (compute floor), in ms"
    if any(alone):
        extra += "; 'linears alone': the pass's linears over the model's weights from memory, the rest left out"
    if with_draft:
        extra += "; a draft step as a share of the one-token target step of the same run"
    if with_decoding:
        extra += "; in decoding: medians over greedy rsd_c(auto) rounds, a draft step as a share of the target pass"
    prov = provenance([r for run in runs for r in run], machine="machine", torch="torch", extra=extra)
    return table(head, lines) + "\n\n" + prov + "\n"


def block_target_step_ops(results: Path) -> str:
    runs = _runs_by_isa(read_csv(results, "target_step_ops"))
    if not runs:
        return "No per-op profile is recorded in `benchmarks/results/target_step_ops.csv`.\n"
    parts = []
    for run in runs:
        news = sorted({int(r["new"]) for r in run})
        lo, hi = news[0], max(n for n in news if n <= 8)
        ms = {(r["op"], int(r["new"])): float(r["self_ms"]) for r in run}
        ops = sorted({r["op"] for r in run}, key=lambda op: -ms.get((op, hi), 0.0))[:8]
        lines = [
            [
                f"`{op}`",
                num(ms.get((op, lo), 0.0)),
                num(ms.get((op, hi), 0.0)),
                num(ms.get((op, hi), 0.0) - ms.get((op, lo), 0.0)),
            ]
            for op in ops
        ]
        total = [sum(v for (op, n), v in ms.items() if n == k) for k in (lo, hi)]
        lines.append(["all ops", num(total[0]), num(total[1]), num(total[1] - total[0])])
        head = ["op (self CPU time)", f"n = {lo}, ms", f"n = {hi}, ms", "growth, ms"]
        prov = provenance(
            run,
            machine="machine",
            torch="torch",
            extra=f"CPU variant {run[0]['cpu_isa']}, {run[0]['threads']} thread(s)",
        )
        parts.append(table(head, lines) + "\n\n" + prov + "\n")
    return "\n".join(parts)


def _shipped(draft: str) -> bool:
    return (ASSETS / f"{draft}.safetensors").is_file()


#: names of the prompt sets of benchmarks/bench_draft_alpha.py
SET_NAMES = {
    "vicuna_1_40": "Vicuna-bench questions 1-40",
    "vicuna_41_80": "Vicuna-bench questions 41-80",
    "magpie": "40 instructions the target wrote itself, not trained on",
    "humaneval": "HumanEval problems 1-40 (code)",
}


def block_draft_alpha(results: Path) -> str:
    rows = [r for r in read_csv(results, "draft_alpha") if _shipped(r["draft"])]
    if not rows:
        return "No run of a shipped draft is recorded in `benchmarks/results/draft_alpha.csv`.\n"
    newest: dict[tuple[str, str], dict[str, str]] = {}
    for r in rows:
        key = (r["draft"], r["set"])
        if key not in newest or r["date"] >= newest[key]["date"]:
            newest[key] = r
    picked = list(newest.values())
    lines = [
        [
            f"`{r['draft']}`",
            SET_NAMES.get(r["set"], r["set"]),
            r["positions"],
            num(r["alpha"]),
            num(r["alpha_depth2"]),
            num(r["greedy_agreement"]),
            num(r["head_coverage"]),
        ]
        for r in picked
    ]
    head = ["draft", "prompt set", "positions", "alpha", "alpha, depth 2", "greedy agreement", "head coverage"]
    extra = f"{', '.join(dict.fromkeys(r['threads'] for r in picked))} thread(s), T = 1 target answers"
    prov = provenance(picked, machine="machine", torch="torch", extra=extra)
    return table(head, lines) + "\n\n" + prov + "\n"


def block_shipped_drafts(results: Path) -> str:
    lines = []
    for path in sorted(ASSETS.glob("*.json")):
        man = json.loads(path.read_text(encoding="utf-8"))
        ev = man.get("eval", {}).get("metrics")
        if not ev:
            continue
        dist = man.get("distill", {})
        cfg = dist.get("config", {}).get("draft", {})
        kind = "feature (EAGLE-style)" if "extra_layers" in cfg else "plain LM"
        lines.append(
            [
                f"`{path.stem}`",
                kind,
                f"{cfg.get('num_layers', '?')} x {cfg.get('hidden_size', 576)}",
                str(cfg.get("head_vocab", "?")),
                str(dist.get("steps", "?")),
                str(dist.get("train_positions", "?")),
                num(ev["alpha"]),
                num(ev.get("alpha_depth2", float("nan"))),
                num(ev["greedy_agreement"]),
                num(ev["head_coverage"]),
                f"{100 * ev['cost_ratio']:.1f} %",
            ]
        )
    head = [
        "draft",
        "kind",
        "layers x width",
        "head tokens",
        "steps",
        "training positions",
        "alpha",
        "alpha, depth 2",
        "greedy agreement",
        "head coverage",
        "draft step / target step",
    ]
    note = (
        "From the `eval` and `distill` sections of `python_api/specdec/assets/<draft>.json` (written by the "
        "pipeline that trained the draft): held-out Vicuna-bench questions 1-40, target answers at T = 1, both "
        "models in bf16. Not recorded in the manifests: machine, CPU flags, torch."
    )
    return table(head, lines) + "\n\n" + note + "\n"


def block_end_to_end(results: Path) -> str:
    rows = read_csv(results, "end_to_end")
    bad = [r for r in rows if implausible(r, "ratio_vs_ar", "block_eff")]
    drafts = list(dict.fromkeys(r["draft"] for r in rows))  # the newest run of each draft, in recording order
    out = []
    for draft in drafts:
        run = [r for r in newest_run([r for r in rows if r["draft"] == draft], ("time",)) if r not in bad]
        if not run:
            continue
        lines = [
            [
                r["method"],
                r["batch"],
                num(r["tok_s"]),
                f"{num(r['ratio_vs_ar'])}x",
                num(r["block_eff"]),
            ]
            for r in run
        ]
        r0 = run[0]
        extra = (
            f"draft {r0['draft']}, T = {r0['temperature']}, {r0['prompts']} prompts x {r0['tokens']} tokens, "
            f"{r0['threads']} thread(s)"
        )
        head = ["method", "batch", "tok/s", "vs AR", "block eff."]
        prov = provenance(run, machine="machine", torch="torch", extra=extra)
        out.append(f"Draft `{draft}`:\n\n" + table(head, lines) + "\n\n" + prov + "\n")
    if not out:
        return "No run recorded in `benchmarks/results/end_to_end.csv`.\n"
    return "\n".join(out)


#: the demo's default draft as the demo loads it (int8 weights), whose end-to-end run the README shows
HEADLINE_DRAFT = "smollm2-eagle+ngram (int8)"


def block_end_to_end_headline(results: Path) -> str:
    """Batch-1 speed of the newest run with the demo's default draft, against our AR."""
    rows = [r for r in read_csv(results, "end_to_end") if r["draft"] == HEADLINE_DRAFT]
    run = [
        r
        for r in newest_run(rows, ("time",))
        if r["batch"] == "1" and not r["method"].startswith("sweep:") and not implausible(r, "ratio_vs_ar", "block_eff")
    ]
    if not run:
        return f"No run with the draft `{HEADLINE_DRAFT}` recorded in `benchmarks/results/end_to_end.csv`.\n"
    lines = []
    for r in run:
        name = r["method"].replace("specdec:", "").replace("hf:", "transformers ")
        lines.append([name, num(r["tok_s"]), f"{num(r['ratio_vs_ar'])}x", num(r["block_eff"])])
    r0 = run[0]
    t = float(r0["temperature"])
    mode = "greedy" if t == 0 else f"T = {r0['temperature']}"
    extra = f"{mode}, {r0['prompts']} HumanEval prompts x {r0['tokens']} tokens, {r0['threads']} thread(s)"
    prov = provenance(run, machine="machine", torch="torch", extra=extra)
    return table(["method", "tok/s", "vs our AR", "block eff."], lines) + "\n\n" + prov + "\n"


def block_demo_runs(results: Path) -> str:
    """One line per recorded demo run (the newest of each prompt set, temperature, thread count, CPU variant, draft
    and machine): our AR, the fastest method against it and against transformers' generate, the slowest method, and
    the machine's load average before the run where it was recorded. Where runs of several machines are shown, the
    variant's cell names the machine."""
    rows = read_csv(results, "demo")
    newest: dict[tuple[str, str, str, str, str, str], str] = {}
    for r in rows:
        key = (r["prompt_set"], r["temperature"], r["threads"], r["draft"], r.get("cpu_isa") or "-", r["machine"])
        newest[key] = max(newest.get(key, ""), r["timestamp"])
    several = len({key[5] for key in newest}) > 1
    lines, runs = [], []
    for key, stamp in sorted(newest.items()):
        run = [r for r in rows if r["timestamp"] == stamp]
        ar = next((r for r in run if r["label"] == "ar"), None)
        hf = next((r for r in run if r["label"] == "hf generate"), None)
        ours = [r for r in run if r["label"] != "ar" and not r["label"].startswith("hf ")]
        ours = [r for r in ours if not implausible(r, "speed_ratio", "block_efficiency")]
        if ar is None or not ours:
            continue
        best = max(ours, key=lambda r: float(r["speed_ratio"]))
        worst = min(ours, key=lambda r: float(r["speed_ratio"]))
        vs_hf = f"{float(best['tokens_per_second']) / float(hf['tokens_per_second']):.2f}x" if hf else "-"
        mode = "greedy" if float(key[1]) == 0 else f"T = {key[1]}"
        lines.append(
            [
                key[0].removesuffix(".jsonl"),
                mode,
                key[2],
                _variant_cell(key[4], key[5], several),
                f"`{key[3]}`",
                num(ar["tokens_per_second"]),
                f"{best['label']} {float(best['speed_ratio']):.2f}x",
                vs_hf,
                f"{worst['label']} {float(worst['speed_ratio']):.2f}x",
                ar.get("load_before") or "-",
            ]
        )
        runs += run
    if not lines:
        return "No demo run recorded in `benchmarks/results/demo.csv`.\n"
    head = ["prompts", "sampling", "threads", "CPU variant", "draft", "our AR, tok/s", "fastest (vs AR)"]
    head += ["fastest vs generate", "slowest", "load before (1 min)"]
    r0 = runs[0]
    extra = f"{r0['num_prompts']} prompts x {r0['max_new_tokens']} tokens, batch {r0['batch_size']}, {r0['dtype']}"
    extra += ", wall clock"
    return table(head, lines) + "\n\n" + provenance(runs, machine="machine", torch="torch", extra=extra) + "\n"


def block_specdec_pp(results: Path) -> str:
    rows = read_csv(results, "specdec_pp")
    run = [
        r
        for r in newest_run(rows, ("machine", "torch", "git_rev", "prompts", "new_tokens"))
        if not implausible(r, "speedup_vs_ar", "block_efficiency")
    ]
    if not run:
        return "No run recorded in `benchmarks/results/specdec_pp.csv`.\n"
    lines = [
        [
            r["config"],
            num(r["discard_rate"]),
            num(r["verification_rate"]),
            num(r["block_efficiency"]),
            num(r["tok_per_s"]),
            f"{num(r['speedup_vs_ar'])}x",
        ]
        for r in run
    ]
    r0 = run[0]
    extra = f"{r0['prompts']} prompts x {r0['new_tokens']} tokens, draft smollm2-distill with its acceptance head"
    head = ["config", "discard rate", "verification rate", "block eff.", "tok/s", "vs AR"]
    prov = provenance(run, machine="machine", torch="torch", extra=extra)
    return table(head, lines) + "\n\n" + prov + "\n"


def block_draft_e2e(results: Path) -> str:
    rows = read_csv(results, "bench_draft_e2e")
    good = newest_run([r for r in rows if not implausible(r, "speedup", "block_efficiency")], ("timestamp",))
    if not good:
        return "No plausible run recorded in `benchmarks/results/bench_draft_e2e.csv`.\n"
    lines = [[r["method"], num(r["tok_per_s"]), f"{num(r['speedup'])}x", num(r["block_efficiency"])] for r in good]
    extra = f"{good[0]['prompts']} prompts x {good[0]['new_tokens']} tokens, T = 1, {good[0]['threads']} thread(s)"
    prov = provenance(good, machine="machine", torch="torch", extra=extra)
    return table(["method", "tok/s", "vs AR", "block eff."], lines) + "\n\n" + prov + "\n"


#: display names of the prompt sets of benchmarks/bench_csd.py
CSD_SETS = {"gsm8k": "GSM8K", "humaneval": "HumanEval"}


def _csd_run(results: Path) -> Rows:
    return newest_run(read_csv(results, "csd"), ("time",))


def _csd_setting(setting: str) -> str:
    """``k11=4 k12=8`` -> ``4, 8`` (the paper's parenthesised hyper-parameters)."""
    return ", ".join(part.split("=", 1)[1] for part in setting.split())


def block_csd(results: Path) -> str:
    """The CS Drafting table of benchmarks/bench_csd.py in the paper's layout (rows: set and metric; columns: the
    decoders, each with its searched setting in parentheses), then every row of the newest run."""
    run = _csd_run(results)
    if not run:
        return "No run recorded in `benchmarks/results/csd.csv`.\n"
    speed_ok = {id(r): not implausible(r, "ratio_vs_ar", "block_eff") for r in run}
    greedy = [r for r in run if float(r["temperature"]) == 0]
    labels = list(dict.fromkeys(r["row"] for r in greedy))
    pivot = []
    for name in dict.fromkeys(r["dataset"] for r in greedy):
        by = {r["row"]: r for r in greedy if r["dataset"] == name}
        for col, metric in (("swi_ms", "SWI-MS"), ("swi_pw", "SWI-PW"), ("ratio_vs_ar", "tok/s vs AR")):
            vals = {
                lab: float(r[col]) for lab, r in by.items() if lab != "AR" and (col != "ratio_vs_ar" or speed_ok[id(r)])
            }
            top = max(vals.values(), default=None)
            cells = []
            for lab in labels:
                r = by.get(lab)
                if r is None or (lab != "AR" and lab not in vals):
                    cells.append("-")
                    continue
                cell = num(r[col]) + (f" ({_csd_setting(r['setting'])})" if r["setting"] else "")
                cells.append(f"**{cell}**" if vals.get(lab) == top else cell)
            pivot.append([f"{CSD_SETS.get(name, name)}, {metric}", *cells])
    detail = []
    for r in run:
        ok = speed_ok[id(r)]
        detail.append(
            [
                CSD_SETS.get(r["dataset"], r["dataset"]),
                "greedy" if float(r["temperature"]) == 0 else f"T = {r['temperature']}",
                r["row"],
                r["setting"] or "-",
                num(r["tok_s"]) if ok else "-",
                f"{num(r['ratio_vs_ar'])}x" if ok else "-",
                num(r["block_eff"]),
                num(r["swi_ms"]),
                num(r["swi_pw"]),
                r["equal_ar"] or "-",
            ]
        )
    head = ["set", "mode", "decoder", "setting", "tok/s", "vs AR", "block eff.", "SWI-MS", "SWI-PW", "= AR"]
    costs = {}
    for r in run:
        for d, ms, pw in zip(*(r[c].split(";") for c in ("drafters", "c_ms", "c_pw")), strict=True):
            if d:
                costs[d] = f"`{d}` {num(pw)} measured, {num(ms)} by parameters"
    notes = ["Cost c of one drafter forward relative to one target forward: " + "; ".join(costs.values()) + "."]
    for name in dict.fromkeys(r["dataset"] for r in greedy):
        by = {r["row"]: r for r in greedy if r["dataset"] == name and speed_ok[id(r)]}
        sd = [r for lab, r in by.items() if lab.startswith("SD ")]
        if "CSD full" in by and sd:
            best = max(sd, key=lambda r: float(r["tok_s"]))
            ratio = float(by["CSD full"]["tok_s"]) / float(best["tok_s"])
            notes.append(
                f"{CSD_SETS.get(name, name)}: the full cascade runs at {ratio:.2f}x the tokens/s of the fastest "
                f"single-drafter SD ({best['row']}, {best['setting']})."
            )
    if not all(speed_ok.values()):
        notes.append("A speed shown as - exceeded its block efficiency: it measured machine load, not the decoder.")
    r0 = run[0]
    extra = (
        f"{r0['prompts']} measured prompts per set x up to {r0['tokens']} tokens, settings searched on "
        f"{r0['tune_prompts']} other prompts by {r0['select']}; {r0['dtype']}, {r0['threads']} thread(s), "
        f"{r0['clock']} clock; load average {r0['load_before']} before, {r0['load_after']} after"
    )
    prov = provenance(run, machine="machine", torch="torch", extra=extra)
    return (
        table(["set, metric", *labels], pivot)
        + "\n\n"
        + table(head, detail)
        + "\n\n"
        + " ".join(notes)
        + "\n\n"
        + prov
        + "\n"
    )


def plot_csd(results: Path) -> str | None:
    """Bars of the newest CS Drafting run (greedy rows): measured speed-up over AR, SWI-MS and SWI-PW per decoder,
    one panel per prompt set."""
    run = [r for r in _csd_run(results) if float(r["temperature"]) == 0]
    if not run:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["dataset"] for r in run))
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 3.8), squeeze=False)
    series = (("ratio_vs_ar", "tok/s vs AR"), ("swi_ms", "SWI-MS"), ("swi_pw", "SWI-PW"))
    for ax, name in zip(axes[0], names, strict=True):
        rows = [r for r in run if r["dataset"] == name]
        for i, (col, label) in enumerate(series):
            vals = [
                float("nan") if col == "ratio_vs_ar" and implausible(r, "ratio_vs_ar", "block_eff") else float(r[col])
                for r in rows
            ]
            ax.bar([j + (i - 1) * 0.27 for j in range(len(rows))], vals, width=0.27, label=label)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([r["row"] for r in rows], rotation=30, ha="right", fontsize=8)
        ax.set_title(CSD_SETS.get(name, name))
    axes[0][0].legend(fontsize=8)
    r0 = run[0]
    fig.suptitle(f"CS Drafting, SmolLM2-135M greedy: {r0['machine']}", fontsize=9)
    fig.tight_layout()
    path = results / "csd.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


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


BLOCKS: dict[str, Callable[[Path], str]] = {
    "kernel-headline": block_kernel_headline,
    "kernel-tables": block_kernel_tables,
    "step-overhead-headline": lambda results: block_step_overhead(results, brief=True),
    "step-overhead": block_step_overhead,
    "draft-alpha": block_draft_alpha,
    "draft-alpha-headline": lambda results: block_draft_alpha(results),
    "shipped-drafts": block_shipped_drafts,
    "end-to-end": block_end_to_end,
    "demo-runs": block_demo_runs,
    "end-to-end-headline": block_end_to_end_headline,
    "specdec-pp": block_specdec_pp,
    "draft-e2e": block_draft_e2e,
    "target-step": block_target_step,
    "target-step-ops": block_target_step_ops,
    "csd": block_csd,
    "gpu-ops": block_gpu_ops,
    "gpu-model": block_gpu_model,
}


# --------------------------------------------------------------------------------------------------- rendering


def render_text(text: str, results: Path = RESULTS) -> str:
    """``text`` with every generated block replaced by its rendering (unknown block names raise KeyError)."""
    cache: dict[str, str] = {}

    def sub(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in BLOCKS:
            raise KeyError(f"unknown report block {name!r}; known: {', '.join(BLOCKS)}")
        if name not in cache:
            cache[name] = BLOCKS[name](results)
        return m.group(1) + cache[name] + m.group(4)

    return BLOCK.sub(sub, text)


def render_all(root: Path = ROOT, results: Path = RESULTS) -> dict[str, tuple[str, str]]:
    """{doc path: (committed text, rendered text)} for every file in DOCS."""
    out = {}
    for rel in DOCS:
        text = (root / rel).read_text(encoding="utf-8")
        out[rel] = (text, render_text(text, results))
    return out


def render_pngs(results: Path) -> list[str]:
    """The PNGs of benchmarks/plot.py (kernel microbenchmarks, summary, step overhead), from the same CSVs."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import plot

    written = []
    all_rows = {}
    for op in KERNEL_OPS:
        rows = read_csv(results, op)
        if rows:
            all_rows[op] = plot.newest_run(rows)
            written.append(plot.plot_op(op, all_rows[op], str(results)))
    summary = plot.plot_summary(all_rows, str(results))
    if summary:
        written.append(summary)
    overhead = read_csv(results, "step_overhead")
    if overhead:
        written.append(plot.plot_step_overhead(overhead, str(results)))
    for extra in (plot_end_to_end(results), plot_csd(results)):
        if extra:
            written.append(extra)
    pp = [r for r in newest_run(read_csv(results, "specdec_pp"), ("machine", "torch", "git_rev", "prompts"))]
    if pp:
        import bench_specdec_pp

        floats = ("param", "discard_rate", "verification_rate")
        pts = [{**r, **{k: float(r[k]) if r.get(k) else 0.0 for k in floats}} for r in pp]
        written.append(str(bench_specdec_pp.plot(pts)))
    return written


def plot_end_to_end(results: Path) -> str | None:
    """Bar plot of the newest end-to-end run (batch 1): tokens/s of each method relative to AR."""
    run = [r for r in newest_run(read_csv(results, "end_to_end"), ("time",)) if r["batch"] == "1"]
    run = [r for r in run if not r["method"].startswith("sweep") and not implausible(r, "ratio_vs_ar", "block_eff")]
    if not run:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = [float(r["ratio_vs_ar"]) for r in run]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.bar([r["method"] for r in run], ratios, color=["tab:green" if x >= 1 else "tab:red" for x in ratios])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylabel("tokens/s vs specdec AR")
    r0 = run[0]
    ax.set_title(
        f"SmolLM2-135M, draft {r0['draft']}, T={r0['temperature']}: {r0['machine']}, torch {r0['torch']}",
        fontsize=9,
    )
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    path = results / "end_to_end.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 when a committed block is stale")
    ap.add_argument("--no-png", action="store_true", help="do not render the PNGs")
    args = ap.parse_args()
    stale = []
    for rel, (old, new) in render_all().items():
        if old == new:
            continue
        stale.append(rel)
        if not args.check:
            (ROOT / rel).write_text(new, encoding="utf-8")
            print("rewrote", rel)
    if args.check:
        for rel in stale:
            print(f"{rel}: generated blocks differ from benchmarks/results; run python benchmarks/report.py")
        return 1 if stale else 0
    if not args.no_png:
        for path in render_pngs(RESULTS):
            print("wrote", os.path.relpath(path, ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
