"""The CS Drafting block: the paper's table and its plot (csd.csv)."""

from __future__ import annotations

from pathlib import Path

from .common import Rows, implausible, newest_run, num, provenance, read_csv, table

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
            pivot.append([f"{CSD_SETS.get(name, name)}, {metric}", *_pivot_cells(by, labels, col, speed_ok)])
    detail = [_detail_row(r, speed_ok[id(r)]) for r in run]
    head = ["set", "mode", "decoder", "setting", "tok/s", "vs AR", "block eff.", "SWI-MS", "SWI-PW", "= AR"]
    notes = _csd_notes(run, greedy, speed_ok)
    r0 = run[0]
    extra = (
        f"{r0['prompts']} measured prompts per set x up to {r0['tokens']} tokens, settings searched on "
        f"{r0['tune_prompts']} other prompts by {r0['select']}; {r0['dtype']}, {r0['threads']} thread(s), "
        f"{r0['clock']} clock; load average {r0['load_before']} before, {r0['load_after']} after"
    )
    prov = provenance(run, machine="machine", torch="torch", extra=extra)
    return "\n\n".join([table(["set, metric", *labels], pivot), table(head, detail), " ".join(notes), prov]) + "\n"


def _pivot_cells(by: dict[str, dict[str, str]], labels: list[str], col: str, speed_ok: dict[int, bool]) -> list[str]:
    """One metric's cells of one prompt set, a column per decoder, the best one (AR aside) in bold; a speed that
    measured the machine's load is left out."""
    vals = {lab: float(r[col]) for lab, r in by.items() if lab != "AR" and (col != "ratio_vs_ar" or speed_ok[id(r)])}
    top = max(vals.values(), default=None)
    cells = []
    for lab in labels:
        r = by.get(lab)
        if r is None or (lab != "AR" and lab not in vals):
            cells.append("-")
            continue
        cell = num(r[col]) + (f" ({_csd_setting(r['setting'])})" if r["setting"] else "")
        cells.append(f"**{cell}**" if vals.get(lab) == top else cell)
    return cells


def _detail_row(r: dict[str, str], ok: bool) -> list[str]:
    return [
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


def _csd_notes(run: Rows, greedy: Rows, speed_ok: dict[int, bool]) -> list[str]:
    """The drafters' costs, the full cascade against the fastest single-drafter SD per set, and a word on speeds
    left out."""
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
    return notes


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
