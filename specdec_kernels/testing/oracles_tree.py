"""Float64 NumPy oracles for tree verification (docs/methods.md), written independently of
``specdec_kernels.reference``, plus random level-order tree topologies for property tests.

A *node rule* maps (candidate tokens in draft order, p, q, hub) to the node's test sequence
``[(slot, den, num)]`` -- candidate ``slot`` is accepted iff ``U[slot] * den < num`` (division-free) --
and the law of the token emitted when every test fails. ``tree_walk`` runs the tree walk with any rule, so the same
walk serves as the oracle for the public verifier and as the host of deliberately wrong rules (negative controls,
docs/exactness.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..ops import gds_sample, gumbel_topk, spechub_sample
from .oracles import spechub_parts

ZERO_MASS = 1e-12  # zero-mass rule (docs/exactness.md), fp64 oracle tolerance

Tests = list[tuple[int, float, float]]
NodeRule = Callable[[list[int], np.ndarray, np.ndarray, "int | None"], tuple[Tests, np.ndarray]]

__all__ = [
    "RULES",
    "kseq_gamma",
    "parents_from_counts",
    "random_parents",
    "residual",
    "rule_gds",
    "rule_kseq",
    "rule_rrs",
    "rule_rrsw",
    "rule_spechub",
    "sample_gumbel_max",
    "tree_walk",
    "draw_tree",
    "open_uniform",
]


def residual(r: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Norm[(r - s)^+], falling back to r when the mass is below 1e-12."""
    m = np.maximum(r - s, 0.0)
    tot = m.sum()
    return r if tot <= ZERO_MASS else m / tot


def rule_rrs(cand: list[int], p: np.ndarray, q: np.ndarray, hub: int | None = None) -> tuple[Tests, np.ndarray]:
    """SD / RRS: i.i.d. candidates; the residual is updated once per candidate, duplicates included."""
    tests: Tests = []
    r = q
    for j, x in enumerate(cand):
        tests.append((j, float(p[x]), float(r[x])))
        r = residual(r, p)
    return tests, r


def rule_rrsw(cand: list[int], p: np.ndarray, q: np.ndarray, hub: int | None = None) -> tuple[Tests, np.ndarray]:
    """RRSw: candidate k is tested against p^{(k)} (p without the earlier candidates, renormalized)."""
    tests: Tests = []
    r, s = q, p.copy()
    for j, x in enumerate(cand):
        tests.append((j, float(s[x]), float(r[x])))
        r = residual(r, s)
        s[x] = 0.0
        if s.sum() > 0:
            s = s / s.sum()
    return tests, r


def kseq_gamma(p: np.ndarray, q: np.ndarray, k: int) -> tuple[float, float]:
    """K-SEQ: smallest gamma in [1, k] with h(gamma) >= 0, 40 fp64 bisection steps, upper bracket."""

    def beta(g: float) -> float:
        return float(np.minimum(p, q / g).sum())

    def h(g: float) -> float:
        return float(np.minimum(g * p, q).sum()) - 1.0 + (1.0 - beta(g)) ** k

    # p = q: beta(1) is the rows' common mass (which an fp32 row only approximates by 1), so gamma = 1
    if k <= 1 or beta(1.0) >= max(p.sum(), q.sum()) - 1e-12 or h(1.0) >= 0.0:
        return 1.0, beta(1.0)
    lo, hi = 1.0, float(k)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if h(mid) >= 0.0 else (mid, hi)
    return hi, beta(hi)


def rule_kseq(
    cand: list[int], p: np.ndarray, q: np.ndarray, hub: int | None = None, *, gamma: float | None = None
) -> tuple[Tests, np.ndarray]:
    """K-SEQ over K i.i.d. candidates; ``gamma`` overrides gamma* (a wrong value is a negative control)."""
    k = len(cand)
    g, be = kseq_gamma(p, q, k) if gamma is None else (gamma, float(np.minimum(p, q / gamma).sum()))
    if be <= 0.0:  # disjoint supports: nothing can be accepted
        return [(j, 1.0, 0.0) for j in range(k)], q
    c = (1.0 - (1.0 - be) ** k) / be
    num = np.maximum(q - c * np.minimum(p, q / g), 0.0)
    fin = q if num.sum() <= ZERO_MASS else num / num.sum()
    return [(j, g * float(p[x]), float(q[x])) for j, x in enumerate(cand)], fin


