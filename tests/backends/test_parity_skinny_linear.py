"""cpu vs torch parity of skinny_linear. Both accumulate the same products in fp32 (fp64 for double) in different
orders, so the budget is earned from the float64 truth: the cpu error may be at most 2x the reference's own error
on the same call plus one rounding of the output dtype (bf16 8e-3, fp16 1e-3, fp32 2e-7, fp64 1e-15 relative to
the row's scale)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from backend_parity import requires_cpu_ext

import specdec_kernels as sk
from specdec_kernels import _registry

pytestmark = requires_cpu_ext

ROUNDING = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 2e-7, torch.float64: 1e-15}
SHAPES = [  # (leading shape of x, in, out): decode steps of the shipped drafts, odd sizes, tails of every loop
    ((1,), 576, 4096),
    ((1, 1), 1152, 576),
    ((1, 3), 576, 960),
    ((4,), 1024, 576),
    ((16,), 576, 2048),
    ((5,), 1536, 576),  # the AVX2 path's 3- to 6-row tiles (verification passes of 3-6 nodes)
    ((2, 3), 576, 193),
    ((7,), 576, 130),
    ((2, 3), 33, 7),
    ((5,), 7, 1),
    ((1,), 1, 3),
    ((3,), 31, 5),
    ((40,), 64, 13),
    # the AVX512-BF16 path's tiles: 1-2 rows x 8 W rows, 3-6 rows x 4, more rows 4 at a time then 3-6; whole
    # tiles, padded tiles and tails of the 32-element chunks
    ((2,), 576, 203),
    ((8,), 576, 576),
    ((6,), 1536, 1000),
    ((9,), 96, 19),
    ((11,), 160, 37),
    ((2,), 40, 9),
]


def assert_within_budget(
    out: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor, size: torch.Tensor, dtype: torch.dtype
) -> None:
    """The cpu error against the float64 ``truth``, relative to ``size`` (the size of the terms summed), is at most
    2x the reference's plus one rounding of ``dtype``."""
    assert out.shape == ref.shape and out.dtype == ref.dtype == dtype
    size = size.clamp_min(1e-300)
    err_cpu = ((out.double() - truth).abs() / size).max().item()
    err_ref = ((ref.double() - truth).abs() / size).max().item()
    assert err_cpu <= 2 * err_ref + ROUNDING[dtype], (err_cpu, err_ref)


def check(x: torch.Tensor, w: torch.Tensor) -> None:
    out = sk.skinny_linear(x, w, backend="cpu")
    ref = sk.skinny_linear(x, w, backend="torch")
    truth = F.linear(x.double(), w.double())
    assert_within_budget(out, ref, truth, x.double().abs() @ w.double().abs().T, x.dtype)


@pytest.mark.parametrize("dtype", list(ROUNDING), ids=str)
@pytest.mark.parametrize(("lead", "n_in", "n_out"), SHAPES, ids=str)
def test_matches_reference(dtype: torch.dtype, lead: tuple[int, ...], n_in: int, n_out: int) -> None:
    g = torch.Generator().manual_seed(n_in * 31 + n_out)
    x = torch.randn((*lead, n_in), generator=g).to(dtype)
    w = torch.randn((n_out, n_in), generator=g).to(dtype)
    check(x, w)


def test_special_values_propagate() -> None:
    """NaN and inf in an input row reach that row's outputs as they do in torch; other rows stay finite."""
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(3, 64).to(dtype)
        x[0, 5], x[1, 7] = float("nan"), float("inf")
        w = torch.rand(9, 64).to(dtype) + 0.1  # positive weights: the inf row sums to +inf, not inf - inf
        out, ref = sk.skinny_linear(x, w, backend="cpu"), sk.skinny_linear(x, w, backend="torch")
        assert torch.isnan(out[0]).all() and torch.isnan(ref[0]).all()
        assert torch.isposinf(out[1]).all() and torch.isposinf(ref[1]).all()
        assert torch.isfinite(out[2]).all()


def test_strided_inputs() -> None:
    x = torch.randn(4, 3, 100).bfloat16()[:, 1]  # non-contiguous rows
    w = torch.randn(100, 200).bfloat16()[:, ::2]  # [100, 100] with stride 2
    check(x, w)


def test_opcheck() -> None:
    for dtype in (torch.bfloat16, torch.float32):
        x, w = torch.randn(2, 3, 40).to(dtype), torch.randn(9, 40).to(dtype)
        torch.library.opcheck(torch.ops.specdec.skinny_linear, (x, w))


def test_auto_uses_cpu_on_cpu() -> None:
    assert _registry.resolve("skinny_linear", "auto", torch.device("cpu")) is _registry.resolve(
        "skinny_linear", "cpu", torch.device("cpu")
    )


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'skinny_linear': backend 'cpu' does not support"):
        _registry.resolve("skinny_linear", "cpu", torch.device("meta"))


@pytest.mark.parametrize(("n_in", "n_out"), [(37, 11), (64, 40), (96, 43)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_row_does_not_depend_on_its_call(dtype: torch.dtype, n_in: int, n_out: int) -> None:
    """Row r of an n-row call is bitwise the one-row call on row r: the linears of a verification pass then give
    every node what a one-token step gives it. Odd sizes reach every tail; 64 and 96 inputs (whole 32-element
    chunks) reach the tiles that store whole rows of outputs at once, 43 outputs a padded tile."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn((17, n_in), generator=g).to(dtype)
    w = torch.randn((n_out, n_in), generator=g).to(dtype)
    full = sk.skinny_linear(x, w, backend="cpu")
    for n in range(1, 18):
        assert torch.equal(sk.skinny_linear(x[:n], w, backend="cpu"), full[:n])
        assert torch.equal(sk.skinny_linear(x[n - 1 : n], w, backend="cpu"), full[n - 1 : n])


def test_bf16_outputs_round_to_nearest_even() -> None:
    """Sums that are exact in fp32 (two products of bf16 values by powers of two) come out as torch rounds them to
    bf16, ties to even included, on every tile and every row count; NaN and inf rows stay NaN and inf."""
    g = torch.Generator().manual_seed(11)
    n_in, n_out = 64, 40
    x = torch.zeros(17, n_in)
    x[:, 0] = torch.randn(17, generator=g).bfloat16().float()
    x[:, 1] = torch.randn(17, generator=g).bfloat16().float() * 2.0**-8  # ties and near-ties against x[:, 0]
    x[3, 0], x[5, 0] = float("nan"), float("inf")
    w = torch.zeros(n_out, n_in)
    w[:, 0] = 1.0
    w[:, 1] = 2.0 ** torch.randint(-2, 3, (n_out,), generator=g).float()
    x, w = x.bfloat16(), w.bfloat16()
    want = (x.float() @ w.float().T).bfloat16()  # exact fp32 sums, one rounding
    for n in range(1, 18):
        out = sk.skinny_linear(x[:n], w, backend="cpu")
        assert torch.equal(out.isnan(), want[:n].isnan())
        assert torch.equal(torch.nan_to_num(out), torch.nan_to_num(want[:n])), n
