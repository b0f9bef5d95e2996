"""Microbenchmark of filter_kv: cpu vs torch reference, in place on per-layer K/V tensors.

Bytes read per call: the accepted slots it moves, layers * B * H * n_accepted * D * element size.
Run: python benchmarks/bench_filter_kv.py [--threads 2] [--no-csv]
"""

from __future__ import annotations

from functools import partial

import torch
from _timing import Recorder, impl, parse_args

OP = "filter_kv"


def main() -> None:
    args = parse_args(__doc__)
    rec = Recorder(OP, args)
    # SmolLM2-135M: 30 layers x (K, V), 3 KV heads, head dim 64
    for batch, slots, dtype, m in [
        (1, 600, torch.float32, 5),
        (8, 1100, torch.bfloat16, 6),
        (32, 600, torch.float32, 4),
    ]:
        kv = [torch.randn((batch, 3, slots, 64)).to(dtype) for _ in range(60)]
        prefix = torch.full((batch,), slots - 40, dtype=torch.long)
        nodes = torch.stack([torch.arange(1, m + 1) * 3 for _ in range(batch)])
        n_acc = torch.full((batch,), m, dtype=torch.long)
        ref_kv = [t.clone() for t in kv]
        impl(OP, "torch")(ref_kv, prefix, nodes, n_acc)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            mine = [t.clone() for t in kv]
            fn(mine, prefix, nodes, n_acc)
            if not all(torch.equal(a, b) for a, b in zip(mine, ref_kv, strict=True)):
                raise SystemExit(f"{backend} disagrees with the reference on B={batch}")
            fns[backend] = partial(fn, mine, prefix, nodes, n_acc)
        nbytes = 60 * batch * 3 * m * 64 * kv[0].element_size()
        rec.case(f"60x[{batch},3,{slots},64] {str(dtype)[6:]} m={m}", fns, nbytes=nbytes)
    rec.save()


if __name__ == "__main__":
    main()
