"""decode_attention: grouped-query attention of a few rows over a KV cache; semantics and bad inputs (public API)."""

from __future__ import annotations

import pytest
import torch

from specdec_kernels import decode_attention


def naive(q, k, v, mask, scale):
    """Per head, in float64, with HF's repeat_kv grouping (query head h reads KV head h // (H / Hkv))."""
    b, h, n, d = q.shape
    group = h // k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    m = mask.double().expand(b, 1, n, k.shape[2])
    for bi in range(b):
        for hi in range(h):
            kk, vv = k[bi, hi // group].double(), v[bi, hi // group].double()
            w = torch.softmax(q[bi, hi].double() @ kk.T * scale + m[bi, 0], dim=-1)
            out[bi, hi] = w @ vv
    return out


@pytest.mark.parametrize("backend", ["torch", "auto"])
@pytest.mark.parametrize(("heads", "kv_heads"), [(1, 1), (4, 2), (9, 3), (6, 1)])
def test_matches_per_head_softmax(backend: str, heads: int, kv_heads: int) -> None:
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    q = torch.randn(2, heads, 3, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, kv_heads, 11, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, kv_heads, 11, 16, generator=g, dtype=torch.float64)
    mask = torch.zeros(2, 1, 3, 11, dtype=torch.float64)
    mask[0, 0, 0, 4:] = float("-inf")  # a tree row: sees the past and itself
    mask[1, 0, 2, :3] = torch.finfo(torch.float64).min
    out = decode_attention(q, k, v, mask, 0.25, backend=backend)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out, naive(q, k, v, mask, 0.25), rtol=1e-12, atol=1e-12)


def test_mask_broadcasts_over_batch_and_rows() -> None:
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.zeros(1, 1, 1, 5)
    mask[..., 1] = float("-inf")
    full = mask.expand(2, 1, 3, 5).clone()
    torch.testing.assert_close(decode_attention(q, k, v, mask, 0.3), decode_attention(q, k, v, full, 0.3))


def test_row_blocked_everywhere_is_nan_like_softmax() -> None:
    q, k, v = torch.randn(1, 2, 2, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    mask = torch.zeros(1, 1, 2, 4)
    mask[0, 0, 1] = float("-inf")
    for backend in ("torch", "auto"):
        out = decode_attention(q, k, v, mask, 0.5, backend=backend)
        assert torch.isnan(out[:, :, 1]).all() and torch.isfinite(out[:, :, 0]).all()


def _bad():
    q, k, m = torch.randn(1, 4, 2, 8), torch.randn(1, 2, 5, 8), torch.zeros(1, 1, 2, 5)
    return [
        ((q[0], k, k, m, 1.0), ValueError, "q must have 4 dimensions"),
        ((q, k, k[..., :4], m, 1.0), ValueError, r"k and v must be \[B=1, Hkv, S, D=8\]"),
        ((q, torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8), m, 1.0), ValueError, "multiple of k's heads"),
        ((q, k, k, torch.zeros(1, 1, 2, 4), 1.0), ValueError, r"mask must broadcast to \[B, 1, n, S\]"),
        ((q, k, k, torch.zeros(1, 4, 2, 5), 1.0), ValueError, r"mask must broadcast to \[B, 1, n, S\]"),
        ((q, k.double(), k.double(), m, 1.0), TypeError, "q, k and v must share a dtype"),
        ((q, k, k, m, float("nan")), ValueError, "scale must be a finite number"),
        ((q, k[:, :, :0], k[:, :, :0], m[..., :0], 1.0), ValueError, "at least one cache slot"),
        ((q.long(), k.long(), k.long(), m, 1.0), TypeError, "q must be a floating"),
    ]


@pytest.mark.parametrize("case", range(9))
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_bad_inputs(case: int, backend: str) -> None:
    args, exc, match = _bad()[case]
    with pytest.raises(exc, match=match):
        decode_attention(*args, backend=backend)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("dim", [64, 128])
