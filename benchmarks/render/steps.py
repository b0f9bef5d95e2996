"""The step-cost blocks: the per-call overhead of the decoders (step_overhead.csv) and the target's one-token step and
passes against the read-bandwidth floor (target_step.csv, target_step_ops.csv)."""

from __future__ import annotations

from pathlib import Path

from .common import Rows, _variant_cell, newest_run, newest_runs, num, provenance, read_csv, table


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


def _split_run(run: Rows) -> tuple[Rows, dict, dict, dict, dict]:
    """One run's rows by kind: the target's passes; its linears alone (by n) and in cache (by n); the draft's steps
    (by kind); the draft's steps and the target's passes as a decoding ran them (bench_target_step
    --decode-prompts, by kind)."""
    steps = [r for r in run if not r["case"].startswith(("draft ", "decoding ")) and " linears " not in r["case"]]
    alone = {int(r["case"].rsplit(" ", 1)[1]): r for r in run if " linears new " in r["case"]}
    cached = {int(r["case"].rsplit(" ", 1)[1]): r for r in run if " in cache " in r["case"]}
    drafts = {r["case"].rsplit(" ", 1)[1]: r for r in run if r["case"].startswith("draft ")}
    decoding = {r["case"].removeprefix("decoding "): r for r in run if r["case"].startswith("decoding ")}
    return steps, alone, cached, drafts, decoding


def block_target_step(results: Path) -> str:
    runs = [run for run in _runs_by_isa(read_csv(results, "target_step")) if run[0].get("cpu_isa")]
    if not runs:
        return "No target-step run with its CPU variant is recorded in `benchmarks/results/target_step.csv`.\n"
    steps, alone, cached, drafts, decoding = (list(part) for part in zip(*map(_split_run, runs), strict=True))
    news = sorted({int(r["case"].rsplit(" ", 1)[1]) for run in steps for r in run})
    with_draft, with_decoding = any(drafts), any(decoding)
    several = len({run[0]["machine"] for run in runs}) > 1  # then each variant's rows name their machine
    lines = []
    for run, draft, lin, arith, dec in zip(steps, drafts, alone, cached, decoding, strict=True):
        label = _variant_cell(run[0]["cpu_isa"], run[0]["machine"], several)
        lines += _variant_lines(label, run, draft, lin, arith, dec, news, with_draft, with_decoding)
    head = ["CPU variant", "read floor", "copy floor", *[f"n = {n}" for n in news], "torch n = 1"]
    if with_draft:
        name = next(iter(next(d for d in drafts if d).values()))["case"].split(" ")[1]
        head += [f"draft step ({name}), after a target step", "draft step, repeated"]
    if with_decoding:
        head += ["target pass in decoding", "draft step in decoding, first of a round", "later in a round"]
    r0 = runs[-1][0]
    notes = [
        f"{r0['threads']} thread(s), clock: {r0['clock']}; n = 1 in ms, n > 1 as a ratio to n = 1",
        "read floor: the weights' bytes over the same run's streaming read rate (a one-token step cannot beat it), "
        "with n = 1 as a multiple of it; copy floor: over its copy rate, which also writes",
        "'linears in cache': the pass's multiply-adds on one weight in cache (compute floor), in ms" * any(cached),
        "'linears alone': the pass's linears over the model's weights from memory, the rest left out" * any(alone),
        "a draft step as a share of the one-token target step of the same run" * with_draft,
        "in decoding: medians over greedy rsd_c(auto) rounds, a draft step as a share of the target pass"
        * with_decoding,
    ]
    extra = "; ".join(n for n in notes if n)
    prov = provenance([r for run in runs for r in run], machine="machine", torch="torch", extra=extra)
    return table(head, lines) + "\n\n" + prov + "\n"


