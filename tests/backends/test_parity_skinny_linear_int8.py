"""cpu vs torch parity of skinny_linear_int8. The int8 weights are exact in fp32 and fp64, so both backends sum the
same products in different orders and scale the sum once; the budget is earned from the float64 truth as for
skinny_linear: the cpu error may be at most 2x the reference's own error on the same call plus one rounding of the
output dtype."""

from __future__ import annotations

import pytest
import torch
from backend_parity import requires_cpu_ext
from test_parity_skinny_linear import ROUNDING, SHAPES, assert_within_budget

import specdec_kernels as sk

pytestmark = requires_cpu_ext


def quantized(n_out: int, n_in: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return sk.quantize_int8(torch.randn((n_out, n_in), generator=g))


def check(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    out = sk.skinny_linear_int8(x, q, s, backend="cpu")
    ref = sk.skinny_linear_int8(x, q, s, backend="torch")
    truth = (x.double() @ q.double().T) * s.double()
    assert_within_budget(out, ref, truth, (x.double().abs() @ q.double().abs().T) * s.double(), x.dtype)


@pytest.mark.parametrize("dtype", list(ROUNDING), ids=str)
@pytest.mark.parametrize(("lead", "n_in", "n_out"), SHAPES, ids=str)
def test_matches_reference(dtype: torch.dtype, lead: tuple[int, ...], n_in: int, n_out: int) -> None:
    g = torch.Generator().manual_seed(n_in * 31 + n_out)
    q, s = quantized(n_out, n_in, g)
    check(torch.randn((*lead, n_in), generator=g).to(dtype), q, s)


def test_special_values_propagate() -> None:
    """NaN and inf in an input row reach that row's outputs as they do in torch; other rows stay finite."""
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(3, 64).to(dtype)
        x[0, 5], x[1, 7] = float("nan"), float("inf")
        q, s = sk.quantize_int8(torch.rand(9, 64) + 0.1)  # positive weights: the inf row sums to +inf
        out, ref = sk.skinny_linear_int8(x, q, s, backend="cpu"), sk.skinny_linear_int8(x, q, s, backend="torch")
        assert torch.isnan(out[0]).all() and torch.isnan(ref[0]).all()
        assert torch.isposinf(out[1]).all() and torch.isposinf(ref[1]).all()
        assert torch.isfinite(out[2]).all()


def test_strided_inputs() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, 100, generator=g).bfloat16()[:, 1]  # non-contiguous rows
    q, s = quantized(200, 100, g)
    check(x, q[::2], s[::2])  # strided weight rows and scales


def test_opcheck() -> None:
    q, s = sk.quantize_int8(torch.randn(9, 40))
    for dtype in (torch.bfloat16, torch.float32):
        torch.library.opcheck(torch.ops.specdec.skinny_linear_int8, (torch.randn(2, 3, 40).to(dtype), q, s))


@pytest.mark.parametrize(("n_in", "n_out"), [(37, 11), (64, 40), (96, 43)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_row_does_not_depend_on_its_call(dtype: torch.dtype, n_in: int, n_out: int) -> None:
    """Row r of an n-row call is bitwise the one-row call on row r, as for skinny_linear: a verification pass gives
    every node what a one-token step gives it."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn((17, n_in), generator=g).to(dtype)
    q, s = quantized(n_out, n_in, g)
    full = sk.skinny_linear_int8(x, q, s, backend="cpu")
    for n in range(1, 18):
        assert torch.equal(sk.skinny_linear_int8(x[:n], q, s, backend="cpu"), full[:n])
        assert torch.equal(sk.skinny_linear_int8(x[n - 1 : n], q, s, backend="cpu"), full[n - 1 : n])


def test_exact_sums_round_like_torch() -> None:
    """Sums exact in fp32 (small integers times integer weights, power-of-two scales) come out bitwise as the
    reference's, on every tile and row count."""
    g = torch.Generator().manual_seed(11)
    x = torch.randint(-8, 9, (17, 96), generator=g).float()
    q = torch.randint(-127, 128, (40, 96), generator=g).to(torch.int8)
    s = 2.0 ** torch.randint(-12, -4, (40,), generator=g).float()
    for dtype in (torch.float32, torch.bfloat16):
        for n in range(1, 18):
            out = sk.skinny_linear_int8(x[:n].to(dtype), q, s, backend="cpu")
            assert torch.equal(out, sk.skinny_linear_int8(x[:n].to(dtype), q, s, backend="torch")), (dtype, n)
