"""End-to-end benchmark on SmolLM2-135M-Instruct: AR vs every specdec method vs HuggingFace generation, with
HF assisted generation (prompt lookup with the n-gram draft and with a hybrid ``NAME+ngram`` draft,
``assistant_model=`` with a plain neural draft) as the peer baseline.

Same prompts, same model pair and seeds for every method; methods take turns per prompt in rotating order so that
load drift on a shared machine does not favour one of them. Each decoder is built once and reused over the prompts
(so ``rsd_c(auto)`` keeps its acceptance counts, as a user's decoder would). SpecDec++ runs as the demo runs it
(``specdec.harness.head_plan``): with ``--draft`` and the acceptance head shipped for it, else with ``--pp-draft`` and
``--head``.
Reports tokens/s, ratio to specdec AR, block efficiency and MBSU (greedy: also on how many prompts each output equals
AR's token for token), plus a batch-size sweep of SD and rsd_c(auto) vs AR (where speculation stops paying).
``--device cuda`` runs the models on a GPU (``--csv`` then names a file of its own). Rows go to
``benchmarks/results/end_to_end.csv`` (``--csv``) with the machine, CPU flags, torch version, commit, extension
variant and device; a bar plot beside it (``end_to_end.png``).

    python benchmarks/bench_end_to_end.py --prompts 6 --tokens 64 --temperature 0.7 --draft smollm2-eagle
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import specdec
import torch
from _timing import append_csv, run_meta
from specdec.baselines import sampling_kwargs
from specdec.drafters import load_head
from specdec.harness import HYBRID_SUFFIX, draft_label, head_plan, load_prompts, make_draft
from specdec.smollm2 import chat_prompt, load_smollm2
from tqdm import tqdm

RESULTS = Path(__file__).resolve().parent / "results"

#: (label, method, parameters): every registered method, trees of 5 to 11 nodes, and the machine-chosen trees
SPECDEC_METHODS: list[tuple[str, str, dict[str, Any]]] = [
    ("ar", "ar", {}),
    ("sd", "sd", {"draft_length": 4}),
    ("rrs", "rrs", {"branching": (2, 2, 1)}),
    ("rrsw", "rrsw", {"branching": (2, 2, 1)}),
    ("rsd_c", "rsd_c", {"branching": (2, 2, 1)}),
    ("rsd_c(auto)", "rsd_c", {"branching": "auto"}),
    ("rsd_s", "rsd_s", {"beam_width": 2, "draft_length": 3}),
    ("spectr", "spectr", {"num_chains": 2, "draft_length": 3}),
    ("spechub", "spechub", {"branching": (2, 2, 1)}),
    ("specdec_pp", "specdec_pp", {}),
]


def run_specdec(decoder: specdec.SpeculativeDecoder, ids: torch.Tensor, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    # the law run_hf samples: no top-k, no EOS
    kw = sampling_kwargs(args.temperature, 0, 1.0)
    out = decoder.generate(ids, max_new_tokens=args.tokens, eos_token_id=None, seed=0, **kw)
    dt = time.perf_counter() - t0
    st = out.stats
    return {
        "tokens": sum(len(r) for r in out.new_tokens),
        "seconds": dt,
        "block_eff": st.block_efficiency,
        "mbsu": st.mbsu,
        "new_tokens": out.new_tokens,
    }


def run_hf(target: Any, ids: torch.Tensor, args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    # the law run_specdec samples (no top-k), at full length
    kw: dict[str, Any] = {**sampling_kwargs(args.temperature, 0, 1.0), "max_new_tokens": args.tokens}
    kw["min_new_tokens"] = args.tokens
    torch.manual_seed(0)
    t0 = time.perf_counter()
    out = target.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=2, **kw, **extra)
    dt = time.perf_counter() - t0
    return {
        "tokens": int(out.shape[1] - ids.shape[1]) * ids.shape[0],
        "seconds": dt,
        "block_eff": float("nan"),
        "mbsu": float("nan"),
        "new_tokens": out[:, ids.shape[1] :].tolist(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-file", default=None, help="JSONL prompts (default: HumanEval)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--draft", default="ngram")
    ap.add_argument(
        "--draft-int8", action=argparse.BooleanOptionalAction, default=True, help="int8 weights for the neural drafts"
    )
    ap.add_argument("--pp-draft", default=None, help="draft of specdec_pp (default: as the demo's --pp-draft)")
    ap.add_argument("--head", default=None, help="acceptance head of specdec_pp (default: <pp-draft>-head)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--device", default="cpu", help="where the models run (cuda: a GPU)")
    ap.add_argument("--csv", default=str(RESULTS / "end_to_end.csv"), help="CSV the rows go to (plot beside it)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    target, tok = load_smollm2(dtype=torch.bfloat16)
    # drafts load against the target where it was loaded (they check its embedding), then move with it
    draft = make_draft(args.draft, target, torch.bfloat16, dev, int8=args.draft_int8)
    pp_draft, head = head_plan(args)
    if pp_draft == args.draft:
        pp_use = draft
    else:
        pp_use = make_draft(pp_draft, target, torch.bfloat16, dev, int8=args.draft_int8)
    target = target.to(dev)
    prompts = [torch.tensor([chat_prompt(tok, p)], device=dev) for p in load_prompts(args.prompt_file, args.prompts)]
    feature = getattr(draft, "reads_target_features", False)
    decoders = _decoders(target, draft, pp_use, head, dev)

    methods = [f"specdec:{m}" for m in decoders] + ["hf:generate"]
    if args.draft == "ngram" or args.draft.endswith(HYBRID_SUFFIX):
        methods.append("hf:prompt_lookup")
    elif isinstance(draft, torch.nn.Module) and not feature:
        methods.append("hf:assistant_model")  # a feature draft (EAGLE-style) is not an HF assistant model
    totals = {m: {"tokens": 0, "seconds": 0.0, "block_eff": [], "mbsu": [], "equal": 0} for m in methods}
    with torch.inference_mode():
        for i, ids in enumerate(tqdm(prompts, desc="prompts")):
            order = methods[i % len(methods) :] + methods[: i % len(methods)]
            outputs = {}
            for m in order:
                r = _run_method(m, decoders, target, draft, ids, args)
                t = totals[m]
                t["tokens"] += r["tokens"]
                t["seconds"] += r["seconds"]
                t["block_eff"].append(r["block_eff"])
                t["mbsu"].append(r["mbsu"])
                outputs[m] = r["new_tokens"]
            for m, toks in outputs.items():  # greedy: every method decodes the target's greedy path
                totals[m]["equal"] += int(toks == outputs["specdec:ar"])
        # batch sweep: SD and auto trees vs AR with the same prompt replicated (rows decode independently)
        sweep = []
        for b in args.batches:
            ids = prompts[0].expand(b, -1).contiguous()
            ar = run_specdec(decoders["ar"], ids, args)
            for name in ("sd", "rsd_c(auto)"):
                r = run_specdec(decoders[name], ids, args)
                sweep.append((name, b, ar["tokens"] / ar["seconds"], r["tokens"] / r["seconds"], r["block_eff"]))

    base = totals["specdec:ar"]["tokens"] / totals["specdec:ar"]["seconds"]
    path = Path(args.csv)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    rows = []
    greedy = args.temperature == 0
    print(f"\n{'method':22s} {'tok/s':>8s} {'vs AR':>7s} {'block eff':>10s} {'MBSU':>6s} {'= AR':>6s}")
    for m, t in totals.items():
        rate = t["tokens"] / t["seconds"]
        be = sum(t["block_eff"]) / len(t["block_eff"])
        mb = sum(t["mbsu"]) / len(t["mbsu"])
        same = f"{t['equal']}/{len(prompts)}" if greedy else ""
        print(f"{m:22s} {rate:8.2f} {rate / base:6.2f}x {be:10.2f} {mb:6.2f} {same:>6s}")
        rows.append({"method": m, "tok_s": rate, "ratio_vs_ar": rate / base, "block_eff": be, "mbsu": mb, "batch": 1,
                     "equal_ar": same})  # fmt: skip
    print(f"\n{'method':12s} {'batch':>5s} {'AR tok/s':>9s} {'tok/s':>9s} {'vs AR':>6s} {'block eff':>10s}")
    for name, b, ar_rate, rate, be in sweep:
        print(f"{name:12s} {b:5d} {ar_rate:9.2f} {rate:9.2f} {rate / ar_rate:5.2f}x {be:10.2f}")
        rows.append(
            {
                "method": f"sweep:{name}",
                "tok_s": rate,
                "ratio_vs_ar": rate / ar_rate,
                "block_eff": be,
                "mbsu": float("nan"),
                "batch": b,
                "equal_ar": "",
            }
        )
    meta = run_meta()
    fields = ["time", "machine", "cpu_flags", "cpu_isa", "torch", "git", "draft", "temperature", "tokens", "prompts"]
    fields += ["device", "threads", *rows[0].keys()]
    run = {"time": stamp, "machine": meta["machine"], "cpu_flags": meta["cpu_flags"], "cpu_isa": meta["cpu_isa"]}
    run |= {"torch": meta["torch"], "git": meta["git_rev"], "temperature": args.temperature}
    run["draft"] = draft_label(args.draft, args.draft_int8)
    run |= {"tokens": args.tokens, "prompts": args.prompts, "threads": args.threads}
    run["device"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    append_csv(path, fields, [{**run, **r} for r in rows])
    _plot(rows, path, args)
    print(f"\nrows appended to {path}")


def _decoders(target: Any, draft: Any, pp_use: Any, head: str, dev: torch.device) -> dict[str, Any]:
    """One SpeculativeDecoder per row of SPECDEC_METHODS; specdec_pp's with its acceptance head and draft."""
    decoders: dict[str, specdec.SpeculativeDecoder] = {}
    for label, method, params in SPECDEC_METHODS:
        extra: dict[str, Any] = {}
        use = draft
        if specdec.methods.get(method).needs_head:
            acceptance, extra["threshold"] = load_head(head)
            extra["head"] = acceptance.to(dev)
            use = pp_use
        decoders[label] = specdec.SpeculativeDecoder(target, use, method=method, **params, **extra)
    return decoders


def _run_method(m: str, decoders: dict[str, Any], target: Any, draft: Any, ids: torch.Tensor, args: Any) -> dict:
    """One timed run of method ``m`` ("specdec:<label>" or "hf:<generate|prompt_lookup|assistant_model>")."""
    kind, name = m.split(":", 1)
    if kind == "specdec":
        return run_specdec(decoders[name], ids, args)
    if name == "generate":
        return run_hf(target, ids, args)
    if name == "prompt_lookup":
        return run_hf(target, ids, args, prompt_lookup_num_tokens=4)
    return run_hf(target, ids, args, assistant_model=draft)


def _plot(rows: list[dict], path: Path, args: Any) -> None:
    """Bars of the batch-1 rows' speed against specdec AR, beside the CSV."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    names = [r["method"] for r in rows if r["batch"] == 1 and not r["method"].startswith("sweep")]
    ratios = [r["ratio_vs_ar"] for r in rows if r["batch"] == 1 and not r["method"].startswith("sweep")]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.bar(names, ratios, color=["tab:green" if x >= 1 else "tab:red" for x in ratios])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylabel("tokens/s vs specdec AR")
    ax.set_title(f"SmolLM2-135M bf16, draft={args.draft}, T={args.temperature}")
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main()
