"""sample_categorical: one Gumbel-max sample per row (randomness: docs/kernels.md, Randomness contract).

False alarms: each law check is a chi-square at alpha = 1e-4 plus a TV bound exceeded with probability <= 1e-6;
the seeds are fixed, so a pass is reproducible for a given torch version.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels import BackendUnavailableError, available_backends, process_logits, sample_categorical
from specdec_kernels.testing import oracles as O
from specdec_kernels.testing.stats import law_check

F64 = torch.float64
NEG_INF = float("-inf")
# The backends that run CPU tensors natively (torch, cpu) get the full grid; Triton on CPU runs under its
# interpreter (seconds per call) and gets one small case (tests/backends/ covers parity in depth).
FAST_BACKENDS = [b for b in available_backends("sample_categorical") if b in ("torch", "cpu")]


def _uniforms(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.rand(shape, dtype=F64, generator=torch.Generator().manual_seed(seed)).clamp_min(2.0**-60)


def _oracle(logp: torch.Tensor, noise: torch.Tensor) -> np.ndarray:
    """argmax_v logp[v] - log(-log U_v), first maximum on ties (np.argmax)."""
    scores = logp.double().numpy() - np.log(-np.log(noise.numpy()))
    return np.argmax(scores, axis=-1)


# ---------------------------------------------------------------------------------------------------------------
# 1. Exactness against the NumPy oracle with injected noise


def _cases() -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for backend in available_backends("sample_categorical"):
        full = [(7,), (3, 111), (99, 7), (2, 3, 5), (1, 32000), (1, 128256)]
        shapes = full if backend in FAST_BACKENDS else [(3, 11)]
        out += [(backend, s) for s in shapes]
    return out


@pytest.mark.parametrize("backend,shape", _cases())
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_matches_oracle_with_injected_noise(backend, shape, dtype):
    gen = torch.Generator().manual_seed(shape[-1])
    logits = 3 * torch.randn(shape, generator=gen)
    logits[..., 1] = NEG_INF
    logp = process_logits(logits).to(dtype)
    noise = _uniforms(shape, shape[-1])
    try:
        out = sample_categorical(logp, noise=noise, backend=backend)
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))
    assert out.shape == shape[:-1] and out.dtype == torch.int64
    assert np.array_equal(out.numpy(), _oracle(logp, noise))


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_high_resolution_noise_reaches_far_tail(backend):
    """With 53-bit uniforms a token 30 nats below the maximum can still win."""
    logp = torch.tensor([[0.0, -30.0]], dtype=F64)
    noise = torch.tensor([[0.5, 1.0 - 2.0**-53]], dtype=F64)
    assert int(sample_categorical(logp, noise=noise, backend=backend)) == 1


# ---------------------------------------------------------------------------------------------------------------
# 2. Distribution

LAWS = {
    "skewed": [0.5, 0.3, 0.15, 0.049, 0.001],
    "masked": [0.0, 0.4, 0.0, 0.6],
    "flat": [0.125] * 8,
}


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("name", list(LAWS))
def test_law(backend, name):
    p = np.array(LAWS[name])
    n = 200000
    logp = torch.log(torch.tensor(p)).expand(n, len(p))
    tokens = sample_categorical(logp, seed=17, backend=backend).numpy()
    check = law_check(np.bincount(tokens, minlength=len(p)), p, max_tv=O.tv_bound(n, len(p)))
    assert check.ok, str(check)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_law_after_processing_with_temperature_and_filters(backend):
    z = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    logp = process_logits(z, 0.7, 4, 0.95)
    n = 100000
    tokens = sample_categorical(logp.expand(n, 6), seed=3, backend=backend).numpy()
    law = logp.double().exp().numpy()
    check = law_check(np.bincount(tokens, minlength=6), law, max_tv=O.tv_bound(n, 6))
    assert check.ok, str(check)


def test_wrong_sampler_fails_the_law_check():
    """Power: argmax(logp + U) (uniform instead of Gumbel perturbation) is rejected by the same check."""
    p = np.array(LAWS["skewed"])
    n = 200000
    u = _uniforms((n, len(p)), 5).numpy()
    tokens = np.argmax(np.log(p) + u, axis=-1)
    check = law_check(np.bincount(tokens, minlength=len(p)), p, max_tv=O.tv_bound(n, len(p)))
    assert not check.ok


# ---------------------------------------------------------------------------------------------------------------
# 3. Properties


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@settings(max_examples=30, deadline=None)
@given(v=st.integers(1, 30), n_masked=st.integers(0, 29), seed=st.integers(0, 10**6))
def test_masked_tokens_never_sampled_and_in_range(backend, v, n_masked, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn((64, v), generator=gen)
    masked = torch.rand((64, v), generator=gen).argsort(-1)[:, : min(n_masked, v - 1)]
    logits.scatter_(1, masked, NEG_INF)
    tokens = sample_categorical(process_logits(logits), generator=gen, backend=backend)
    assert bool(((tokens >= 0) & (tokens < v)).all())
    assert bool(torch.isfinite(logits.gather(1, tokens[:, None])).all())


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_ties_break_to_lowest_id(backend):
    logp = torch.log(torch.full((1, 4), 0.25, dtype=F64))
    assert int(sample_categorical(logp, noise=torch.full((1, 4), 0.3, dtype=F64), backend=backend)) == 0


def test_one_hot_row_is_deterministic():
    logp = process_logits(torch.tensor([[0.0, 5.0, 1.0]]), temperature=0.0)
    assert sample_categorical(logp.expand(100, 3), seed=0).eq(1).all()


# ---------------------------------------------------------------------------------------------------------------
# 4. Bad inputs

LOGP = torch.log(torch.tensor([[0.2, 0.3, 0.5]], dtype=F64))
BAD = [
    (dict(logp=[0.1, 0.9]), TypeError, "logp must be a torch.Tensor"),
    (dict(logp=torch.tensor(0.0)), ValueError, r"logp must have at least 1 dimension\(s\)"),
    (dict(logp=torch.tensor([[0, 1]])), TypeError, "logp must be a floating-point tensor"),
    (dict(logp=torch.zeros((1, 0))), ValueError, "logp must have a non-empty vocabulary"),
    (dict(logp=torch.tensor([[0.0, float("nan")]])), ValueError, "logp contains NaN"),
    (dict(logp=torch.tensor([[0.0, float("inf")]])), ValueError, r"logp contains \+inf"),
    (dict(logp=torch.tensor([[NEG_INF, NEG_INF]])), ValueError, "every entry is -inf"),
    (dict(noise=torch.full((1, 4), 0.5, dtype=F64)), ValueError, r"noise must have shape \(1, 3\)"),
    (dict(noise=torch.tensor([[0.0, 0.5, 0.5]], dtype=F64)), ValueError, r"noise must hold uniforms in \(0, 1\)"),
    (dict(noise=torch.tensor([[1.0, 0.5, 0.5]], dtype=F64)), ValueError, r"noise must hold uniforms in \(0, 1\)"),
    (dict(noise=torch.ones((1, 3), dtype=torch.long)), TypeError, "noise must be a floating-point tensor"),
    (dict(seed=1, generator=torch.Generator()), ValueError, "pass either generator= or seed=, not both"),
    (dict(seed="1"), TypeError, "seed must be an int"),
    (dict(backend="cuda"), BackendUnavailableError, "backend 'cuda' is unavailable"),
]


@pytest.mark.parametrize("kw,exc,msg", BAD, ids=lambda x: x if isinstance(x, str) else None)
def test_bad_input(kw, exc, msg):
    args = dict(logp=LOGP)
    args.update(kw)
    with pytest.raises(exc, match=msg):
        sample_categorical(args.pop("logp"), **args)


# ---------------------------------------------------------------------------------------------------------------
# 5. Reproducibility


def test_seed_and_generator_reproducibility():
    logp = torch.log(torch.full((500, 6), 1 / 6, dtype=F64))
    a = sample_categorical(logp, seed=1)
    assert torch.equal(a, sample_categorical(logp, seed=1))
    assert not torch.equal(a, sample_categorical(logp, seed=2))
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    first = sample_categorical(logp, generator=g1)
    assert torch.equal(first, sample_categorical(logp, generator=g2))
    assert not torch.equal(first, sample_categorical(logp, generator=g1))  # the generator advanced
    noise = _uniforms((500, 6), 8)
    assert torch.equal(sample_categorical(logp, noise=noise), sample_categorical(logp, noise=noise))
