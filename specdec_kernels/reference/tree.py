"""Backend "torch": tree attention mask, position ids and KV-cache filtering."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._registry import register


def ancestor_matrix(parent: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """anc[b, i, j] = node j is an ancestor of node i or j == i (closed form of RSD Alg. 5), padding sees itself."""
    batch, n = parent.shape
    eye = torch.eye(n, dtype=torch.bool, device=parent.device)
    anc = eye.expand(batch, n, n).clone()
    for i in range(1, n):  # level order: parent[i] < i, so the parent's row is final
        par = parent[:, i].clamp_min(0)
        inherit = anc[torch.arange(batch, device=parent.device), par] & valid[:, i, None]
        anc[:, i] |= inherit
    return anc


@register("tree_mask", "torch")
def tree_mask(parent: torch.Tensor, valid: torch.Tensor, past_valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [B, 1, N, P_kv + N]: 0 where attention is allowed, finfo(dtype).min elsewhere."""
    anc = ancestor_matrix(parent, valid)
    past = past_valid[:, None, :] & valid[:, :, None]  # padding nodes see only themselves
    allowed = torch.cat([past, anc], dim=-1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=parent.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


@register("tree_positions", "torch")
def tree_positions(depth: torch.Tensor, prefix_len: torch.Tensor) -> torch.Tensor:
    """Node n sits at position P - 1 + depth[n] (the root is the last committed token)."""
    return (prefix_len[:, None] - 1 + depth).to(torch.long)


@register("filter_kv", "torch")
def filter_kv(
    kv: Sequence[torch.Tensor], prefix_len: torch.Tensor, accepted_nodes: torch.Tensor, n_accepted: torch.Tensor
) -> torch.Tensor:
    """In place on every [B, H, S, D] tensor: slot P-1+n_j moves to slot P+j (j = 0-based depth-1)."""
    for b in range(accepted_nodes.shape[0]):
        m = int(n_accepted[b])
        if m == 0:
            continue
        p = int(prefix_len[b])
        src = (p - 1 + accepted_nodes[b, :m]).to(torch.long)
        for t in kv:
            # index_select copies before the write, so overlapping source/destination slots are safe
            t[b, :, p : p + m] = t[b].index_select(-2, src.to(t.device))
    return prefix_len + n_accepted
