"""The drafts' blocks: shipped drafts (their manifests), acceptance on held-out sets (draft_alpha.csv), SpecDec++
(specdec_pp.csv) and the draft end to end (draft_e2e.csv)."""

from __future__ import annotations

import json
from pathlib import Path

from .common import ASSETS, implausible, newest_run, num, provenance, read_csv, table


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
