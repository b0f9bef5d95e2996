"""Block and traversal verification against token-level verification on the real model (block_verification.csv,
benchmarks/bench_block_verification.py)."""

from __future__ import annotations

from pathlib import Path

from .common import newest_runs, num, provenance, read_csv, table

#: a run is one bench_block_verification call's setting on one machine and CPU variant
RUN_KEY = ("machine", "cpu_isa", "prompts", "skip", "limit", "new_tokens", "threads", "temperature")


def _prompt_set(r: dict[str, str]) -> str:
    name = Path(r["prompts"]).stem if r["prompts"] != "humaneval" else "HumanEval"
    first = int(r["skip"]) + 1
    return f"{name} {first}-{first + int(r['limit']) - 1}"


def _pct(value: str) -> str:
    return "-" if value in ("", "nan") else f"{100 * float(value):+.1f} %"


def block_block_verification(results: Path) -> str:
    runs = list(newest_runs(read_csv(results, "block_verification"), RUN_KEY).values())
    if not runs:
        return "No run recorded in `benchmarks/results/block_verification.csv`.\n"
    out = []
    for run in runs:
        r0 = run[0]
        by_config = {r["config"]: r for r in run}
        head = ["method + path verifier", "block eff. token / path", "tok/s token / path", "path vs token (tok/s)",
                "path vs AR (tok/s)", "kept per round, exact: token / path", "gain: kept / block eff.",
                "rounds scored"]  # fmt: skip
        lines = []
        for r in run:
            if r["verifier"] != "token":
                continue
            b = by_config.get(f"{r['config']}+block") or by_config.get(f"{r['config']}+traversal")
            if b is None:
                continue
            lines.append([
                f"{b['config']} ({r['draft']})",
                f"{num(r['block_efficiency'])} / {num(b['block_efficiency'])}",
                f"{num(r['tok_per_s'])} / {num(b['tok_per_s'])}",
                f"{float(b['vs_token']):.2f}x",
                f"{float(b['vs_ar']):.2f}x",
                f"{num(r['kept_token'])} / {num(r['kept_block'])}",
                f"{_pct(r['gain'])} / {_pct(r['be_gain'])}",
                r["scored_rounds"],
            ])  # fmt: skip
        ar = by_config.get("ar")
        ar_rate = num(ar["tok_per_s"]) if ar else "-"
        title = (f"**{_prompt_set(r0)}**, T = {float(r0['temperature']):g} (untruncated), {r0['new_tokens']} new "
                 f"tokens per prompt, {r0['threads']} thread(s); AR {ar_rate} tok/s")  # fmt: skip
        extra = f"CPU variant {r0['cpu_isa']}; load {r0['load']} at the start"
        out.append(title + "\n\n" + table(head, lines) + "\n\n" + provenance(run, machine="machine", torch="torch",
                                                                               extra=extra))  # fmt: skip
    return "\n\n".join(out) + "\n"


#: a run of bench_optimum: one prompt set and length on one machine
OPT_KEY = ("machine", "prompts", "skip", "limit", "new_tokens")


def block_optimum(results: Path) -> str:
    """Per draft and temperature, each verifier's one-step acceptance and its fraction of the optimum of its own
    draft process and of the best process at the same number of drafts (optimum.csv, benchmarks/bench_optimum.py)."""
    runs = list(newest_runs(read_csv(results, "optimum"), OPT_KEY).values())
    if not runs:
        return "No run recorded in `benchmarks/results/optimum.csv`.\n"
    out = []
    for run in runs:
        r0 = run[0]
        head = ["draft", "T", "n", "verifier (draft process)", "acceptance", "optimum of its process",
                "fraction of it", "fraction of the best process's optimum (best)"]  # fmt: skip
        lines = [
            [
                r["draft"],
                f"{float(r['temperature']):g}",
                r["n"],
                f"`{r['method']}` ({r['process']})",
                num(r["alpha"]),
                num(r["optimum_own"]),
                f"{float(r['frac_own']):.3f}",
                f"{float(r['frac_best']):.3f} ({r['best_process']})",
            ]
            for r in run
        ]
        rows = sorted({(r["draft"], r["temperature"], r["rows"]) for r in run})
        counts = ", ".join(f"{d} T = {float(t):g}: {n}" for d, t, n in rows)
        title = f"**{_prompt_set(r0)}**, {r0['new_tokens']} new tokens per prompt; rows (rounds) scored: {counts}"
        out.append(title + "\n\n" + table(head, lines) + "\n\n" + provenance(run, machine="machine", torch="torch"))
    return "\n\n".join(out) + "\n"
