"""The optimal one-step acceptance of a multi-draft process at any vocabulary size, and each verifier's own
acceptance at that size (float64 NumPy; docs/methods.md, Distance to the optimum).

For a draft process that proposes a tuple of tokens with law Q, the best any exact verifier can do (the OTM optimum,
a max-flow from tuples to tokens) is the min-cut

    alpha*(Q, q) = min over token sets H of  q(H) + 1 - P_Q(every drafted token lies in H),

which :func:`otm_acceptance` enumerates over all 2^V sets (V <= 16). Here the
minimum is found among the V + 1 sets H_m = {the m tokens of smallest q / p} (tokens with p = 0 last):

* i.i.d. drafts (rrs, kseq): P_Q(inside H) = p(H)^n is a convex function f of p(H), so with s = p(H*) at an optimal
  set H*, f(p(H)) >= f(s) + f'(s) (p(H) - s) for every H and the set T = {x : q(x) < f'(s) p(x)} satisfies
  value(T) <= q(T) - f(s) - f'(s) (p(T) - s) + 1 <= the same expression at H* = value(H*); T is one of the H_m,
  so the minimum over them is exact;
* two drafts without replacement (rrsw, Gumbel-top-2): P_Q(inside H) = sum_{x in H} p(x) (p(H) - p(x)) / (1 - p(x))
  is not a function of p(H) alone; the sets H_m are the candidates Hu et al. (arXiv 2502.18779) search, and
  tests/ops/test_optimum.py checks the result against the enumeration over all sets;
* SpecHub's hub pairs and the greedy draft process (``gds``: the n - 1 most likely tokens and one draw from the rest)
  have closed forms, derived in docs/methods.md; their own verifiers reach them.
"""

from __future__ import annotations

import numpy as np

from .oracles import (
    SWOR_MASS_EPS,
    as_law,
    gds_acceptance,
    hub_joint,
    iid_joint,
    kseq_acceptance,
    normalize,
    rrs_acceptance,
    spechub_acceptance,
    swor_law,
)

#: draft processes with an optimum here, and the verifiers that verify their drafts
PROCESSES = ("iid", "swor", "hub", "gds")
PROCESS_OF = {"sd": "iid", "rrs": "iid", "kseq": "iid", "rrsw": "swor", "spechub": "hub", "gds": "gds"}


def otm_acceptance(joint: dict[tuple[int, ...], float], q: np.ndarray) -> float:
    """alpha*(Q, q) = min over token sets T of q(T) + 1 - Q(tuples inside T); V <= 16."""
    q = as_law(q)
    v = len(q)
    if v > 16:
        raise ValueError(f"OTM enumerates 2^V token sets; V = {v} is too large")
    sets = np.arange(1 << v, dtype=np.int64)
    bits = (sets[:, None] >> np.arange(v)) & 1
    q_t = bits @ q
    masks = np.array([sum(1 << x for x in set(t)) for t in joint], dtype=np.int64)
    w = np.array(list(joint.values()))
    inside = ((masks[None, :] & ~sets[:, None]) == 0) @ w
    return float((q_t + 1.0 - inside).min())


def otm_iid(p: np.ndarray, q: np.ndarray, k: int) -> float:
    return otm_acceptance(iid_joint(p, k), q)


def otm_swor(p: np.ndarray, q: np.ndarray, k: int = 2) -> float:
    """OTMw: the OTM optimum for drafts without replacement (for K = 2: Q(i, j) = p(i) p(j) / (1 - p(i)))."""
    return otm_acceptance(swor_law(p, k), q)


def otm_hub(p: np.ndarray, q: np.ndarray) -> float:
    return otm_acceptance(hub_joint(p), q)


