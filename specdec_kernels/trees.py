"""Static tree topologies in the flattened level-order layout of docs/kernels.md (node 0 = root, parent[0] = -1)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "binary_tree_parents",
    "branching_parents",
    "chain_parents",
    "check_parents",
    "child_counts",
    "depth_from_parents",
    "kseq_chain_parents",
    "parents_tensor",
]


def _check_factors(name: str, factors: Sequence[int]) -> list[int]:
    out = list(factors)
    if not out or any((not isinstance(b, int)) or isinstance(b, bool) or b < 1 for b in out):
        raise ValueError(f"{name} must be a non-empty sequence of positive ints, got {factors!r}")
    return out


def branching_parents(branching: Sequence[int]) -> list[int]:
    """RSD-C / static trees: level l nodes each get ``branching[l]`` children, e.g. (3, 2, 1) -> 16 nodes."""
    factors = _check_factors("branching", branching)
    parents = [-1]
    level = [0]
    for b in factors:
        nxt = []
        for node in level:
            for _ in range(b):
                parents.append(node)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


def chain_parents(length: int) -> list[int]:
    """SD chain of ``length`` draft nodes."""
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be a positive int, got {length!r}")
    return [-1] + list(range(length))


def binary_tree_parents(levels: int) -> list[int]:
    """SpecHub "binaryN": a full binary tree with N levels including the root (2**N - 1 nodes)."""
    if not isinstance(levels, int) or levels < 2:
        raise ValueError(f"levels must be an int >= 2 (binary2 = root + 2 children), got {levels!r}")
    return branching_parents([2] * (levels - 1))


def kseq_chain_parents(k: int, length: int) -> list[int]:
    """SpecTr K x L: K chains of length L hanging off the root, in level order (K * L draft nodes)."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    chain_parents(length)
    parents = [-1] + [0] * k
    for d in range(1, length):
        parents += [1 + (d - 1) * k + c for c in range(k)]
    return parents


def check_parents(parents: Sequence[int]) -> list[int]:
    """Validate a level-order parent list: parent[0] = -1, parent[n] in [0, n), depth non-decreasing,
    siblings contiguous with parents in increasing order."""
    par = [int(x) for x in parents]
    if not par or par[0] != -1:
        raise ValueError(f"parents[0] must be -1 (node 0 is the root), got {par[:1]}")
    depth = [0]
    for n in range(1, len(par)):
        if not 0 <= par[n] < n:
            raise ValueError(f"parents[{n}] must be in [0, {n}) (level order), got {par[n]}")
        if par[n] < par[n - 1]:
            raise ValueError(
                f"parents must be grouped by parent in increasing order (level order); parents[{n}]={par[n]} "
                f"follows parents[{n - 1}]={par[n - 1]}"
            )
        depth.append(depth[par[n]] + 1)
        if depth[n] < depth[n - 1]:
            raise ValueError(f"nodes must be in level order; node {n} has depth {depth[n]} < {depth[n - 1]}")
    return par


def child_counts(parent: torch.Tensor, valid: torch.Tensor) -> list[list[int]]:
    """[B][N] number of valid children of each node, on host lists (the batches of a decoding round are small).

    Shape: parent/valid [B, N]. Raises ValueError when a valid node (other than the root) has a parent outside
    [0, node), which would break level order.
    """
    out = []
    for prow, vrow in zip(parent.tolist(), valid.tolist(), strict=True):
        counts = [0] * len(prow)
        for node in range(1, len(prow)):
            if vrow[node]:
                if not 0 <= prow[node] < node:
                    raise ValueError(f"parent: valid node {node} has parent {prow[node]} (must be in [0, {node}))")
                counts[prow[node]] += 1
        out.append(counts)
    return out


def depth_from_parents(parent: torch.Tensor) -> torch.Tensor:
    """depth[b, n] from parent[b, n] (parent[n] < n, parent[0] = -1); padding nodes (parent 0) get depth 1.

    Pointer jumping: ``jump[n]`` is an ancestor of n at distance ``depth[n]``; each round doubles that distance
    until every node points at the root, so ceil(log2 N) rounds of two gathers instead of one gather per node.
    """
    n = parent.shape[-1]
    jump = parent.clamp_min(0).long()  # the root points at itself
    depth = (torch.arange(n, device=parent.device) > 0).long().expand_as(jump)
    for _ in range(max(n - 1, 1).bit_length()):
        depth = depth + depth.gather(-1, jump)
        jump = jump.gather(-1, jump)
    return depth.contiguous()


def parents_tensor(parents: Sequence[int], batch: int = 1, device: torch.device | str = "cpu") -> torch.Tensor:
    """[batch, N] int64 tensor of a validated parent list."""
    return torch.tensor(check_parents(parents), dtype=torch.long, device=device).expand(batch, -1).clone()