def rule_spechub(cand: list[int], p: np.ndarray, q: np.ndarray, hub: int | None = None) -> tuple[Tests, np.ndarray]:
    """SpecHub verification of a hub pair, on the pair law the sampler draws (oracles.spechub_parts); one
    candidate is plain SD."""
    if len(cand) == 1:
        return [(0, float(p[cand[0]]), float(q[cand[0]]))], residual(q, p)
    if hub is None:
        raise ValueError("spechub needs the hub token")
    hp = spechub_parts(p, q, hub)
    a = hp.hub
    # a hub test with no leftover mass is never reached; its numerator is 0 (the ops' convention)
    if cand[0] == a:  # pair (a, i): the non-hub token (slot 1) is tested first
        i = cand[1]
        return [
            (1, float(hp.qai[i]), float(q[i] - hp.a1[i])),
            (0, hp.s_ai, float(q[a]) if hp.s_ai > 0 else 0.0),
        ], hp.final
    i = cand[0]
    return [(0, float(p[i]), float(q[i])), (1, hp.s_ia, float(q[a]) - hp.a3 if hp.s_ia > 0 else 0.0)], hp.final


def rule_gds(cand: list[int], p: np.ndarray, q: np.ndarray, hub: int | None = None) -> tuple[Tests, np.ndarray]:
    """Greedy draft sampling: the last candidate, drawn from p without the others (D), is tested against that law;
    then the tokens of D in slot order, each against the residual's mass not yet tested; the final law is the
    residual without D."""
    *det, x = cand
    s = p.copy()
    s[det] = 0.0
    s = s / s.sum()
    tests: Tests = [(len(det), float(s[x]), float(q[x]))]
    r = residual(q, s)
    left = 1.0
    for j, d in enumerate(det):
        tests.append((j, left, float(r[d])))
        left -= float(r[d])
    fin = r.copy()
    fin[det] = 0.0
    return tests, (q if fin.sum() <= ZERO_MASS else fin / fin.sum())


RULES: dict[str, NodeRule] = {
    "sd": rule_rrs,
    "rrs": rule_rrs,
    "rrsw": rule_rrsw,
    "kseq": rule_kseq,
    "spechub": rule_spechub,
    "gds": rule_gds,
}


def sample_gumbel_max(probs: np.ndarray, u: np.ndarray) -> int:
    """Gumbel-max: argmax(log probs - log(-log U)); zero-probability tokens are never chosen."""
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.log(probs) - np.log(-np.log(u))))


