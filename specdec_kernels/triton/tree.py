"""Backend "triton": the kernels and launchers of tree_positions, tree_mask, filter_kv.

As the C++ and CUDA sources group them; what every kernel shares is in ``common.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (
    _block,
)

# ----------------------------------------------------------------------------------------------------------------
# tree layout


@triton.jit
def _tree_positions_kernel(
    depth_ptr,  # [B, N] int64
    plen_ptr,  # [B] int64
    out_ptr,  # [B, N] int64
    N,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    p = tl.load(plen_ptr + b)
    for start in range(0, N, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        m = offs < N
        d = tl.load(depth_ptr + b * N + offs, mask=m, other=0)
        tl.store(out_ptr + b * N + offs, p - 1 + d, mask=m)


def tree_positions(depth: torch.Tensor, prefix_len: torch.Tensor) -> torch.Tensor:
    d = depth.long().contiguous()
    out = torch.empty_like(d)
    batch, n = d.shape
    if batch and n:
        _tree_positions_kernel[(batch,)](d, prefix_len.long().contiguous(), out, n, BLOCK_N=_block(n))
    return out


@triton.jit
def _tree_mask_kernel(
    parent_ptr,  # [B, N] int64
    valid_ptr,  # [B, N] int8
    past_ptr,  # [B, P] int8
    out_ptr,  # [B, N, P + N] int8 (1 = attend), zero-initialised
    N,
    P,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1).to(tl.int64)
    width = P + N
    row_valid = tl.load(valid_ptr + b * N + i) != 0
    base = out_ptr + (b * N + i) * width
    for start in range(0, P, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < P
        pv = tl.load(past_ptr + b * P + offs, mask=m, other=0)
        tl.store(base + offs, ((pv != 0) & row_valid).to(tl.int8), mask=m)
    tl.store(base + P + i, tl.full((), 1, tl.int8))
    cur = tl.where(row_valid & (i > 0), tl.load(parent_ptr + b * N + i), -1)
    while cur >= 0:  # walk the ancestors up to the root (parent[0] = -1)
        tl.store(base + P + cur, tl.full((), 1, tl.int8))
        cur = tl.load(parent_ptr + b * N + cur)


def tree_mask(parent: torch.Tensor, valid: torch.Tensor, past_valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    batch, n = parent.shape
    past = past_valid.shape[1]
    allowed = torch.zeros((batch, n, past + n), dtype=torch.int8, device=parent.device)
    if batch and n:
        _tree_mask_kernel[(batch, n)](
            parent.long().contiguous(),
            valid.to(torch.int8).contiguous(),
            past_valid.to(torch.int8).contiguous(),
            allowed,
            n,
            past,
            BLOCK=_block(max(past, 1)),
        )
    mask = torch.zeros(allowed.shape, dtype=dtype, device=parent.device)
    mask.masked_fill_(allowed == 0, torch.finfo(dtype).min)
    return mask[:, None]


@triton.jit
def _filter_kv_kernel(
    kv_ptr,  # [B, H, S, D] contiguous
    plen_ptr,  # [B] int64
    acc_ptr,  # [B, L] int64
    nacc_ptr,  # [B] int64
    H,
    S,
    D,
    L,
    BLOCK_D: tl.constexpr,
):
    """One program per (row, head); depth order keeps the in-place moves safe (source slot >= destination)."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // H
    base = kv_ptr + pid * S * D
    p = tl.load(plen_ptr + b)
    for j in range(0, tl.load(nacc_ptr + b)):
        src = p - 1 + tl.load(acc_ptr + b * L + j)
        dst = p + j
        for start in range(0, D, BLOCK_D):
            offs = start + tl.arange(0, BLOCK_D)
            m = offs < D
            tl.store(base + dst * D + offs, tl.load(base + src * D + offs, mask=m), mask=m)


def filter_kv(
    kv: list[torch.Tensor], prefix_len: torch.Tensor, accepted_nodes: torch.Tensor, n_accepted: torch.Tensor
) -> torch.Tensor:
    batch, max_len = accepted_nodes.shape
    plen = prefix_len.long().contiguous()
    acc = accepted_nodes.long().contiguous()
    nacc = n_accepted.long().contiguous()
    for t in kv:
        if not t.is_contiguous():
            raise ValueError("filter_kv (triton): kv tensors must be contiguous [B, H, S, D]")
        _, heads, slots, dim = t.shape
        if batch and heads and max_len:
            _filter_kv_kernel[(batch * heads,)](t, plen, acc, nacc, heads, slots, dim, max_len, BLOCK_D=_block(dim))
    return prefix_len + n_accepted
