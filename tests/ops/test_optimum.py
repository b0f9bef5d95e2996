"""The large-V optimum and acceptance oracles (``specdec_kernels.testing.optimum``) against the enumeration over all
2^V token sets (``optimum.otm_acceptance``) and the recursive closed forms at small V."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_kernels.testing import optimum as O
from specdec_kernels.testing import oracles as R

EXACT = 1e-9


def _instances(seed: int, count: int, max_v: int):
    """Random (p, q) with Dirichlet concentrations from peaked to flat, some with zeros in p or q."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        v = int(rng.integers(2, max_v + 1))
        a = float(rng.choice([0.1, 0.3, 1.0, 3.0]))
        p, q = rng.dirichlet([a] * v), rng.dirichlet([a] * v)
        if i % 5 == 0:
            p[rng.integers(v)] = 0.0
            p /= p.sum()
        if i % 7 == 0:
            q[rng.integers(v)] = 0.0
            q /= q.sum()
        yield p, q


def gds_joint(p: np.ndarray, n: int) -> dict[tuple[int, ...], float]:
    """The greedy draft process's tuples: D, the n - 1 most likely tokens, with one draw from the rest."""
    top, sampled = R.gds_split(p, n)
    return {(*map(int, top), int(x)): float(sampled[x]) for x in np.flatnonzero(sampled > 0)}


@pytest.mark.parametrize("seed", range(4))
def test_iid_optimum_equals_the_enumerated_cut(seed):
    for p, q in _instances(seed, 300, 8):
        for n in (1, 2, 3):
            if n == 3 and len(p) > 6:
                continue
            assert abs(O.optimum("iid", p, q, n) - O.otm_iid(p, q, n)) <= EXACT, (p, q, n)


@pytest.mark.parametrize("seed", range(4))
def test_swor_optimum_equals_the_enumerated_cut(seed):
    for p, q in _instances(10 + seed, 300, 9):
        assert abs(O.optimum("swor", p, q, 2) - O.otm_swor(p, q, 2)) <= EXACT, (p, q)


def test_hub_and_gds_optima_equal_the_enumerated_cut():
    for p, q in _instances(20, 300, 8):
        assert abs(O.optimum("hub", p, q, 2) - O.otm_hub(p, q)) <= EXACT, (p, q)
        for n in (1, 2, 3, 4):
            want = O.otm_acceptance(gds_joint(p, n), q)
            assert abs(O.optimum("gds", p, q, n) - want) <= EXACT, (p, q, n)


def test_acceptances_equal_the_recursive_closed_forms():
    for p, q in _instances(30, 300, 8):
        assert abs(O.acceptance("rrsw", p, q, 2) - R.rrsw_acceptance(p, q, 2).total) <= EXACT, (p, q)
        for n in (2, 3):
            assert abs(O.acceptance("rrs", p, q, n) - R.rrs_acceptance(p, q, n).total) <= EXACT
            assert abs(O.acceptance("kseq", p, q, n) - R.kseq_acceptance(p, q, n).total) <= EXACT
        assert abs(O.acceptance("spechub", p, q, 2) - R.spechub_acceptance(p, q).total) <= EXACT


def test_no_verifier_beats_the_optimum_of_its_draft_process():
    for p, q in _instances(40, 300, 9):
        for method, n in (("rrs", 2), ("rrs", 3), ("kseq", 2), ("kseq", 3), ("rrsw", 2), ("spechub", 2)):
            alpha, best = O.acceptance(method, p, q, n), O.optimum(O.PROCESS_OF[method], p, q, n)
            assert alpha <= best + EXACT, (method, n, p, q)


def test_the_ratio_order_matters():
    """Power: searching the prefixes of the wrong order (decreasing q / p) misses the optimum on some instance."""
    misses = 0
    for p, q in _instances(50, 200, 7):
        order = np.argsort(-(q / np.where(p > 0, p, 1e-300)), kind="stable")
        ph = np.concatenate([[0.0], np.cumsum(p[order])])
        qh = np.concatenate([[0.0], np.cumsum(q[order])])
        wrong = float(min(1.0, (qh + 1.0 - ph**2).min()))
        misses += wrong > O.otm_iid(p, q, 2) + 1e-6
    assert misses > 20


def test_large_vocabulary_rows():
    """V = 50k: each process's optimum bounds its verifiers."""
    rng = np.random.default_rng(7)
    v = 50_000
    p = rng.dirichlet(np.full(v, 0.01))
    q = 0.5 * p + 0.5 * rng.dirichlet(np.full(v, 0.01))
    for n in (2, 3):
        opt = O.optimum("iid", p, q, n)
        assert O.acceptance("rrs", p, q, n) <= opt + EXACT
        assert O.acceptance("kseq", p, q, n) <= opt + EXACT
    assert O.acceptance("rrsw", p, q, 2) <= O.optimum("swor", p, q, 2) + EXACT
    assert 0.0 < O.optimum("gds", p, q, 3) <= 1.0


def test_bad_arguments():
    p = q = np.full(4, 0.25)
    with pytest.raises(ValueError, match="process"):
        O.optimum("beam", p, q, 2)
    with pytest.raises(ValueError, match="n must be"):
        O.optimum("iid", p, q, 0)
    with pytest.raises(ValueError, match="n <= 2"):
        O.optimum("swor", p, q, 3)
    with pytest.raises(ValueError, match="SpecHub"):
        O.optimum("hub", p, q, 3)
    with pytest.raises(ValueError, match="method"):
        O.acceptance("traversal", p, q, 2)
