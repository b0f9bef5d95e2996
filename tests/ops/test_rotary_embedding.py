"""rotary_embedding: HF's apply_rotary_pos_emb in one op. Every product and sum is rounded as torch's ops round
them, so the reference is HF's function bit for bit and so is the cpu kernel, for every dtype (the bitwise sweep
over shapes and layouts is tests/backends/test_parity_rotary_embedding.py); bad inputs (public API)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec_kernels as sk
from specdec_kernels import native, rotary_embedding
from tests.llama_layers import assert_rotary_cpu_is_reference, assert_same_bits, projected, rope_tables

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]


def hf_apply(q, k, cos, sin):
    """transformers' own function (the reference must equal it)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    return apply_rotary_pos_emb(q, k, cos, sin)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reference_is_hf_apply_rotary_pos_emb(dtype: torch.dtype) -> None:
    """With a tiny random Llama's own rotary embedding: the torch backend is HF's function bit for bit, and so is the
    cpu kernel."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    g = torch.Generator().manual_seed(0)
    q, k = projected(2, 4, 5, 16, dtype, g), projected(2, 2, 5, 16, dtype, g)
    position_ids = torch.tensor([[7, 8, 9, 10, 11], [0, 1, 2, 2, 3]])
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(q, position_ids)
    assert cos.dtype == dtype and cos.shape == (2, 5, 16)
    want_q, want_k = hf_apply(q, k, cos, sin)
    backends = ["torch", "cpu"] if native.HAVE_CPU else ["torch"]
    for backend in backends:
        out_q, out_k = rotary_embedding(q, k, cos, sin, backend=backend)
        assert out_q.is_contiguous() and out_k.is_contiguous()
        assert_same_bits(out_q, want_q)
        assert_same_bits(out_k, want_k)


@pytest.mark.skipif(not native.HAVE_CPU, reason="the C++ extension is not built")
@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 3),
    hkv=st.integers(1, 3),
    group=st.integers(1, 3),
    n=st.integers(1, 16),
    half=st.integers(1, 40),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    shared=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_cpu_equals_reference_property(b, hkv, group, n, half, dtype, shared, seed) -> None:
    """Any batch, GQA grouping, width, even head dim and cos/sin sharing: the cpu kernel gives the reference's bits."""
    g = torch.Generator().manual_seed(seed)
    d = 2 * half
    q, k = projected(b, hkv * group, n, d, dtype, g, 4.0), projected(b, hkv, n, d, dtype, g, 4.0)
    cos, sin = rope_tables(1 if shared else b, n, d, dtype, g)
    assert_rotary_cpu_is_reference(q, k, cos, sin)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 8), half=st.integers(1, 24), seed=st.integers(0, 2**31 - 1))
def test_rotation_keeps_each_pair_length_property(n: int, half: int, seed: int) -> None:
    """In fp64 the op is a rotation of each pair (x_j, x_{j + D/2}): the pair's length is kept, and the angle 0
    (position 0: cos = 1, sin = 0) is the identity, bit for bit on every backend."""
    g = torch.Generator().manual_seed(seed)
    d = 2 * half
    q, k = projected(1, 3, n, d, torch.float64, g), projected(1, 1, n, d, torch.float64, g)
    cos, sin = rope_tables(1, n, d, torch.float64, g)
    out_q, _ = rotary_embedding(q, k, cos, sin, backend="torch")

    def pair_len(x: torch.Tensor) -> torch.Tensor:
        return x[..., :half].square() + x[..., half:].square()

    torch.testing.assert_close(pair_len(out_q), pair_len(q), rtol=1e-12, atol=1e-12)
    for backend in ["torch", "cpu"] if native.HAVE_CPU else ["torch"]:
        same_q, same_k = rotary_embedding(q, k, torch.ones_like(cos), torch.zeros_like(sin), backend=backend)
        assert torch.equal(same_q, q) and torch.equal(same_k, k)


