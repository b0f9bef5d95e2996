"""rms_norm: HF Llama's RMSNorm in one op. The reference is HF's module bit for bit; the cpu kernel is HF's formula
with its own summation order of the mean of squares (budgets in tests/backends/test_parity_rms_norm.py); eps, edges
and bad inputs (public API)."""

from __future__ import annotations

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import native, rms_norm
from tests.llama_layers import norm_case, rms_norm_in_kernel_order


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64], ids=str)
def test_reference_is_hf_llama_rms_norm(dtype: torch.dtype) -> None:
    """A tiny random Llama's own norm layer: the torch backend is LlamaRMSNorm.forward bit for bit (a double input
    HF computes in fp32, the reference in fp64), the cpu kernel is its formula in the kernel's summation order."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    norm = model.model.layers[0].input_layernorm
    assert isinstance(norm, LlamaRMSNorm)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(48, generator=torch.Generator().manual_seed(0)))
        x = torch.randn(2, 5, 48, generator=torch.Generator().manual_seed(1)).to(dtype)
        want = norm(x)
        ref = rms_norm(x, norm.weight, norm.variance_epsilon, backend="torch")
        if dtype == torch.float64:
            torch.testing.assert_close(ref, want, rtol=1e-6, atol=0)
        else:
            assert torch.equal(ref, want)
        if native.HAVE_CPU:
            out = rms_norm(x, norm.weight, norm.variance_epsilon, backend="cpu")
            assert torch.equal(out, rms_norm_in_kernel_order(x, norm.weight, norm.variance_epsilon))


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_eps_and_edges(backend: str) -> None:
    x = torch.zeros(2, 8)
    assert torch.isnan(rms_norm(x, torch.ones(8), 0.0, backend=backend)).all()  # 0 / sqrt(0), as HF gives
    assert torch.equal(rms_norm(x, torch.ones(8), 1e-6, backend=backend), x)
    assert rms_norm(torch.randn(0, 8), torch.ones(8), 1e-6, backend=backend).shape == (0, 8)
    assert rms_norm(torch.randn(3, 0), torch.ones(0), 1e-6, backend=backend).shape == (3, 0)
    one = rms_norm(torch.tensor([[-3.0, 4.0]]), torch.tensor([1.0, 2.0]), 0.0, backend=backend)
    torch.testing.assert_close(one, torch.tensor([[-3.0, 8.0]]) / 12.5**0.5, rtol=1e-6, atol=0)
    vec = rms_norm(torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.full((4,), 2.0), 1e-6, backend=backend)  # 1-D x
    assert vec.shape == (4,) and torch.allclose(vec, torch.full((4,), 2.0), rtol=1e-6)


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_special_values_stay_in_their_row(backend: str) -> None:
    x = torch.randn(3, 64).bfloat16()
    x[0, 5], x[1, 7] = float("nan"), float("inf")
    out = rms_norm(x, torch.ones(64).bfloat16(), 1e-5, backend=backend)
    assert torch.isnan(out[0]).all() and torch.isnan(out[1, 7]) and (out[1, :7] == 0).all()
    assert torch.isfinite(out[2]).all()


def test_unvalidated_call_is_the_same_op() -> None:
    x, w = norm_case((3, 64), torch.bfloat16, seed=9)
    assert torch.equal(rms_norm(x, w, 1e-5, validate=False), rms_norm(x, w, 1e-5))
    assert torch.equal(rms_norm(x, w, 1e-5, backend="torch", validate=False), rms_norm(x, w, 1e-5, backend="torch"))


BAD = [
    ((torch.tensor(1.0), torch.ones(1), 1e-5), ValueError, "x must have at least 1 dimension"),
    ((torch.randn(2, 8), torch.ones(2, 8), 1e-5), ValueError, "weight must have 1 dimensions"),
    ((torch.randn(2, 8), torch.ones(7), 1e-5), ValueError, r"weight must be \[D=8\] to match x"),
    ((torch.randn(2, 8), torch.ones(8).double(), 1e-5), TypeError, "x and weight must share a dtype"),
    ((torch.ones(2, 8, dtype=torch.long), torch.ones(8, dtype=torch.long), 1e-5), TypeError, "x must be a floating"),
    (([1.0, 2.0], torch.ones(2), 1e-5), TypeError, "x must be a torch.Tensor"),
    ((torch.randn(2, 8), [1.0] * 8, 1e-5), TypeError, "weight must be a torch.Tensor"),
    ((torch.randn(2, 8), torch.ones(8), -1e-5), ValueError, "eps must be a finite number >= 0"),
    ((torch.randn(2, 8), torch.ones(8), float("inf")), ValueError, "eps must be a finite number >= 0"),
    ((torch.randn(2, 8), torch.ones(8), float("nan")), ValueError, "eps must be a finite number >= 0"),
    ((torch.randn(2, 8), torch.ones(8), True), ValueError, "eps must be a finite number >= 0"),
    ((torch.randn(2, 8), torch.ones(8), "1e-5"), ValueError, "eps must be a finite number >= 0"),
    ((torch.randn(2, 8), torch.ones(8, device="meta"), 1e-5), ValueError, "all tensors must be on one device"),
]


@pytest.mark.parametrize(("args", "exc", "match"), BAD, ids=[b[2][:40] for b in BAD])
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_bad_inputs(args, exc, match: str, backend: str) -> None:
    with pytest.raises(exc, match=match):
        rms_norm(*args, backend=backend)


def test_exported() -> None:
    assert "rms_norm" in sk.__all__ and sk.rms_norm is rms_norm
    assert sk.available_backends("rms_norm")[0] == "torch"
