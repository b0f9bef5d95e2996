"""Traversal Verification from its definition, in float64 NumPy and independent of ``specdec_kernels.reference``.

Traversal Verification (docs/methods.md, Traversal verification) judges a draft tree from its leaves up. Every node n
that the walk has reached carries an acceptance probability ``a_n``, a target law ``R_n`` and a draft law ``D_n``: the
root starts with ``a = 1``, ``R = q_root``, ``D = p_root``; a child c with token x, reached from its parent P, starts
with ``a_c = min(1, a_P R_P(x) / D_P(x))``, ``R_c = q_c``, ``D_c = p_c``. The walk goes down the first child still in
the tree until it reaches a node without children and tests it: with a uniform U, the node is accepted when
``U (S + 1 - a_old) < S`` for a node whose ``a`` was updated (``a = S / (S + 1 - a_old)``), or ``U < a`` otherwise.
Accepted: the path from the root to it is kept and one more token is drawn from its ``R``. Rejected: the node leaves the
tree and its parent P is updated: ``r = (a_P R_P - D_P)^+``, ``S = sum r``, ``a_P = S / (S + 1 - a_P)``,
``R_P = r / S`` (kept when ``S`` is numerically zero), and for children drawn without replacement ``D_P`` loses the
rejected token and is renormalised. The root, reached without children left, is accepted (its token from ``R_root``).

* :func:`traversal_tree` / :func:`traversal_walk`: the verdict under injected uniforms (the oracle of
  ``verify_tree(..., method="traversal" | "traversalw")``); :func:`walk_tests` gives the tests the walk would make
  if every one failed, from which :func:`accept_probs` reads the law of the accepted node given the tree.
* :func:`round_law`: the exact law of one round's output by enumeration of every draft tree of a fixed shape, children
  drawn i.i.d. or without replacement; ``wrong`` selects a negative control.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np

from .block import ZERO_MASS, Laws
from .oracles_tree import sample_gumbel_max

#: negative controls of :func:`round_law`: the draft law kept after a rejection for trees drawn without replacement
#: ("no_removal"), and the bonus token from the target's raw row instead of the updated residual ("raw_q")
WRONG = ("no_removal", "raw_q")


def _children(parent: Sequence[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parent]
    for n in range(1, len(parent)):
        kids[parent[n]].append(n)
    return kids


def walk_tests(
    parent: Sequence[int],
    tokens: Sequence[int],
    p_rows: np.ndarray,
    q_rows: np.ndarray,
    *,
    swor: bool,
    wrong: str | None = None,
) -> list[tuple[int, float, float, np.ndarray]]:
    """The walk's tests in order, assuming every test fails: (node, den, num, law of the token drawn if it passes).
    The root comes last with (1, 1): it always passes. Rows are indexed by node; ``tokens[n]`` is node n's token."""
    kids = _children(parent)
    alive = [True] * len(parent)
    state: dict[int, list] = {0: [1.0, None, np.asarray(q_rows[0], float), np.asarray(p_rows[0], float)]}
    out = []
    while True:
        n = 0
        while any(alive[c] for c in kids[n]):
            c = next(c for c in kids[n] if alive[c])
            if c not in state:
                a_p, _, r_p, d_p = state[n]
                x = tokens[c]
                a = min(1.0, a_p * float(r_p[x]) / float(d_p[x])) if d_p[x] > 0 else 0.0
                state[c] = [a, None, np.asarray(q_rows[c], float), np.asarray(p_rows[c], float)]
            n = c
        a, updated, r, _ = state[n]
        law = np.asarray(q_rows[n], float) if wrong == "raw_q" else r
        if n == 0:
            out.append((0, 1.0, 1.0, law))
            return out
        out.append((n, 1.0, a) if updated is None else (n, updated[1], updated[0]))
        out[-1] = (*out[-1], law)
        alive[n] = False
        par = parent[n]
        a_p, _, r_p, d_p = state[par]
        excess = np.maximum(a_p * r_p - d_p, 0.0)
        s = float(excess.sum())
        den = s + (1.0 - a_p)
        a_new = s / den if den > 0 else a_p
        r_new = excess / s if s > ZERO_MASS else r_p
        if swor and wrong != "no_removal":
            d_p = d_p.copy()
            d_p[tokens[n]] = 0.0
            mass = d_p.sum()
            d_p = d_p / mass if mass > 0 else d_p
        state[par] = [a_new, (s, den), r_new, d_p]


def accept_probs(tests: list[tuple[int, float, float, np.ndarray]]) -> list[tuple[int, float, np.ndarray]]:
    """(node, P(the walk accepts it), law of the token drawn then) for every test: each node is tested once, in a
    fixed order, so it is accepted with its own pass probability times the probability that every earlier test
    failed."""
    out, carry = [], 1.0
    for node, den, num, law in tests:
        h = min(1.0, max(0.0, num / den)) if den > 0 else (1.0 if num > 0 else 0.0)
        out.append((node, carry * h, law))
        carry *= 1.0 - h
    return out


def traversal_walk(
    parent: Sequence[int],
    tokens: Sequence[int],
    p_rows: np.ndarray,
    q_rows: np.ndarray,
    u: Sequence[float],
    noise: np.ndarray,
    *,
    swor: bool,
) -> tuple[list[int], int]:
    """(accepted path, next token) of one tree: ``u[n]`` is node n's uniform, ``noise`` [V] the final sample's."""
    for node, den, num, law in walk_tests(parent, tokens, p_rows, q_rows, swor=swor):
        if node == 0 or u[node] * den < num:
            path = []
            while node != 0:
                path.append(node)
                node = parent[node]
            return path[::-1], sample_gumbel_max(law, noise)
    raise AssertionError("the root always passes")


