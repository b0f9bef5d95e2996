"""Microbenchmark of rotary_embedding: cpu vs torch (HF's apply_rotary_pos_emb, ~14 torch ops) on a decode step.

Shapes: SmolLM2-135M's attention (9 query heads over 3 KV heads, D = 64) in bf16 for n = 1, 8 and 16 new tokens,
q and k the strided views a projection gives ([B, n, H D] viewed as [B, n, H, D] and transposed), cos/sin
[1, n, D]; bytes = q, k, cos and sin read once plus both outputs written.
Run: python benchmarks/bench_rotary_embedding.py [--threads 1] [--clock cpu] [--no-csv]
"""

from __future__ import annotations

from functools import partial

import torch
from _timing import Recorder, impl, parse_args

OP = "rotary_embedding"


def main() -> None:
    args = parse_args(__doc__)
    rec = Recorder(OP, args)
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim = 9, 3, 64
    for n in (1, 8, 16):
        q = torch.randn((1, n, heads * dim), generator=g).bfloat16().view(1, n, heads, dim).transpose(1, 2)
        k = torch.randn((1, n, kv_heads * dim), generator=g).bfloat16().view(1, n, kv_heads, dim).transpose(1, 2)
        angle = torch.arange(200, 200 + n)[:, None] * 10000 ** (-torch.arange(0, dim, 2) / dim)
        angle = torch.cat([angle, angle], dim=-1)[None]
        cos, sin = angle.cos().bfloat16(), angle.sin().bfloat16()
        ref = impl(OP, "torch")(q, k, cos, sin)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            if not all(torch.equal(a, b) for a, b in zip(fn(q, k, cos, sin), ref, strict=True)):
                raise SystemExit(f"{backend} is not bitwise the reference on n={n}")
            fns[backend] = partial(fn, q, k, cos, sin)
        nbytes = 2 * (q.numel() + k.numel() + cos.numel()) * q.element_size()
        rec.case(f"H=9/3 D=64 n={n} bf16", fns, nbytes=nbytes)
    rec.save()


if __name__ == "__main__":
    main()
