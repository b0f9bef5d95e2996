"""Backend "torch": the ops of a draft model's decode step (projections on a few rows, attention over the cache)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._registry import register


@register("skinny_linear", "torch")
def skinny_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x weight^T in the input dtype; PyTorch's CPU and CUDA linears accumulate bf16/fp16 products in fp32."""
    return F.linear(x, weight)


@register("decode_attention", "torch")
def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """softmax(scale q k^T + mask) v in fp32 (fp64 for double), query head h reading KV head h // (H / Hkv) as in
    HF's repeat_kv; the result in q's dtype."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    b, h, n, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    qg = q.to(acc).reshape(b, hkv, (h // hkv) * n, d)  # query heads grouped by their KV head
    scores = torch.matmul(qg, k.to(acc).transpose(-1, -2)).view(b, hkv, h // hkv, n, s) * scale
    probs = torch.softmax(scores + mask.to(acc)[:, :, None], dim=-1)
    out = torch.matmul(probs.view(b, hkv, (h // hkv) * n, s), v.to(acc))
    return out.view(b, h, n, d).to(q.dtype)
