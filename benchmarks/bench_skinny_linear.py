"""Microbenchmark of skinny_linear (``--int8``: skinny_linear_int8): cpu vs torch (F.linear; for int8 the fp32
reference) on the projections of a draft's decode step.

Shapes: the shipped feature draft smollm2-eagle (width 576, MLP 1024, 4096-token head), bf16, 1-256 rows; bytes =
the weight read once. "warm" cases repeat one call (the weight stays in cache); the "step from DRAM" case runs all
six projections of one draft step on a fresh copy of the weights each call (24 copies, ~270 MB, the size of the
target's weights that a draft step follows), which is how the driver meets them.
With ``--int8`` the weights are int8 with one fp32 scale per row (specdec_kernels.quantize_int8) and bytes count
both.
Run: python benchmarks/bench_skinny_linear.py [--int8] [--threads 2] [--no-csv]
"""

from __future__ import annotations

from functools import partial
from itertools import cycle

import torch
from _timing import Recorder, impl, parse_args

import specdec_kernels as sk

DRAFT = {"pair": (576, 1152), "qkv": (960, 576), "o": (576, 576), "gate_up": (2048, 576), "down": (576, 1024)}
DRAFT["head"] = (4096, 576)
COPIES = 24


def weight_args(w: torch.Tensor, int8: bool) -> tuple[torch.Tensor, ...]:
    """The op's weight arguments for a bf16 matrix ``w``: itself, or its int8 matrix and scales."""
    return sk.quantize_int8(w) if int8 else (w,)


def nbytes_of(ws: tuple[torch.Tensor, ...]) -> int:
    return sum(t.numel() * t.element_size() for t in ws)


def main() -> None:
    args = parse_args(__doc__, lambda ap: ap.add_argument("--int8", action="store_true", help="int8 weights"))
    op = "skinny_linear_int8" if args.int8 else "skinny_linear"
    rec = Recorder(op, args)
    g = torch.Generator().manual_seed(0)
    # 64 and 256 rows: a prompt's prefill, which the adapter hands to skinny_linear in bf16 where the kernel runs
    # its AVX2 tiles (specdec.models.BF16_ROWS)
    cases = [("head", 1), ("gate_up", 1), ("o", 1), ("head", 4), ("head", 8), ("gate_up", 16)]
    for name, rows in [*cases, ("gate_up", 64), ("gate_up", 256)]:
        n_out, n_in = DRAFT[name]
        w = weight_args((torch.randn((n_out, n_in), generator=g) * 0.05).bfloat16(), args.int8)
        x = torch.randn((rows, n_in), generator=g).bfloat16()
        ref = impl(op, "torch")(x, *w)
        fns = {}
        for backend in args.backends:
            fn = impl(op, backend)
            if not torch.allclose(fn(x, *w).float(), ref.float(), rtol=2e-2, atol=2e-2):
                raise SystemExit(f"{backend} disagrees with the reference on {name}")
            fns[backend] = partial(fn, x, *w)
        rec.case(f"{name} {n_out}x{n_in} rows={rows} warm", fns, nbytes=nbytes_of(w))

    sets = [
        {k: weight_args((torch.randn(s, generator=g) * 0.05).bfloat16(), args.int8) for k, s in DRAFT.items()}
        for _ in range(COPIES)
    ]
    xs = {k: torch.randn((1, s[1]), generator=g).bfloat16() for k, s in DRAFT.items()}
    nbytes = sum(nbytes_of(w) for w in sets[0].values())
    fns = {}
    for backend in args.backends:
        fn, it = impl(op, backend), cycle(sets)

        def step(fn=fn, it=it) -> None:
            ws = next(it)
            for k, w in ws.items():
                fn(xs[k], *w)

        fns[backend] = step
    rec.case(f"draft step (6 projections) from DRAM x{COPIES}", fns, nbytes=nbytes)
    rec.save()


if __name__ == "__main__":
    main()
