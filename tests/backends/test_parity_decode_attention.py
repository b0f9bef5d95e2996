"""cpu vs torch parity of decode_attention. Both work in fp32 (fp64 for double) with different summation orders; the
budget is earned from the float64 truth: the cpu error may be at most 2x the reference's own error plus one
rounding of the output dtype, relative to the scale of v (bf16 8e-3, fp16 1e-3, fp32 1e-6, fp64 1e-14)."""

from __future__ import annotations

import pytest
import torch
from backend_parity import requires_cpu_ext

import specdec_kernels as sk
from specdec_kernels import _registry

pytestmark = requires_cpu_ext

ROUNDING = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-6, torch.float64: 1e-14}
SHAPES = [  # (B, H, Hkv, n, S, D): the shipped draft (9 heads over 3, D 64), tails of the 32-wide loops, batches
    (1, 9, 3, 1, 201, 64),
    (1, 9, 3, 4, 37, 64),
    (3, 4, 2, 2, 5, 32),
    (2, 4, 4, 3, 17, 7),
    (1, 2, 1, 8, 1, 48),
    (99, 1, 1, 1, 3, 16),
    (1, 4, 2, 3, 33, 80),  # a multiple of 16, not of 32: the AVX2 path in every x86 build
    (1, 2, 1, 2, 6, 128),  # the AVX2 path's widest head
    (1, 2, 2, 1, 9, 136),  # wider than the AVX2 path takes: the generic loop
]


def check(q, k, v, mask, scale) -> None:
    out = sk.decode_attention(q, k, v, mask, scale, backend="cpu")
    ref = sk.decode_attention(q, k, v, mask, scale, backend="torch")
    assert out.shape == ref.shape and out.dtype == ref.dtype
    truth = sk.decode_attention(q.double(), k.double(), v.double(), mask.double(), scale, backend="torch")
    fin = torch.isfinite(truth)
    assert torch.equal(fin, torch.isfinite(out)) and torch.equal(fin, torch.isfinite(ref))
    vmax = v.double().abs().max().item()
    err_cpu = (out.double() - truth)[fin].abs().max().item() / vmax
    err_ref = (ref.double() - truth)[fin].abs().max().item() / vmax
    assert err_cpu <= 2 * err_ref + ROUNDING[q.dtype], (err_cpu, err_ref)


@pytest.mark.parametrize("dtype", list(ROUNDING), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    b, h, hkv, n, s, d = shape
    g = torch.Generator().manual_seed(b * 1000 + s * 10 + d)
    q = torch.randn(b, h, n, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, s, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, s, d, generator=g).to(dtype)
    mask = torch.zeros(b, 1, n, s, dtype=dtype)
    blocked = torch.rand(b, 1, n, s, generator=g) < 0.3
    blocked[..., 0] = False  # every row keeps a slot
    mask[blocked] = torch.finfo(dtype).min if s % 2 else float("-inf")
    check(q, k, v, mask, d**-0.5)


def test_strided_and_broadcast_inputs() -> None:
    q = torch.randn(2, 3, 9, 4, 32).bfloat16()[:, 1].transpose(1, 2)  # [2, 4, 9, 32] non-contiguous
    kv = torch.randn(2, 2, 2, 6, 32).bfloat16()
    mask = torch.zeros(1, 1, 1, 6).bfloat16()
    check(q[:, :, :3], kv[:, 0], kv[:, 1], mask, 0.2)


def test_row_blocked_everywhere_is_nan() -> None:
    q, k, v = (
        torch.randn(1, 2, 2, 64).bfloat16(),
        torch.randn(1, 1, 4, 64).bfloat16(),
        torch.randn(1, 1, 4, 64).bfloat16(),
    )
    mask = torch.zeros(1, 1, 2, 4).bfloat16()
    mask[0, 0, 1] = float("-inf")
    out = sk.decode_attention(q, k, v, mask, 0.5, backend="cpu")
    assert torch.isnan(out[:, :, 1]).all() and torch.isfinite(out[:, :, 0]).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("blocked", ["min", "-inf"])
def test_a_row_ignores_other_rows_and_blocked_slots(dtype: torch.dtype, blocked: str) -> None:
    """A query row's output is bitwise the same whichever rows share its call and wherever blocked slots sit in the
    cache. A tree node in a verification pass (siblings and stale slots blocked in between) then gets the bits the
    same token gets in a one-token step over the compacted cache, which the target's bf16 greedy equality rests on.
    Odd cache lengths reach the kernels' tails."""
    g = torch.Generator().manual_seed(11)
    b, h, hkv, n, s, d = 1, 4, 2, 6, 23, 64
    q = torch.randn(b, h, n, d, generator=g).to(dtype)
    k, v = torch.randn(2, b, hkv, s, d, generator=g).to(dtype)
    mask = torch.zeros(b, 1, n, s, dtype=dtype)
    mask[..., 3] = torch.finfo(dtype).min  # a slot blocked for every row stays blocked below
    full = sk.decode_attention(q, k, v, mask, 0.125, backend="cpu")
    for r in range(n):
        one = sk.decode_attention(q[:, :, r : r + 1], k, v, mask[:, :, r : r + 1], 0.125, backend="cpu")
        assert torch.equal(one, full[:, :, r : r + 1])
    fill = torch.finfo(dtype).min if blocked == "min" else float("-inf")
    for where in ([0], [5, 6, 7], [9, 17, 23], list(range(0, 23, 3))):
        keep = torch.ones(s + len(where), dtype=torch.bool)
        keep[torch.tensor(where) + torch.arange(len(where))] = False  # inserted slots land at these places
        k2, v2 = (torch.randn(b, hkv, s + len(where), d, generator=g).to(dtype) for _ in range(2))
        k2[:, :, keep], v2[:, :, keep] = k, v
        mask2 = torch.full((b, 1, n, s + len(where)), fill, dtype=dtype)
        mask2[..., keep] = mask
        assert torch.equal(sk.decode_attention(q, k2, v2, mask2, 0.125, backend="cpu"), full), where


def test_opcheck() -> None:
    for dtype in (torch.bfloat16, torch.float32):
        q, k, v = torch.randn(1, 4, 2, 32).to(dtype), torch.randn(1, 2, 5, 32).to(dtype), torch.randn(1, 2, 5, 32)
        torch.library.opcheck(torch.ops.specdec.decode_attention, (q, k, v.to(dtype), torch.zeros(1, 1, 2, 5), 0.3))


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'decode_attention': backend 'cpu' does not support"):
        _registry.resolve("decode_attention", "cpu", torch.device("meta"))
