"""verify_node: the node verifiers sd, rrs, rrsw, kseq, spechub (docs/methods.md; the checks: docs/exactness.md).

Sections: 1 exactness against the independent NumPy oracle with injected noise; 2 distributions:
golden values, exact enumeration THROUGH the op (analytic mode), the Bernoulli table, closed forms, invariants,
Monte Carlo in sampling mode, and the negative controls failing the same checks; 3 Hypothesis
properties; 4 bad inputs; 5 reproducibility.

False alarms: the enumeration tests are deterministic. Each Monte Carlo check (chi-square at alpha = 1e-4, a TV
bound exceeded with probability <= 1e-6, acceptance rates at 5 standard errors ~ 6e-7 each) has a false-alarm rate
of about 1e-4; with the fixed seeds below the outcome is reproducible for a given torch version.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels import BackendUnavailableError, available_backends, kseq_gamma, process_logits, verify_node
from specdec_kernels.testing import chains as C
from specdec_kernels.testing import optimum as OPT
from specdec_kernels.testing import oracles as O
from specdec_kernels.testing import wrong as W
from specdec_kernels.testing.stats import LawCheck, law_check, rate_tolerance
from tests.strategies import GOLDEN, I1, instances, pq_pairs, prob_vectors, random_instance

F64 = torch.float64
EXACT = 1e-9  # float64 enumeration vs q or vs a closed form
TABLE = 5e-7  # golden values given to 6 decimals
METHOD_K = [
    ("sd", 1),
    ("rrs", 1),
    ("rrs", 2),
    ("rrs", 3),
    ("rrsw", 1),
    ("rrsw", 2),
    ("rrsw", 3),
    ("kseq", 1),
    ("kseq", 2),
    ("kseq", 3),
    ("spechub", 2),
]
HYPO = settings(max_examples=30, deadline=None)
# Distribution tests run on the backends that run CPU tensors natively (torch, cpu); Triton on CPU runs under its
# interpreter (seconds per call) and gets reduced tests below.
FAST_BACKENDS = [b for b in available_backends("verify_node") if b in ("torch", "cpu")]


def _verifier(backend: str):
    return functools.partial(verify_node, backend=backend)


# Zeros in both laws; the hub (token 0) has no target mass.
Z = (np.array([0.4, 0.3, 0.2, 0.1, 0.0]), np.array([0.0, 0.1, 0.2, 0.3, 0.4]))
INSTANCES = {**GOLDEN, "Z": Z}


def _rows(x: np.ndarray, n: int, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.tensor(x, dtype=dtype).expand(n, len(x)).contiguous()


# ---------------------------------------------------------------------------------------------------------------
# 1. Exactness against the NumPy oracle with injected noise


def _random_rows(gen: torch.Generator, batch: int, vocab: int) -> torch.Tensor:
    logits = 2.0 * torch.randn((batch, vocab), dtype=F64, generator=gen)
    if vocab <= 16:  # exact zeros: mask two random tokens per row (never all)
        drop = torch.rand((batch, vocab), generator=gen).argsort(dim=-1)[:, :2]
        logits.scatter_(1, drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


INTERPRETED_BACKENDS = [b for b in available_backends("verify_node") if b not in FAST_BACKENDS]
NODE_METHODS = [("sd", 1), ("rrs", 3), ("rrsw", 3), ("kseq", 2), ("spechub", 2), ("gds", 3)]


def _check_against_oracle(backend, method, k, batch, vocab, dtype):
    gen = torch.Generator().manual_seed(1000 * batch + vocab)
    p = _random_rows(gen, batch, vocab).to(dtype)
    q = _random_rows(gen, batch, vocab).to(dtype)
    cand, valid, hub = O.draft_candidates(method, p.double(), k, gen)
    accept_u = torch.rand((batch, k), dtype=F64, generator=gen)
    final_noise = torch.rand((batch, vocab), dtype=F64, generator=gen).clamp_min(2.0**-60)
    noise = dict(hub=hub, accept_u=accept_u, final_noise=final_noise, analytic=True)
    out = verify_node(method, cand, valid, p, q, backend=backend, **noise)
    ref = C.oracle_verifier(method, cand, valid, p.double(), q.double(), **noise)
    assert torch.equal(out.slot, ref.slot)
    assert torch.equal(out.token, ref.token)
    # fp64 inputs are computed in fp64 by the torch and cpu backends; kernels on GPUs do fp32 math.
    tol = 1e-10 if dtype == F64 and backend in FAST_BACKENDS else 2e-5
    torch.testing.assert_close(out.accept_prob.double(), ref.accept_prob, atol=tol, rtol=0)
    torch.testing.assert_close(out.final_residual.double(), ref.final_residual, atol=tol, rtol=0)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("method,k", NODE_METHODS)
@pytest.mark.parametrize("batch,vocab", [(1, 7), (3, 111), (99, 7), (2, 32000)])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_matches_oracle_with_injected_noise(backend, method, k, batch, vocab, dtype):
    _check_against_oracle(backend, method, k, batch, vocab, dtype)


# Triton runs on CPU tensors only under its interpreter (seconds per call): one small case; tests/backends/ covers
# backend parity in depth.
@pytest.mark.parametrize("backend", INTERPRETED_BACKENDS)
@pytest.mark.parametrize("method,k", NODE_METHODS)
def test_backend_matches_oracle(backend, method, k):
    try:
        _check_against_oracle(backend, method, k, 3, 11, torch.float32)
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))


def test_sampling_mode_matches_analytic_decisions():
    """Sampling mode (early exit) and analytic mode (all tests evaluated) make the same decisions."""
    gen = torch.Generator().manual_seed(7)
    p, q = _random_rows(gen, 50, 7), _random_rows(gen, 50, 7)
    cand, valid, _ = O.draft_candidates("rrs", p, 3, gen)
    kw = dict(accept_u=torch.rand((50, 3), dtype=F64, generator=gen), final_noise=torch.rand((50, 7), dtype=F64))
    a = verify_node("rrs", cand, valid, p, q, analytic=True, **kw)
    s = verify_node("rrs", cand, valid, p, q, **kw)
    assert torch.equal(a.slot, s.slot) and torch.equal(a.token, s.token)
    assert s.accept_prob is None and s.final_residual is None


# ---------------------------------------------------------------------------------------------------------------
# 2a. Golden values (instances of tests/strategies.py), through the op by exact enumeration

GOLDEN_TOTAL = {  # exact fractions where the value is rational, else the value to 6 decimals
    ("sd", 1): {"I1": 1 / 2, "I2": 0.85, "I3": 0.6},
    ("rrs", 2): {"I1": 0.6, "I2": 0.8725, "I3": 0.72},
    ("rrsw", 2): {"I1": 241 / 350, "I2": 0.8975, "I3": 5 / 6},
    ("kseq", 2): {"I1": 0.622829, "I2": 0.897924, "I3": 0.75},
    ("rrs", 3): {"I1": 0.68, "I2": 0.891625, "I3": 0.768},
    ("rrsw", 3): {"I1": 0.775, "I2": 1.0, "I3": 1.0},
    ("kseq", 3): {"I1": 0.705406, "I2": 0.934718, "I3": 0.793950},
    ("spechub", 2): {"I1": 0.7, "I2": 1.0, "I3": 14 / 15},
}
IRRATIONAL = {("kseq", 2, "I1"), ("kseq", 2, "I2"), ("kseq", 3, "I1"), ("kseq", 3, "I2"), ("kseq", 3, "I3")}
GOLDEN_SLOTS = {
    ("spechub", 2): {"I1": (0.5, 0.2), "I3": (0.6, 1 / 3)},
    ("rrs", 2): {"I1": (0.5, 0.1), "I3": (0.6, 0.12)},
    ("rrsw", 2): {"I1": (0.5, 33 / 175), "I3": (0.6, 7 / 30)},
}
GOLDEN_OTM = {"I1": (0.66, 869 / 1190), "I2": (0.9775, 1.0), "I3": (0.79, 23 / 24)}


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("method,k", list(GOLDEN_TOTAL))
@pytest.mark.parametrize("inst", ["I1", "I2", "I3"])
def test_golden_acceptance(backend, method, k, inst):
    p, q = GOLDEN[inst]
    res = O.enumerate_node(method, p, q, k, verifier=_verifier(backend))
    want = GOLDEN_TOTAL[(method, k)][inst]
    tol = TABLE if (method, k, inst) in IRRATIONAL else EXACT
    assert abs(res.accept - want) <= tol
    assert abs(res.accept - O.acceptance(method, p, q, k).total) <= EXACT
    assert res.max_error(q) <= EXACT


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("method,k", list(GOLDEN_SLOTS))
@pytest.mark.parametrize("inst", ["I1", "I3"])
def test_golden_per_slot_rates(backend, method, k, inst):
    p, q = GOLDEN[inst]
    res = O.enumerate_node(method, p, q, k, verifier=_verifier(backend))
    np.testing.assert_allclose(res.slot_rates, GOLDEN_SLOTS[(method, k)][inst], atol=EXACT, rtol=0)
    np.testing.assert_allclose(O.acceptance(method, p, q, k).per_slot, res.slot_rates, atol=EXACT, rtol=0)


@pytest.mark.parametrize("inst", ["I1", "I2", "I3"])
def test_golden_otm(inst):
    p, q = GOLDEN[inst]
    otm_iid, otm_w = GOLDEN_OTM[inst]
    assert abs(OPT.otm_iid(p, q, 2) - otm_iid) <= EXACT
    assert abs(OPT.otm_swor(p, q, 2) - otm_w) <= EXACT
    # The closed form of OTM_iid over token sets equals the LP-style enumeration over the joint.
    sets = [np.array([(t >> i) & 1 for i in range(len(p))], dtype=bool) for t in range(1 << len(p))]
    direct = min(q[s].sum() + 1.0 - p[s].sum() ** 2 for s in sets)
    assert abs(direct - otm_iid) <= EXACT


# ---------------------------------------------------------------------------------------------------------------
# 2b. Exact output law == q for every method on random instances (exact enumeration, docs/exactness.md)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("method,k", METHOD_K)
def test_enumerated_law_is_target_and_matches_closed_form(backend, method, k):
    for p, q in instances(seed=METHOD_K.index((method, k)), count=16, max_v=6):
        res = O.enumerate_node(method, p, q, k, verifier=_verifier(backend))
        assert res.max_error(q) <= EXACT, (p, q)
        acc = O.acceptance(method, p, q, k)
        assert abs(res.accept - acc.total) <= EXACT, (p, q)
        np.testing.assert_allclose(res.slot_rates, acc.per_slot, atol=EXACT, rtol=0)


@HYPO
@given(pq=pq_pairs(2, 6), mk=st.sampled_from(METHOD_K))
def test_enumerated_law_is_target_hypothesis(pq, mk):
    p, q = pq
    method, k = mk
    res = O.enumerate_node(method, p, q, k)
    assert res.max_error(q) <= EXACT
    assert abs(res.accept - O.acceptance(method, p, q, k).total) <= EXACT


@pytest.mark.parametrize("backend", available_backends("verify_node"))
@pytest.mark.parametrize("method,k", [("sd", 1), ("rrs", 2), ("rrsw", 3), ("kseq", 2), ("spechub", 2)])
def test_enumerated_law_with_float32_rows(backend, method, k):
    """fp32 inputs: the law is q up to fp32 round-off (fp32 probability math). Every backend."""
    p, q = I1
    try:
        res = O.enumerate_node(method, p, q, k, verifier=_verifier(backend), dtype=torch.float32)
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))
    assert res.max_error(q) <= 1e-6
    assert abs(res.accept - O.acceptance(method, p, q, k).total) <= 1e-6


def test_oracle_verifier_agrees_with_op_on_enumeration():
    """The harness itself: the NumPy oracle verifier and the op give the same exact law."""
    for p, q in instances(seed=3, count=6, max_v=5):
        for method, k in [("rrs", 3), ("rrsw", 3), ("kseq", 3), ("spechub", 2)]:
            a = O.enumerate_node(method, p, q, k)
            b = O.enumerate_node(method, p, q, k, verifier=C.oracle_verifier)
            np.testing.assert_allclose(a.law, b.law, atol=1e-12, rtol=0)
            np.testing.assert_allclose(a.slot_rates, b.slot_rates, atol=1e-10, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# 2c. Bernoulli toy example: p, q = probability of token 1, K = 2

BERNOULLI = [  # p, q, SD, RRS, K-SEQ, gamma*, OTM, RRSw, SpecHub
    (0.1, 0.5, 0.6000, 0.6400, 0.6584, 1.5844, 0.6900, 1, 1),
    (0.1, 0.9, 0.2000, 0.2800, 0.2846, 1.8458, 0.2900, 1, 1),
    (0.3, 0.1, 0.8000, 0.9400, 0.9525, 1.2179, 1.0000, 1, 1),
    (0.3, 0.5, 0.8000, 0.8600, 0.8965, 1.3217, 1.0000, 1, 1),
    (0.3, 0.9, 0.4000, 0.5800, 0.5917, 1.6390, 0.6100, 1, 1),
    (0.5, 0.1, 0.6000, 0.8000, 0.8150, 1.4301, 0.8500, 1, 1),
    (0.5, 0.9, 0.6000, 0.8000, 0.8150, 1.4301, 0.8500, 1, 1),
    (0.7, 0.1, 0.4000, 0.5800, 0.5917, 1.6390, 0.6100, 1, 1),
    (0.9, 0.1, 0.2000, 0.2800, 0.2846, 1.8458, 0.2900, 1, 1),
    (0.4, 0.4, 1, 1, 1, 1, 1, 1, 1),
    (0.85, 0.85, 1, 1, 1, 1, 1, 1, 1),
]


def _ber(x: float) -> np.ndarray:
    return np.array([1.0 - x, x])


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("row", BERNOULLI, ids=lambda r: f"p{r[0]}-q{r[1]}")
def test_bernoulli_table(backend, row):
    pb, qb, sd, rrs, kseq, gamma, otm, rrsw, hub = row
    p, q = _ber(pb), _ber(qb)
    for method, k, want in [("sd", 1, sd), ("rrs", 2, rrs), ("kseq", 2, kseq), ("rrsw", 2, rrsw), ("spechub", 2, hub)]:
        res = O.enumerate_node(method, p, q, k, verifier=_verifier(backend))
        assert abs(res.accept - want) <= 1e-4, method
        assert res.max_error(q) <= EXACT, method
    g, _ = kseq_gamma(torch.tensor(p)[None], torch.tensor(q)[None], 2)
    assert abs(float(g) - gamma) <= 1e-4
    assert abs(OPT.otm_iid(p, q, 2) - otm) <= 1e-4


@pytest.mark.parametrize("pb", [0.0, 0.05, 0.3, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("qb", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_bernoulli_closed_forms(pb, qb):
    """Closed forms of the Bernoulli example on a grid, including the p in {0, 1} edge where only one candidate is
    valid."""
    p, q = _ber(pb), _ber(qb)
    p_u = pb if qb > pb else 1.0 - pb
    inner = 0.0 < pb < 1.0
    want = {
        ("sd", 1): 1 - abs(pb - qb),
        ("rrs", 2): 1 - abs(pb - qb) * (1 - p_u),
        ("rrsw", 2): 1.0 if inner else 1 - abs(pb - qb),
        ("spechub", 2): 1.0 if inner else 1 - abs(pb - qb),
    }
    for (method, k), value in want.items():
        res = O.enumerate_node(method, p, q, k)
        assert abs(res.accept - value) <= EXACT, method
        assert res.max_error(q) <= EXACT, method
    assert abs(OPT.otm_iid(p, q, 2) - min(1, 1 + qb - pb**2, 2 - qb - (1 - pb) ** 2)) <= EXACT


# ---------------------------------------------------------------------------------------------------------------
# 2d. Invariants (acceptances from the op's enumeration, OTM from the oracle)


@pytest.mark.parametrize("seed", range(3))
def test_invariants(seed):
    for p, q in instances(seed=100 + seed, count=8, max_v=5):
        acc = {(m, k): O.enumerate_node(m, p, q, k).accept for m, k in METHOD_K}
        sd = acc[("sd", 1)]
        for k in (2, 3):
            otm = OPT.otm_iid(p, q, k)
            assert otm >= acc[("rrs", k)] - 1e-12
            assert otm >= acc[("kseq", k)] - 1e-12
            assert acc[("rrs", k)] >= sd - 1e-12 and acc[("rrsw", k)] >= sd - 1e-12
        assert OPT.otm_swor(p, q, 2) >= acc[("rrsw", 2)] - 1e-12
        assert abs(OPT.otm_hub(p, q) - acc[("spechub", 2)]) <= EXACT
        assert acc[("spechub", 2)] >= sd - 1e-12
        assert all(a <= 1 + 1e-12 for a in acc.values())
        # K = 1 of every family is plain speculative sampling.
        for method in ("rrs", "rrsw", "kseq"):
            assert abs(acc[(method, 1)] - sd) <= EXACT


# ---------------------------------------------------------------------------------------------------------------
# 2e. Negative controls (docs/exactness.md) fail the enumeration

CONTROL_TV = [  # control, method, K, instance, exact TV from q
    ("rrs_skip_duplicates", "rrs", 2, "I1", 0.026),
    ("rrs_skip_duplicates", "rrs", 3, "I1", 0.057),
    ("rrs_skip_duplicates", "rrs", 2, "I3", 0.050),
    ("rrs_skip_duplicates", "rrs", 3, "I3", 0.085),
    ("kseq_gamma_one", "kseq", 2, "I1", 0.150),
    ("kseq_gamma_one", "kseq", 2, "I3", 0.120),
    ("rrsw_unrenormalized", "rrsw", 2, "I1", 0.050),
    ("rrsw_unrenormalized", "rrsw", 2, "I3", 0.167),
    ("rrsw_next_residual", "rrsw", 2, "I1", 0.136),
    ("rrsw_next_residual", "rrsw", 2, "I3", 0.327),
]


@pytest.mark.parametrize("name,method,k,inst,tv", CONTROL_TV)
def test_negative_control_fails_enumeration(name, method, k, inst, tv):
    p, q = GOLDEN[inst]
    bad = O.enumerate_node(method, p, q, k, verifier=W.NODE_CONTROLS[name])
    assert bad.max_error(q) > 1e-3  # the check used for the real op reports failure
    assert abs(bad.tv(q) - tv) <= 1e-3
    assert O.enumerate_node(method, p, q, k).max_error(q) <= EXACT  # same instance, correct op passes


@pytest.mark.parametrize("name", list(W.NODE_CONTROLS))
def test_negative_control_fails_on_random_instances(name):
    method = W.NODE_CONTROLS[name].methods[0]
    errors = [
        O.enumerate_node(method, p, q, 2, verifier=W.NODE_CONTROLS[name]).max_error(q) for p, q in instances(5, 12)
    ]
    assert max(errors) > 1e-3


def test_negative_control_rejects_other_methods():
    with pytest.raises(ValueError, match="kseq_gamma_one is defined for methods"):
        O.enumerate_node("rrs", *I1, 2, verifier=W.kseq_gamma_one)


# ---------------------------------------------------------------------------------------------------------------
# 2f. Monte Carlo in sampling mode (docs/exactness.md). The reference loops over rows in Python, so the
# default suite uses 2k-20k rows; the slow grid below runs 1e5.


def _mc_check(tr: O.NodeTrials, method: str, p: np.ndarray, q: np.ndarray, k: int) -> tuple[LawCheck, list[str]]:
    law = law_check(tr.token_counts, q, max_tv=O.tv_bound(tr.n, len(q)))
    acc = O.acceptance(method, p, q, k)
    rate_errors = []
    if abs(tr.accept_rate - acc.total) > rate_tolerance(acc.total, tr.n):
        rate_errors.append(f"accept rate {tr.accept_rate:.4f} vs {acc.total:.4f}")
    for j in range(k):
        obs = tr.slot_counts[j] / tr.n
        if abs(obs - acc.per_slot[j]) > rate_tolerance(acc.per_slot[j], tr.n, floor=1e-9):
            rate_errors.append(f"slot {j} rate {obs:.4f} vs {acc.per_slot[j]:.4f}")
    return law, rate_errors


MC_CASES = [  # method, K, instance, rows
    ("sd", 1, "I1", 20000),
    ("rrs", 2, "I1", 20000),
    ("rrs", 3, "I3", 10000),
    ("rrsw", 2, "I1", 20000),
    ("rrsw", 3, "I1", 10000),
    ("kseq", 2, "I3", 4000),
    ("spechub", 2, "I1", 20000),
    ("rrs", 2, "Z", 10000),
    ("rrsw", 2, "Z", 10000),
    ("kseq", 3, "Z", 2000),
    ("spechub", 2, "Z", 10000),
]


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("method,k,inst,n", MC_CASES)
def test_sampling_mode_statistics(backend, method, k, inst, n):
    p, q = INSTANCES[inst]
    tr = O.node_trials(method, p, q, k, n, seed=11, verifier=_verifier(backend))
    law, rate_errors = _mc_check(tr, method, p, q, k)
    assert law.ok, str(law)
    assert not rate_errors, rate_errors


MC_CONTROLS = [  # same method, K, instance and rows as a MC_CASES entry
    ("rrs_skip_duplicates", "rrs", 2, "I1", 20000),
    ("rrs_skip_duplicates", "rrs", 3, "I3", 10000),
    ("kseq_gamma_one", "kseq", 2, "I3", 4000),
    ("rrsw_unrenormalized", "rrsw", 2, "I1", 20000),
    ("rrsw_next_residual", "rrsw", 2, "I1", 20000),
]


@pytest.mark.parametrize("name,method,k,inst,n", MC_CONTROLS)
def test_negative_control_fails_sampling_statistics(name, method, k, inst, n):
    p, q = INSTANCES[inst]
    tr = O.node_trials(method, p, q, k, n, seed=11, verifier=W.NODE_CONTROLS[name])
    law, _ = _mc_check(tr, method, p, q, k)
    assert not law.ok, str(law)


def test_seeded_calls_are_unbiased():
    """Regression: seed= once drew accept_u and final_noise from two generators seeded alike, so a rejection
    (large U) made the final Gumbel of token 0 large. One row per call, fresh seed per call."""
    p = torch.tensor([[0.1, 0.6, 0.2, 0.1]], dtype=F64)
    q = torch.tensor([[0.5, 0.1, 0.2, 0.2]], dtype=F64)
    cand, valid = torch.tensor([[1]]), torch.tensor([[True]])
    n = 3000
    tokens = [int(verify_node("sd", cand, valid, p, q, seed=s).token) for s in range(n)]
    tests, final = C.node_chain("sd", [1], p[0].numpy(), q[0].numpy())
    _, den, num = tests[0]
    law = (1 - num / den) * final
    law[1] += num / den
    check = law_check(np.bincount(tokens, minlength=4), law, max_tv=O.tv_bound(n, 4))
    assert check.ok, str(check)


def _slow_grid() -> list[tuple[str, int, int]]:
    out = []
    for v in (2, 5, 8):
        for method, ks in (("sd", [1]), ("rrs", [2, 3, 4]), ("rrsw", [2, 3, 4]), ("kseq", [2, 3]), ("spechub", [2])):
            out += [(method, k, v) for k in ks]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("method,k,v", _slow_grid())
def test_sampling_mode_statistics_full_grid(backend, method, k, v):
    """Full grid: a random instance, zeros in p, zeros in q per (method, K, V); 1e5 rows. The torch reference
    loops over rows in Python, so it gets 3e4 rows (kseq 1e4); the negative controls
    are already detected at 1e4 rows (TV >= 0.026)."""
    n = 100000 if backend != "torch" else 10000 if method == "kseq" else 30000
    rng = np.random.default_rng(1000 * v + k)
    for i, kind in enumerate(("random", "p_zero", "q_zero")):
        p, q = random_instance(rng, v, kind)
        tr = O.node_trials(method, p, q, k, n, seed=i, verifier=_verifier(backend))
        law, rate_errors = _mc_check(tr, method, p, q, k)
        assert law.ok, (p, q, str(law))
        assert not rate_errors, (p, q, rate_errors)


# ---------------------------------------------------------------------------------------------------------------
# 3. Properties (edge cases and invariants)


@HYPO
@given(p=st.integers(2, 6).flatmap(lambda v: prob_vectors(v)), mk=st.sampled_from(METHOD_K), seed=st.integers(0, 99))
def test_p_equals_q_accepts_the_first_draft(p, mk, seed):
    method, k = mk
    n = 64
    gen = torch.Generator().manual_seed(seed)
    cand, valid, hub = O.draft_candidates(method, _rows(p, n), k, gen)
    out = verify_node(method, cand, valid, _rows(p, n), _rows(p, n), hub=hub, generator=gen)
    assert bool((out.slot == 0).all())
    assert torch.equal(out.token, cand[:, 0])


@HYPO
@given(pq=pq_pairs(2, 6), mk=st.sampled_from(METHOD_K), seed=st.integers(0, 99))
def test_outputs_in_range_and_zero_target_mass_never_emitted(pq, mk, seed):
    p, q = pq
    method, k = mk
    n, vocab = 64, len(p)
    gen = torch.Generator().manual_seed(seed)
    cand, valid, hub = O.draft_candidates(method, _rows(p, n), k, gen)
    out = verify_node(method, cand, valid, _rows(p, n), _rows(q, n), hub=hub, generator=gen, analytic=True)
    slot, token = out.slot, out.token
    assert bool(((slot >= -1) & (slot < k)).all())
    hit = slot >= 0
    assert bool(valid[hit, slot[hit]].all())
    assert torch.equal(token[hit], cand[hit, slot[hit]])
    assert bool(((token >= 0) & (token < vocab)).all())
    assert bool((torch.tensor(q)[token] > 0).all())  # q(x) = 0 is never accepted nor sampled
    ap, fin = out.accept_prob, out.final_residual
    assert bool(((ap >= 0) & (ap <= 1)).all())
    assert bool((ap[~valid] == 0).all())
    torch.testing.assert_close(fin.sum(-1), torch.ones(n, dtype=F64), atol=1e-12, rtol=0)
    assert bool((fin[:, torch.tensor(q) == 0] == 0).all())


@settings(max_examples=20, deadline=None)
@given(
    v=st.integers(3, 40),
    n_masked=st.integers(1, 2),
    mk=st.sampled_from([("rrs", 2), ("rrsw", 3), ("kseq", 2), ("spechub", 2)]),
    seed=st.integers(0, 99),
)
def test_masked_tokens_from_process_logits(v, n_masked, mk, seed):
    """-inf logits: p and q with exact zeros from process_logits (fp32) verify cleanly."""
    method, k = mk
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn((32, 2, v), generator=gen)
    logits[:, 0, :n_masked] = float("-inf")  # draft never proposes the first tokens
    logits[:, 1, -n_masked:] = float("-inf")  # target gives the last tokens no mass
    logp = process_logits(logits)
    p, q = logp[:, 0].exp(), logp[:, 1].exp()
    cand, valid, hub = O.draft_candidates(method, p.double(), k, gen)
    assert bool((cand[valid] >= n_masked).all())
    out = verify_node(method, cand, valid, p, q, hub=hub, generator=gen, analytic=True)
    assert bool((out.token < v - n_masked).all())
    assert not bool(torch.isnan(out.final_residual).any())
    assert bool((out.final_residual[:, -n_masked:] == 0).all())


def test_zero_mass_residual_never_nan():
    """q == p up to a few ulps: the residual falls back to q, never NaN."""
    p = torch.tensor([[0.25, 0.25, 0.25, 0.25]], dtype=F64)
    q = p + torch.tensor([[1e-16, -1e-16, 0.0, 0.0]], dtype=F64)
    for method, k in [("rrs", 3), ("rrsw", 3)]:
        cand = torch.tensor([[0, 1, 2]])[:, :k]
        out = verify_node(method, cand, torch.ones_like(cand, dtype=torch.bool), p, q, seed=0, analytic=True)
        assert torch.isfinite(out.final_residual).all()
        torch.testing.assert_close(out.final_residual.sum(), torch.tensor(1.0, dtype=F64))


def test_support_exhausted_rrsw_accepts_everything():
    """Candidates covering the whole draft support leave a point mass; acceptance is 1."""
    p, q = np.array([0.6, 0.4, 0.0]), np.array([0.2, 0.5, 0.3])
    res = O.enumerate_node("rrsw", p, q, 3)  # only two valid slots exist
    assert res.max_error(q) <= EXACT
    assert abs(res.accept - (1 - 0.3)) <= EXACT  # everything but q's mass outside supp(p)


def test_kseq_disjoint_supports_samples_target():
    """Disjoint supports give beta = 0: nothing is accepted and the output is q."""
    p, q = np.array([0.5, 0.5, 0.0, 0.0]), np.array([0.0, 0.0, 0.3, 0.7])
    res = O.enumerate_node("kseq", p, q, 2)
    assert res.accept == 0.0
    assert res.max_error(q) <= EXACT


def test_spechub_single_candidate_is_sd():
    """p(a) = 1: the hub sampler gives one draft and the node is verified as SD."""
    p, q = np.array([1.0, 0.0, 0.0]), np.array([0.2, 0.5, 0.3])
    res = O.enumerate_node("spechub", p, q, 2)
    assert abs(res.accept - 0.2) <= EXACT and res.slot_rates[1] == 0.0
    assert res.max_error(q) <= EXACT


# ---------------------------------------------------------------------------------------------------------------
# 4. Bad inputs: one test per validation rule


def _good(method: str = "rrs", k: int = 2) -> dict:
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=F64)
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=F64)
    cand = torch.tensor([[0, 1, 2]])[:, :k]
    return dict(method=method, cand=cand, cand_valid=torch.ones_like(cand, dtype=torch.bool), p=p, q=q)


def _call(**kw):
    args = _good(kw.pop("method", "rrs"), kw.pop("k", 2))
    args.update(kw)
    return verify_node(
        args.pop("method"), args.pop("cand"), args.pop("cand_valid"), args.pop("p"), args.pop("q"), **args
    )


def test_good_call_runs():
    assert _call(seed=0).slot.shape == (1,)


BAD = [
    (dict(method="otm"), ValueError, "method must be one of"),
    (dict(cand=[[0, 1]]), TypeError, "cand must be a torch.Tensor"),
    (dict(cand=torch.tensor([0, 1])), ValueError, "cand must have 2 dimensions"),
    (dict(cand=torch.tensor([[0.0, 1.0]])), TypeError, "cand must be an integer tensor"),
    (dict(cand_valid=torch.ones((1, 2), dtype=torch.long)), TypeError, "cand_valid must be a bool tensor"),
    (dict(cand_valid=torch.ones((1, 3), dtype=torch.bool)), ValueError, r"cand_valid must have shape \(1, 2\)"),
    (dict(p=torch.full((4,), 0.25, dtype=F64)), ValueError, "p must have 2 dimensions"),
    (dict(p=torch.ones((1, 4), dtype=torch.long)), TypeError, "p must be a floating-point tensor"),
    (dict(p=torch.tensor([[float("nan"), 0.5, 0.25, 0.25]])), ValueError, "p contains NaN or inf"),
    (dict(q=torch.tensor([[float("inf"), 0.5, 0.25, 0.25]])), ValueError, "q contains NaN or inf"),
    (dict(p=torch.tensor([[-0.1, 0.6, 0.25, 0.25]])), ValueError, "p contains negative probabilities"),
    (dict(q=torch.tensor([[0.5, 0.5, 0.5, 0.5]])), ValueError, r"q rows must sum to 1 .*process_logits"),
    (dict(q=torch.full((1, 5), 0.2, dtype=F64)), ValueError, "p and q must share the vocabulary size"),
    (
        dict(p=torch.full((2, 4), 0.25, dtype=F64), q=torch.full((2, 4), 0.25)),
        ValueError,
        r"p must have shape \(1, 4\)",
    ),
    (dict(q=torch.full((2, 4), 0.25, dtype=F64)), ValueError, r"q must have shape \(1, 4\)"),
    (dict(p=torch.zeros((1, 0)), q=torch.zeros((1, 0))), ValueError, "p must have a non-empty vocabulary"),
    (dict(cand=torch.tensor([[0, 4]])), ValueError, r"cand must hold token ids in \[0, 4\)"),
    (dict(cand=torch.tensor([[0, -1]])), ValueError, r"cand must hold token ids in \[0, 4\)"),
    (dict(p=torch.tensor([[0.0, 0.5, 0.25, 0.25]])), ValueError, "a valid candidate has zero draft probability"),
    (dict(method="sd"), ValueError, r"method 'sd' verifies exactly one candidate per node \(K = 1\), got K = 2"),
    (dict(method="rrsw", cand=torch.tensor([[1, 1]])), ValueError, "method 'rrsw' needs distinct sibling candidates"),
    (dict(method="spechub", k=3, hub=torch.tensor([0])), ValueError, "method 'spechub' needs K = 2 candidates"),
    (dict(method="spechub"), ValueError, "method 'spechub' needs hub="),
    (dict(method="spechub", hub=torch.tensor(0)), ValueError, "hub must have 1 dimensions"),
    (dict(method="spechub", hub=torch.tensor([0.0])), TypeError, "hub must be an integer tensor"),
    (dict(method="spechub", hub=torch.tensor([0, 0])), ValueError, r"hub must have shape \(1,\)"),
    (dict(method="spechub", hub=torch.tensor([3])), ValueError, "hub must be one of the two candidates"),
    (
        dict(method="spechub", hub=torch.tensor([10**9])),
        ValueError,
        r"hub must hold token ids in \[0, 4\), got 1000000000",
    ),
    (
        dict(method="spechub", hub=torch.tensor([0]), cand_valid=torch.tensor([[False, True]])),
        ValueError,
        "spechub nodes need a valid slot-0 candidate",
    ),
    (dict(hub=torch.tensor([0])), ValueError, "hub= is only used by method 'spechub'"),
    (dict(analytic="yes"), TypeError, "analytic must be a bool, got str"),
    (dict(accept_u=torch.tensor([[0.5, 1.0]], dtype=F64)), ValueError, r"accept_u must hold uniforms in \[0, 1\)"),
    (dict(accept_u=torch.tensor([[-0.1, 0.5]], dtype=F64)), ValueError, r"accept_u must hold uniforms in \[0, 1\)"),
    (dict(accept_u=torch.tensor([[float("nan"), 0.5]])), ValueError, r"accept_u must hold uniforms in \[0, 1\)"),
    (dict(accept_u=torch.zeros((1, 3), dtype=F64)), ValueError, r"accept_u must have shape \(1, 2\)"),
    (dict(accept_u=torch.zeros((1, 2), dtype=torch.long)), TypeError, "accept_u must be a floating-point tensor"),
    (dict(accept_u=[[0.1, 0.2]]), TypeError, "accept_u must be a torch.Tensor"),
    (dict(final_noise=torch.zeros((1, 4), dtype=F64)), ValueError, r"final_noise must hold uniforms in \(0, 1\)"),
    (dict(final_noise=torch.full((1, 5), 0.5, dtype=F64)), ValueError, r"final_noise must have shape \(1, 4\)"),
    (dict(seed=1, generator=torch.Generator()), ValueError, "pass either generator= or seed=, not both"),
    (dict(seed=1.5), TypeError, "seed must be an int"),
    (dict(backend="tpu"), ValueError, "backend must be 'auto' or one of"),
    (dict(backend="cuda"), BackendUnavailableError, "backend 'cuda' is unavailable"),
]


@pytest.mark.parametrize("kw,exc,msg", BAD, ids=lambda x: x if isinstance(x, str) else None)
def test_bad_input(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        _call(**kw)


# ---------------------------------------------------------------------------------------------------------------
# 5. Reproducibility


def _batch(n: int = 200) -> dict:
    gen = torch.Generator().manual_seed(0)
    p = _rows(I1[0], n)
    cand, valid, _ = O.draft_candidates("rrs", p, 2, gen)
    return dict(cand=cand, cand_valid=valid, p=p, q=_rows(I1[1], n))


@pytest.mark.parametrize("method", ["rrs", "kseq"])
def test_same_seed_same_output_different_seed_different_output(method):
    b = _batch()
    a1 = verify_node(method, b["cand"], b["cand_valid"], b["p"], b["q"], seed=5)
    a2 = verify_node(method, b["cand"], b["cand_valid"], b["p"], b["q"], seed=5)
    a3 = verify_node(method, b["cand"], b["cand_valid"], b["p"], b["q"], seed=6)
    assert torch.equal(a1.slot, a2.slot) and torch.equal(a1.token, a2.token)
    assert not (torch.equal(a1.slot, a3.slot) and torch.equal(a1.token, a3.token))


def test_generator_state_reproduces_and_advances():
    b = _batch()
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    first = verify_node("rrs", b["cand"], b["cand_valid"], b["p"], b["q"], generator=g1)
    again = verify_node("rrs", b["cand"], b["cand_valid"], b["p"], b["q"], generator=g2)
    assert torch.equal(first.token, again.token)
    second = verify_node("rrs", b["cand"], b["cand_valid"], b["p"], b["q"], generator=g1)
    assert not torch.equal(first.token, second.token)


def test_explicit_noise_is_deterministic():
    b = _batch()
    gen = torch.Generator().manual_seed(1)
    noise = dict(accept_u=torch.rand((200, 2), dtype=F64, generator=gen), final_noise=torch.rand((200, 4), dtype=F64))
    outs = [verify_node("rrs", b["cand"], b["cand_valid"], b["p"], b["q"], **noise) for _ in range(2)]
    assert torch.equal(outs[0].slot, outs[1].slot) and torch.equal(outs[0].token, outs[1].token)
    # Uniform 0 passes every test whose candidate has target mass (all of them in I1).
    low = verify_node("rrs", b["cand"], b["cand_valid"], b["p"], b["q"], accept_u=torch.zeros((200, 2), dtype=F64))
    assert bool((low.slot == 0).all())
