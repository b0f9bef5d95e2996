"""The adapter's attention: transformers' sdpa with :func:`specdec_kernels.decode_attention` for the decode-sized
calls, registered once under its own name beside transformers' entries."""

from __future__ import annotations

from typing import Any

import torch

import specdec_kernels as sk

from . import linear
from .linear import decode_op, decode_ops_on

NATIVE_ATTENTION = "cpu" in sk.available_backends()  # else decode_attention would be the slow fp32 reference


#: the attention implementation name of the adapter's own forwards: HF's sdpa with decode_attention for the calls it
#: takes (registered once, beside HF's own entries; "sdpa" itself is never replaced)
SPECDEC_ATTENTION = "specdec_sdpa"


def _kernel_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float | None
) -> torch.Tensor | None:
    """HF attention (q [B, H, n, D], k/v [B, Hkv, S, D] after the cache update, additive mask) by
    :func:`specdec_kernels.decode_attention` when the cpu kernel takes the call: CPU tensors of one dtype, at most
    :data:`~.linear.DECODE_ROWS` query rows, a 4-D floating mask covering exactly the S keys. Returns [B, n, H, D] (HF's
    layout), or None for a call it leaves to the model's own attention.

    Every query row is computed alone and blocked slots add exact zeros, so with row-independent linears a tree
    node's logits in a verification pass are bitwise those of the same token in a one-token step: greedy speculative
    decoding then equals AR token for token in bf16 too, not only up to bf16 near-ties (tested)."""
    if not NATIVE_ATTENTION or mask is None or scale is None:
        return None
    b, h, n, _ = query.shape
    if (
        n > linear.DECODE_ROWS
        or query.device.type != "cpu"
        or key.dtype != query.dtype
        or value.dtype != query.dtype
        or query.dtype not in (torch.bfloat16, torch.float32)
        or mask.dim() != 4
        or not mask.is_floating_point()
        or mask.shape[1] != 1
        or mask.shape[2] != n
        or mask.shape[3] != key.shape[2]
        or mask.shape[0] not in (1, b)
        or key.shape[2] == 0
        or h % max(key.shape[1], 1)
        or (torch.is_grad_enabled() and query.requires_grad)
    ):
        return None
    out = decode_op("decode_attention", query.device)(query, key, value, mask, float(scale))
    return out.transpose(1, 2).contiguous()


def specdec_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """:data:`SPECDEC_ATTENTION`: decode_attention for the calls :func:`_kernel_attention` takes, HF's sdpa else."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if (
        decode_ops_on()  # another thread calling the model meanwhile keeps HF's sdpa, as for linears
        and not dropout
        and kwargs.get("softcap") is None  # (a sliding window is in the adapter's masks already: window_mask)
        and kwargs.get("s_aux") is None
        and not kwargs.get("output_attentions")
    ):
        out = _kernel_attention(query, key, value, attention_mask, scaling)
        if out is not None:
            return out, None
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def stock_sdpa() -> bool:
    """Whether transformers' attention registry still maps "sdpa" to transformers' own function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS.get("sdpa") is sdpa_attention_forward


def register_attention() -> None:
    """Register :data:`SPECDEC_ATTENTION` (and sdpa's mask function under the same name) once per process."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    if SPECDEC_ATTENTION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(SPECDEC_ATTENTION, specdec_attention)
    if SPECDEC_ATTENTION not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(SPECDEC_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
