"""Microbenchmark of verify_tree (spec §3.6): cpu vs torch reference, same noise.

Bytes read per call (lower bound): the p and q rows of the nodes the walk visits plus the final noise; counted as
B * (depth + 1) * V * 8 + B * V * 8 with depth = the tree depth.
Run: python benchmarks/bench_verify_tree.py [--threads 2] [--no-csv]
"""

from __future__ import annotations

from functools import partial

import torch
from _timing import Recorder, impl, open_uniform, parse_args

import specdec_kernels as sk
from specdec_kernels import branching_parents, kseq_chain_parents

OP = "verify_tree"


def main() -> None:
    args = parse_args(__doc__)
    rec = Recorder(OP, args)
    batch, vocab = 8, 32000
    for method, parents, depth in [
        ("rrsw", branching_parents([3, 2, 1]), 3),
        ("rrs", branching_parents([2, 2, 2]), 3),
        ("kseq", kseq_chain_parents(3, 4), 4),
        ("spechub", branching_parents([2, 2, 2]), 3),
    ]:
        g = torch.Generator().manual_seed(len(parents))
        n = len(parents)
        z = 2.5 * torch.randn((batch, n, vocab), generator=g)
        z[..., :8] += torch.linspace(14, 6, 8)
        p_rows = torch.softmax(z, -1)
        q_rows = torch.softmax(z + 0.5 * torch.randn(z.shape, generator=g), -1)
        tokens = torch.zeros((batch, n), dtype=torch.long)
        valid = torch.ones((batch, n), dtype=torch.bool)
        hub = torch.zeros((batch, n), dtype=torch.long) if method == "spechub" else None
        for m in range(n):
            kids = [c for c in range(1, n) if parents[c] == m]
            if not kids:
                continue
            if method == "rrsw":
                draw = sk.gumbel_topk(p_rows[:, m].log(), len(kids), noise=open_uniform((batch, vocab), m))
                tokens[:, kids], valid[:, kids] = draw.tokens.clamp_min(0), draw.valid
            elif method == "spechub":
                draw = sk.spechub_sample(p_rows[:, m].log(), noise=open_uniform((batch, vocab), m))
                tokens[:, kids], valid[:, kids], hub[:, m] = draw.tokens.clamp_min(0), draw.valid, draw.hub
            else:
                tokens[:, kids] = torch.multinomial(p_rows[:, m], len(kids), replacement=True, generator=g)
        for c in range(1, n):
            valid[:, c] &= valid[:, parents[c]]
        parent = torch.where(valid, torch.tensor(parents).expand(batch, n), 0)
        parent[:, 0] = -1
        u = torch.rand((batch, n, 3), dtype=torch.float64, generator=g)
        fin = open_uniform((batch, vocab), 5)
        call = (tokens, parent, valid, p_rows, q_rows, method, hub, u, fin, False, None, depth)
        ref = impl(OP, "torch")(*call)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            out = fn(*call)
            if not all(torch.equal(a, b) for a, b in zip(out, ref, strict=True)):
                raise SystemExit(f"{backend} disagrees with the reference for {method}")
            fns[backend] = partial(fn, *call)
        rec.case(f"{method} B={batch} N={n} V={vocab}", fns, nbytes=batch * (depth + 2) * vocab * 8)
    rec.save()


if __name__ == "__main__":
    main()
