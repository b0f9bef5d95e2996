"""SpecDec++ on the real model: discard rate vs verification rate over the threshold h and the SD length K (paper
Figure 4 style), plus adaptive vs fixed depth for a draft tree (rsd_c).

Target SmolLM2-135M-Instruct (bf16), draft = the shipped distilled draft, head = the shipped acceptance head.
Held-out Vicuna-bench questions ($SPECDEC_DATA_DIR/vicuna_bench_questions.jsonl, from --offset on; questions 0-39
score the training pipeline's eval stage), temperature 1, same seeds for every configuration, configurations
interleaved per prompt so machine-load drift hits them alike. Metrics (SpecDec++): N = generated tokens, N_target =
target forwards, N_draft = draft forwards (= drafted tokens for chains), N_discarded = N_draft + N_target - N; discard
rate N_discarded / N, verification rate N_target / N; tok/s is wall clock on a shared CPU (compare ratios within one run
only).

Run: python benchmarks/bench_specdec_pp.py [--prompts 4] [--new-tokens 48] [--lengths 1,2,3,4,6,8]
     [--thresholds 0.3,0.5,0.7,0.8,0.9] [--no-plot]
Writes benchmarks/results/specdec_pp.csv (appends) and benchmarks/results/specdec_pp.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python_api"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import RESULTS, append_csv, run_meta  # noqa: E402

FIELDS = ["machine", "torch", "git_rev", "cpu_flags", "cpu_isa", "prompts", "new_tokens", "config", "family", "param",
          "tokens", "target_calls", "draft_calls", "discard_rate", "verification_rate", "block_efficiency", "tok_per_s",
          "speedup_vs_ar"]  # fmt: skip


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import specdec
    from specdec.baselines import sampling_kwargs

    sample_t1 = sampling_kwargs(1.0, 0, 1.0)  # the law at temperature 1, untruncated
    from specdec.drafters import load_draft, load_head
    from specdec.smollm2 import chat_prompt, load_smollm2
    from specdec.train.common import read_jsonl, shared_data_dir

    torch.set_num_threads(args.threads)
    target, tok = load_smollm2("bf16")
    draft = load_draft("smollm2-distill", target)
    head, h_default = load_head("smollm2-distill-head")
    rows = read_jsonl(shared_data_dir() / "vicuna_bench_questions.jsonl")[args.offset : args.offset + args.prompts]
    prompts = [chat_prompt(tok, r["turns"][0]) for r in rows]
    S = specdec.SpeculativeDecoder
    configs: list[tuple[str, str, float, Any]] = [("ar", "ar", 0.0, S(target, None, method="ar"))]
    for k in map(int, args.lengths.split(",")):
        configs.append((f"sd(K={k})", "sd", k, S(target, draft, method="sd", draft_length=k)))
    for h in map(float, args.thresholds.split(",")):
        dec = S(target, draft, method="specdec_pp", head=head, threshold=h, draft_length=args.cap)
        configs.append((f"specdec_pp(h={h})", "specdec_pp", h, dec))
    branching = tuple(int(b) for b in args.tree.split(","))
    configs.append((f"rsd_c(b={args.tree})", "rsd_c", 0.0, S(target, draft, method="rsd_c", branching=branching)))
    for h in map(float, args.tree_thresholds.split(",")):
        dec = S(target, draft, method="rsd_c", branching=branching, head=head, threshold=h)
        configs.append((f"rsd_c(b={args.tree})+head(h={h})", "rsd_c_adaptive", h, dec))
    print(f"shipped head threshold: {h_default}", flush=True)
    acc = {name: {"tokens": 0, "seconds": 0.0, "target": 0, "draft": 0, "emitted": 0, "rounds": 0}
           for name, *_ in configs}  # fmt: skip
    warm = torch.tensor([prompts[0]])
    for _, _, _, dec in configs:
        dec.generate(warm, max_new_tokens=2, seed=0)
    for i, p in enumerate(prompts):
        order = configs if i % 2 == 0 else configs[::-1]
        for name, _, _, dec in order:
            t0 = time.perf_counter()
            out = dec.generate(
                torch.tensor([p]), max_new_tokens=args.new_tokens, eos_token_id=None, seed=1000 + i, **sample_t1
            )
            a = acc[name]
            a["seconds"] += time.perf_counter() - t0
            st = out.stats
            a["tokens"] += st.new_tokens
            a["target"] += st.target_calls  # decoding rounds; the prompt forward is the same for all
            a["draft"] += st.draft_calls
            a["emitted"] += st.emitted
            a["rounds"] += st.row_rounds
        print(f"prompt {i + 1}/{len(prompts)} done", flush=True)
    ar_rate = acc["ar"]["tokens"] / acc["ar"]["seconds"]
    results = []
    for name, family, param, _ in configs:
        a = acc[name]
        n = max(1, a["tokens"])
        discarded = a["draft"] + a["target"] - a["tokens"]
        rate = a["tokens"] / a["seconds"]
        results.append({
            "config": name, "family": family, "param": param, "tokens": a["tokens"], "target_calls": a["target"],
            "draft_calls": a["draft"], "discard_rate": discarded / n, "verification_rate": a["target"] / n,
            "block_efficiency": a["emitted"] / max(1, a["rounds"]), "tok_per_s": rate, "speedup_vs_ar": rate / ar_rate,
        })  # fmt: skip
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in results[-1].items()}))
    return results


def write_csv(results: list[dict[str, Any]], args: argparse.Namespace) -> Path:
    path = Path(RESULTS) / "specdec_pp.csv"
    meta = {**run_meta(), "prompts": args.prompts, "new_tokens": args.new_tokens}
    rows = [{**meta, **{k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()}} for r in results]
    append_csv(path, FIELDS, rows)
    return path


def plot(results: list[dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    styles = {"sd": ("o-", "SD, fixed K"), "specdec_pp": ("s-", "SpecDec++, threshold h"),
              "rsd_c": ("^", "RSD-C fixed depth"), "rsd_c_adaptive": ("v--", "RSD-C + head, h")}  # fmt: skip
    for fam, (marker, label) in styles.items():
        pts = [r for r in results if r["family"] == fam]
        if not pts:
            continue
        pts.sort(key=lambda r: r["discard_rate"])
        ax.plot([r["discard_rate"] for r in pts], [r["verification_rate"] for r in pts], marker, label=label)
        for r in pts:
            tag = f"K={int(r['param'])}" if fam == "sd" else (f"h={r['param']:g}" if r["param"] else "")
            ax.annotate(tag, (r["discard_rate"], r["verification_rate"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")  # fmt: skip
    ax.set_xlabel("discard rate  N_discarded / N")
    ax.set_ylabel("verification rate  N_target / N")
    ax.set_title("SmolLM2-135M + distilled draft, Vicuna held-out, T = 1")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = Path(RESULTS) / "specdec_pp.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--offset", type=int, default=40, help="first Vicuna question (0-39 score the eval stage)")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lengths", default="1,2,3,4,6,8", help="SD draft lengths K")
    ap.add_argument("--thresholds", default="0.3,0.5,0.7,0.8,0.9", help="SpecDec++ thresholds h")
    ap.add_argument("--cap", type=int, default=20, help="SpecDec++ hard cap")
    ap.add_argument("--tree", default="2,2,2", help="rsd_c branching for the adaptive-depth comparison")
    ap.add_argument("--tree-thresholds", default="0.5,0.8", help="thresholds of the adaptive rsd_c runs")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()
    results = run(args)
    print(f"wrote {write_csv(results, args)}")
    if not args.no_plot:
        print(f"wrote {plot(results)}")


if __name__ == "__main__":
    main()
