"""cpu vs torch parity of rms_norm. The kernel computes HF's formula with its own summation order of the mean of
squares, and nothing else differs: that order is pinned exactly (the cpu output is bitwise the formula summed in 16
lanes, a fixed tree, then the tail; tests/llama_layers.py). Against the reference (torch's mean) the budget is, per
dtype:

* bf16/fp16: the fp32 scale 1 / sqrt(mean + eps) may differ by a few fp32 ulps, so the normalised value rounds to
  the same half-precision number unless it lies that close to a rounding boundary: with weight 1 at most 1 ulp, on
  at most 0.1 % of the elements (about 1e-5 measured); with a weight the product rounds that ulp again: at most 2
  ulps of the output, on the same elements.
* fp32: earned from the float64 truth: the cpu error (relative, per element) at most 2x the reference's own worst
  error plus 2 fp32 eps.
* fp64: at most 8 ulps (two orders of a sum of D squares; 6 measured at D = 2048).
"""

from __future__ import annotations

import pytest
import torch
from backend_parity import requires_cpu_ext

import specdec_kernels as sk
from specdec_kernels import _registry
from tests.llama_layers import norm_case, rms_norm_in_kernel_order, ulps

pytestmark = requires_cpu_ext

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
#: a decode step's rows of SmolLM2-135M (D = 576; 1 token, a draft tree, a verification pass), wider models, tails
SHAPES = [(1, 576), (8, 576), (16, 576), (1, 2048), (3, 5, 64), (7, 1000), (4, 15), (3, 1), (2, 3, 40)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cpu_is_the_formula_in_its_summation_order(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x, w = norm_case(shape, dtype, seed=shape[-1] * 7 + len(shape))
    out = sk.rms_norm(x, w, 1e-5, backend="cpu")
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    assert torch.equal(out, rms_norm_in_kernel_order(x, w, 1e-5))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dim", [576, 2048, 64, 1000])
def test_half_precision_budget(dtype: torch.dtype, dim: int) -> None:
    x, w = norm_case((512, dim), dtype, seed=dim)
    for weight, max_ulps in ((torch.ones(dim, dtype=dtype), 1), (w, 2)):
        dist = ulps(sk.rms_norm(x, weight, 1e-5, backend="cpu"), sk.rms_norm(x, weight, 1e-5, backend="torch"))
        assert int(dist.max()) <= max_ulps, int(dist.max())
        assert float((dist > 0).double().mean()) <= 1e-3


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fp32_budget_is_earned_from_the_truth(shape: tuple[int, ...]) -> None:
    x, w = norm_case(shape, torch.float32, seed=shape[-1])
    truth = sk.rms_norm(x.double(), w.double(), 1e-5, backend="torch")

    def err(out: torch.Tensor) -> float:
        return float(((out.double() - truth).abs() / truth.abs().clamp_min(1e-300)).max())

    err_cpu, err_ref = err(sk.rms_norm(x, w, 1e-5, backend="cpu")), err(sk.rms_norm(x, w, 1e-5, backend="torch"))
    assert err_cpu <= 2 * err_ref + 2 * torch.finfo(torch.float32).eps, (err_cpu, err_ref)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fp64_budget(shape: tuple[int, ...]) -> None:
    x, w = norm_case(shape, torch.float64, seed=shape[-1])
    dist = ulps(sk.rms_norm(x, w, 1e-5, backend="cpu"), sk.rms_norm(x, w, 1e-5, backend="torch"))
    assert int(dist.max()) <= 8, int(dist.max())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [576, 64, 1000, 17])
def test_a_row_does_not_depend_on_its_call(dtype: torch.dtype, dim: int) -> None:
    """Row r of a call is bitwise the call on row r alone, in 1-D, 2-D and 3-D inputs: a verification pass then
    normalises every node as a one-token step does."""
    x, w = norm_case((12, dim), dtype, seed=dim)
    full = sk.rms_norm(x, w, 1e-6, backend="cpu")
    for r in range(12):
        assert torch.equal(sk.rms_norm(x[r : r + 1], w, 1e-6, backend="cpu"), full[r : r + 1])
        assert torch.equal(sk.rms_norm(x[r], w, 1e-6, backend="cpu"), full[r])
    assert torch.equal(sk.rms_norm(x.view(3, 4, dim), w, 1e-6, backend="cpu"), full.view(3, 4, dim))


def test_a_call_split_over_threads() -> None:
    """A prefill-sized call (enough elements for the kernel to use every torch thread) is its rows' one-row calls."""
    x, w = norm_case((600, 576), torch.bfloat16, seed=12)
    full = sk.rms_norm(x, w, 1e-5, backend="cpu")
    assert torch.equal(full, rms_norm_in_kernel_order(x, w, 1e-5))
    assert all(torch.equal(sk.rms_norm(x[r], w, 1e-5, backend="cpu"), full[r]) for r in range(0, 600, 37))


def test_strided_inputs() -> None:
    """Rows with a stride (a slice of a wider tensor) are read in place; a last dimension that is not contiguous
    is copied first; either way the bits of the contiguous call, in a contiguous output."""
    x, w = norm_case((4, 3, 200), torch.bfloat16, seed=3)
    for t in (x[:, 1], x[..., :100], x.transpose(0, 2)[:50].transpose(0, 2), x[:, :, ::2]):
        out = sk.rms_norm(t, w[: t.shape[-1]], 1e-5, backend="cpu")
        assert out.is_contiguous() and out.shape == t.shape
        assert torch.equal(out, sk.rms_norm(t.contiguous(), w[: t.shape[-1]], 1e-5, backend="cpu"))


def test_special_values_propagate_like_torch() -> None:
    """A NaN row stays NaN; an inf makes the scale 0 (inf itself gives NaN, the rest of its row 0); a zero row with
    eps > 0 stays 0; the other rows are untouched."""
    for dtype in (torch.bfloat16, torch.float32):
        x, w = norm_case((4, 48), dtype, seed=4)
        x[0, 5], x[1, 7], x[2] = float("nan"), float("inf"), 0.0
        out, ref = sk.rms_norm(x, w, 1e-5, backend="cpu"), sk.rms_norm(x, w, 1e-5, backend="torch")
        assert torch.equal(out.isnan(), ref.isnan()) and out[0].isnan().all() and out[1, 7].isnan()
        assert torch.equal(torch.nan_to_num(out[1:3]), torch.nan_to_num(ref[1:3]))
        assert torch.isfinite(out[3]).all()


def test_opcheck() -> None:
    for dtype in (torch.bfloat16, torch.float32):
        x, w = torch.randn(2, 3, 40).to(dtype), torch.randn(40).to(dtype)
        torch.library.opcheck(torch.ops.specdec.rms_norm, (x, w, 1e-5))


def test_auto_uses_cpu_on_cpu() -> None:
    cpu = torch.device("cpu")
    assert _registry.resolve("rms_norm", "auto", cpu) is _registry.resolve("rms_norm", "cpu", cpu)


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'rms_norm': backend 'cpu' does not support"):
        _registry.resolve("rms_norm", "cpu", torch.device("meta"))


def test_kernel_checks_its_arguments() -> None:
    """Called without the public op's checks, the kernel still refuses what it cannot read."""
    with pytest.raises(RuntimeError, match=r"weight must be \[D=8\]"):
        torch.ops.specdec.rms_norm(torch.randn(2, 8), torch.ones(7), 1e-5)
    with pytest.raises(RuntimeError, match="eps must be a finite number >= 0"):
        torch.ops.specdec.rms_norm(torch.randn(2, 8), torch.ones(8), -1.0)
    with pytest.raises(RuntimeError, match="expected a floating dtype"):
        torch.ops.specdec.rms_norm(torch.ones(2, 8, dtype=torch.long), torch.ones(8, dtype=torch.long), 1e-5)
