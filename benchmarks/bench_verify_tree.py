"""Microbenchmark of verify_tree: cpu vs torch reference, same noise.

Cases: the goal shape (8 rows x 32 nodes x 49152 vocab, every method, high and low acceptance) and a sweep one
axis at a time around it:
vocab 32000 / 49152 / 128256, rows 1 / 8 / 64, tree sizes 8 / 16 / 32 / 64 (``--quick``: the goal shape only).
Trees have exactly N nodes: per method a level-filled template (rrs/rrsw: 4 children at the root then 2, spechub:
binary, kseq: 4 i.i.d. chains, sd and block: one chain; traversal, traversalw and gds: the rrs and rrsw trees), the last
level cut at N. ``block`` / ``traversal(w)`` (the path verifiers) and ``sd`` / ``rrs(w)`` (token level) judge the
same trees: their rows compare the verifiers' cost.

Bytes read per call (lower bound): the p and q rows of the nodes on the longest root-to-leaf path plus the final
noise, B * (depth + 1) * V * 8 + B * V * 8 with depth = the tree depth (a walk reads no more than one path's rows).
Run: python benchmarks/bench_verify_tree.py [--threads 1 --clock cpu] [--quick] [--no-csv]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
from _timing import Recorder, impl, open_uniform, parse_args

from specdec_kernels.testing.oracles_tree import draw_tree

OP = "verify_tree"
METHODS = ("rrsw", "rrs", "spechub", "kseq", "sd", "block", "traversalw", "traversal", "gds")
GOAL = (8, 32, 49152)


def tree(method: str, n: int) -> list[int]:
    """Parents of an n-node tree in level order (see the module docstring)."""
    if method in ("sd", "block"):
        return [-1, *range(n - 1)]
    if method == "kseq":  # chain c holds nodes 1 + c, 1 + c + K, ...: the root's K children, then one child each
        k = 4
        return [-1] + [0 if i <= k else i - k for i in range(1, n)]
    width = 2 if method == "spechub" else 4
    parents, level = [-1], [0]
    while len(parents) < n:
        nxt = []
        for m in level:
            for _ in range(width):
                if len(parents) == n:
                    break
                nxt.append(len(parents))
                parents.append(m)
        level, width = nxt, 2
    return parents


def depth_of(parents: list[int]) -> int:
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return max(depth)


def case(method: str, batch: int, n: int, vocab: int, spread: float = 0.5) -> tuple[tuple, int]:
    """verify_tree arguments (drafts sampled as the method prescribes) and the tree depth. q's logits are p's plus
    ``spread`` * N(0, 1) noise: 0.5 accepts most drafts, 2.0 rejects most (residual passes and final samples)."""
    parents = tree(method, n)
    depth = depth_of(parents)
    g = torch.Generator().manual_seed(n + vocab)
    z = 2.5 * torch.randn((batch, n, vocab), generator=g)
    z[..., :8] += torch.linspace(14, 6, 8)
    p_rows = torch.softmax(z, -1)
    z.add_(spread * torch.randn(z.shape, generator=g))
    q_rows = torch.softmax(z, -1)
    del z
    tokens, valid, parent, hub = draw_tree(method, parents, p_rows, g, 0)
    u = torch.rand((batch, n, 4), dtype=torch.float64, generator=g)
    fin = open_uniform((batch, vocab), 5)
    return (tokens, parent, valid, p_rows, q_rows, method, hub, u, fin, False, None, depth), depth


def shapes(quick: bool) -> list[tuple[int, int, int, float]]:
    """(rows, nodes, vocab, spread): the goal shape in both acceptance regimes, then the sweep (high acceptance)."""
    goal = [(*GOAL, 0.5), (*GOAL, 2.0)]
    if quick:
        return goal
    sweep = [(8, 32, 32000), (8, 32, 128256), (1, 32, 49152), (64, 8, 49152), (8, 8, 49152), (8, 16, 49152)]
    sweep.append((8, 64, 49152))
    return goal + [(*s, 0.5) for s in sweep]


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="only the goal shape 8 x 32 x 49152")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated verifiers")


def main() -> None:
    args = parse_args(__doc__, options)
    rec = Recorder(OP, args)
    for batch, n, vocab, spread in shapes(args.quick):
        for method in args.methods.split(","):
            call, depth = case(method, batch, n, vocab, spread)
            ref = impl(OP, "torch")(*call)
            fns = {}
            for backend in args.backends:
                fn = impl(OP, backend)
                out = fn(*call)
                if not all(torch.equal(a, b) for a, b in zip(out, ref, strict=True)):
                    raise SystemExit(f"{backend} disagrees with the reference for {method} {batch}x{n}x{vocab}")
                fns[backend] = partial(fn, *call)
            mean_acc = float(ref[1].double().mean())
            name = f"{method} B={batch} N={n} V={vocab} depth={depth} spread={spread} acc={mean_acc:.1f}"
            rec.case(name, fns, nbytes=batch * (depth + 2) * vocab * 8)
            del call, fns
    rec.save()


if __name__ == "__main__":
    main()
