"""Microbenchmark of rms_norm: cpu vs torch (HF's LlamaRMSNorm formula, ~8 torch ops) on a decode step's norms.

Shapes: SmolLM2-135M's hidden size 576 in bf16 for 1 row (a one-token step), 8 and 16 rows (a draft tree, a
verification pass), and 1 row of 2048 (a wider model); bytes = x and the weight read once plus the output written.
Run: python benchmarks/bench_rms_norm.py [--threads 1] [--clock cpu] [--no-csv]
"""

from __future__ import annotations

from functools import partial

import torch
from _timing import Recorder, impl, parse_args

OP = "rms_norm"


def main() -> None:
    args = parse_args(__doc__)
    rec = Recorder(OP, args)
    g = torch.Generator().manual_seed(0)
    for rows, dim in [(1, 576), (8, 576), (16, 576), (1, 2048)]:
        x = torch.randn((rows, dim), generator=g).bfloat16()
        w = (1 + 0.5 * torch.randn(dim, generator=g)).bfloat16()
        ref = impl(OP, "torch")(x, w, 1e-5)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            if not torch.allclose(fn(x, w, 1e-5).float(), ref.float(), rtol=2e-2, atol=1e-2):
                raise SystemExit(f"{backend} disagrees with the reference on rows={rows} D={dim}")
            fns[backend] = partial(fn, x, w, 1e-5)
        nbytes = 2 * x.numel() * x.element_size() + w.numel() * w.element_size()
        rec.case(f"rows={rows} D={dim} bf16", fns, nbytes=nbytes)
    rec.save()


if __name__ == "__main__":
    main()
