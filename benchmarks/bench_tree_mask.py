"""Microbenchmark of tree_mask: cpu vs torch reference.

The op is write-bound: bytes = the mask it writes, B * N * (P_kv + N) * element size ("written" in the CSV).
Run: python benchmarks/bench_tree_mask.py [--threads 2] [--no-csv]
"""

from __future__ import annotations

from functools import partial

import torch
from _timing import Recorder, impl, parse_args

from specdec_kernels import branching_parents, parents_tensor

OP = "tree_mask"


def main() -> None:
    args = parse_args(__doc__)
    rec = Recorder(OP, args)
    rsd_c = ("rsd-c 3,2,2,1 (37 nodes)", branching_parents([3, 2, 2, 1]))
    binary6 = ("binary6 (63 nodes)", branching_parents([2] * 5))
    for (name, parents), batch, past, dtype in [
        (rsd_c, 1, 512, torch.float32),
        (binary6, 8, 512, torch.bfloat16),
        (binary6, 32, 2048, torch.float32),
    ]:
        parent = parents_tensor(parents, batch=batch)
        valid = torch.ones_like(parent, dtype=torch.bool)
        past_valid = torch.ones((batch, past), dtype=torch.bool)
        ref = impl(OP, "torch")(parent, valid, past_valid, dtype)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            if not torch.equal(fn(parent, valid, past_valid, dtype), ref):
                raise SystemExit(f"{backend} disagrees with the reference on {name}")
            fns[backend] = partial(fn, parent, valid, past_valid, dtype)
        rec.case(
            f"{name} B={batch} P={past} {str(dtype)[6:]}",
            fns,
            nbytes=ref.numel() * ref.element_size(),
            bytes_kind="written",
        )
    rec.save()


if __name__ == "__main__":
    main()