def tree_walk(
    tokens: np.ndarray,
    parent: np.ndarray,
    valid: np.ndarray,
    p_rows: np.ndarray | None,
    q_rows: np.ndarray,
    accept_u: np.ndarray | None,
    final_noise: np.ndarray | None,
    rule: NodeRule | None,
    *,
    hub: np.ndarray | None = None,
    chains: bool = False,
    eos: Sequence[int] = (),
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """TreeVerify for every row; ``rule=None`` is greedy mode (accept the child equal to argmax q).

    Shapes as in ``verify_tree``: tokens/parent/valid [B, N], p_rows/q_rows [B, N, V], accept_u [B, N, Kmax],
    final_noise [B, V]. ``chains=True`` is SpecTr: the candidates after accepting token t are the children
    of every alive chain node carrying t. Returns accepted_nodes [B, L] (the accepted node and its ancestors),
    n_accepted [B], next_token [B] (-1 after an accepted EOS) and accepted_rank [B, L] (slot among the
    candidates), with L = the deepest valid node.
    """
    batch, n = tokens.shape
    eos_set = {int(e) for e in eos}
    depth = np.zeros((batch, n), dtype=np.int64)
    for m in range(1, n):
        depth[:, m] = depth[np.arange(batch), np.maximum(parent[:, m], 0)] + 1
    max_depth = int(np.where(valid, depth, 0).max())
    nodes = np.full((batch, max_depth), -1, dtype=np.int64)
    ranks = np.full((batch, max_depth), -1, dtype=np.int64)
    n_acc = np.zeros(batch, dtype=np.int64)
    nxt = np.zeros(batch, dtype=np.int64)
    for b in range(batch):
        kids: list[list[int]] = [[] for _ in range(n)]
        for m in range(1, n):
            if valid[b, m]:
                kids[int(parent[b, m])].append(m)
        alive = [0]
        last = 0
        taken: list[int] = []
        out: int | None = None
        while out is None:
            rep = alive[0]
            cands = [c for a in alive for c in kids[a]] if chains else kids[rep]
            q = q_rows[b, rep]
            if not cands:
                out = int(np.argmax(q)) if rule is None else sample_gumbel_max(q, final_noise[b])
                break
            toks = [int(tokens[b, c]) for c in cands]
            if rule is None:
                best = int(np.argmax(q))
                slot = toks.index(best) if best in toks else -1
                if slot < 0:
                    out = best
            else:
                tests, fin = rule(toks, p_rows[b, rep], q, None if hub is None else int(hub[b, rep]))
                slot = next((j for j, den, num in tests if accept_u[b, rep, j] * den < num), -1)
                if slot < 0:
                    out = sample_gumbel_max(fin, final_noise[b])
            if slot >= 0:
                last = cands[slot]
                taken.append(slot)
                if toks[slot] in eos_set:
                    out = -1
                alive = [c for c in cands if int(tokens[b, c]) == toks[slot]] if chains else [last]
        m_acc = len(taken)
        node = last
        for d in range(m_acc - 1, -1, -1):
            nodes[b, d] = node
            node = int(parent[b, node])
        ranks[b, :m_acc] = taken
        n_acc[b] = m_acc
        nxt[b] = out
    return nodes, n_acc, nxt, ranks


def parents_from_counts(counts: Sequence[int], max_nodes: int) -> list[int]:
    """Level-order parent list: node i (in id order) gets ``counts[i]`` children until ``max_nodes`` are placed.

    Giving children to nodes in increasing id order yields parents in non-decreasing order, i.e. level order
    with siblings contiguous (the layout of docs/kernels.md)."""
    parents = [-1]
    for i, c in enumerate(counts):
        if i >= len(parents):
            break
        for _ in range(c):
            if len(parents) >= max_nodes:
                return parents
            parents.append(i)
    return parents


def random_parents(rng: np.random.Generator, max_nodes: int, max_children: int = 3) -> list[int]:
    """A random level-order tree with at most ``max_nodes`` nodes (root included)."""
    counts = rng.integers(0, max_children + 1, size=max_nodes).tolist()
    counts[0] = max(counts[0], 1)
    return parents_from_counts(counts, max_nodes)


def open_uniform(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """float64 uniforms in (0, 1) from a fixed seed: injected noise for the sampling ops."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, dtype=torch.float64, generator=g).clamp_min_(2.0**-60)


def draw_tree(
    method: str, parents: Sequence[int], p_rows: torch.Tensor, generator: torch.Generator, noise_seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Draft tokens for the level-order topology ``parents``, each node's children drawn from its p row as
    ``method`` prescribes: i.i.d. (sd, rrs, kseq, block, traversal), Gumbel-top-k (rrsw, traversalw), SpecHub's hub
    pair (spechub), greedy draft sampling (gds). A candidate the op leaves invalid becomes padding, and so do its
    descendants.

    Shape: p_rows [B, N, V] -> tokens [B, N], valid [B, N], parent [B, N] (padding re-parented to the root, -1 at
    the root), hub [B, N] (spechub) or None."""
    batch, n, vocab = p_rows.shape
    tokens = torch.zeros((batch, n), dtype=torch.long)
    valid = torch.ones((batch, n), dtype=torch.bool)
    hub = torch.zeros((batch, n), dtype=torch.long) if method == "spechub" else None
    for m in range(n):
        kids = [c for c in range(1, n) if parents[c] == m]
        if not kids:
            continue
        k = len(kids)
        if method in ("sd", "rrs", "kseq", "block", "traversal"):
            tokens[:, kids] = torch.multinomial(p_rows[:, m], k, replacement=True, generator=generator)
        elif method in ("rrsw", "traversalw"):
            draw = gumbel_topk(p_rows[:, m].log(), k, noise=open_uniform((batch, vocab), noise_seed + m))
            tokens[:, kids] = draw.tokens.clamp_min(0)
            valid[:, kids] &= draw.valid
        elif method == "gds":
            draw = gds_sample(p_rows[:, m].log(), k, noise=open_uniform((batch, vocab), noise_seed + m))
            tokens[:, kids] = draw.tokens.clamp_min(0)
            valid[:, kids] &= draw.valid
        elif method == "spechub":
            draw = spechub_sample(p_rows[:, m].log(), noise=open_uniform((batch, vocab), noise_seed + m))
            tokens[:, kids] = draw.tokens[:, :k].clamp_min(0)
            valid[:, kids] &= draw.valid[:, :k]
            assert hub is not None
            hub[:, m] = draw.hub
        else:
            raise ValueError(f"unknown method {method!r}")
    for c in range(1, n):  # children of padding nodes are padding too
        valid[:, c] &= valid[:, parents[c]]
    parent = torch.where(valid, torch.tensor(list(parents), dtype=torch.long).expand(batch, n), 0)
    parent[:, 0] = -1
    return tokens, valid, parent, hub
