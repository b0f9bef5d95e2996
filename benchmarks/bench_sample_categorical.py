"""Microbenchmark of sample_categorical: cpu vs torch reference, same noise.

Bytes read per call: logp (4 B fp32) + float64 noise (8 B) per element.
Run: python benchmarks/bench_sample_categorical.py [--threads 2] [--no-csv]
"""

from __future__ import annotations

from functools import partial

import torch
from _timing import Recorder, impl, open_uniform, parse_args

OP = "sample_categorical"


def logits(rows: int, vocab: int, kind: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((rows, vocab), generator=g)
    if kind == "peaked":  # LLM-like: a few dominant tokens over a flat tail
        x = 2.5 * x
        x[:, :8] += torch.linspace(14, 6, 8)
    return x


def main() -> None:
    args = parse_args(__doc__)
    rec = Recorder(OP, args)
    for rows, vocab, kind in [(64, 32000, "flat"), (64, 32000, "peaked"), (8, 128256, "peaked"), (1, 49152, "flat")]:
        logp = torch.log_softmax(logits(rows, vocab, kind, seed=vocab), -1)
        u = open_uniform((rows, vocab), seed=rows)
        ref = impl(OP, "torch")(logp, u)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            if not torch.equal(fn(logp, u), ref):
                raise SystemExit(f"{backend} disagrees with the reference on {rows}x{vocab} {kind}")
            fns[backend] = partial(fn, logp, u)
        rec.case(f"{rows}x{vocab} {kind} fp32", fns, nbytes=rows * vocab * (4 + 8))
    rec.save()


if __name__ == "__main__":
    main()
