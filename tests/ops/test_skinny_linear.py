"""skinny_linear: x weight^T for the few rows of a decode step; shapes, dtypes and bad inputs (public API)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdec_kernels import skinny_linear


@pytest.mark.parametrize("shape", [(5,), (1, 5), (2, 3, 5)])
def test_leading_shape_is_kept(shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, dtype=torch.float64)
    w = torch.randn(7, 5, dtype=torch.float64)
    out = skinny_linear(x, w)
    assert out.shape == (*shape[:-1], 7) and out.dtype == torch.float64
    torch.testing.assert_close(out, x @ w.T, rtol=1e-12, atol=1e-12)


def test_zero_sizes() -> None:
    assert skinny_linear(torch.randn(0, 4), torch.randn(3, 4)).shape == (0, 3)
    assert skinny_linear(torch.randn(2, 4), torch.randn(0, 4)).shape == (2, 0)
    assert torch.equal(skinny_linear(torch.randn(2, 0), torch.randn(3, 0)), torch.zeros(2, 3))


BAD = [
    (torch.randn(2, 4), torch.randn(3, 5), ValueError, r"x must be \[\.\.\., in=5\]"),
    (torch.randn(2, 4), torch.randn(4), ValueError, "weight must have 2 dimensions"),
    (torch.tensor(1.0), torch.randn(3, 1), ValueError, "x must have at least 1 dimension"),
    (torch.randn(2, 4), torch.randn(3, 4, dtype=torch.float64), TypeError, "x and weight must share a dtype"),
    (torch.ones(2, 4, dtype=torch.long), torch.ones(3, 4, dtype=torch.long), TypeError, "x must be a floating"),
    ([1.0, 2.0], torch.randn(3, 2), TypeError, "x must be a torch.Tensor"),
]


@pytest.mark.parametrize(("x", "w", "exc", "match"), BAD, ids=[b[3][:40] for b in BAD])
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_bad_inputs(x, w, exc, match, backend: str) -> None:
    with pytest.raises(exc, match=match):
        skinny_linear(x, w, backend=backend)


def test_reference_is_torch_linear() -> None:
    x, w = torch.randn(3, 9).bfloat16(), torch.randn(4, 9).bfloat16()
    assert torch.equal(skinny_linear(x, w, backend="torch"), F.linear(x, w))


def test_unvalidated_call_is_the_same_op() -> None:
    x, w = torch.randn(3, 9).bfloat16(), torch.randn(4, 9).bfloat16()
    assert torch.equal(skinny_linear(x, w, validate=False), skinny_linear(x, w))
    assert torch.equal(skinny_linear(x, w, backend="torch", validate=False), F.linear(x, w))


def test_the_built_path_is_reported() -> None:
    from specdec_kernels import native

    assert native.skinny_linear_isa() in ("amx", "avx512bf16", "avx512", "avx2", "portable", "none")