def _variant_lines(
    label: str,
    run: Rows,
    draft: dict[str, dict[str, str]],
    lin: dict[int, dict[str, str]],
    arith: dict[int, dict[str, str]],
    dec: dict[str, dict[str, str]],
    news: list[int],
    with_draft: bool,
    with_decoding: bool,
) -> list[list[str]]:
    """The table rows of one CPU variant's run: its passes against the memory floor, then its linears alone and in
    cache where the run timed them; none without a one-token step on the cpu backend."""
    cpu = {int(r["case"].rsplit(" ", 1)[1]): r for r in run if r["backend"] == "cpu"}
    torch_rows = {int(r["case"].rsplit(" ", 1)[1]): r for r in run if r["backend"] == "torch"}
    if 1 not in cpu:
        return []
    one = float(cpu[1]["median_ms"])
    copy_floor = sum(int(r["bytes"]) / float(r["copy_gbps"]) / 1e6 for r in run) / len(run)
    read = [r for r in run if r.get("read_gbps")]  # runs before the read rate was recorded have none
    floor = sum(int(r["bytes"]) / float(r["read_gbps"]) / 1e6 for r in read) / len(read) if read else None
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
    cells = _new_cells(cpu, news)
    if floor is not None:  # the one-token step against the read floor
        cells[news.index(1)] += f" ({one / floor:.2f}x floor)"
    lines = [[label, f"{num(floor)} ms" if floor is not None else "-", f"{num(copy_floor)} ms", *cells, torch_cell,
              *(draft_cells if with_draft else []), *(dec_cells if with_decoding else [])]]  # fmt: skip
    blank = ["-"] * (2 * with_draft + 3 * with_decoding)
    if 1 in lin:  # the same run's linears alone, from memory
        cells = _new_cells(lin, news)
        if floor is not None:
            cells[news.index(1)] += f" ({float(lin[1]['median_ms']) / floor:.2f}x floor)"
        lines.append([f"{label}: linears alone", "-", "-", *cells, "-", *blank])
    if arith:  # the same run's compute floor: the pass's multiply-adds on a weight in cache, in ms
        cells = [f"{num(arith[n]['median_ms'])} ms" if n in arith else "-" for n in news]
        lines.append([f"{label}: linears in cache", "-", "-", *cells, "-", *blank])
    return lines


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


SMOLLM2 = "SmolLM2-135M-Instruct"


def _model_cell(model: str) -> str:
    """A short name of a profiled model: the real model, or the random Llama's size."""
    return "SmolLM2-135M" if model == SMOLLM2 else model.removesuffix(" (random weights)").removeprefix("Llama ")


def block_step_profile(results: Path) -> str:
    rows = read_csv(results, "step_profile")
    if not rows:
        return "No run recorded in `benchmarks/results/step_profile.csv`.\n"
    by_key = newest_runs(rows, ("machine", "cpu_isa", "model", "threads"))
    order = sorted(by_key, key=lambda k: (k[2] != SMOLLM2, k[2], k[3], k[1]))  # the real model first, then by threads
    runs = [by_key[key] for key in order]
    several = len({run[0]["machine"] for run in runs}) > 1
    head = ["part of a step"] + [
        f"{_model_cell(run[0]['model'])}, {_variant_cell(run[0]['cpu_isa'], run[0]['machine'], several)}, "
        f"{run[0]['threads']} thread(s)"
        for run in runs
    ]
    parts = list(dict.fromkeys(r["part"] for run in runs for r in run))
    lines = [[part] + [next((f"{num(r['ms_per_token'])} ms ({100 * float(r['share']):.1f} %)" for r in run
                             if r["part"] == part), "-") for run in runs] for part in parts]  # fmt: skip
    lines.append(["the step (decode only)"] + [f"{num(run[0]['step_ms'])} ms" for run in runs])
    floors = [f"{num(run[0]['read_floor_ms'])} ms ({num(run[0]['read_gbps'])} GB/s)" for run in runs]
    lines.append(["read floor (weights / read rate)", *floors])
    lines.append(["step / read floor"]
                 + [f"{float(run[0]['step_ms']) / float(run[0]['read_floor_ms']):.2f}x" for run in runs])  # fmt: skip
    all_rows = [r for run in runs for r in run]
    models = ", ".join(dict.fromkeys(r["model"] for r in all_rows))
    extra = (f"{models} bf16, greedy plain decoding, {', '.join(dict.fromkeys(r['tokens'] for r in all_rows))} "
             "tokens; per generated token, the prompt's forward left out")  # fmt: skip
    return table(head, lines) + "\n\n" + provenance(all_rows, machine="machine", torch="torch", extra=extra) + "\n"
