"""Shared input generators: Hypothesis strategies and seeded instance makers for node-level tests.

Probability vectors come from small integer weights (so no entry is a tiny positive float that would trip the
1e-7 SWOR cut-off) and cover the awkward cases on purpose: p = q, zeros in p, zeros in q.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

KINDS = ("random", "equal", "p_zero", "q_zero")

# Golden instances (p = draft, q = target).
I1 = (np.array([0.5, 0.3, 0.15, 0.05]), np.array([0.1, 0.2, 0.3, 0.4]))
I2 = (np.array([0.6, 0.25, 0.1, 0.05]), np.array([0.5, 0.2, 0.2, 0.1]))
I3 = (np.array([0.7, 0.2, 0.1]), np.array([0.3, 0.3, 0.4]))
GOLDEN = {"I1": I1, "I2": I2, "I3": I3}


@st.composite
def prob_vectors(draw: st.DrawFn, v: int, zeros: bool = True) -> np.ndarray:
    low = 0 if zeros else 1
    w = np.array(draw(st.lists(st.integers(low, 12), min_size=v, max_size=v)), dtype=np.float64)
    if w.sum() == 0:
        w[draw(st.integers(0, v - 1))] = 1.0
    return w / w.sum()


@st.composite
def pq_pairs(draw: st.DrawFn, min_v: int = 2, max_v: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """(p, q) with V in [min_v, max_v]; p = q, zeros in p and zeros in q each get their own share of examples."""
    v = draw(st.integers(min_v, max_v))
    kind = draw(st.sampled_from(KINDS))
    p = draw(prob_vectors(v, zeros=kind == "p_zero"))
    if kind == "equal":
        return p, p.copy()
    q = draw(prob_vectors(v, zeros=kind == "q_zero"))
    return p, q


def random_law(rng: np.random.Generator, v: int, n_zeros: int = 0) -> np.ndarray:
    """Dirichlet law (concentration in [0.1, 3]) with ``n_zeros`` exact zeros; entries below 1e-3 are zeroed."""
    x = rng.dirichlet(np.full(v, rng.uniform(0.1, 3.0)))
    x[x < 1e-3] = 0.0
    if n_zeros:
        x[rng.choice(v, size=min(n_zeros, v - 1), replace=False)] = 0.0
    if x.sum() == 0:
        x[rng.integers(v)] = 1.0
    return x / x.sum()


def random_instance(rng: np.random.Generator, v: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """One (p, q) of the given kind (see KINDS)."""
    p = random_law(rng, v, n_zeros=1 if kind == "p_zero" and v > 1 else 0)
    if kind == "equal":
        return p, p.copy()
    return p, random_law(rng, v, n_zeros=1 if kind == "q_zero" and v > 1 else 0)


def instances(seed: int, count: int, min_v: int = 2, max_v: int = 6) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` seeded instances cycling through KINDS with V in [min_v, max_v]."""
    rng = np.random.default_rng(seed)
    return [random_instance(rng, int(rng.integers(min_v, max_v + 1)), KINDS[i % len(KINDS)]) for i in range(count)]
