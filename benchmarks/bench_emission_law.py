"""Microbenchmark of emission_law (CS Drafting's lenient review): cpu vs torch reference on the rows of a reviewed
block, as the cascade calls it once per review.

Bytes read per call: the p and q rows in fp32, R * V * (4 + 4) (the output's writes not counted).
Run: python benchmarks/bench_emission_law.py [--threads 2] [--no-csv]
"""

from __future__ import annotations

from functools import partial

import torch
from _timing import Recorder, impl, parse_args

OP = "emission_law"


def main() -> None:
    args = parse_args(__doc__)
    rec = Recorder(OP, args)
    # (batch rows x block positions, vocabulary): one review of a 10-token block, and a batch of 4 such blocks
    for rows, vocab, leniency in [(10, 49152, 2.0), (40, 49152, 2.0), (40, 32000, 1.5)]:
        g = torch.Generator().manual_seed(rows * vocab)
        z = 2.5 * torch.randn((rows, vocab), generator=g)
        p = torch.softmax(z, -1)
        q = torch.softmax(z + 0.7 * torch.randn(z.shape, generator=g), -1)
        p[0] = 0.0  # a Max-Gram row: a point mass
        p[0, 3] = 1.0
        ref = impl(OP, "torch")(p, q, leniency)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            out = fn(p, q, leniency)
            # float output: within a few fp32 ulps of the reference (sums over V in another order)
            if not torch.allclose(out, ref, rtol=0, atol=1e-6):
                raise SystemExit(f"{backend} disagrees with the reference on R={rows} V={vocab}")
            fns[backend] = partial(fn, p, q, leniency)
        rec.case(f"R={rows} V={vocab} l={leniency}", fns, nbytes=rows * vocab * 8)
    rec.save()


if __name__ == "__main__":
    main()
