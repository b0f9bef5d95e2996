"""int8 weights for the decode-step linears: one scale per output row, the int8 matrix carried on the weight."""

from __future__ import annotations

import torch

import specdec_kernels as sk

#: the attribute :func:`int8_weights` sets on a weight: (q int8 [out, in], scale float32 [out], weight._version or
#: None where it is not tracked)
INT8_ATTR = "_specdec_int8"


def int8_pair(
    weight: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor, int | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    q, scale, version = packed
    if (version is not None and weight._version != version) or q.device != weight.device:
        raise RuntimeError(
            "a weight changed or moved after specdec.int8_weights() quantized it; call int8_weights() again on the "
            "model as it is now"
        )
    return q, scale


def concat_weights(weights: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``torch.cat(weights)`` (output rows stacked), carrying the parts' int8 matrices and scales along when every
    part has them (:func:`int8_weights` scales each output row on its own, so the stacked pair is the whole's)."""
    whole = torch.cat(weights).detach()
    packed = [getattr(w, INT8_ATTR, None) for w in weights]
    if all(p is not None for p in packed):
        pairs = [int8_pair(w, p) for w, p in zip(weights, packed, strict=True)]
        q, scale = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
        setattr(whole, INT8_ATTR, (q, scale, None))  # a private copy: never edited
    return whole


def int8_weights(model: torch.nn.Module) -> torch.nn.Module:
    """Give every bias-free ``nn.Linear`` of ``model`` (and a reduced draft head's matrix) int8 weights, one scale
    per output row (:func:`specdec_kernels.quantize_int8`); returns ``model``, changed in place.

    Each such module gets a new weight ``Parameter`` holding the dequantized values (``q * scale`` in the weight's
    dtype), so every path computes the same layer up to rounding: the decode-step calls (:func:`decode_linear`)
    run :func:`specdec_kernels.skinny_linear_int8` on the int8 matrix, others (``F.linear`` beyond
    :data:`DECODE_ROWS` rows, autograd, plain module calls) the dequantized one. The old weight tensor is left as it
    was, so a tensor the model shares with another (a tied embedding, another model's head) keeps its values; a
    module the model shares with another (a draft whose head is the target's own ``lm_head``) changes for both, and
    the decoders refuse a target whose linears carry int8 weights. A
    draft step reads its weights whole, so this halves the bytes of a bf16 draft's step; the draft's law changes by
    the quantization, which every verifier accounts for (the output law stays the target's). Call it after moving
    the model to its device and dtype; a weight changed afterwards raises at its next decode call."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is None:
                name = "weight"
            elif getattr(module, "reduced_output", False):  # a reduced head (specdec.drafters.networks.ReducedHead)
                name = "reduced_weight"
            else:
                continue
            old = getattr(module, name)
            if not old.is_floating_point():
                raise TypeError(f"int8_weights: {type(module).__name__} has a {old.dtype} weight")
            q, scale = sk.quantize_int8(old)
            weight = torch.nn.Parameter((q.float() * scale[:, None]).to(old.dtype), requires_grad=old.requires_grad)
            setattr(module, name, weight)
            # an inference tensor has no version counter (and cannot be edited outside inference mode)
            version = tensor_version(weight)
            setattr(weight, INT8_ATTR, (q, scale, version))  # quantize_int8 leaves both on the weight's device
    return model


def tensor_version(t: torch.Tensor) -> int | None:
    """``t._version`` (bumped by every in-place edit), or None for an inference tensor (a model built under
    torch.inference_mode), which has no version counter."""
    return None if t.is_inference() else t._version