def traversal_tree(
    tokens: np.ndarray,
    parent: np.ndarray,
    valid: np.ndarray,
    p_rows: np.ndarray,
    q_rows: np.ndarray,
    accept_u: np.ndarray,
    final_noise: np.ndarray,
    *,
    swor: bool,
    eos: Sequence[int] = (),
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """verify_tree's outputs (shapes as there) for a batch of ragged trees; node n reads accept_u[b, n, 0]; an accepted
    EOS ends the row after it (next token -1)."""
    batch, n = tokens.shape
    depth = np.zeros((batch, n), dtype=np.int64)
    for m in range(1, n):
        depth[:, m] = depth[np.arange(batch), np.maximum(parent[:, m], 0)] + 1
    width = max(1, int(np.where(valid, depth, 0).max()))
    nodes = np.full((batch, width), -1, dtype=np.int64)
    ranks = np.full((batch, width), -1, dtype=np.int64)
    n_acc = np.zeros(batch, dtype=np.int64)
    nxt = np.zeros(batch, dtype=np.int64)
    for b in range(batch):
        ids = [m for m in range(n) if valid[b, m]]  # level order: a parent comes before its children
        local = {m: i for i, m in enumerate(ids)}
        par = [-1] + [local[int(parent[b, m])] for m in ids[1:]]
        toks = [int(tokens[b, m]) for m in ids]
        path, y = traversal_walk(
            par, toks, p_rows[b, ids], q_rows[b, ids], [float(accept_u[b, m, 0]) for m in ids], final_noise[b],
            swor=swor,
        )  # fmt: skip
        kids = _children(par)
        for d, m in enumerate(path):
            if toks[m] in set(eos):
                path, y = path[: d + 1], -1
                break
        nodes[b, : len(path)] = [ids[m] for m in path]
        ranks[b, : len(path)] = [kids[par[m]].index(m) for m in path]
        n_acc[b], nxt[b] = len(path), y
    return nodes, n_acc, nxt, ranks


def _draws(p: np.ndarray, k: int, swor: bool) -> list[tuple[tuple[int, ...], float]]:
    """Every ordered k-tuple of children with its probability: i.i.d. from p, or without replacement."""
    out = []
    for t in itertools.product(range(len(p)), repeat=k):
        if swor and len(set(t)) < k:
            continue
        prob, left = 1.0, 1.0
        for x in t:
            if p[x] <= 0:
                prob = 0.0
                break
            prob *= p[x] / left if swor else p[x]
            if swor:
                left -= p[x]
        if prob > 0:
            out.append((t, prob))
    return out


def round_law(
    p_of: Laws,
    q_of: Laws,
    shape: Sequence[int],
    vocab: int,
    *,
    swor: bool,
    wrong: str | None = None,
    rule: Callable | None = None,
) -> dict[tuple[int, ...], float]:
    """Exact law of one round's output (accepted path, then one token) over every draft tree whose nodes at depth d
    have ``shape[d]`` children (laws per prefix, the root at the empty prefix)."""
    if wrong is not None and wrong not in WRONG:
        raise ValueError(f"wrong must be one of {WRONG}, got {wrong!r}")
    law: dict[tuple[int, ...], float] = {}
    for parent, toks, prefixes, prob in _trees(p_of, shape, swor):
        p_rows = np.stack([p_of(pre) for pre in prefixes])
        q_rows = np.stack([q_of(pre) for pre in prefixes])
        tests = walk_tests(parent, toks, p_rows, q_rows, swor=swor, wrong=wrong)
        for node, pa, y_law in accept_probs(tests):
            if pa <= 0:
                continue
            for y in np.flatnonzero(y_law > 0):
                key = (*prefixes[node], int(y))
                law[key] = law.get(key, 0.0) + prob * pa * float(y_law[y])
    return law


def _trees(p_of: Laws, shape: Sequence[int], swor: bool):
    """Every draft tree of ``shape`` in level order: (parent, tokens, prefix of each node, probability)."""
    levels: list[tuple[list[int], list[int], list[tuple[int, ...]], float]] = [([-1], [0], [()], 1.0)]
    frontier = [0]
    for k in shape:
        grown = []
        for parent, toks, prefixes, prob in levels:
            options = [_draws(p_of(prefixes[n]), k, swor) for n in frontier]
            for combo in itertools.product(*options):
                par, tk, pre, pr = list(parent), list(toks), list(prefixes), prob
                for n, (draw, w) in zip(frontier, combo, strict=True):
                    for x in draw:
                        par.append(n)
                        tk.append(x)
                        pre.append((*prefixes[n], x))
                    pr *= w
                grown.append((par, tk, pre, pr))
        if not grown:
            break
        first = len(levels[0][0])
        levels = grown
        frontier = list(range(first, len(levels[0][0])))
    for parent, toks, prefixes, prob in levels:
        yield parent, toks, prefixes, prob


def expected_accepted(p_of: Laws, q_of: Laws, shape: Sequence[int], vocab: int, *, swor: bool) -> float:
    """Mean drafted tokens kept per round over every draft tree of ``shape``."""
    total = 0.0
    for parent, toks, prefixes, prob in _trees(p_of, shape, swor):
        p_rows = np.stack([p_of(pre) for pre in prefixes])
        q_rows = np.stack([q_of(pre) for pre in prefixes])
        for node, pa, _ in accept_probs(walk_tests(parent, toks, p_rows, q_rows, swor=swor)):
            total += prob * pa * len(prefixes[node])
    return total


__all__ = [
    "WRONG",
    "accept_probs",
    "expected_accepted",
    "round_law",
    "walk_tests",
    "traversal_tree",
    "traversal_walk",
]