def test_blocked_slots_do_not_change_a_row(dtype: torch.dtype, dim: int) -> None:
    """A tree node sees the cache and its ancestors, with blocked slots (other branches) between them; a one-token
    step sees the same keys packed together. The row must come out bitwise the same either way: the kernels sum the
    softmax and the weighted values in slot order, where a blocked slot adds an exact 0."""
    g = torch.Generator().manual_seed(dim)
    s_len = 203
    q = torch.randn(1, 9, 1, dim, generator=g).to(dtype)
    k = torch.randn(1, 3, s_len, dim, generator=g).to(dtype)
    v = torch.randn(1, 3, s_len, dim, generator=g).to(dtype)
    for trial in range(4):
        visible = torch.rand(s_len, generator=g) < (0.9 if trial % 2 else 0.5)
        visible[0] = True
        mask = torch.zeros(1, 1, 1, s_len)
        mask[..., ~visible] = float("-inf")
        spread = decode_attention(q, k, v, mask, dim**-0.5, backend="auto")
        packed = decode_attention(
            q, k[:, :, visible], v[:, :, visible], torch.zeros(1, 1, 1, int(visible.sum())), dim**-0.5, backend="auto"
        )
        assert torch.equal(spread, packed), trial


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (8, 2, 96), (4, 1, 256), (2, 2, 48)])
def test_a_row_comes_out_the_same_with_or_without_other_rows(
    dtype: torch.dtype, heads: int, kv_heads: int, dim: int
) -> None:
    """The kernels may share a cache slot's values between the rows of a KV head (its query heads, a tree's nodes);
    each row must still come out bitwise as it does alone (a tree node = the same token in a one-token step)."""
    g = torch.Generator().manual_seed(heads * dim)
    n, s_len = 11, 57
    q = torch.randn(2, heads, n, dim, generator=g).to(dtype)
    k = torch.randn(2, kv_heads, s_len, dim, generator=g).to(dtype)
    v = torch.randn(2, kv_heads, s_len, dim, generator=g).to(dtype)
    mask = torch.where(torch.rand(2, 1, n, s_len, generator=g) < 0.3, float("-inf"), 0.0)
    mask[..., 0] = 0.0
    together = decode_attention(q, k, v, mask, dim**-0.5, backend="auto")
    group = heads // kv_heads
    for b in range(2):
        for h in range(heads):
            for i in range(n):
                kv = slice(h // group, h // group + 1)
                alone = decode_attention(
                    q[b : b + 1, h : h + 1, i : i + 1], k[b : b + 1, kv], v[b : b + 1, kv],
                    mask[b : b + 1, :, i : i + 1], dim**-0.5, backend="auto",
                )  # fmt: skip
                assert torch.equal(alone[0, 0, 0], together[b, h, i]), (b, h, i)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_cache_views_with_room_read_like_packed_keys(dtype: torch.dtype, backend: str) -> None:
    """k/v as views [B, Hkv, S, D] of [B, Hkv, capacity, D] buffers (a cache with room to grow: slots dense, head
    and batch strides wider) give bitwise the packed result, and so do k/v in any other layout."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 6, 3, 64, generator=g).to(dtype)
    kbuf = torch.randn(2, 3, 40, 64, generator=g).to(dtype)
    vbuf = torch.randn(2, 3, 40, 64, generator=g).to(dtype)
    k, v = kbuf[:, :, :29], vbuf[:, :, :29]
    assert not k.is_contiguous()
    mask = torch.zeros(2, 1, 3, 29, dtype=dtype)
    mask[1, 0, 1, 5:9] = float("-inf")
    packed = decode_attention(q, k.contiguous(), v.contiguous(), mask, 0.125, backend=backend)
    assert torch.equal(decode_attention(q, k, v, mask, 0.125, backend=backend), packed)
    # slots not dense (every other slot) and heads-last layouts take a packed copy; same result
    k2 = torch.empty(2, 3, 58, 64, dtype=dtype)[:, :, ::2].copy_(k)
    v2 = torch.empty(2, 29, 3, 64, dtype=dtype).transpose(1, 2).copy_(v)
    assert torch.equal(decode_attention(q, k2, v2, mask, 0.125, backend=backend), packed)
