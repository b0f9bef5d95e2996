"""What the adapter knows of each model family: which ones it takes, how they apply a sliding window and soft caps,
when their rotary frequencies change with the sequence, and the additive masks that carry a tree or chain to them.

Only families whose attention takes a 4-D additive float mask plus explicit ``position_ids`` are accepted
(:data:`SUPPORTED_MODEL_TYPES`) with the ``sdpa`` or ``eager`` attention implementation; FlashAttention and
flex-attention cannot take an arbitrary tree mask. Sliding-window layers get the tree mask with every key older than
the window hidden as well (:func:`window_mask`), and the cache keeps every layer whole.
"""

from __future__ import annotations

from typing import Any

import torch

import specdec_kernels as sk

from ..errors import UnsupportedModelError

# How each family applies ``config.sliding_window``: to no layer, to every layer (one mask), or to the layers that
# ``config.layer_types`` marks "sliding_attention" (the base model takes a dict of masks keyed by layer type).
WINDOWED_LAYERS = {
    "llama": "none",
    "mistral": "all",
    "phi3": "all",
    "qwen2": "typed",
    "qwen3": "typed",
    "gemma2": "typed",
    "gemma3_text": "typed",
}


SUPPORTED_MODEL_TYPES = tuple(WINDOWED_LAYERS)


# families whose attention applies ``config.attn_logit_softcapping``, which HF's sdpa refuses (only eager applies it)
SOFTCAPPED_ATTENTION = ("gemma2",)


# families whose *ForCausalLM caps the logits after lm_head with ``config.final_logit_softcapping``
SOFTCAPPED_LOGITS = ("gemma2", "gemma3_text")


SUPPORTED_ATTENTION = ("sdpa", "eager")


