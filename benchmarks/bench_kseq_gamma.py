"""Microbenchmark of kseq_gamma: cpu vs torch reference.

Cases: K = 2 / 4 / 8 at 8 rows x 49152, and vocab 32000 / 128256 at K = 4 (``--quick``: 8 x 49152, K = 4).
q is p's logits plus N(0, 0.5^2) noise (a realistic draft/target pair). Bytes read per call: p and q (4 B fp32 each)
once; the bisection itself revisits only the tokens whose ratio q/p is still inside the bracket.
Run: python benchmarks/bench_kseq_gamma.py [--threads 1 --clock cpu] [--quick] [--no-csv]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
from _timing import Recorder, impl, parse_args

OP = "kseq_gamma"
GOAL = [(8, 49152, 4)]
SWEEP = [(8, 49152, 2), (8, 49152, 8), (8, 32000, 4), (8, 128256, 4)]


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="only 8 x 49152, K = 4")


def main() -> None:
    args = parse_args(__doc__, options)
    rec = Recorder(OP, args)
    for rows, vocab, k in GOAL + ([] if args.quick else SWEEP):
        g = torch.Generator().manual_seed(vocab + k)
        z = 2.5 * torch.randn((rows, vocab), generator=g)
        z[:, :8] += torch.linspace(14, 6, 8)
        p = torch.softmax(z, -1)
        q = torch.softmax(z + 0.5 * torch.randn(z.shape, generator=g), -1)
        kk = torch.full((rows,), k)
        ref = impl(OP, "torch")(p, q, kk)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            gamma, _ = fn(p, q, kk)
            if not bool(((gamma - ref[0]).abs() <= 4 * (k - 1) * 2.0**-40).all()):
                raise SystemExit(f"{backend} gamma is off the reference's on {rows}x{vocab} K={k}")
            fns[backend] = partial(fn, p, q, kk)
        rec.case(f"{rows}x{vocab} K={k} fp32", fns, nbytes=rows * vocab * 8)
    rec.save()


if __name__ == "__main__":
    main()
