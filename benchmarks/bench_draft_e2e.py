"""End-to-end benchmark of the shipped distilled draft on SmolLM2-135M-Instruct (bf16, CPU, batch 1).

AR vs SD (draft lengths 1..4) vs SpecDec++ (shipped acceptance head at its own threshold) on held-out Vicuna-bench
prompts (read from ``$SPECDEC_DATA_DIR/vicuna_bench_questions.jsonl``), T = 1, same seeds for every method, methods
interleaved per prompt; beside them transformers' plain ``generate`` and its assisted generation with the same
draft (``assistant_model=``), same prompts and settings. Prints the load average first; reports block efficiency,
tokens/s and the speedup over our AR; appends rows to benchmarks/results/bench_draft_e2e.csv.

    python benchmarks/bench_draft_e2e.py --prompts 8 --new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from _timing import append_csv, run_meta

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python_api"))

FIELDS = ["timestamp", "machine", "torch", "git_rev", "cpu_flags", "cpu_isa", "threads", "prompts", "new_tokens"]
FIELDS += ["method", "tok_per_s", "speedup", "block_efficiency"]


def main() -> None:
    import specdec
    from specdec import SpecDecPPDecoder
    from specdec.baselines import sampling_kwargs
    from specdec.drafters import load_draft, load_head
    from specdec.smollm2 import chat_prompt, load_smollm2
    from specdec.train.common import read_jsonl, shared_data_dir

    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--offset", type=int, default=40, help="first Vicuna question (0-39 score the eval stage)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="1,2,3,4")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) before the run", flush=True)
    torch.set_num_threads(args.threads)
    target, tok = load_smollm2("bf16")
    draft = load_draft("smollm2-distill", target)
    rows = read_jsonl(shared_data_dir() / "vicuna_bench_questions.jsonl")[args.offset : args.offset + args.prompts]
    prompts = [chat_prompt(tok, r["turns"][0]) for r in rows]
    law = sampling_kwargs(1.0, 0, 1.0)
    methods: list[tuple[str, object]] = [("ar", specdec.SpeculativeDecoder(target, None, method="ar"))]
    for length in map(int, args.lengths.split(",")):
        methods.append((f"sd(L={length})", specdec.SpeculativeDecoder(target, draft, method="sd", draft_length=length)))
    head, h = load_head("smollm2-distill-head")
    methods.append((f"specdec_pp(h={h})", SpecDecPPDecoder(target, draft, head)))
    methods += [("hf generate", None), ("hf assisted", draft)]
    # Methods interleaved per prompt, so a change of machine load hits every method alike.
    acc = {name: {"tokens": 0, "seconds": 0.0, "emitted": 0, "rounds": 0} for name, _ in methods}
    for i, p in enumerate(prompts):
        ids = torch.tensor([p])
        for name, dec in methods:
            a = acc[name]
            t = time.perf_counter()
            if name.startswith("hf "):
                torch.manual_seed(i)
                extra = {} if dec is None else {"assistant_model": dec}
                out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                                      eos_token_id=2, pad_token_id=2, **law, **extra)  # fmt: skip
                a["seconds"] += time.perf_counter() - t
                a["tokens"] += int(out.shape[1] - ids.shape[1])
                continue
            res = dec.generate(ids, max_new_tokens=args.new_tokens, eos_token_id=2, seed=i, **law)
            a["seconds"] += time.perf_counter() - t
            a["tokens"] += res.stats.new_tokens
            a["emitted"] += res.stats.emitted
            a["rounds"] += res.stats.row_rounds
    base = acc["ar"]["tokens"] / acc["ar"]["seconds"]
    meta = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), **run_meta(), "threads": args.threads}
    out_rows = []
    for name, a in acc.items():
        rate = a["tokens"] / a["seconds"]
        eff = a["emitted"] / a["rounds"] if a["rounds"] else float("nan")
        row = {"method": name, "tok_per_s": f"{rate:.2f}", "speedup": f"{rate / base:.3f}",
               "block_efficiency": f"{eff:.3f}"}  # fmt: skip
        print(json.dumps(row), flush=True)
        out_rows.append({**meta, "prompts": args.prompts, "new_tokens": args.new_tokens, **row})
    append_csv(ROOT / "benchmarks" / "results" / "bench_draft_e2e.csv", FIELDS, out_rows)


if __name__ == "__main__":
    main()