def _ratio_order(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Tokens by increasing q / p, the tokens with p = 0 last (adding one to H only adds q)."""
    ratio = np.where(p > 0, q / np.where(p > 0, p, 1.0), np.inf)
    return np.argsort(ratio, kind="stable")


def _prefix_min(q_sorted: np.ndarray, inside: np.ndarray) -> float:
    """min over m = 0..V of q(H_m) + 1 - inside[m], with ``inside[m]`` = P(tuple inside H_m), inside[0] = 0."""
    qh = np.concatenate([[0.0], np.cumsum(q_sorted)])
    return float(min(1.0, (qh + 1.0 - inside).min()))


def optimum_iid(p: np.ndarray, q: np.ndarray, n: int) -> float:
    p, q = normalize(as_law(p)), as_law(q)
    order = _ratio_order(p, q)
    ph = np.concatenate([[0.0], np.cumsum(p[order])])
    return _prefix_min(q[order], np.clip(ph, 0.0, 1.0) ** n)


def optimum_swor2(p: np.ndarray, q: np.ndarray) -> float:
    """Two draws without replacement; a second slot exists only while 1 - p(first) > 1e-7 (Gumbel-top-k's cut)."""
    p, q = normalize(as_law(p)), as_law(q)
    order = _ratio_order(p, q)
    ps = p[order]
    single = 1.0 - ps <= SWOR_MASS_EPS
    rest = np.where(single, 1.0, 1.0 - ps)
    # P(both inside H_m) = p(H_m) A_m - B_m with A = sum p / (1 - p), B = sum p^2 / (1 - p) over H_m; a token drafted
    # alone (p ~ 1) is inside whenever it belongs to H_m
    a = np.concatenate([[0.0], np.cumsum(np.where(single, 0.0, ps / rest))])
    b = np.concatenate([[0.0], np.cumsum(np.where(single, 0.0, ps * ps / rest))])
    alone = np.concatenate([[0.0], np.cumsum(np.where(single, ps, 0.0))])
    ph = np.concatenate([[0.0], np.cumsum(ps)])
    return _prefix_min(q[order], np.clip(ph * a - b + alone, 0.0, 1.0))


def optimum_hub(p: np.ndarray, q: np.ndarray) -> float:
    """SpecHub's pairs: with a = argmax p, Q(i, a) = p(i) and Q(a, i) = p(a) p(i) / (1 - p(a)); the cut must hold a,
    and then P(pair inside H) = p(H - a) / (1 - p(a)), which gives q(a) + sum_{i != a} min(q(i), p(i) / (1 - p(a)))."""
    return spechub_acceptance(normalize(as_law(p)), as_law(q)).total


def optimum_gds(p: np.ndarray, q: np.ndarray, n: int) -> float:
    """Every tuple holds D, so the cut holds D and alpha* = q(D) + sum_{x not in D} min(q(x), p'(x))."""
    return min(1.0, gds_acceptance(normalize(as_law(p)), as_law(q), n).total)


def optimum(process: str, p: np.ndarray, q: np.ndarray, n: int) -> float:
    """alpha* of ``process`` with ``n`` drafts (docstring of this module)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if process == "iid":
        return optimum_iid(p, q, n)
    if process == "swor":
        if n == 1:
            return optimum_iid(p, q, 1)
        if n != 2:
            raise ValueError(f"the swor optimum is computed here for n <= 2 (got {n}); enumerate with otm_swor")
        return optimum_swor2(p, q)
    if process == "hub":
        if n != 2:
            raise ValueError(f"SpecHub drafts n = 2 tokens, got {n}")
        return optimum_hub(p, q)
    if process == "gds":
        return optimum_gds(p, q, n)
    raise ValueError(f"process must be one of {PROCESSES}, got {process!r}")


def rrsw2_acceptance(p: np.ndarray, q: np.ndarray) -> float:
    """RRS without replacement with two drafts at any V: sum min(p, q) + sum_x (p(x) - min(p(x), q(x))) G(x), where
    G(x) = sum_y min(p(y) / (1 - p(x)), r1(y)) is the second test's acceptance after the first draft x was rejected
    (r1 the residual of q against p); G is read off F(c) = sum_y min(c p(y), r1(y)) by one sort of r1 / p."""
    p, q = normalize(as_law(p)), as_law(q)
    acc = np.minimum(p, q)
    first = float(acc.sum())
    r1 = np.maximum(q - p, 0.0)
    tot = r1.sum()
    if tot <= 1e-12:
        return first
    r1 = r1 / tot
    live = p > 0
    ratio = r1[live] / p[live]
    order = np.argsort(ratio, kind="stable")
    t, ps, rs = ratio[order], p[live][order], r1[live][order]
    p_above = np.concatenate([np.cumsum(ps[::-1])[::-1], [0.0]])  # sum of p over ratios >= t[i]
    r_below = np.concatenate([[0.0], np.cumsum(rs)])  # sum of r1 over ratios < t[i]
    lost = p - acc  # drafts x rejected with positive probability have p(x) > q(x), so r1(x) = 0
    xs = np.flatnonzero((lost > 0) & (1.0 - p > SWOR_MASS_EPS))
    c = 1.0 / (1.0 - p[xs])
    i = np.searchsorted(t, c, side="left")
    # F(c); x's own term min(c p(x), r1(x)) is 0 (p(x) > q(x) gives r1(x) = 0), so G(x) = F(c)
    g = c * p_above[i] + r_below[i]
    return first + float((lost[xs] * g).sum())


def acceptance(method: str, p: np.ndarray, q: np.ndarray, n: int) -> float:
    """One-step acceptance of ``method`` with ``n`` drafts from its own draft process, at any V."""
    p, q = normalize(as_law(p)), as_law(q)
    if method == "sd" or n == 1 and method in ("rrs", "rrsw", "kseq"):
        return float(np.minimum(p, q).sum())
    if method == "rrs":
        return rrs_acceptance(p, q, n).total
    if method == "kseq":
        return kseq_acceptance(p, q, n).total
    if method == "rrsw":
        if n != 2:
            raise ValueError(f"rrsw's acceptance is computed here for n <= 2, got {n}")
        return rrsw2_acceptance(p, q)
    if method == "spechub":
        return optimum("hub", p, q, n)
    if method == "gds":
        return optimum_gds(p, q, n)
    raise ValueError(f"method must be one of {tuple(PROCESS_OF)}, got {method!r}")
