"""skinny_linear_int8 and quantize_int8: int8 weights with one scale per output row; shapes, the quantization's
error bound, and bad inputs (public API)."""

from __future__ import annotations

import pytest
import torch

from specdec_kernels import quantize_int8, skinny_linear_int8


def test_quantization_error_is_at_most_half_a_step() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(33, 70, generator=g) * torch.logspace(-3, 2, 33)[:, None]
    w[5] = 0.0
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (33,)
    assert int(q.abs().max()) <= 127 and bool((q.abs().amax(dim=1)[s > 0] == 127).all())
    assert float(s[5]) == 0.0 and not bool(q[5].any())
    err = (q.float() * s[:, None] - w).abs()
    assert bool((err <= s[:, None] / 2 * (1 + 1e-5) + 1e-30).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.float16], ids=str)
def test_quantized_linear_is_the_dequantized_one(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(7, 5, generator=g)
    q, s = quantize_int8(w.to(dtype))
    x = torch.randn(2, 3, 5, generator=g).to(dtype)
    out = skinny_linear_int8(x, q, s)
    assert out.shape == (2, 3, 7) and out.dtype == dtype
    want = x.double() @ (q.double() * s.double()[:, None]).T
    torch.testing.assert_close(out.double(), want, rtol=1e-2 if dtype != torch.float64 else 1e-12, atol=1e-2)


def test_zero_sizes() -> None:
    q, s = quantize_int8(torch.randn(3, 4))
    assert skinny_linear_int8(torch.randn(0, 4), q, s).shape == (0, 3)
    q0, s0 = quantize_int8(torch.randn(0, 4))
    assert skinny_linear_int8(torch.randn(2, 4), q0, s0).shape == (2, 0)
    qe, se = quantize_int8(torch.randn(3, 0))
    assert torch.equal(skinny_linear_int8(torch.randn(2, 0), qe, se), torch.zeros(2, 3))


Q, S = quantize_int8(torch.randn(3, 4))
BAD = [
    (torch.randn(2, 5), Q, S, ValueError, r"x must be \[\.\.\., in=4\]"),
    (torch.randn(2, 4), Q.float(), S, TypeError, "weight must be int8"),
    (torch.randn(2, 4), Q, S.double(), TypeError, "scale must be float32"),
    (torch.randn(2, 4), Q, S[:2], ValueError, r"scale must be \[out=3\]"),
    (torch.randn(2, 4), Q[0], S, ValueError, "weight must have 2 dimensions"),
    (torch.ones(2, 4, dtype=torch.long), Q, S, TypeError, "x must be a floating"),
    (torch.tensor(1.0), Q, S, ValueError, "x must have at least 1 dimension"),
]


@pytest.mark.parametrize(("x", "q", "s", "exc", "match"), BAD, ids=[b[4][:40] for b in BAD])
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_bad_inputs(x, q, s, exc, match, backend: str) -> None:
    with pytest.raises(exc, match=match):
        skinny_linear_int8(x, q, s, backend=backend)


@pytest.mark.parametrize(
    ("w", "exc", "match"),
    [
        (torch.tensor([[1.0, float("nan")]]), ValueError, "weight must be finite"),
        (torch.tensor([[1.0, float("inf")]]), ValueError, "weight must be finite"),
        (torch.ones(2, 3, dtype=torch.int8), TypeError, "weight must be a floating"),
        (torch.ones(3), ValueError, "weight must have 2 dimensions"),
    ],
)
def test_quantize_bad_inputs(w: torch.Tensor, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        quantize_int8(w)


def test_unvalidated_call_is_the_same_op() -> None:
    q, s = quantize_int8(torch.randn(4, 9))
    x = torch.randn(3, 9).bfloat16()
    assert torch.equal(skinny_linear_int8(x, q, s, validate=False), skinny_linear_int8(x, q, s))
