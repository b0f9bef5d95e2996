"""Confident drafts: every node verifier stays exact when 1 - p(top) falls to the sampler's own cut-off (the
normaliser audit of docs/exactness.md).

Pipeline, as in the decoders: the sampling op draws from float32 log-probs and the verifier gets their softmax
(float32) and a float32 target row. The drafting law is the op's own, enumerated with its own normalisers from the
log-probs it was given (``oracles.draft_law``); the emitted law is accumulated in float64 from each backend's analytic
acceptance probabilities and final residual (``oracles.enumerate_node``), and compared with the target row over its
own sum.

Budget: ``FP32_LAW`` = 1e-7 absolute. The float32 rows themselves carry ~6e-8 relative rounding per entry, and when
p(a) ~ 1 the second SpecHub draft spreads the whole pair mass over the rounded non-hub entries, so the law is off by
up to ~7e-8 whatever the verifier does; SpecHub's plan is computed in float64 on every backend to stay there. The
negative control (Q(a, i) normalised by 1 - p(a) in float32) misses by 4e-5 at 1 - p(a) = 1e-4 and by percents at
1e-6, so the budget separates the two by orders of magnitude.

False alarms: the enumeration tests are deterministic; the Monte Carlo check has chi-square alpha = 1e-4 and a TV
bound exceeded with probability <= 1e-6 (seeded, so reproducible).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from specdec_kernels import available_backends, kseq_gamma, spechub_sample, verify_node, verify_tree
from specdec_kernels.testing import oracles as O
from specdec_kernels.testing import wrong as W
from specdec_kernels.testing.stats import law_check

FP32_LAW = 1e-7
# gds has no cut-off: its drawn draft always comes from the non-greedy tail, so at 1 - p(a) <= 1e-7 every ratio of
# the whole non-greedy target mass (0.75 here) is read off tail entries that carry their own float32 rounding
# (measured: up to 1.6e-7; the unrenormalised control misses by percents)
GDS_FP32_LAW = 2e-7
BACKENDS = available_backends("verify_node")
Q = np.array([0.25, 0.25, 0.3, 0.2])
# 1 - p(a): four decades, then just above and just below the sampler's cut-off 1 - p(a) <= 1e-7 (one draft only)
CONFIDENCE = [1e-4, 1e-5, 1e-6, 1e-7, 1e-7 * 1.2, 1e-7 * 0.8]
METHOD_K = [
    ("sd", 1),
    ("rrs", 2),
    ("rrsw", 2),
    ("rrsw", 3),
    ("kseq", 2),
    ("kseq", 3),
    ("spechub", 2),
    ("gds", 2),
    ("gds", 3),
]


def confident(e: float) -> np.ndarray:
    return np.array([1.0 - e, 0.5 * e, 0.3 * e, 0.2 * e])


def target32() -> np.ndarray:
    q32 = torch.tensor(Q, dtype=torch.float32).double().numpy()
    return q32 / q32.sum()


def law_error(method: str, k: int, e: float, verifier) -> float:
    res = O.enumerate_node(method, confident(e), Q, k, verifier=verifier, dtype=torch.float32)
    return float(np.abs(res.law - target32()).max())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("e", CONFIDENCE)
@pytest.mark.parametrize("method,k", METHOD_K)
def test_confident_draft_law_is_target(backend, method, k, e):
    err = law_error(method, k, e, functools.partial(verify_node, backend=backend))
    budget = GDS_FP32_LAW if method == "gds" else FP32_LAW
    assert err <= budget, f"{method} K={k} on {backend} at 1 - p(a) = {e:g}: max |law - q| = {err:.3g}"


def test_cutoff_cases_sit_on_both_sides():
    """The last two confidences straddle the sampler's cut-off: pairs above it, a single draft below."""
    logp = [torch.log(torch.tensor(confident(e))).float().double().numpy() for e in CONFIDENCE[-2:]]
    above, below = (O.draft_law("spechub", lp, 2) for lp in logp)
    assert all(len(t) == 2 for t in above)
    assert all(len(t) == 1 for t in below)


@pytest.mark.parametrize("e", [1e-4, 1e-5, 1e-6])
def test_one_minus_pa_normaliser_fails(e):
    """Power: the same enumeration catches Q(a, i) = p(a) p(i) / (1 - p(a)) in float32."""
    err = law_error("spechub", 2, e, W.spechub_fp32_one_minus_pa)
    assert err > 100 * FP32_LAW, err


