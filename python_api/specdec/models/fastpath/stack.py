"""A model's whole stack of decoder layers in one :func:`specdec_kernels.decoder_stack` call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..kv import slot_layer_class
from .layers import has_hooks, layer_static, mask_covers
from .linear import decode_op


class StackPlan(NamedTuple):
    """What :func:`native_stack` passes to :func:`specdec_kernels.decoder_stack` for a model's layers apart from the
    cache buffers: every layer's matrices and int8 scales (flat, in layer order), norms, shared epsilons and score
    scale, the float weights' dtype (None: int8) and each layer's cache index."""

    weights: list[torch.Tensor]
    scales: list[torch.Tensor]
    ln1: list[torch.Tensor]
    ln2: list[torch.Tensor]
    shared: tuple[float, float, float]
    dtype: torch.dtype | None
    index: list[int]


def stack_plan(
    layers: Any, fused: Callable[[Any], tuple[torch.Tensor, torch.Tensor]] | None = None
) -> StackPlan | None:
    """The layers' part of a :func:`specdec_kernels.decoder_stack` call, or None unless every layer is a Llama layer
    of one weight kind (float of one dtype, or int8) whose epsilons and score scale all share. ``fused(layer)``:
    the layer's [q; k; v] and [gate; up] matrices as one each (a small draft's), else its seven projections."""
    found = [layer_static(layer, *(fused(layer) if fused else (None, None))) for layer in layers]
    statics = [st for st in found if st is not None]
    index = [layer._modules["self_attn"].layer_idx for layer in layers]
    if not statics or len(statics) != len(found) or not all(isinstance(i, int) for i in index):
        return None
    if len({st.dtype for st in statics}) != 1 or len({st.shared for st in statics}) != 1:
        return None
    return StackPlan(
        [w for st in statics for w in st.weights],
        [sc for st in statics for sc in st.scales],
        [st.ln1 for st in statics],
        [st.ln2 for st in statics],
        statics[0].shared,
        statics[0].dtype,
        index,
    )


def native_stack(
    layers: Any,
    h: torch.Tensor,
    mask: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache: Any,
    plan: StackPlan,
) -> torch.Tensor | None:
    """Once :func:`native_ready` holds, every layer of ``layers`` (in order) in one
    :func:`specdec_kernels.decoder_stack` call: what each layer's one-call path computes, bit for bit, without a
    Python-level call per layer. None (nothing run) unless every layer would take that path, none has hooks, and
    all share their epsilons, score scale and weight kind (float or int8). ``plan``: :func:`stack_plan` of
    ``layers`` (the adapter makes it once per cache)."""
    for layer in layers:
        if has_hooks(layer):
            return None
    if plan.dtype is not None and plan.dtype != h.dtype:
        return None
    slot_class = slot_layer_class()
    found = getattr(cache, "layers", None)
    if not isinstance(found, list):
        return None
    b, n, _ = h.shape
    slots = []
    for i in plan.index:
        slot = found[i] if 0 <= i < len(found) else None
        if not isinstance(slot, slot_class):
            return None
        slots.append(slot)
    end = slots[0].get_seq_length() + n
    if not mask_covers(mask, b, n, end):
        return None
    k_caches, v_caches = [], []
    for slot in slots:
        room = slot.slots(n)
        if room is None or room[2] != end - n:
            return None
        k_caches.append(room[0])
        v_caches.append(room[1])
    out = decode_op("decoder_stack", h.device)(
        h, plan.weights, plan.scales, plan.ln1, plan.ln2, cos, sin, k_caches, v_caches, end - n, mask, *plan.shared
    )
    for slot in slots:
        slot.commit(end)
    return out
