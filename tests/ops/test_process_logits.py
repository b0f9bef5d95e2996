"""process_logits: temperature, top-k, top-p, fp32 log-softmax; greedy one-hot below T = 1e-5.

Deterministic op: section 2 checks the semantics case by case (and against the NumPy oracle), section 5 checks
bit-identical repeated and batched calls.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels import BackendUnavailableError, available_backends, process_logits
from specdec_kernels.testing import oracles as O

NEG_INF = float("-inf")
# The backends that run CPU tensors natively (torch, cpu) get the full grid and the semantics; Triton on CPU runs
# under its interpreter (seconds per call) and gets one small case.
FAST_BACKENDS = [b for b in available_backends("process_logits") if b in ("torch", "cpu")]
INTERPRETED_BACKENDS = [b for b in available_backends("process_logits") if b not in FAST_BACKENDS]


@pytest.fixture(params=FAST_BACKENDS)
def pl(request):
    """process_logits bound to one backend."""
    return functools.partial(process_logits, backend=request.param)


def _kept(logp: torch.Tensor) -> list[int]:
    return torch.nonzero(torch.isfinite(logp)).flatten().tolist()


def _logits(probs: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor(probs, dtype=torch.float64)).float()


# ---------------------------------------------------------------------------------------------------------------
# 1. Exactness against the NumPy oracle

SETTINGS = [(1.0, 0, 1.0), (0.7, 5, 1.0), (2.5, 0, 0.9), (1.3, 20, 0.5), (0.0, 0, 1.0), (1.0, 1, 0.3)]


def _check_against_oracle(backend, shape, dtype, temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(math.prod(shape))
    logits = (3 * torch.randn(shape, generator=gen)).to(dtype)
    logits.view(-1, shape[-1])[:, 0] = NEG_INF  # masked token stays masked
    out = process_logits(logits, temperature, top_k, top_p, backend=backend)
    assert out.dtype == torch.float32 and out.shape == logits.shape
    rows = logits.double().reshape(-1, shape[-1]).numpy()
    got = out.double().reshape(-1, shape[-1]).numpy()
    for x, y in zip(rows, got, strict=True):
        want = O.process_logits_oracle(x, temperature, top_k, top_p)
        assert np.array_equal(np.isfinite(y), np.isfinite(want))
        fin = np.isfinite(want)
        np.testing.assert_allclose(y[fin], want[fin], atol=1e-5, rtol=1e-6)
    # log=False: the oracle's law, exactly 0 where it masks (one-hot in greedy mode)
    probs = process_logits(logits, temperature, top_k, top_p, log=False, backend=backend)
    assert probs.dtype == torch.float32 and probs.shape == logits.shape
    for x, y in zip(rows, probs.double().reshape(-1, shape[-1]).numpy(), strict=True):
        want = np.exp(O.process_logits_oracle(x, temperature, top_k, top_p))
        assert np.array_equal(y == 0, want == 0)
        np.testing.assert_allclose(y, want, atol=1e-7, rtol=1e-5)
        assert abs(y.sum() - 1.0) < 1e-5


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("shape", [(7,), (3, 111), (2, 2, 7), (1, 32000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_matches_oracle(backend, shape, dtype, temperature, top_k, top_p):
    _check_against_oracle(backend, shape, dtype, temperature, top_k, top_p)


# Triton runs on CPU tensors only under its interpreter (seconds per call): one small case; tests/backends/ covers
# backend parity in depth.
@pytest.mark.parametrize("backend", INTERPRETED_BACKENDS)
def test_backend_matches_oracle(backend):
    try:
        _check_against_oracle(backend, (3, 111), torch.bfloat16, 0.7, 20, 0.9)
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))


# ---------------------------------------------------------------------------------------------------------------
# 2. Semantics, case by case


@pytest.mark.parametrize("temperature", [0.25, 1.0, 3.0])
def test_temperature_divides_logits(temperature, pl):
    z = torch.tensor([1.0, -2.0, 0.5, 3.0])
    torch.testing.assert_close(pl(z, temperature), torch.log_softmax(z / temperature, -1))


@pytest.mark.parametrize("temperature", [0.0, 1e-6, 9.9e-6])
def test_greedy_is_one_hot_argmax_lowest_id(temperature, pl):
    z = torch.tensor([[1.0, 3.0, 3.0, 2.0], [NEG_INF, -1.0, -5.0, -1.0]])
    out = pl(z, temperature)
    want = torch.full_like(z, NEG_INF)
    want[0, 1] = want[1, 1] = 0.0
    assert torch.equal(out, want)


def test_temperature_at_threshold_is_not_greedy(pl):
    z = torch.tensor([0.0, 1e-6])
    out = pl(z, 1e-5)  # T < 1e-5 selects greedy; T = 1e-5 divides
    assert torch.isfinite(out).all()
    assert out[1] > out[0]


def test_top_k_keeps_ties_at_the_boundary(pl):
    z = torch.tensor([1.0, 2.0, 2.0, 3.0, 0.0])
    assert _kept(pl(z, top_k=2)) == [1, 2, 3]
    assert _kept(pl(z, top_k=1)) == [3]
    assert _kept(pl(z, top_k=5)) == [0, 1, 2, 3, 4]
    assert _kept(pl(z, top_k=9)) == [0, 1, 2, 3, 4]  # k >= V disables the filter


def test_top_k_renormalizes(pl):
    z = torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(pl(z, top_k=2)[1:], torch.log_softmax(z[1:], -1))


@pytest.mark.parametrize(("top_p", "kept"), [(0.45, [0]), (0.75, [0, 1]), (0.85, [0, 1, 2]), (1.0, [0, 1, 2, 3])])
def test_top_p_keeps_the_shortest_prefix(top_p, kept, pl):
    z = _logits([0.5, 0.3, 0.15, 0.05])
    assert _kept(pl(z, top_p=top_p)) == kept


def test_top_p_ties_break_toward_lower_token_id(pl):
    z = _logits([0.2, 0.4, 0.4])
    assert _kept(pl(z, top_p=0.3)) == [1]
    assert _kept(pl(z, top_p=0.5)) == [1, 2]
    z = torch.zeros(6)  # all tied: the prefix in token-id order
    assert _kept(pl(z, top_p=0.4)) == [0, 1, 2]


def test_top_p_always_keeps_one_token(pl):
    z = _logits([0.1, 0.6, 0.3])
    out = pl(z, top_p=1e-9)
    assert _kept(out) == [1] and out[1] == 0.0


def test_processing_order_temperature_top_k_top_p(pl):
    """HF order: top-p sees the law after temperature and after top-k."""
    z = _logits([0.4, 0.3, 0.2, 0.1])
    assert _kept(pl(z, top_p=0.5)) == [0, 1]
    assert _kept(pl(z, top_k=2, top_p=0.5)) == [0]  # after top-k, token 0 has 4/7 >= 0.5
    assert _kept(pl(z, temperature=0.5, top_p=0.5)) == [0]  # T = 0.5: token 0 has 0.533


def test_masked_entries_have_probability_exactly_zero(pl):
    z = torch.tensor([[NEG_INF, 0.0, 1.0, NEG_INF], [2.0, NEG_INF, NEG_INF, NEG_INF]])
    out = pl(z, 0.8, 1, 0.9)
    assert torch.equal(out.exp() == 0, torch.tensor([[True, True, False, True], [False, True, True, True]]))
    assert out[1, 0] == 0.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_half_and_double_inputs_give_fp32(dtype, pl):
    z = torch.randn((3, 50), generator=torch.Generator().manual_seed(0)).to(dtype)
    out = pl(z, 0.7, 10, 0.9)
    assert out.dtype == torch.float32
    assert torch.equal(out, pl(z.float(), 0.7, 10, 0.9))


@pytest.mark.parametrize("shape", [(5,), (2, 5), (2, 3, 5), (1, 2, 3, 5)])
def test_any_leading_shape(shape, pl):
    z = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    out = pl(z, 1.0, 2, 0.9)
    assert out.shape == shape
    torch.testing.assert_close(out.reshape(-1, 5), pl(z.reshape(-1, 5), 1.0, 2, 0.9))


# ---------------------------------------------------------------------------------------------------------------
# 3. Properties


@st.composite
def logit_rows(draw: st.DrawFn) -> torch.Tensor:
    v = draw(st.integers(1, 24))
    vals = draw(st.lists(st.one_of(st.integers(-8, 8).map(float), st.just(NEG_INF)), min_size=v, max_size=v))
    if all(x == NEG_INF for x in vals):
        vals[0] = 0.0
    return torch.tensor(vals)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@settings(max_examples=40, deadline=None)
@given(
    z=logit_rows(),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    top_k=st.integers(0, 30),
    top_p=st.floats(0.01, 1.0),
)
def test_properties(backend, z, temperature, top_k, top_p):
    pl = functools.partial(process_logits, backend=backend)
    out = pl(z, temperature, top_k, top_p)
    kept = torch.isfinite(out)
    assert 1 <= int(kept.sum()) <= int(torch.isfinite(z).sum())
    assert not bool(torch.isnan(out).any())
    assert abs(float(torch.logsumexp(out.double(), -1))) <= 1e-5  # a normalized law
    assert not bool((kept & ~torch.isfinite(z)).any())  # masked logits stay masked
    if temperature == 0.0:
        assert _kept(out) == [int(torch.argmax(z))]
        return
    after_k = pl(z, temperature, top_k, 1.0)
    if top_k:
        n_fin = int(torch.isfinite(z).sum())
        assert int(torch.isfinite(after_k).sum()) >= min(top_k, n_fin)  # ties can only add tokens
    # Top-p keeps the shortest prefix (in stable descending order) of the top-k law with mass >= top_p.
    probs = after_k.double().exp()
    order = torch.sort(probs, descending=True, stable=True).indices
    n_keep = int(kept.sum())
    assert bool(kept[order[:n_keep]].all())
    assert float(probs[order[:n_keep]].sum()) >= top_p - 1e-6 or n_keep == int(torch.isfinite(after_k).sum())
    assert n_keep == 1 or float(probs[order[: n_keep - 1]].sum()) < top_p + 1e-6


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@settings(max_examples=25, deadline=None)
@given(z=logit_rows(), p1=st.floats(0.01, 1.0), p2=st.floats(0.01, 1.0))
def test_top_p_is_monotone(backend, z, p1, p2):
    pl = functools.partial(process_logits, backend=backend)
    lo, hi = sorted((p1, p2))
    small, big = torch.isfinite(pl(z, top_p=lo)), torch.isfinite(pl(z, top_p=hi))
    assert not bool((small & ~big).any())


# ---------------------------------------------------------------------------------------------------------------
# 4. Bad inputs

Z = torch.tensor([[0.0, 1.0, 2.0]])
BAD = [
    (dict(logits=[0.0, 1.0]), TypeError, "logits must be a torch.Tensor"),
    (dict(logits=torch.tensor(1.0)), ValueError, r"logits must have at least 1 dimension\(s\)"),
    (dict(logits=torch.tensor([[1, 2]])), TypeError, "logits must be a floating-point tensor"),
    (dict(logits=torch.zeros((2, 0))), ValueError, "logits must have a non-empty vocabulary"),
    (dict(logits=torch.tensor([[0.0, float("nan")]])), ValueError, "logits contains NaN"),
    (dict(logits=torch.tensor([[0.0, float("inf")]])), ValueError, r"logits contains \+inf"),
    (dict(logits=torch.tensor([[0.0, 1.0], [NEG_INF, NEG_INF]])), ValueError, "every entry is -inf"),
    (dict(temperature=-0.5), ValueError, r"temperature must be >= 0 \(0 = greedy\)"),
    (dict(temperature=float("nan")), ValueError, "temperature must be a finite number"),
    (dict(temperature=float("inf")), ValueError, "temperature must be a finite number"),
    (dict(temperature="1"), ValueError, "temperature must be a finite number"),
    (dict(temperature=True), ValueError, "temperature must be a finite number"),
    (dict(top_k=-1), ValueError, r"top_k must be an int >= 0 \(0 disables it\)"),
    (dict(top_k=2.0), ValueError, "top_k must be an int >= 0"),
    (dict(top_k=True), ValueError, "top_k must be an int >= 0"),
    (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=-0.1), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=float("nan")), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=False), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(backend="cuda"), BackendUnavailableError, "backend 'cuda' is unavailable"),
    (dict(log=1), TypeError, "log must be a bool"),
]


@pytest.mark.parametrize("kw,exc,msg", BAD, ids=lambda x: x if isinstance(x, str) else None)
def test_bad_input(kw, exc, msg):
    args = dict(logits=Z, temperature=1.0, top_k=0, top_p=1.0)
    args.update(kw)
    with pytest.raises(exc, match=msg):
        process_logits(args.pop("logits"), **args)


# The value checks: made by the public op for backends without their own (torch), by the kernel in its first pass
# for cpu (process_logits.checks_values); same errors, same precedence, every dtype and mode.
BAD_VALUES = [
    ("nan", "logits contains NaN"),
    ("posinf", r"logits contains \+inf"),
    ("neginf_row", "every entry is -inf"),
    ("nan_after_neginf_row", "logits contains NaN"),  # NaN is reported first, as check_logp does
    ("posinf_after_neginf_row", r"logits contains \+inf"),
]


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize(
    "setting", [(1.0, 0, 1.0), (0.0, 0, 1.0), (0.7, 5, 0.9), (1.3, 0, 0.8), (0.7, 5, 1.0), (1.0, 2000, 1.0)]
)
@pytest.mark.parametrize("log", [True, False])
@pytest.mark.parametrize("kind,msg", BAD_VALUES)
def test_bad_values(backend, dtype, setting, log, kind, msg):
    z = (torch.randn((4, 111), generator=torch.Generator().manual_seed(3)) * 3).to(dtype)
    if kind.endswith("neginf_row"):
        z[1] = NEG_INF
    if kind.startswith("nan"):
        z[3, 57] = float("nan")
    if kind.startswith("posinf"):
        z[2, 0] = float("inf")
    with pytest.raises(ValueError, match=msg):
        process_logits(z, *setting, log=log, backend=backend)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("log", [True, False])
def test_logits_that_overflow_at_the_temperature_are_refused(backend, dtype, log):
    """Finite logits whose maximum / T overflows fp32 would give NaN rows: refused; T >= 1 and greedy are fine."""
    z = torch.tensor([[3e38, 1e38, 0.0], [1.0, 2.0, 3.0]]).to(dtype)
    for top_k in (0, 2):  # top-k without top-p takes its own pass on the cpu backend
        with pytest.raises(ValueError, match=r"logits / temperature overflows float32"):
            process_logits(z, 0.5, top_k, log=log, backend=backend)
    for temperature in (1.0, 0.0):
        out = process_logits(z, temperature, log=log, backend=backend)
        assert not torch.isnan(out).any()


# ---------------------------------------------------------------------------------------------------------------
# 5. Reproducibility


def test_deterministic_and_row_independent(pl):
    z = 2 * torch.randn((6, 300), generator=torch.Generator().manual_seed(3))
    a = pl(z, 0.9, 40, 0.8)
    assert torch.equal(a, pl(z, 0.9, 40, 0.8))
    assert torch.equal(a[4], pl(z[4:5], 0.9, 40, 0.8)[0])