def test_spechub_sampling_at_one_minus_pa_1e6():
    """Monte Carlo through the cpu kernel (or torch) at 1 - p(a) = 1e-6: emitted tokens follow q; the float32
    1 - p(a) normaliser fails the same check (its P(0) is ~0.232 instead of 0.25)."""
    backend = "cpu" if "cpu" in BACKENDS else "torch"
    n = 200_000 if backend == "cpu" else 20_000
    p = confident(1e-6)
    good = O.node_trials(
        "spechub", p, Q, 2, n, seed=5, verifier=functools.partial(verify_node, backend=backend), dtype=torch.float32
    )
    bad = O.node_trials("spechub", p, Q, 2, n, seed=5, verifier=W.spechub_fp32_one_minus_pa, dtype=torch.float32)
    max_tv = O.tv_bound(n, len(Q))
    ok = law_check(good.token_counts, Q, max_tv=max_tv)
    assert ok.ok, str(ok)
    if n >= 100_000:
        fail = law_check(bad.token_counts, Q, max_tv=max_tv)
        assert not fail.ok, str(fail)


@pytest.mark.parametrize("backend", available_backends("kseq_gamma"))
@pytest.mark.parametrize("k", [2, 3, 4])
def test_kseq_gamma_is_one_when_p_equals_q_in_float32(backend, k):
    """p = q as float32 rows that sum to 1 only within their rounding: gamma* = 1, not 1 + (1 - mass)^(1/K)."""
    gen = torch.Generator().manual_seed(k)
    rows = torch.softmax(3.0 * torch.randn((6, 1000), generator=gen, dtype=torch.float64), dim=-1).float()
    rows[0] = torch.tensor([1.0 - 1e-6] + [1e-6 / 999] * 999, dtype=torch.float32)  # confident and equal
    masses = rows.double().sum(dim=-1)
    assert bool((masses != 1.0).any())  # the case that matters: rows whose float32 sum is not exactly 1
    ks = torch.full((rows.shape[0],), k, dtype=torch.long)
    gamma, beta = kseq_gamma(rows, rows.clone(), ks, backend=backend)
    assert torch.equal(gamma, torch.ones_like(gamma)), gamma
    torch.testing.assert_close(beta, masses, atol=1e-12, rtol=0)


def _tree_first_tokens(backend: str, n: int) -> np.ndarray:
    """First emitted token of n roots, each with SpecHub's two children drafted at 1 - p(a) = 1e-6."""
    logp = torch.log(torch.tensor(confident(1e-6))).float()
    d = spechub_sample(logp.expand(n, 4).contiguous(), seed=21, backend="cpu" if "cpu" in BACKENDS else "torch")
    tokens = torch.cat([torch.zeros((n, 1), dtype=torch.long), d.tokens.clamp_min(0)], dim=1)
    parent = torch.tensor([[-1, 0, 0]]).expand(n, 3).contiguous()
    valid = torch.cat([torch.ones((n, 1), dtype=torch.bool), d.valid], dim=1)
    p_rows = torch.zeros((n, 3, 4))
    p_rows[:, 0] = torch.softmax(logp, dim=-1)
    q_rows = torch.tensor(Q, dtype=torch.float32).expand(n, 3, 4).contiguous()
    hub = torch.zeros((n, 3), dtype=torch.long)
    hub[:, 0] = d.hub
    out = verify_tree(tokens, parent, p_rows, q_rows, method="spechub", valid=valid, hub=hub, seed=3, backend=backend)
    child = tokens.gather(1, out.accepted_nodes[:, :1].clamp_min(0))[:, 0]
    return torch.where(out.n_accepted > 0, child, out.next_token).numpy()


TREE_ROWS = {"cpu": 100_000, "torch": 30_000}


@pytest.mark.parametrize("backend", available_backends("verify_tree"))
def test_spechub_tree_walk_at_one_minus_pa_1e6(backend):
    """The tree walk (its lazy first test and the full plan) at 1 - p(a) = 1e-6: the first token follows q."""
    n = TREE_ROWS.get(backend, 600)  # the Triton interpreter: a smaller check of the same walk
    first = _tree_first_tokens(backend, n)
    check = law_check(np.bincount(first, minlength=4), Q, max_tv=O.tv_bound(n, 4))
    assert check.ok, str(check)


def test_tree_walk_check_has_power(monkeypatch):
    """The torch walk with the float32 1 - p(a) chain in place of its own fails the same check."""
    import specdec_kernels.reference.verify as reference_verify

    monkeypatch.setattr(reference_verify, "node_chain", W.torch_node_chain(W.spechub_fp32_one_minus_pa))
    n = TREE_ROWS["torch"]
    check = law_check(np.bincount(_tree_first_tokens("torch", n), minlength=4), Q, max_tv=O.tv_bound(n, 4))
    assert not check.ok, str(check)
