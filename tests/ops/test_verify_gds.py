"""Greedy draft sampling (``gds_sample`` + the ``gds`` verifier, docs/methods.md): the emitted law is q by exact
enumeration on every backend, the acceptance is the optimum of the draft process (the enumerated min-cut over all
token sets), the sampler draws the law the verifier assumes, and two controls show the checks have power.

False alarms: enumeration tests are deterministic (float64 budget 1e-9); the Monte Carlo check of the sampler has
chi-square alpha = 1e-4 and a TV bound exceeded with probability <= 1e-6 (seeded, so reproducible).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from specdec_kernels import available_backends, gds_sample, verify_node
from specdec_kernels.testing import optimum as OPT
from specdec_kernels.testing import oracles as O
from specdec_kernels.testing import wrong as W
from specdec_kernels.testing.stats import law_check
from tests.strategies import instances

EXACT = 1e-9
FAST_BACKENDS = [b for b in available_backends("verify_node") if b in ("torch", "cpu")]


def _verifier(backend: str):
    return functools.partial(verify_node, backend=backend)


def chain_acceptance(chain_fn, p: np.ndarray, q: np.ndarray, k: int) -> float:
    """Acceptance of a node rule over the gds draft law, its tests taken in the rule's own order."""
    total = 0.0
    for t, w in O.draft_law("gds", np.log(p), k).items():
        reach = w
        for _, den, num in chain_fn(list(t), p, q)[0]:
            a = min(1.0, num / den) if den > 0 else float(num > 0)
            total += reach * a
            reach *= 1.0 - a
    return total


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_law_is_target_and_acceptance_is_the_optimum(backend, k):
    for p, q in instances(seed=70 + k, count=24, max_v=6):
        res = O.enumerate_node("gds", p, q, k, verifier=_verifier(backend))
        assert res.max_error(q) <= EXACT, (p, q)
        acc = O.acceptance("gds", p, q, k)
        assert abs(res.accept - acc.total) <= EXACT
        np.testing.assert_allclose(res.slot_rates, acc.per_slot, atol=EXACT, rtol=0)
        best = OPT.otm_acceptance(O.draft_law("gds", np.log(p), k), q)  # min-cut over all 2^V token sets
        assert abs(res.accept - best) <= EXACT, (p, q)
        assert res.accept >= O.sd_acceptance(p, q) - EXACT  # never below one drawn draft


@pytest.mark.parametrize("backend", available_backends("verify_node"))
def test_float32_rows(backend):
    """The decoders' pipeline (float32 rows, the sampler's own normalisers): the law within 1e-6."""
    for p, q in instances(seed=90, count=6 if backend == "triton" else 16, max_v=6):
        for k in (2, 3):
            res = O.enumerate_node("gds", p, q, k, verifier=_verifier(backend), dtype=torch.float32)
            assert res.max_error(q) <= 1e-6, (backend, p, q, k)


def test_two_drafts_are_spechubs_process_and_its_optimum():
    """With k = 2 the drafted set is SpecHub's (the argmax and one draw from the rest), and both verifiers reach
    the same optimum."""
    for p, q in instances(seed=91, count=30, max_v=7):
        sets = {}
        for t, w in O.draft_law("gds", np.log(p), 2).items():
            sets[frozenset(t)] = sets.get(frozenset(t), 0.0) + w
        hub = {}
        for t, w in O.draft_law("spechub", np.log(p), 2).items():
            hub[frozenset(t)] = hub.get(frozenset(t), 0.0) + w
        assert sets.keys() == hub.keys()
        assert all(abs(sets[s] - hub[s]) <= EXACT for s in sets)
        assert abs(O.acceptance("gds", p, q, 2).total - O.acceptance("spechub", p, q, 2).total) <= EXACT


def test_unrenormalised_control_fails_the_law():
    errors = [
        O.enumerate_node("gds", p, q, 3, verifier=W.gds_unrenormalized).max_error(q)
        for p, q in instances(seed=92, count=12, max_v=6)
    ]
    assert max(errors) > 1e-3


def test_greedy_first_control_is_exact_but_below_the_optimum():
    """Power of the optimality check: testing the greedy tokens first keeps the law (each test is against what q has
    left) but accepts less on some instances, which the equality with the min-cut above would catch."""
    gaps = []
    for p, q in instances(seed=93, count=30, max_v=6):
        k = 3
        gaps.append(O.acceptance("gds", p, q, k).total - chain_acceptance(W.gds_greedy_first_chain, p, q, k))
    assert min(gaps) >= -EXACT
    assert max(gaps) > 1e-3


def test_sampler_draws_the_enumerated_law():
    """gds_sample: the k - 1 most likely tokens in order, the draw from the rest with the law of draft_law."""
    p = np.array([0.05, 0.3, 0.1, 0.25, 0.0, 0.2, 0.1])
    k, n = 3, 40_000
    logp = torch.log(torch.tensor(p, dtype=torch.float64)).expand(n, -1).contiguous()
    d = gds_sample(logp, k, generator=torch.Generator().manual_seed(3))
    assert torch.equal(d.tokens[:, :2], torch.tensor([1, 3]).expand(n, -1))
    assert bool(d.valid.all())
    law = O.draft_law("gds", np.log(p), k)
    want = np.zeros(len(p))
    for t, w in law.items():
        want[t[-1]] += w
    counts = np.bincount(d.tokens[:, 2].numpy(), minlength=len(p)).astype(np.float64)
    check = law_check(counts, want, max_tv=O.tv_bound(n, len(p)))
    assert check.ok, str(check)


def test_sampler_small_support_and_ties():
    """Support of two tokens with k = 4: one greedy token, the draw, two invalid slots; ties go to the lower id;
    k = 1 is one draw from p."""
    logp = torch.log(torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]))
    d = gds_sample(logp, 4, seed=1)
    assert d.valid.tolist() == [[True, True, False, False]]
    assert d.tokens[0, 0].item() == 1 and d.tokens[0, 1].item() == 3
    assert d.tokens[0, 2:].tolist() == [-1, -1]
    one = gds_sample(torch.log(torch.tensor([[0.0, 1.0, 0.0]])), 2, seed=0)
    assert one.tokens.tolist() == [[1, -1]] and one.valid.tolist() == [[True, False]]
    single = gds_sample(torch.log(torch.tensor([[0.2, 0.8]])), 1, seed=0)
    assert single.valid.tolist() == [[True]]


def test_seeded_sampler_is_reproducible_and_never_draws_a_greedy_token():
    logp = torch.log_softmax(torch.randn(5, 50, generator=torch.Generator().manual_seed(0)), -1)
    a, b = gds_sample(logp, 4, seed=9), gds_sample(logp, 4, seed=9)
    assert torch.equal(a.tokens, b.tokens)
    assert not bool((a.tokens[:, 3, None] == a.tokens[:, :3]).any())  # the draw is never a greedy token


def test_bad_inputs():
    logp = torch.log(torch.full((2, 4), 0.25))
    with pytest.raises(ValueError, match="k must be"):
        gds_sample(logp, 0)
    with pytest.raises(ValueError, match="k must be"):
        gds_sample(logp, 5)
    with pytest.raises(ValueError, match="NaN|nan"):
        gds_sample(torch.full((1, 3), float("nan")), 2)
    p = torch.full((1, 4), 0.25)
    cand = torch.tensor([[1, 1, 2]])
    with pytest.raises(ValueError, match="method 'gds' needs distinct sibling candidates"):
        verify_node("gds", cand, torch.ones_like(cand, dtype=torch.bool), p, p, seed=0)
