"""Microbenchmark of verify_node: cpu vs torch reference for every method, same noise.

Bytes read per call: p and q (fp32) + float64 final noise per row, B * V * (4 + 4 + 8); the recursive methods
read p/q again per candidate, so GB/s is a lower bound of the real traffic.
Run: python benchmarks/bench_verify_node.py [--threads 2] [--no-csv]
"""

from __future__ import annotations

from functools import partial

import torch
from _timing import Recorder, impl, open_uniform, parse_args

import specdec_kernels as sk

OP = "verify_node"


def main() -> None:
    args = parse_args(__doc__)
    rec = Recorder(OP, args)
    batch, vocab = 16, 32000
    g = torch.Generator().manual_seed(0)
    z = 2.5 * torch.randn((batch, vocab), generator=g)
    z[:, :8] += torch.linspace(14, 6, 8)
    p = torch.softmax(z, -1)
    q = torch.softmax(z + 0.5 * torch.randn(z.shape, generator=g), -1)
    for method, k in [("sd", 1), ("rrs", 3), ("rrsw", 3), ("kseq", 3), ("spechub", 2), ("gds", 3)]:
        hub = None
        if method in ("sd", "rrs", "kseq"):
            cand = torch.multinomial(p, k, replacement=True, generator=g)
            cand_valid = torch.ones_like(cand, dtype=torch.bool)
        elif method == "rrsw":
            draw = sk.gumbel_topk(p.log(), k, noise=open_uniform((batch, vocab), 1))
            cand, cand_valid = draw.tokens.clamp_min(0), draw.valid
        elif method == "gds":
            pick = sk.gds_sample(p.log(), k, noise=open_uniform((batch, vocab), 1))
            cand, cand_valid = pick.tokens.clamp_min(0), pick.valid
        else:
            draw = sk.spechub_sample(p.log(), noise=open_uniform((batch, vocab), 1))
            cand, cand_valid, hub = draw.tokens.clamp_min(0), draw.valid, draw.hub
        u = torch.rand((batch, k), dtype=torch.float64, generator=g)
        fin = open_uniform((batch, vocab), 2)
        call = (method, cand, cand_valid, p, q, u, fin, hub, False)
        ref = impl(OP, "torch")(*call)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            out = fn(*call)
            if not (torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])):
                raise SystemExit(f"{backend} disagrees with the reference for {method}")
            fns[backend] = partial(fn, *call)
        rec.case(f"{method} B={batch} K={k} V={vocab}", fns, nbytes=batch * vocab * (4 + 4 + 8))
    rec.save()


if __name__ == "__main__":
    main()
