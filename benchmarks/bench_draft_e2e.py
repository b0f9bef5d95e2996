"""End-to-end benchmark of the shipped distilled draft on SmolLM2-135M-Instruct (bf16, CPU, batch 1).

AR vs SD (draft lengths 1..4) vs SpecDec++ (shipped acceptance head) on held-out Vicuna-bench prompts (read from
``$SPECDEC_DATA_DIR/vicuna_bench_questions.jsonl``), T = 1, same seeds for every method, methods interleaved per
prompt. Reports block efficiency, tokens/s and the speedup over AR; appends rows to
benchmarks/results/bench_draft_e2e.csv. Long: run it under ``nice -n 19`` on a shared machine.

    python benchmarks/bench_draft_e2e.py --prompts 8 --new-tokens 64
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python_api"))


def main() -> None:
    import specdec
    from specdec import SpecDecPPDecoder
    from specdec.baselines import sampling_kwargs
    from specdec.smollm2 import chat_prompt, load_smollm2
    from specdec.train import load_draft, load_head
    from specdec.train.common import read_jsonl, shared_data_dir

    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--offset", type=int, default=40, help="first Vicuna question (0-39 score the eval stage)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="1,2,3,4")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, tok = load_smollm2("bf16")
    draft = load_draft("smollm2-distill", target)
    rows = read_jsonl(shared_data_dir() / "vicuna_bench_questions.jsonl")[args.offset : args.offset + args.prompts]
    prompts = [chat_prompt(tok, r["turns"][0]) for r in rows]
    methods: list[tuple[str, object]] = [("ar", specdec.SpeculativeDecoder(target, None, method="ar"))]
    for L in map(int, args.lengths.split(",")):
        methods.append((f"sd(L={L})", specdec.SpeculativeDecoder(target, draft, method="sd", draft_length=L)))
    try:
        head, h = load_head("smollm2-distill-head")
        methods.append((f"specdec_pp(h={h})", SpecDecPPDecoder(target, draft, head, threshold=h)))
    except FileNotFoundError:
        pass
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    # Methods interleaved per prompt, so a change of machine load hits every method alike.
    acc = {name: {"tokens": 0, "seconds": 0.0, "emitted": 0, "rounds": 0} for name, _ in methods}
    for i, p in enumerate(prompts):
        for name, dec in methods:
            t = time.perf_counter()
            out = dec.generate(
                torch.tensor([p]),
                max_new_tokens=args.new_tokens,
                eos_token_id=2,
                seed=i,
                **sampling_kwargs(1.0, 0, 1.0),
            )
            a = acc[name]
            a["seconds"] += time.perf_counter() - t
            a["tokens"] += out.stats.new_tokens
            a["emitted"] += out.stats.emitted
            a["rounds"] += out.stats.row_rounds
    results = []
    for name, a in acc.items():
        results.append({"method": name, "tokens": a["tokens"], "seconds": a["seconds"],
                        "tok_per_s": a["tokens"] / a["seconds"],
                        "block_efficiency": a["emitted"] / max(1, a["rounds"])})  # fmt: skip
        print(json.dumps(results[-1]), flush=True)
    base = results[0]["tok_per_s"]
    out_csv = ROOT / "benchmarks" / "results" / "bench_draft_e2e.csv"
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    new = not out_csv.is_file()
    with open(out_csv, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["machine", "torch", "git", "prompts", "new_tokens", "method", "tok_per_s", "speedup",
                        "block_efficiency"])  # fmt: skip
        for r in results:
            w.writerow([platform.processor() or platform.machine(), torch.__version__, rev.strip(), args.prompts,
                        args.new_tokens, r["method"], f"{r['tok_per_s']:.2f}", f"{r['tok_per_s'] / base:.3f}",
                        f"{r['block_efficiency']:.3f}"])  # fmt: skip


if __name__ == "__main__":
    main()
