"""Microbenchmark of decode_attention: cpu vs torch (fp32 reference) on a draft's decode-step attention.

Shapes: the shipped feature draft smollm2-eagle (9 query heads over 3 KV heads, D = 64), bf16, 1-8 query rows over
caches of 200-2000 slots, and one head width that is a multiple of 16 but not of 32 (8 heads, D = 80, 8 rows);
bytes = q, k, v and the mask read once plus the output written.
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
    # (query heads, KV heads, D, n, S); D = 80: a head width that is a multiple of 16 but not of 32
    cases = [(9, 3, 64, n, s) for n, s in [(1, 200), (4, 200), (8, 200), (1, 2000), (4, 2000)]]
    for h, hkv, d, n, s in [*cases, (8, 8, 80, 8, 200)]:
        q = torch.randn((1, h, n, d), generator=g).bfloat16()
        k = torch.randn((1, hkv, s, d), generator=g).bfloat16()
        v = torch.randn((1, hkv, s, d), generator=g).bfloat16()
        mask = torch.zeros((1, 1, n, s), dtype=torch.bfloat16)
        mask[..., s - n :] = torch.finfo(torch.bfloat16).min  # tree rows see part of the new slots
        scale = d**-0.5
        ref = impl(OP, "torch")(q, k, v, mask, scale)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            if not torch.allclose(fn(q, k, v, mask, scale).float(), ref.float(), rtol=2e-2, atol=2e-2):
                raise SystemExit(f"{backend} disagrees with the reference on D={d} n={n} S={s}")
            fns[backend] = partial(fn, q, k, v, mask, scale)
        nbytes = sum(t.numel() * t.element_size() for t in (q, k, v, mask, ref))
        rec.case(f"H={h}/{hkv} D={d} n={n} S={s} bf16", fns, nbytes=nbytes)
    rec.save()


if __name__ == "__main__":
    main()