def chain_mask(past_valid: torch.Tensor, block_valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask for appending a right-padded chain of new tokens per row (prompt catch-up, draft roots).

    Shape: past_valid [B, S] bool, block_valid [B, n] bool (a prefix of each row) -> mask [B, 1, n, S + n].
    Token j sees the row's valid past and chain tokens 0..j; padding tokens see only themselves, so no softmax row
    is empty. A chain is the tree whose node j hangs from node j - 1, so this is
    :func:`specdec_kernels.tree_mask` of that tree: one op call instead of about ten small ones."""
    batch, n = block_valid.shape
    parent = torch.arange(-1, n - 1, device=block_valid.device).expand(batch, n).contiguous()
    # the parents are a chain by construction; the kernel still bounds-checks
    return sk.tree_mask(parent, block_valid, past_valid.shape[1], past_valid=past_valid, dtype=dtype, validate=False)


def window_mask(mask: torch.Tensor, window: int) -> torch.Tensor:
    """``mask`` with every key hidden that lies ``window`` or more positions before its query (HF's sliding window: a
    query at position q sees positions q - window + 1 .. q).

    Shape: mask [B, 1, n, K] additive (0 = visible). The keys a query sees are its own sequence, one per position
    0 .. q in slot order (committed slots, then the chain or the tree path), so a key's distance from the query is
    the number of visible keys after it: no slot positions are needed."""
    if mask.shape[-1] <= window:
        return mask
    seen = mask == 0
    newer = seen.flip(-1).cumsum(-1).flip(-1)  # visible keys at or after each slot, the query itself included
    return mask.masked_fill(seen & (newer > window), torch.finfo(mask.dtype).min)


def sliding_window(config: Any, name: str) -> tuple[int | None, bool]:
    """The window of the model's sliding-window layers (None: no layer has one) and whether only some layers have it
    (the base model then takes a dict of masks keyed by layer type)."""
    layers = WINDOWED_LAYERS[config.model_type]
    window = getattr(config, "sliding_window", None) if layers != "none" else None
    if layers == "typed":
        types = set(getattr(config, "layer_types", None) or ())
        unknown = sorted(types - {"full_attention", "sliding_attention"})
        if unknown:
            raise ValueError(
                f"{name}: layer_types {unknown} are not supported; tree masks are built for full_attention and "
                f"sliding_attention layers only"
            )
        if "sliding_attention" not in types:
            window = None
    if window is None:
        return None, False
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"{name}: sliding_window must be a positive int or None, got {window!r}")
    return window, layers == "typed"


def rope_limit(model: Any) -> tuple[int, str] | None:
    """The longest sequence over which the model's rotary frequencies stay fixed, and the RoPE type that changes them
    beyond it; None when they never change. transformers' ``dynamic`` RoPE rescales them from the longest position of
    each forward once it passes ``max_position_embeddings``, and ``longrope`` switches to its long factors past
    ``original_max_position_embeddings`` (Phi-3 then also recomputes every cached key): beyond that length a token's
    logits depend on how the sequence is chunked and batched, not on its prefix alone."""
    limits = []
    for module in model.modules():
        kinds = getattr(module, "rope_type", None)
        # a rotary module: its frequencies as one buffer, or one per layer type (Gemma 3: "<type>_inv_freq")
        if kinds is None or not any(n.endswith("inv_freq") for n, _ in module.named_buffers(recurse=False)):
            continue
        for layer_type, kind in kinds.items() if isinstance(kinds, dict) else [(None, kinds)]:
            if not isinstance(kind, str):
                continue
            if "dynamic" in kind:
                limits.append((int(module.original_max_seq_len), kind))
            elif kind == "longrope":
                params = getattr(module.config, "rope_parameters", None) or {}
                params = params.get(layer_type, params) if layer_type is not None else params
                original = params.get("original_max_position_embeddings") or getattr(
                    module.config, "original_max_position_embeddings", None
                )
                limits.append((int(original or module.config.max_position_embeddings), kind))
    return min(limits) if limits else None


def layer_features(base: Any, hidden_states: tuple[torch.Tensor, ...], layers: tuple[int, ...]) -> torch.Tensor:
    """The inputs of decoder layers ``layers`` as those layers see them (after their input RMSNorm, which tames the
    residual stream's outlier channels), concatenated; read by feature drafts with extra layers.

    Shape: hidden_states[l] [B, n, E] (HF ``output_hidden_states``) -> [B, n, len(layers) E]."""
    return torch.cat([base.layers[layer].input_layernorm(hidden_states[layer]) for layer in layers], dim=-1)


def check_supported(model: Any, name: str) -> None:
    """Refuse, naming ``name``, a model the adapter cannot run exactly: another family, an attention implementation
    that cannot take a tree mask, a soft cap only eager attention applies, a model split over devices, or
    non-causal attention."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        hint = "; for Gemma 3 load the text model (Gemma3ForCausalLM)" if model_type == "gemma3" else ""
        raise UnsupportedModelError(
            f"{name}: architecture {model_type!r} is not supported; tree decoding needs a model that takes a 4-D "
            f"additive mask and position_ids, tested for {SUPPORTED_MODEL_TYPES}{hint}"
        )
    attn = getattr(config, "_attn_implementation", None)
    if attn not in SUPPORTED_ATTENTION:
        raise UnsupportedModelError(
            f"{name}: attn_implementation {attn!r} cannot take a custom tree mask; load the model with "
            f"attn_implementation='sdpa' or 'eager'"
        )
    softcap = getattr(config, "attn_logit_softcapping", None)
    if model_type in SOFTCAPPED_ATTENTION and softcap is not None and attn != "eager":
        raise ValueError(
            f"{name}: attn_logit_softcapping={softcap} is applied by {model_type}'s eager attention only (sdpa "
            f"cannot); load the model with attn_implementation='eager'"
        )
    devices = {str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}
    if len(devices) > 1:
        raise ValueError(
            f"{name} is split over devices by device_map ({', '.join(sorted(devices))}); tree decoding runs a "
            "model on one device: load it with device_map set to a single device"
        )
    if getattr(config, "use_bidirectional_attention", False):
        raise ValueError(
            f"{name}: use_bidirectional_attention=True makes attention non-causal; tree decoding needs a causal LM"
        )
