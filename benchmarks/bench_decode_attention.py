"""Microbenchmark of decode_attention: cpu vs torch (fp32 reference) on a draft's decode-step attention.

Shapes: the shipped feature draft smollm2-eagle (9 query heads over 3 KV heads, D = 64), bf16, 1-8 query rows over
caches of 200-2000 slots; bytes = q, k, v and the mask read once plus the output written.
Run: python benchmarks/bench_decode_attention.py [--threads 2] [--no-csv]
"""

from __future__ import annotations

from functools import partial

import torch
from _timing import Recorder, impl, parse_args

OP = "decode_attention"


def main() -> None:
    args = parse_args(__doc__)
    rec = Recorder(OP, args)
    g = torch.Generator().manual_seed(0)
    for n, s in [(1, 200), (4, 200), (8, 200), (1, 2000), (4, 2000)]:
        q = torch.randn((1, 9, n, 64), generator=g).bfloat16()
        k = torch.randn((1, 3, s, 64), generator=g).bfloat16()
        v = torch.randn((1, 3, s, 64), generator=g).bfloat16()
        mask = torch.zeros((1, 1, n, s), dtype=torch.bfloat16)
        mask[..., s - n :] = torch.finfo(torch.bfloat16).min  # tree rows see part of the new slots
        ref = impl(OP, "torch")(q, k, v, mask, 0.125)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            if not torch.allclose(fn(q, k, v, mask, 0.125).float(), ref.float(), rtol=2e-2, atol=2e-2):
                raise SystemExit(f"{backend} disagrees with the reference on n={n} S={s}")
            fns[backend] = partial(fn, q, k, v, mask, 0.125)
        nbytes = sum(t.numel() * t.element_size() for t in (q, k, v, mask, ref))
        rec.case(f"H=9/3 D=64 n={n} S={s} bf16", fns, nbytes=nbytes)
    rec.save()


if __name__ == "__main__":
    main()
