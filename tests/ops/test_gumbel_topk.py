"""gumbel_topk: k draws without replacement in draw order.

False alarms: each law check is a chi-square at alpha = 1e-4 plus a TV bound exceeded with probability <= 1e-6;
the seeds are fixed, so a pass is reproducible for a given torch version.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels import BackendUnavailableError, available_backends, gumbel_topk
from specdec_kernels.testing import oracles as O
from specdec_kernels.testing.stats import law_check

F64 = torch.float64
NEG_INF = float("-inf")
# The backends that run CPU tensors natively (torch, cpu) get the full grid; Triton on CPU runs under its
# interpreter (seconds per call) and gets one small case (tests/backends/ covers parity in depth).
FAST_BACKENDS = [b for b in available_backends("gumbel_topk") if b in ("torch", "cpu")]


def _uniforms(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.rand(shape, dtype=F64, generator=torch.Generator().manual_seed(seed)).clamp_min(2.0**-60)


def _oracle_row(logp: np.ndarray, noise: np.ndarray, k: int) -> tuple[list[int], list[bool], list[float]]:
    """Stable descending sort of logp + Gumbel; invalid: score -inf, or remaining mass <= 1e-7."""
    scores = logp - np.log(-np.log(noise))
    order = np.argsort(-scores, kind="stable")[:k]
    p = np.exp(logp)
    tokens, valid, out_scores = [], [], []
    used = 0.0
    for x in order:
        ok = bool(np.isfinite(scores[x])) and 1.0 - used > O.SWOR_MASS_EPS
        tokens.append(int(x) if ok else -1)
        valid.append(ok)
        out_scores.append(float(scores[x]) if ok else NEG_INF)
        used += p[x] if ok else 0.0
    return tokens, valid, out_scores


# ---------------------------------------------------------------------------------------------------------------
# 1. Exactness against the NumPy oracle with injected noise


def _cases() -> list[tuple[str, tuple[int, ...], int]]:
    out = []
    for backend in available_backends("gumbel_topk"):
        if backend in FAST_BACKENDS:
            cases = [((7,), 3), ((3, 111), 8), ((99, 7), 7), ((2, 3, 5), 2), ((1, 32000), 16), ((4, 9), 0)]
        else:
            cases = [((3, 11), 3)]
        out += [(backend, s, k) for s, k in cases]
    return out


@pytest.mark.parametrize("backend,shape,k", _cases())
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_matches_oracle_with_injected_noise(backend, shape, k, dtype):
    gen = torch.Generator().manual_seed(shape[-1] + k)
    logits = 3 * torch.randn(shape, generator=gen, dtype=F64)
    logits[..., 2] = NEG_INF
    logp = torch.log_softmax(logits, -1).to(dtype)
    noise = _uniforms(shape, shape[-1])
    try:
        out = gumbel_topk(logp, k, noise=noise, backend=backend)
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))
    assert out.tokens.shape == out.valid.shape == out.score.shape == shape[:-1] + (k,)
    rows_lp = logp.double().reshape(-1, shape[-1]).numpy()
    rows_u = noise.reshape(-1, shape[-1]).numpy()
    toks, val, sc = (x.reshape(rows_lp.shape[0], k) for x in out)
    tol = 1e-12 if backend == "torch" else 1e-5  # kernels form Gumbel scores in fp32
    for r in range(rows_lp.shape[0]):
        t, v, s = _oracle_row(rows_lp[r], rows_u[r], k)
        assert toks[r].tolist() == t and val[r].tolist() == v
        np.testing.assert_allclose(sc[r].double().numpy(), s, rtol=0, atol=tol)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_remaining_mass_cutoff_invalidates_later_slots(backend):
    """Once 1 - sum p(x_i) <= 1e-7 the later candidates are not real draws."""
    logp = torch.log(torch.tensor([[1 - 1e-8, 1e-8, 0.0]], dtype=F64))
    first_big = gumbel_topk(logp, 2, noise=torch.tensor([[0.9, 0.1, 0.5]], dtype=F64), backend=backend)
    assert first_big.valid.tolist() == [[True, False]] and first_big.tokens.tolist() == [[0, -1]]
    first_small = gumbel_topk(logp, 2, noise=torch.tensor([[1e-300, 1 - 1e-16, 0.5]], dtype=F64), backend=backend)
    assert first_small.tokens.tolist() == [[1, 0]] and first_small.valid.all()


# ---------------------------------------------------------------------------------------------------------------
# 2. Distribution: the ordered tuple follows the exact SWOR law


def _tuple_counts(tokens: np.ndarray, law: dict[tuple[int, ...], float]) -> tuple[np.ndarray, np.ndarray]:
    """Observed counts and exact probabilities over the outcomes of ``law`` (+ one bin for anything else)."""
    index = {t: i for i, t in enumerate(law)}
    counts = np.zeros(len(law) + 1)
    for row in tokens:
        counts[index.get(tuple(int(x) for x in row if x >= 0), len(law))] += 1
    return counts, np.array([*law.values(), 0.0])


SWOR_CASES = [  # p, k, rows
    ([0.4, 0.25, 0.2, 0.1, 0.05], 3, 100000),  # 60 ordered triples
    ([0.5, 0.0, 0.3, 0.2], 3, 60000),  # a zero: 6 triples
    ([0.7, 0.3, 0.0, 0.0], 3, 30000),  # support exhausted: pairs, slot 3 invalid
]


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("p,k,n", SWOR_CASES)
def test_ordered_tuple_law(backend, p, k, n):
    law = O.swor_law(p, k)
    logp = torch.log(torch.tensor(p, dtype=F64)).expand(n, len(p))
    out = gumbel_topk(logp, k, seed=21, backend=backend)
    counts, probs = _tuple_counts(out.tokens.numpy(), law)
    check = law_check(counts, probs, max_tv=O.tv_bound(n, len(law)))
    assert check.ok, str(check)
    assert out.valid.sum(-1).eq(min(k, int(np.count_nonzero(p)))).all()


def test_wrong_order_fails_the_law_check():
    """Power: the same draws reported in token-id order instead of draw order fail the same check."""
    p, k, n = SWOR_CASES[0]
    law = O.swor_law(p, k)
    out = gumbel_topk(torch.log(torch.tensor(p, dtype=F64)).expand(n, len(p)), k, seed=21)
    counts, probs = _tuple_counts(np.sort(out.tokens.numpy(), axis=-1), law)
    assert not law_check(counts, probs, max_tv=O.tv_bound(n, len(law))).ok


def test_swor_law_oracle_sums_to_one_and_matches_formula():
    p = np.array([0.4, 0.25, 0.2, 0.1, 0.05])
    law = O.swor_law(p, 3)
    assert abs(sum(law.values()) - 1.0) <= 1e-12
    assert abs(law[(3, 0, 4)] - 0.1 * 0.4 / 0.9 * 0.05 / 0.5) <= 1e-15


# ---------------------------------------------------------------------------------------------------------------
# 3. Properties


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@settings(max_examples=40, deadline=None)
@given(v=st.integers(1, 20), k_frac=st.floats(0, 1), n_masked=st.integers(0, 19), seed=st.integers(0, 10**6))
def test_properties(backend, v, k_frac, n_masked, seed):
    k = round(k_frac * v)
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn((32, v), generator=gen)
    logits[:, : min(n_masked, v - 1)] = NEG_INF
    logp = torch.log_softmax(logits, -1)
    out = gumbel_topk(logp, k, generator=gen, backend=backend)
    n_support = v - min(n_masked, v - 1)
    assert out.valid.sum(-1).eq(min(k, n_support)).all()  # no mass cut-off with these laws
    assert torch.equal(out.valid, out.score > NEG_INF)
    assert bool((out.tokens[~out.valid] == -1).all())
    assert bool((out.tokens[out.valid] >= min(n_masked, v - 1)).all())  # masked tokens never drawn
    assert bool((out.score[:, 1:] <= out.score[:, :-1]).all())  # descending = draw order
    for row, ok in zip(out.tokens.tolist(), out.valid.tolist(), strict=True):
        live = [t for t, o in zip(row, ok, strict=True) if o]
        assert len(set(live)) == len(live) and ok == sorted(ok, reverse=True)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_ties_break_to_lowest_id(backend):
    logp = torch.log(torch.full((1, 5), 0.2, dtype=F64))
    out = gumbel_topk(logp, 3, noise=torch.full((1, 5), 0.5, dtype=F64), backend=backend)
    assert out.tokens.tolist() == [[0, 1, 2]]


def test_k_zero_and_k_equals_v():
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.2]], dtype=F64))
    empty = gumbel_topk(logp, 0, seed=0)
    assert empty.tokens.shape == (1, 0)
    full = gumbel_topk(logp, 3, seed=0)
    assert sorted(full.tokens[0].tolist()) == [0, 1, 2]


# ---------------------------------------------------------------------------------------------------------------
# 4. Bad inputs

LOGP = torch.log(torch.tensor([[0.2, 0.3, 0.4, 0.1]], dtype=F64))
BAD = [
    (dict(logp=[0.1, 0.9]), TypeError, "logp must be a torch.Tensor"),
    (dict(logp=torch.tensor(0.0)), ValueError, r"logp must have at least 1 dimension\(s\)"),
    (dict(logp=torch.tensor([[0, 1]])), TypeError, "logp must be a floating-point tensor"),
    (dict(logp=torch.tensor([[0.0, float("nan")]])), ValueError, "logp contains NaN"),
    (dict(logp=torch.tensor([[0.0, float("inf")]])), ValueError, r"logp contains \+inf"),
    (dict(logp=torch.tensor([[NEG_INF, NEG_INF]])), ValueError, "every entry is -inf"),
    (dict(k=5), ValueError, r"k must be an int in \[0, V=4\], got 5"),
    (dict(k=-1), ValueError, r"k must be an int in \[0, V=4\]"),
    (dict(k=2.0), ValueError, r"k must be an int in \[0, V=4\]"),
    (dict(k=True), ValueError, r"k must be an int in \[0, V=4\]"),
    (dict(noise=torch.full((1, 3), 0.5, dtype=F64)), ValueError, r"noise must have shape \(1, 4\)"),
    (dict(noise=torch.zeros((1, 4), dtype=F64)), ValueError, r"noise must hold uniforms in \(0, 1\)"),
    (dict(seed=1, generator=torch.Generator()), ValueError, "pass either generator= or seed=, not both"),
    (dict(backend="cuda"), BackendUnavailableError, "backend 'cuda' is unavailable"),
]


@pytest.mark.parametrize("kw,exc,msg", BAD, ids=lambda x: x if isinstance(x, str) else None)
def test_bad_input(kw, exc, msg):
    args = dict(logp=LOGP, k=2)
    args.update(kw)
    with pytest.raises(exc, match=msg):
        gumbel_topk(args.pop("logp"), args.pop("k"), **args)


# ---------------------------------------------------------------------------------------------------------------
# 5. Reproducibility


def test_seed_and_noise_reproducibility():
    logp = torch.log(torch.full((300, 8), 1 / 8, dtype=F64))
    a = gumbel_topk(logp, 3, seed=1)
    assert torch.equal(a.tokens, gumbel_topk(logp, 3, seed=1).tokens)
    assert not torch.equal(a.tokens, gumbel_topk(logp, 3, seed=2).tokens)
    noise = _uniforms((300, 8), 2)
    b, c = gumbel_topk(logp, 3, noise=noise), gumbel_topk(logp, 3, noise=noise)
    assert torch.equal(b.tokens, c.tokens) and torch.equal(b.score, c.score)
