"""cpu vs torch parity of rotary_embedding: bitwise for every dtype. HF's formula rounds each product and the sum
to the dtype (bf16/fp16 ops compute in fp32 and round once), the kernel does the same roundings (IEEE, no FMA:
the extension is built with -ffp-contract=off) on every path, vector lanes and scalar tails alike, so there is no
budget: the bit patterns must be equal, signed zeros included, NaN at the same places."""

from __future__ import annotations

import pytest
import torch
from backend_parity import requires_cpu_ext

import specdec_kernels as sk
from specdec_kernels import _registry
from tests.llama_layers import assert_rotary_cpu_is_reference, projected, rope_tables

pytestmark = requires_cpu_ext

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
SHAPES = [  # (B, H, Hkv, n, D): SmolLM2's 9 query heads over 3 KV heads, decode and verification widths, tails
    (1, 9, 3, 1, 64),
    (1, 9, 3, 8, 64),
    (1, 9, 3, 16, 64),
    (2, 9, 3, 5, 64),
    (3, 4, 1, 2, 40),  # half = 20: one vector of 16 (8) and a scalar tail
    (1, 2, 2, 3, 2),
    (2, 3, 1, 7, 128),
    (1, 1, 1, 4, 34),
    (3, 2, 2, 1, 96),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cpu_is_bitwise_the_reference(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """Strided q/k as a model makes them and their contiguous copies, cos/sin per batch row and shared [1, n, D]."""
    b, h, hkv, n, d = shape
    g = torch.Generator().manual_seed(b * 1000 + n * 10 + d)
    q, k = projected(b, h, n, d, dtype, g), projected(b, hkv, n, d, dtype, g)
    cos, sin = rope_tables(b, n, d, dtype, g)
    for c, s in ((cos, sin), (cos[:1], sin[:1])):
        assert_rotary_cpu_is_reference(q, k, c, s)
        assert_rotary_cpu_is_reference(q.contiguous(), k.contiguous(), c, s)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_rounding_across_magnitudes(dtype: torch.dtype) -> None:
    """Inputs over the whole range of the dtype, so that products overflow to inf (and inf - inf gives NaN), fall
    into subnormals or to zero, and signed zeros meet: every rounding is torch's; arbitrary cos/sin, not a table."""
    g = torch.Generator().manual_seed(5)
    info = torch.finfo(dtype)
    lo = torch.log2(torch.tensor(max(info.tiny, 1e-30)))
    span = torch.log2(torch.tensor(info.max)) - lo

    def wide(*shape: int) -> torch.Tensor:
        t = (2 ** (lo + span * torch.rand(shape, generator=g)) * 0.99).to(dtype)
        t = torch.where(torch.rand(shape, generator=g) < 0.5, -t, t)
        t[torch.rand(shape, generator=g) < 0.05] = 0.0
        t[torch.rand(shape, generator=g) < 0.05] = -0.0
        return t

    q, k = wide(2, 3, 4, 48), wide(2, 1, 4, 48)
    for c, s in ((wide(2, 4, 48), wide(2, 4, 48)), (wide(1, 4, 48).clamp(-4, 4), wide(1, 4, 48).clamp(-4, 4))):
        assert torch.isinf(sk.rotary_embedding(q, k, c, s, backend="torch")[0]).any()  # the range is reached
        assert_rotary_cpu_is_reference(q, k, c, s)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_every_half_precision_input(dtype: torch.dtype) -> None:
    """q holds every 16-bit pattern once (subnormals, infinities and NaNs included) against random cos/sin: each
    load and each rounding of the products and sums (scalar conversions on the portable path, vector ones elsewhere)
    agrees with torch's."""
    g = torch.Generator().manual_seed(6)
    q = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).view(1, 1, 1024, 64)
    cos = (torch.randn(1, 1024, 64, generator=g) * 4).to(dtype)
    sin = (torch.randn(1, 1024, 64, generator=g) * 4).to(dtype)
    assert_rotary_cpu_is_reference(q, q, cos, sin)


def test_views_of_a_fused_projection() -> None:
    """q and k cut from one fused qkv output (row stride 3 H D) and cos/sin with a batch stride of 0 (expand)."""
    g = torch.Generator().manual_seed(8)
    b, n, h, d = 2, 3, 4, 32
    qkv = torch.randn(b, n, 3 * h * d, generator=g).bfloat16()
    q = qkv[..., : h * d].view(b, n, h, d).transpose(1, 2)
    k = qkv[..., h * d : 2 * h * d].view(b, n, h, d).transpose(1, 2)
    cos, sin = rope_tables(1, n, d, torch.bfloat16, g)
    cos, sin = cos.expand(b, n, d), sin.expand(b, n, d)
    assert_rotary_cpu_is_reference(q, k, cos, sin)


def test_a_call_split_over_threads() -> None:
    """A prefill-sized call (enough elements for the kernel to use every torch thread) gives the reference's bits."""
    g = torch.Generator().manual_seed(9)
    q, k = projected(2, 9, 300, 64, torch.bfloat16, g), projected(2, 3, 300, 64, torch.bfloat16, g)
    cos, sin = rope_tables(2, 300, 64, torch.bfloat16, g)
    assert_rotary_cpu_is_reference(q, k, cos, sin)


def test_opcheck() -> None:
    for dtype in (torch.bfloat16, torch.float32):
        g = torch.Generator().manual_seed(1)
        q, k = projected(1, 4, 2, 32, dtype, g), projected(1, 2, 2, 32, dtype, g)
        cos, sin = rope_tables(1, 2, 32, dtype, g)
        torch.library.opcheck(torch.ops.specdec.rotary_embedding, (q, k, cos, sin))


def test_auto_uses_cpu_on_cpu() -> None:
    cpu = torch.device("cpu")
    assert _registry.resolve("rotary_embedding", "auto", cpu) is _registry.resolve("rotary_embedding", "cpu", cpu)


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'rotary_embedding': backend 'cpu' does not support"):
        _registry.resolve("rotary_embedding", "cpu", torch.device("meta"))


def test_kernel_checks_its_arguments() -> None:
    """Called without the public op's checks, the kernel still refuses what it cannot read."""
    q, k, c = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8), torch.randn(1, 3, 8)
    with pytest.raises(RuntimeError, match="the head dim D must be even"):
        torch.ops.specdec.rotary_embedding(q[..., :7], k[..., :7], c[..., :7], c[..., :7])
    with pytest.raises(RuntimeError, match=r"cos and sin must be \[B=1 or 1, n=3, D=8\]"):
        torch.ops.specdec.rotary_embedding(q, k, c[:, :2], c)
    with pytest.raises(RuntimeError, match="q, k, cos and sin must share a dtype"):
        torch.ops.specdec.rotary_embedding(q, k.double(), c, c)
