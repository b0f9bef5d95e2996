"""Microbenchmark of gumbel_topk: cpu vs torch reference, same noise.

Cases: the goal shape 64 rows x 49152 vocab (k = 4, 8) and a sweep: vocab 32000 / 49152 / 128256, rows 1 / 8 / 64,
k 4 / 64 / 256 (``--quick``: the goal shape only). Rows are LLM-like: a few dominant tokens over a N(0, 2.5^2) tail.
Bytes read per call: logp (4 B fp32) + float64 noise (8 B) per element.
Run: python benchmarks/bench_gumbel_topk.py [--threads 1 --clock cpu] [--quick] [--no-csv]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
from _timing import Recorder, impl, open_uniform, parse_args

OP = "gumbel_topk"
GOAL = [(64, 49152, 4), (64, 49152, 8)]
SWEEP = [(64, 32000, 4), (64, 128256, 4), (1, 49152, 4), (8, 49152, 4), (64, 49152, 64), (16, 32000, 256)]


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="only the goal shape 64 x 49152")


def main() -> None:
    args = parse_args(__doc__, options)
    rec = Recorder(OP, args)
    for rows, vocab, k in GOAL + ([] if args.quick else SWEEP):
        g = torch.Generator().manual_seed(vocab)
        x = 2.5 * torch.randn((rows, vocab), generator=g)
        x[:, :8] += torch.linspace(14, 6, 8)
        logp = torch.log_softmax(x, -1)
        u = open_uniform((rows, vocab), seed=k)
        ref = impl(OP, "torch")(logp, k, u)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            out = fn(logp, k, u)
            if not (torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])):
                raise SystemExit(f"{backend} disagrees with the reference on {rows}x{vocab} k={k}")
            fns[backend] = partial(fn, logp, k, u)
        rec.case(f"{rows}x{vocab} k={k} fp32", fns, nbytes=rows * vocab * (4 + 8))
    rec.save()


if __name__ == "__main__":
    main()
