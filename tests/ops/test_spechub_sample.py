"""spechub_sample: SpecHub's two drafts through the hub a = argmax p (docs/methods.md, SpecHub).

False alarms: each law check is a chi-square at alpha = 1e-4 plus a TV bound exceeded with probability <= 1e-6;
the seeds are fixed, so a pass is reproducible for a given torch version.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels import BackendUnavailableError, available_backends, gumbel_topk, spechub_sample
from specdec_kernels.testing import oracles as O
from specdec_kernels.testing.stats import law_check

F64 = torch.float64
NEG_INF = float("-inf")
# The backends that run CPU tensors natively (torch, cpu) get the full grid; Triton on CPU runs under its
# interpreter (seconds per call) and gets one small case (tests/backends/ covers parity in depth).
FAST_BACKENDS = [b for b in available_backends("spechub_sample") if b in ("torch", "cpu")]


def _uniforms(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.rand(shape, dtype=F64, generator=torch.Generator().manual_seed(seed)).clamp_min(2.0**-60)


def _oracle_row(logp: np.ndarray, noise: np.ndarray) -> tuple[list[int], int, list[bool]]:
    a = int(np.argmax(logp))
    p = np.exp(logp)
    if 1.0 - p[a] <= O.SWOR_MASS_EPS:
        y1 = int(np.argmax(logp - np.log(-np.log(noise))))
        return [y1, -1], a, [True, False]
    scores = logp - np.log(-np.log(noise))
    y1, y2 = (int(x) for x in np.argsort(-scores, kind="stable")[:2])
    return ([a, y2] if y1 == a else [y1, a]), a, [True, True]


# ---------------------------------------------------------------------------------------------------------------
# 1. Exactness against the NumPy oracle with injected noise


def _cases() -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for backend in available_backends("spechub_sample"):
        shapes = [(7,), (3, 111), (99, 7), (2, 3, 5), (1, 32000)] if backend in FAST_BACKENDS else [(3, 11)]
        out += [(backend, s) for s in shapes]
    return out


@pytest.mark.parametrize("backend,shape", _cases())
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_matches_oracle_with_injected_noise(backend, shape, dtype):
    gen = torch.Generator().manual_seed(shape[-1])
    logits = 2 * torch.randn(shape, generator=gen, dtype=F64)
    logits[..., 3] = NEG_INF
    logp = torch.log_softmax(logits, -1).to(dtype)
    noise = _uniforms(shape, shape[-1] + 1)
    try:
        out = spechub_sample(logp, noise=noise, backend=backend)
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))
    assert out.tokens.shape == out.valid.shape == shape[:-1] + (2,) and out.hub.shape == shape[:-1]
    rows_lp = logp.double().reshape(-1, shape[-1]).numpy()
    rows_u = noise.reshape(-1, shape[-1]).numpy()
    toks, hubs, val = out.tokens.reshape(-1, 2), out.hub.reshape(-1), out.valid.reshape(-1, 2)
    for r in range(rows_lp.shape[0]):
        t, a, v = _oracle_row(rows_lp[r], rows_u[r])
        assert toks[r].tolist() == t and int(hubs[r]) == a and val[r].tolist() == v


# ---------------------------------------------------------------------------------------------------------------
# 2. Distribution: the draft pair follows SpecHub's joint Q


def _pair_counts(tokens: np.ndarray, valid: np.ndarray, law: dict) -> tuple[np.ndarray, np.ndarray]:
    index = {t: i for i, t in enumerate(law)}
    counts = np.zeros(len(law) + 1)
    for row, ok in zip(tokens, valid, strict=True):
        counts[index.get(tuple(int(x) for x, o in zip(row, ok, strict=True) if o), len(law))] += 1
    return counts, np.array([*law.values(), 0.0])


LAWS = {
    "I1": [0.5, 0.3, 0.15, 0.05],
    "flat-ish": [0.3, 0.3, 0.2, 0.2],  # tie at the top: hub = token 0
    "zero": [0.1, 0.0, 0.6, 0.3],
    "peaked": [0.02, 0.95, 0.03],
}


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("name", list(LAWS))
def test_joint_law(backend, name):
    p = np.array(LAWS[name])
    n = 60000
    law = O.hub_joint(p)
    out = spechub_sample(torch.log(torch.tensor(p)).expand(n, len(p)), seed=9, backend=backend)
    assert out.hub.eq(int(np.argmax(p))).all()
    counts, probs = _pair_counts(out.tokens.numpy(), out.valid.numpy(), law)
    check = law_check(counts, probs, max_tv=O.tv_bound(n, len(law)))
    assert check.ok, str(check)
    first = np.bincount(out.tokens[:, 0].numpy(), minlength=len(p))  # slot 0 is marginally p
    assert law_check(first, p, max_tv=O.tv_bound(n, len(p))).ok


def test_plain_top2_fails_the_joint_law_check():
    """Power: Gumbel-top-2 drafts (RRSw drafting, no hub) are rejected by the same check."""
    p = np.array(LAWS["I1"])
    n = 60000
    law = O.hub_joint(p)
    d = gumbel_topk(torch.log(torch.tensor(p)).expand(n, len(p)), 2, seed=9)
    counts, probs = _pair_counts(d.tokens.numpy(), d.valid.numpy(), law)
    assert not law_check(counts, probs, max_tv=O.tv_bound(n, len(law))).ok


def test_hub_joint_oracle():
    p = np.array([0.5, 0.3, 0.2])
    law = O.hub_joint(p)
    assert abs(sum(law.values()) - 1.0) <= 1e-12
    assert abs(law[(1, 0)] - 0.3) <= 1e-15 and abs(law[(0, 2)] - 0.5 * 0.2 / 0.5) <= 1e-15


# ---------------------------------------------------------------------------------------------------------------
# 3. Properties


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@settings(max_examples=40, deadline=None)
@given(v=st.integers(1, 12), n_masked=st.integers(0, 11), seed=st.integers(0, 10**6))
def test_properties(backend, v, n_masked, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn((32, v), generator=gen)
    logits[:, : min(n_masked, v - 1)] = NEG_INF
    logp = torch.log_softmax(logits, -1)
    out = spechub_sample(logp, generator=gen, backend=backend)
    assert torch.equal(out.hub, logp.argmax(-1))
    assert bool(out.valid[:, 0].all())
    two = out.valid[:, 1]
    assert bool((out.tokens[~two, 1] == -1).all())
    assert bool(((out.tokens[two, 0] == out.hub[two]) | (out.tokens[two, 1] == out.hub[two])).all())
    assert bool((out.tokens[two, 0] != out.tokens[two, 1]).all())
    assert bool(torch.isfinite(logp.gather(1, out.tokens[:, :1])).all())
    if v - min(n_masked, v - 1) == 1:  # one token left: p(a) = 1, a single SD draft
        assert not bool(two.any())


def test_point_mass_gives_single_draft():
    """p(a) = 1: the second draft does not exist."""
    logp = torch.log(torch.tensor([[0.0, 1.0, 0.0]], dtype=F64))
    out = spechub_sample(logp, seed=0)
    assert out.tokens.tolist() == [[1, -1]] and out.valid.tolist() == [[True, False]]


def test_hub_ties_go_to_lowest_id():
    logp = torch.log(torch.tensor([[0.1, 0.45, 0.45]], dtype=F64))
    assert spechub_sample(logp, seed=0).hub.tolist() == [1]


# ---------------------------------------------------------------------------------------------------------------
# 4. Bad inputs

LOGP = torch.log(torch.tensor([[0.2, 0.3, 0.5]], dtype=F64))
BAD = [
    (dict(logp=[0.1, 0.9]), TypeError, "logp must be a torch.Tensor"),
    (dict(logp=torch.tensor(0.0)), ValueError, r"logp must have at least 1 dimension\(s\)"),
    (dict(logp=torch.tensor([[0, 1]])), TypeError, "logp must be a floating-point tensor"),
    (dict(logp=torch.tensor([[0.0, float("nan")]])), ValueError, "logp contains NaN"),
    (dict(logp=torch.tensor([[0.0, float("inf")]])), ValueError, r"logp contains \+inf"),
    (dict(logp=torch.tensor([[NEG_INF, NEG_INF]])), ValueError, "every entry is -inf"),
    (dict(noise=torch.full((1, 2), 0.5, dtype=F64)), ValueError, r"noise must have shape \(1, 3\)"),
    (dict(noise=torch.ones((1, 3), dtype=F64)), ValueError, r"noise must hold uniforms in \(0, 1\)"),
    (dict(seed=1, generator=torch.Generator()), ValueError, "pass either generator= or seed=, not both"),
    (dict(backend="cuda"), BackendUnavailableError, "backend 'cuda' is unavailable"),
]


@pytest.mark.parametrize("kw,exc,msg", BAD, ids=lambda x: x if isinstance(x, str) else None)
def test_bad_input(kw, exc, msg):
    args = dict(logp=LOGP)
    args.update(kw)
    with pytest.raises(exc, match=msg):
        spechub_sample(args.pop("logp"), **args)


# ---------------------------------------------------------------------------------------------------------------
# 5. Reproducibility


def test_seed_and_noise_reproducibility():
    logp = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=F64)).expand(300, 4)
    a = spechub_sample(logp, seed=1)
    assert torch.equal(a.tokens, spechub_sample(logp, seed=1).tokens)
    assert not torch.equal(a.tokens, spechub_sample(logp, seed=2).tokens)
    noise = _uniforms((300, 4), 3)
    assert torch.equal(spechub_sample(logp, noise=noise).tokens, spechub_sample(logp, noise=noise).tokens)
