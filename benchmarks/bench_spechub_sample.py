"""Microbenchmark of spechub_sample: cpu vs torch reference, same noise.

Cases: vocab 32000 / 49152 / 128256 at 64 rows, and rows 1 / 8 at 49152 (``--quick``: 64 x 49152 only).
Bytes read per call: logp (4 B fp32) + float64 noise (8 B) per element.
Run: python benchmarks/bench_spechub_sample.py [--threads 1 --clock cpu] [--quick] [--no-csv]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
from _timing import Recorder, impl, open_uniform, parse_args

OP = "spechub_sample"
GOAL = [(64, 49152)]
SWEEP = [(64, 32000), (64, 128256), (1, 49152), (8, 49152)]


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="only 64 x 49152")


def main() -> None:
    args = parse_args(__doc__, options)
    rec = Recorder(OP, args)
    for rows, vocab in GOAL + ([] if args.quick else SWEEP):
        g = torch.Generator().manual_seed(vocab + rows)
        x = 2.5 * torch.randn((rows, vocab), generator=g)
        x[:, :8] += torch.linspace(14, 6, 8)
        logp = torch.log_softmax(x, -1)
        u = open_uniform((rows, vocab), seed=rows)
        ref = impl(OP, "torch")(logp, u)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            if not all(torch.equal(a, b) for a, b in zip(fn(logp, u), ref, strict=True)):
                raise SystemExit(f"{backend} disagrees with the reference on {rows}x{vocab}")
            fns[backend] = partial(fn, logp, u)
        rec.case(f"{rows}x{vocab} fp32", fns, nbytes=rows * vocab * (4 + 8))
    rec.save()


if __name__ == "__main__":
    main()
