"""Backend "torch": the ops of a model's decode step (projections on a few rows, attention over the cache, HF Llama's
RMSNorm and rotary embedding)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._registry import register


@register("skinny_linear", "torch")
def skinny_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x weight^T in the input dtype; PyTorch's CPU and CUDA linears accumulate bf16/fp16 products in fp32."""
    return F.linear(x, weight)


@register("skinny_linear_int8", "torch")
def skinny_linear_int8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(x weight^T) * scale in fp32 (fp64 for double), the int8 weights exact in either; the result in x's dtype."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return (torch.matmul(x.to(acc), weight.to(acc).T) * scale.to(acc)).to(x.dtype)


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


@register("rms_norm", "torch")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's LlamaRMSNorm: x / sqrt(mean(x^2) + eps) in fp32 (fp64 for double), rounded to x's dtype, times weight
    (a bf16/fp16 product computed in fp32 and rounded once)."""
    h = x if x.dtype == torch.float64 else x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@register("rotary_embedding", "torch")
def rotary_embedding(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's apply_rotary_pos_emb (unsqueeze_dim=1): x cos + rotate_half(x) sin, with rotate_half(x) = [-x2, x1],
    each op rounded to the dtype; the results contiguous (torch would keep the layout of a transposed q)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q_out = (q * cos) + (_rotate_half(q) * sin)
    k_out = (k * cos) + (_rotate_half(k) * sin)
    return q_out.contiguous(), k_out.contiguous()
