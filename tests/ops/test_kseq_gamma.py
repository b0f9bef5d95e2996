"""kseq_gamma: SpecTr K-SEQ's smallest valid gamma in [1, K] and beta(gamma) (docs/methods.md, SpecTr).

Deterministic op: sections 2 (distributions) and 5 (reproducibility) reduce to golden values, the optimality of
gamma* checked against the NumPy oracle, and bit-identical repeated calls.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels import BackendUnavailableError, available_backends, kseq_gamma
from specdec_kernels.testing import oracles as O
from tests.strategies import GOLDEN, pq_pairs

F64 = torch.float64
# The backends that run CPU tensors natively (torch, cpu) get the full grid; Triton on CPU runs under its
# interpreter (seconds per call) and gets one small case (tests/backends/ covers parity in depth).
FAST_BACKENDS = [b for b in available_backends("kseq_gamma") if b in ("torch", "cpu")]


def _h(p: np.ndarray, q: np.ndarray, g: float, k: int) -> float:
    """Validity function of K-SEQ: gamma is valid iff h(gamma) >= 0."""
    beta = np.minimum(p, q / g).sum()
    return float(np.minimum(g * p, q).sum() - 1.0 + (1.0 - beta) ** k)


# ---------------------------------------------------------------------------------------------------------------
# 1. Exactness against the oracle


def _check_against_oracle(backend, batch, vocab, dtype):
    gen = torch.Generator().manual_seed(batch * vocab)
    p = torch.softmax(2 * torch.randn((batch, vocab), dtype=F64, generator=gen), -1).to(dtype)
    q = torch.softmax(2 * torch.randn((batch, vocab), dtype=F64, generator=gen), -1).to(dtype)
    k = torch.randint(1, 5, (batch,), generator=gen)
    gamma, beta = kseq_gamma(p, q, k, backend=backend)
    assert gamma.shape == beta.shape == (batch,)
    # Reference: 40 fp64 bisection steps (gamma within (K-1) 2^-40); kernels: 30 fp32 steps.
    tol = 1e-9 if backend == "torch" else 1e-5
    for b in range(batch):
        pb, qb = p[b].double().numpy(), q[b].double().numpy()
        g_ref, beta_ref = O.kseq_gamma(pb, qb, int(k[b]))
        assert abs(float(gamma[b]) - g_ref) <= tol
        assert abs(float(beta[b]) - beta_ref) <= tol
        assert _h(pb, qb, float(gamma[b]), int(k[b])) >= -tol  # the returned upper bracket is valid


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("batch,vocab", [(1, 7), (3, 111), (99, 7), (2, 32000)])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_matches_oracle(backend, batch, vocab, dtype):
    _check_against_oracle(backend, batch, vocab, dtype)


# Triton runs on CPU tensors only under its interpreter (seconds per call): one small case; tests/backends/ covers
# backend parity in depth.
@pytest.mark.parametrize("backend", [b for b in available_backends("kseq_gamma") if b not in FAST_BACKENDS])
def test_backend_matches_oracle(backend):
    try:
        _check_against_oracle(backend, 3, 11, torch.float32)
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))


# ---------------------------------------------------------------------------------------------------------------
# 2. Golden values (the instances of tests/strategies.py, and the Bernoulli example of test_verify_node.py)

GOLDEN_GAMMA = {
    ("I1", 2): 1.614143,
    ("I1", 3): 2.108127,
    ("I2", 2): 1.319493,
    ("I2", 3): 1.564784,
    ("I3", 2): 1.5,
    ("I3", 3): 1.939500,
}


@pytest.mark.parametrize("inst,k", list(GOLDEN_GAMMA))
def test_golden_gamma(inst, k):
    p, q = GOLDEN[inst]
    gamma, beta = kseq_gamma(torch.tensor(p)[None], torch.tensor(q)[None], k)
    assert abs(float(gamma) - GOLDEN_GAMMA[(inst, k)]) <= 5e-7  # printed with 6 decimals
    assert abs(float(gamma) - O.kseq_gamma(p, q, k)[0]) <= 1e-9
    assert abs(float(beta) - np.minimum(p, q / float(gamma)).sum()) <= 1e-12


def test_golden_gamma_i3_k2_is_exactly_three_halves():
    """I3, K = 2: gamma* = 1.5 and beta = 0.5 solve 1 - (1 - beta)^2 = gamma * beta exactly."""
    p, q = GOLDEN["I3"]
    gamma, beta = kseq_gamma(torch.tensor(p)[None], torch.tensor(q)[None], 2)
    assert abs(float(gamma) - 1.5) <= 1e-11 and abs(float(beta) - 0.5) <= 1e-11


BERNOULLI_GAMMA = [(0.1, 0.5, 1.5844), (0.1, 0.9, 1.8458), (0.3, 0.1, 1.2179), (0.3, 0.5, 1.3217)]
BERNOULLI_GAMMA += [(0.3, 0.9, 1.6390), (0.5, 0.1, 1.4301), (0.5, 0.9, 1.4301), (0.7, 0.1, 1.6390)]
BERNOULLI_GAMMA += [(0.9, 0.1, 1.8458), (0.6, 0.6, 1.0)]


@pytest.mark.parametrize("pb,qb,want", BERNOULLI_GAMMA)
def test_bernoulli_gamma(pb, qb, want):
    p = torch.tensor([[1 - pb, pb]], dtype=F64)
    q = torch.tensor([[1 - qb, qb]], dtype=F64)
    gamma, _ = kseq_gamma(p, q, 2)
    assert abs(float(gamma) - want) <= 1e-4


# ---------------------------------------------------------------------------------------------------------------
# 3. Properties


@settings(max_examples=60, deadline=None)
@given(pq=pq_pairs(2, 8), k=st.integers(1, 5))
def test_gamma_is_the_smallest_valid_and_maximizes_acceptance(pq, k):
    p, q = pq
    gamma, beta = (float(x) for x in kseq_gamma(torch.tensor(p)[None], torch.tensor(q)[None], k))
    assert 1.0 <= gamma <= k
    assert abs(beta - np.minimum(p, q / gamma).sum()) <= 1e-12
    assert _h(p, q, gamma, k) >= -1e-12
    if gamma > 1.0 + 1e-6:
        assert _h(p, q, gamma - 1e-6, k) < 1e-12  # minimal up to the bisection resolution and round-off
    # Valid gamma <=> the K-SEQ residual numerator q - c min(p, q/gamma) is non-negative.
    if beta > 0:
        c = (1 - (1 - beta) ** k) / beta
        assert (q - c * np.minimum(p, q / gamma)).min() >= -1e-9
    # Acceptance 1 - (1 - beta(g))^K decreases in g, so gamma* beats every larger valid g.
    acc = 1 - (1 - beta) ** k
    for g in np.linspace(gamma, k, 5):
        assert acc >= 1 - (1 - np.minimum(p, q / g).sum()) ** k - 1e-12


@settings(max_examples=30, deadline=None)
@given(pq=pq_pairs(2, 8))
def test_k_one_is_speculative_sampling(pq):
    p, q = pq
    gamma, beta = kseq_gamma(torch.tensor(p)[None], torch.tensor(q)[None], 1)
    assert float(gamma) == 1.0
    assert abs(float(beta) - np.minimum(p, q).sum()) <= 1e-12


def test_p_equals_q_gives_gamma_one():
    p = torch.tensor([[0.2, 0.3, 0.5]], dtype=F64)
    gamma, beta = kseq_gamma(p, p, 3)
    assert abs(float(gamma) - 1.0) <= 1e-9 and abs(float(beta) - 1.0) <= 1e-12


def test_disjoint_supports_give_gamma_one_beta_zero():
    """Disjoint supports: gamma* = 1 and beta = 0."""
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=F64)
    q = torch.tensor([[0.0, 0.0, 0.4, 0.6]], dtype=F64)
    gamma, beta = kseq_gamma(p, q, 3)
    assert float(gamma) == 1.0 and float(beta) == 0.0


def test_per_row_k():
    p, q = GOLDEN["I1"]
    pt, qt = torch.tensor(p).expand(3, 4), torch.tensor(q).expand(3, 4)
    gamma, _ = kseq_gamma(pt, qt, torch.tensor([1, 2, 3]))
    np.testing.assert_allclose(gamma.numpy(), [1.0, 1.614143, 2.108127], atol=5e-7)
    assert gamma.dtype == F64


# ---------------------------------------------------------------------------------------------------------------
# 4. Bad inputs

P4 = torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=F64)
Q4 = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=F64)
BAD = [
    (dict(p=[[0.5, 0.5]]), TypeError, "p must be a torch.Tensor"),
    (dict(p=P4[0]), ValueError, "p must have 2 dimensions"),
    (dict(q=Q4[None]), ValueError, "q must have 2 dimensions"),
    (dict(p=torch.ones((1, 4), dtype=torch.long)), TypeError, "p must be a floating-point tensor"),
    (dict(q=torch.tensor([[float("nan"), 0.5, 0.25, 0.25]])), ValueError, "q contains NaN or inf"),
    (dict(p=torch.tensor([[-0.5, 1.0, 0.25, 0.25]])), ValueError, "p contains negative probabilities"),
    (dict(p=torch.tensor([[0.5, 0.5, 0.5, 0.5]])), ValueError, "p rows must sum to 1"),
    (dict(q=torch.full((1, 5), 0.2)), ValueError, "p and q must share the vocabulary size"),
    (dict(q=torch.full((2, 4), 0.25)), ValueError, r"q must have shape \(1, 4\)"),
    (dict(k=0), ValueError, r"k must be >= 1, got \[0\]"),
    (dict(k=torch.tensor([2, 2])), ValueError, r"k must have shape \(1,\)"),
    (dict(k=torch.tensor(2)), ValueError, "k must have 1 dimensions"),
    (dict(k=torch.tensor([2.0])), TypeError, "k must be an integer tensor"),
    (dict(k=2.0), TypeError, "k must be a torch.Tensor"),
    (dict(k=True), ValueError, "k must be an int >= 1 or an integer tensor"),
    (dict(backend="cuda"), BackendUnavailableError, "backend 'cuda' is unavailable"),
]


@pytest.mark.parametrize("kw,exc,msg", BAD, ids=lambda x: x if isinstance(x, str) else None)
def test_bad_input(kw, exc, msg):
    args = dict(p=P4, q=Q4, k=2)
    args.update(kw)
    backend = args.pop("backend", None)
    with pytest.raises(exc, match=msg):
        kseq_gamma(args["p"], args["q"], args["k"], backend=backend)


# ---------------------------------------------------------------------------------------------------------------
# 5. Reproducibility


def test_deterministic_and_row_independent():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn((5, 9), dtype=F64, generator=gen), -1)
    q = torch.softmax(torch.randn((5, 9), dtype=F64, generator=gen), -1)
    a = kseq_gamma(p, q, 3)
    b = kseq_gamma(p, q, 3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    single = kseq_gamma(p[2:3], q[2:3], 3)
    assert torch.equal(single[0], a[0][2:3])


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_p_equal_q_gives_gamma_one_whatever_the_rounding_of_the_sum(backend: str) -> None:
    """p = q: h(1) = 0 exactly, so gamma* = 1. A law whose float64 sum lands one ulp below 1 would send a
    bisection to 1 + ulp^(1/K) ~ 1 + 5e-6 (K = 3) while another summation order gives 1.0, so backends would accept
    differently for U within 5e-6 of 1; sums within 1e-12 of 1 count as p = q everywhere."""
    p = torch.tensor([[0.76597418688330909, 0.19054701905637911, 0.0, 0.0, 0.04347879406031179]], dtype=F64)
    for k in (2, 3, 4):
        gamma, beta = kseq_gamma(p, p.clone(), torch.tensor([k]), backend=backend)
        assert float(gamma[0]) == 1.0
        assert abs(float(beta[0]) - 1.0) <= 1e-12
    # and a law far from p still bisects (the rule only covers round-off)
    q = torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.2]], dtype=F64)
    gamma, _ = kseq_gamma(p, q, torch.tensor([3]), backend=backend)
    assert float(gamma[0]) > 1.0