def test_rotation_of_a_pair() -> None:
    """Pair j = (x_j, x_{j + D/2}) turns by its angle a_j: (x_j cos a_j - x_{j+D/2} sin a_j, x_{j+D/2} cos a_j +
    x_j sin a_j)."""
    q = torch.tensor([1.0, 0.0, 0.0, 2.0]).view(1, 1, 1, 4)  # pair 0 = (1, 0), pair 1 = (0, 2)
    a = torch.tensor([0.5, 0.25])
    cos, sin = a.cos().repeat(2).view(1, 1, 4), a.sin().repeat(2).view(1, 1, 4)
    want = torch.stack([a[0].cos(), -2 * a[1].sin(), a[0].sin(), 2 * a[1].cos()])
    for backend in ("torch", "auto"):
        out_q, out_k = rotary_embedding(q, q[:, :0], cos, sin, backend=backend)
        torch.testing.assert_close(out_q.view(4), want, rtol=1e-6, atol=1e-7)
        assert out_k.shape == (1, 0, 1, 4)


def test_unvalidated_call_is_the_same_op() -> None:
    g = torch.Generator().manual_seed(2)
    q, k = projected(1, 9, 2, 64, torch.bfloat16, g), projected(1, 3, 2, 64, torch.bfloat16, g)
    cos, sin = rope_tables(1, 2, 64, torch.bfloat16, g)
    for a, b in zip(rotary_embedding(q, k, cos, sin, validate=False), rotary_embedding(q, k, cos, sin), strict=True):
        assert torch.equal(a, b)


def _bad():
    q, k = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 3, 8)
    c = torch.randn(2, 3, 8)
    return [
        ((q[0], k, c, c), ValueError, "q must have 4 dimensions"),
        ((q, k[0], c, c), ValueError, "k must have 4 dimensions"),
        ((q, k, c[0], c), ValueError, "cos must have 3 dimensions"),
        ((q, k, c, c[None]), ValueError, "sin must have 3 dimensions"),
        ((q[..., :7], k[..., :7], c[..., :7], c[..., :7]), ValueError, "head dim D must be even"),
        ((q, k[:1], c, c), ValueError, r"k must be \[B=2, Hkv, n=3, D=8\] to match q"),
        ((q, k[:, :, :2], c, c), ValueError, r"k must be \[B=2, Hkv, n=3, D=8\] to match q"),
        ((q, k[..., :4], c, c), ValueError, r"k must be \[B=2, Hkv, n=3, D=8\] to match q"),
        ((q, k, c[:, :2], c), ValueError, r"cos must be \[B=2, n=3, D=8\] or \[1, n=3, D=8\]"),
        ((q, k, c, c[..., :4]), ValueError, r"sin must be \[B=2, n=3, D=8\] or \[1, n=3, D=8\]"),
        ((q, k, torch.randn(3, 3, 8), c), ValueError, r"cos must be \[B=2, n=3, D=8\]"),
        ((q, k.double(), c, c), TypeError, "q, k, cos and sin must share a dtype"),
        ((q, k, c.bfloat16(), c), TypeError, "q, k, cos and sin must share a dtype"),
        ((q.long(), k.long(), c.long(), c.long()), TypeError, "q must be a floating"),
        (([0.0], k, c, c), TypeError, "q must be a torch.Tensor"),
        ((q, k, c, c.to("meta")), ValueError, "all tensors must be on one device"),
    ]


@pytest.mark.parametrize("case", range(16))
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_bad_inputs(case: int, backend: str) -> None:
    args, exc, match = _bad()[case]
    with pytest.raises(exc, match=match):
        rotary_embedding(*args, backend=backend)


def test_exported() -> None:
    assert "rotary_embedding" in sk.__all__ and sk.rotary_embedding is rotary_embedding
    assert sk.available_backends("rotary_embedding")[0] == "torch"
