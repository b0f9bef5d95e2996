"""Backend "torch": the ops of a model's decode step (projections on a few rows, attention over the cache, HF Llama's
RMSNorm and rotary embedding)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

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


def layer_from_ops(
    ops: Mapping[str, Callable[..., Any]],
    h: torch.Tensor,
    weights: list[torch.Tensor],
    scales: list[torch.Tensor],
    ln1: torch.Tensor,
    ln2: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    length: int,
    mask: torch.Tensor,
    eps1: float,
    eps2: float,
    scale: float,
) -> torch.Tensor:
    """decoder_layer (arguments as the op's) from the implementations ``ops`` of skinny_linear,
    skinny_linear_int8, rms_norm, rotary_embedding and decode_attention, called one by one: RMSNorm, q/k/v
    projections, rotary embedding, the new keys and values written to cache slots [length, length + n), attention
    over slots [0, length + n), output projection and residual, RMSNorm, SiLU-gated MLP and residual; the adds and
    the gated SiLU are torch's (rounded to h's dtype). ``weights`` (q, k, v, o, gate, up, down) or
    (qkv, o, gate_up, down); with ``scales`` they are int8."""
    b, n, _ = h.shape
    hkv, d = k_cache.shape[1], k_cache.shape[3]

    def linear(x: torch.Tensor, i: int) -> torch.Tensor:
        if scales:
            return ops["skinny_linear_int8"](x, weights[i], scales[i])
        return ops["skinny_linear"](x, weights[i])

    x = ops["rms_norm"](h, ln1, eps1)
    if len(weights) == 7:
        q, k, v = linear(x, 0), linear(x, 1), linear(x, 2)
    else:
        q, k, v = linear(x, 0).split((weights[0].shape[0] - 2 * hkv * d, hkv * d, hkv * d), dim=-1)
    q, k = ops["rotary_embedding"](q.view(b, n, -1, d).transpose(1, 2), k.view(b, n, hkv, d).transpose(1, 2), cos, sin)
    end = length + n
    k_cache[:, :, length:end] = k
    v_cache[:, :, length:end] = v.view(b, n, hkv, d).transpose(1, 2)
    att = ops["decode_attention"](q, k_cache[:, :, :end], v_cache[:, :, :end], mask, scale)
    h = h + linear(att.transpose(1, 2).reshape(b, n, -1), 3 if len(weights) == 7 else 1)
    x = ops["rms_norm"](h, ln2, eps2)
    if len(weights) == 7:
        gate, up = linear(x, 4), linear(x, 5)
    else:
        gate, up = linear(x, 2).chunk(2, dim=-1)
    return h + linear(F.silu(gate) * up, len(weights) - 1)


def stack_from_ops(
    ops: Mapping[str, Callable[..., Any]],
    h: torch.Tensor,
    weights: list[torch.Tensor],
    scales: list[torch.Tensor],
    ln1: list[torch.Tensor],
    ln2: list[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_caches: list[torch.Tensor],
    v_caches: list[torch.Tensor],
    length: int,
    mask: torch.Tensor,
    eps1: float,
    eps2: float,
    scale: float,
) -> torch.Tensor:
    """decoder_stack (arguments as the op's): :func:`layer_from_ops` for each layer in turn, layer i taking the
    i-th group of ``len(weights) / L`` matrices (and scales), the i-th norms and the i-th cache pair."""
    per = len(weights) // len(k_caches)
    for i, (k_cache, v_cache) in enumerate(zip(k_caches, v_caches, strict=True)):
        part = slice(i * per, (i + 1) * per)
        h = layer_from_ops(
            ops, h, weights[part], scales[part] if scales else [], ln1[i], ln2[i], cos, sin, k_cache, v_cache, length,
            mask, eps1, eps2, scale,
        )  # fmt: skip
    return h


_LAYER_OPS = {
    "skinny_linear": skinny_linear,
    "skinny_linear_int8": skinny_linear_int8,
    "rms_norm": rms_norm,
    "rotary_embedding": rotary_embedding,
    "decode_attention": decode_attention,
}


@register("decoder_layer", "torch")
def decoder_layer(*args: Any) -> torch.Tensor:
    """One Llama decoder layer (:func:`layer_from_ops`) from the reference ops above."""
    return layer_from_ops(_LAYER_OPS, *args)


@register("decoder_stack", "torch")
def decoder_stack(*args: Any) -> torch.Tensor:
    """A stack of Llama decoder layers (:func:`stack_from_ops`) from the reference ops above."""
    return stack_from_ops(_LAYER_OPS, *args)
