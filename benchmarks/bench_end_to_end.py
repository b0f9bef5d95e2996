"""End-to-end benchmark on SmolLM2-135M-Instruct: AR vs the specdec decoders vs HuggingFace generation, with
HF assisted generation (prompt lookup, and ``assistant_model=`` for a neural draft) as the peer baseline.

Same prompts, same model pair and seeds for every method; methods take turns per prompt in rotating order so that
load drift on a shared machine does not favour one of them. Reports tokens/s, ratio to specdec AR, block efficiency
and MBSU, plus a batch-size sweep of SD vs AR (where speculation stops paying). Rows go to
``benchmarks/results/end_to_end.csv``, a bar plot to ``benchmarks/results/end_to_end.png``.

    python benchmarks/bench_end_to_end.py --prompts 4 --tokens 64 [--draft ngram|self-bf16|<asset>] [--batches 1 2 4]
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path
from typing import Any

import specdec
import torch
from _timing import cpu_flags, git_rev, machine
from specdec.cli import load_prompts, make_draft
from specdec.smollm2 import chat_prompt, load_smollm2
from tqdm import tqdm

RESULTS = Path(__file__).resolve().parent / "results"

SPECDEC_METHODS: dict[str, dict[str, Any]] = {
    "ar": {},
    "sd": {"draft_length": 4},
    "rsd_c": {"branching": (2, 2, 1)},
    "rsd_s": {"beam_width": 2, "draft_length": 3},
    "spectr": {"num_chains": 2, "draft_length": 3},
    "spechub": {"branching": (2, 2, 1)},
}


def run_specdec(target: Any, draft: Any, ids: torch.Tensor, method: str, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    out = specdec.generate(
        target,
        draft,
        ids,
        method=method,
        max_new_tokens=args.tokens,
        temperature=args.temperature,
        eos_token_id=None,
        seed=0,
        **SPECDEC_METHODS[method],
    )
    dt = time.perf_counter() - t0
    st = out.stats
    return {
        "tokens": sum(len(r) for r in out.new_tokens),
        "seconds": dt,
        "block_eff": st.block_efficiency,
        "mbsu": st.mbsu,
    }


def run_hf(target: Any, ids: torch.Tensor, args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    sample = args.temperature > 0
    kw: dict[str, Any] = {"do_sample": sample, "max_new_tokens": args.tokens, "min_new_tokens": args.tokens}
    if sample:
        kw["temperature"] = args.temperature
        kw["top_k"] = 0
    torch.manual_seed(0)
    t0 = time.perf_counter()
    out = target.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=2, **kw, **extra)
    dt = time.perf_counter() - t0
    return {
        "tokens": int(out.shape[1] - ids.shape[1]) * ids.shape[0],
        "seconds": dt,
        "block_eff": float("nan"),
        "mbsu": float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-file", default=None, help="JSONL prompts (default: HumanEval)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--draft", default="ngram")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 2, 4])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, tok = load_smollm2(dtype=torch.bfloat16)
    draft = make_draft(args.draft, target, torch.bfloat16)
    prompts = [torch.tensor([chat_prompt(tok, p)]) for p in load_prompts(args.prompt_file, args.prompts)]

    methods = [f"specdec:{m}" for m in SPECDEC_METHODS] + ["hf:generate"]
    if args.draft == "ngram":
        methods.append("hf:prompt_lookup")
    elif isinstance(draft, torch.nn.Module) and not getattr(draft, "reads_target_features", False):
        methods.append("hf:assistant_model")  # a feature draft (EAGLE-style) is not an HF assistant model
    totals = {m: {"tokens": 0, "seconds": 0.0, "block_eff": [], "mbsu": []} for m in methods}
    with torch.inference_mode():
        for i, ids in enumerate(tqdm(prompts, desc="prompts")):
            order = methods[i % len(methods) :] + methods[: i % len(methods)]
            for m in order:
                kind, name = m.split(":")
                if kind == "specdec":
                    r = run_specdec(target, draft, ids, name, args)
                elif name == "generate":
                    r = run_hf(target, ids, args)
                elif name == "prompt_lookup":
                    r = run_hf(target, ids, args, prompt_lookup_num_tokens=4)
                else:
                    r = run_hf(target, ids, args, assistant_model=draft)
                t = totals[m]
                t["tokens"] += r["tokens"]
                t["seconds"] += r["seconds"]
                t["block_eff"].append(r["block_eff"])
                t["mbsu"].append(r["mbsu"])
        # batch sweep: SD vs AR with the same prompt replicated (rows decode independently)
        sweep = []
        for b in args.batches:
            ids = prompts[0].expand(b, -1).contiguous()
            ar = run_specdec(target, draft, ids, "ar", args)
            sd = run_specdec(target, draft, ids, "sd", args)
            sweep.append((b, ar["tokens"] / ar["seconds"], sd["tokens"] / sd["seconds"], sd["block_eff"]))

    base = totals["specdec:ar"]["tokens"] / totals["specdec:ar"]["seconds"]
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "end_to_end.csv"
    new = not path.exists()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    rows = []
    print(f"\n{'method':22s} {'tok/s':>8s} {'vs AR':>7s} {'block eff':>10s} {'MBSU':>6s}")
    for m, t in totals.items():
        rate = t["tokens"] / t["seconds"]
        be = sum(t["block_eff"]) / len(t["block_eff"])
        mb = sum(t["mbsu"]) / len(t["mbsu"])
        print(f"{m:22s} {rate:8.2f} {rate / base:6.2f}x {be:10.2f} {mb:6.2f}")
        rows.append({"method": m, "tok_s": rate, "ratio_vs_ar": rate / base, "block_eff": be, "mbsu": mb, "batch": 1})
    print(f"\n{'batch':>5s} {'AR tok/s':>9s} {'SD tok/s':>9s} {'SD/AR':>6s} {'SD block eff':>13s}")
    for b, ar_rate, sd_rate, be in sweep:
        print(f"{b:5d} {ar_rate:9.2f} {sd_rate:9.2f} {sd_rate / ar_rate:5.2f}x {be:13.2f}")
        rows.append(
            {
                "method": "sweep:sd",
                "tok_s": sd_rate,
                "ratio_vs_ar": sd_rate / ar_rate,
                "block_eff": be,
                "mbsu": float("nan"),
                "batch": b,
            }
        )
    with open(path, "a", newline="") as fh:
        w = csv.DictWriter(
            fh,
            fieldnames=[
                "time",
                "machine",
                "cpu_flags",
                "torch",
                "git",
                "draft",
                "temperature",
                "tokens",
                "prompts",
                "threads",
                *rows[0].keys(),
            ],
        )
        if new:
            w.writeheader()
        for r in rows:
            w.writerow(
                {
                    "time": stamp,
                    "machine": machine(),
                    "cpu_flags": cpu_flags(),
                    "torch": torch.__version__,
                    "git": git_rev(),
                    "draft": args.draft,
                    "temperature": args.temperature,
                    "tokens": args.tokens,
                    "prompts": args.prompts,
                    "threads": args.threads,
                    **r,
                }
            )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        names = [r["method"] for r in rows if r["batch"] == 1 and not r["method"].startswith("sweep")]
        ratios = [r["ratio_vs_ar"] for r in rows if r["batch"] == 1 and not r["method"].startswith("sweep")]
        fig, ax = plt.subplots(figsize=(8, 3.5))
        ax.bar(names, ratios, color=["tab:green" if x >= 1 else "tab:red" for x in ratios])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_ylabel("tokens/s vs specdec AR")
        ax.set_title(f"SmolLM2-135M bf16, draft={args.draft}, T={args.temperature}")
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
        fig.tight_layout()
        fig.savefig(RESULTS / "end_to_end.png", dpi=120)
    except ImportError:
        print("matplotlib not installed: no plot")
    print(f"\nrows appended to {path}")


if __name__ == "__main__":
    main()
