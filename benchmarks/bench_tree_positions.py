"""Microbenchmark of tree_positions: cpu vs torch reference.

Bytes read per call: depth (int64) + prefix_len (int64). Tiny op: the numbers mostly measure call overhead.
Run: python benchmarks/bench_tree_positions.py [--threads 2] [--no-csv]
"""

from __future__ import annotations

from functools import partial

import torch
from _timing import Recorder, impl, parse_args

OP = "tree_positions"


def main() -> None:
    args = parse_args(__doc__)
    rec = Recorder(OP, args)
    for batch, n in [(1, 16), (64, 64), (512, 256)]:
        depth = torch.randint(0, 8, (batch, n))
        prefix = torch.randint(1, 4096, (batch,))
        ref = impl(OP, "torch")(depth, prefix)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            if not torch.equal(fn(depth, prefix), ref):
                raise SystemExit(f"{backend} disagrees with the reference on {batch}x{n}")
            fns[backend] = partial(fn, depth, prefix)
        rec.case(f"B={batch} N={n}", fns, nbytes=depth.numel() * 8 + batch * 8)
    rec.save()


if __name__ == "__main__":
    main()
