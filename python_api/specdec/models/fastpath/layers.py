"""Whole decoder layers in a few op calls: the stock Llama/Mistral layer from its weights (:func:`fused_decoder_layer`),
in one :func:`specdec_kernels.decoder_layer` call where the kernels take it (:func:`native_call`), and the rotary
table read as rows (:func:`rotary_rows`)."""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.modules import module as _torch_module

from ..kv import cache_keyword, slot_layer_class
from . import attention
from .attention import specdec_attention
from .int8 import INT8_ATTR, int8_pair, tensor_version
from .linear import decode_linear, decode_op, decode_ops_on, decode_row_limit


def fast_layer_classes() -> tuple[dict[type, tuple[type, type, type]], type]:
    """Decoder-layer classes whose forward :func:`fast_decoder_layer` reproduces, mapped to their (attention, MLP,
    RMSNorm) classes, and HF's SiLU activation class."""
    from transformers.activations import SiLUActivation
    from transformers.models.llama import modeling_llama as llama
    from transformers.models.mistral import modeling_mistral as mistral

    return {
        llama.LlamaDecoderLayer: (llama.LlamaAttention, llama.LlamaMLP, llama.LlamaRMSNorm),
        mistral.MistralDecoderLayer: (mistral.MistralAttention, mistral.MistralMLP, mistral.MistralRMSNorm),
    }, SiLUActivation


def fast_layer_ok(layer: torch.nn.Module, routed: set[int]) -> bool:
    """Whether :func:`fast_decoder_layer` computes ``layer`` as its own forward does: a Llama/Mistral decoder layer
    of the stock classes, SiLU MLP, every projection a routed bias-free linear, no hook or instance forward
    anywhere inside (those must see their module called)."""
    classes, silu = fast_layer_classes()
    parts = classes.get(type(layer))
    if parts is None:
        return False
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    norms = (getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None))
    if type(attn) is not parts[0] or type(mlp) is not parts[1] or any(type(n) is not parts[2] for n in norms):
        return False
    if type(getattr(mlp, "act_fn", None)) is not silu:
        return False
    linears = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    if any(id(m) not in routed for m in linears):
        return False
    for m in layer.modules():
        if m is not layer and ("forward" in m.__dict__ or m._forward_hooks or m._forward_pre_hooks):
            return False
    return "forward" not in layer.__dict__


def lean_base_classes() -> tuple[type, ...]:
    """Base-model classes whose forward :meth:`HFCausalLM._lean_base` reproduces."""
    from transformers.models.llama.modeling_llama import LlamaModel
    from transformers.models.mistral.modeling_mistral import MistralModel

    return (LlamaModel, MistralModel)


def has_hooks(module: torch.nn.Module) -> bool:
    """Whether ``module`` carries hooks that a call of it runs."""
    return bool(
        module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks
    )


def global_hooks() -> bool:
    """Whether a process-wide module forward hook is registered (it must see every submodule called)."""
    return bool(_torch_module._global_forward_hooks or _torch_module._global_forward_pre_hooks)


#: rotary_rows' cos/sin tables, beside the user's rotary modules rather than on them (gone with the module)
_ROTARY_TABLES: weakref.WeakKeyDictionary[Any, tuple[Any, torch.Tensor, torch.Tensor]] = weakref.WeakKeyDictionary()


def rotary_rows(rotary: Any, positions: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``rotary(h, positions)`` of a HF rotary-embedding module: cos/sin [B, n, D] of ``positions``, as rows of a
    table cached on the module (one gather instead of ~10 ops). The table is the module's own output on arange(L),
    so every entry has the bits the module computes for that position. Other RoPE types (dynamic ones update
    inv_freq per call) and a module with hooks go through the module call."""
    if getattr(rotary, "rope_type", None) != "default" or has_hooks(rotary):
        return rotary(h, positions)
    need = int(positions.max()) + 1 if positions.numel() else 1
    inv = rotary.inv_freq
    key = (inv.data_ptr(), tensor_version(inv), getattr(rotary, "attention_scaling", None), h.dtype, h.device)
    hit = _ROTARY_TABLES.get(rotary)
    if hit is None or hit[0] != key or hit[1].shape[0] < need:
        size = max(1024, 1 << (need - 1).bit_length())
        cos, sin = rotary(h, torch.arange(size, device=h.device)[None])
        hit = (key, cos[0], sin[0])
        _ROTARY_TABLES[rotary] = hit
    return hit[1][positions], hit[2][positions]


def fast_decoder_layer(
    layer: Any,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cache: Any = None,
    use_cache: bool | None = False,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """The forward of a stock Llama/Mistral decoder layer (:func:`fast_layer_ok`) inside the adapter's forwards:
    :func:`fused_decoder_layer` with the adapter's attention. Calls it does not cover (another thread's call, extra
    keyword arguments, autograd, another device) run the layer's own forward."""
    if cache is None and "past_key_values" in kwargs:  # the base model's name for it in older transformers (5.17)
        cache = kwargs.pop("past_key_values")
    if (
        kwargs
        or position_embeddings is None
        or not decode_ops_on()
        or global_hooks()
        or hidden_states.device.type != "cpu"
        or hidden_states.dtype == torch.float64  # HF's norms compute a double model in fp32, rms_norm in fp64
        or (torch.is_grad_enabled() and hidden_states.requires_grad)
    ):
        return type(layer).forward(
            layer,
            hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
            # the class's own keyword: the instance forward routed here names ``cache`` whatever transformers does
            **{cache_keyword(type(layer).forward): cache},
            **kwargs,
        )
    cos, sin = position_embeddings
    return fused_decoder_layer(layer, hidden_states, attention_mask, cos, sin, cache, attend=_adapter_attention)


def _adapter_attention(
    attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    return specdec_attention(attn, q, k, v, mask, scaling=attn.scaling)[0]


def fused_decoder_layer(
    layer: Any,
    h: torch.Tensor,
    mask: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache: Any,
    *,
    attend: Any,
    qkv: torch.Tensor | None = None,
    gate_up: torch.Tensor | None = None,
) -> torch.Tensor:
    """One Llama decoder layer (no biases, no dropout, SiLU MLP) from its weights, in a few op calls instead of ~70
    module and aten calls: ``specdec_kernels.rms_norm`` per norm, one ``rotary_embedding``, linears straight to
    :func:`decode_linear`. Rotary and linears are HF's arithmetic bitwise; rms_norm differs only in the order it
    sums a row's squares (with the ops' ``torch`` backend the layer is HF's module bitwise, tested).

    Shape: h [B, n, E]; cos/sin [B, n, D] (HF's position embeddings); ``mask`` the additive mask over the cache after
    this call's keys are appended. ``attend(attn, q, k, v, mask)`` -> [B, n, H, D]. ``qkv`` / ``gate_up``: the
    layer's [q; k; v] and [gate; up] weights as one matrix each (a small draft model's fewer, larger calls), else
    each projection is its own call (a target keeps no second copy of its weights)."""
    out = native_call(layer, h, mask, cos, sin, cache, qkv, gate_up) if native_ready(h, mask) else None
    if out is not None:
        return out
    attn, mlp = layer.self_attn, layer.mlp
    b, n, _ = h.shape
    d = attn.head_dim
    norm = layer.input_layernorm
    dev = h.device
    x = decode_op("rms_norm", dev)(h, norm.weight, float(norm.variance_epsilon))
    if qkv is None:
        q, k, v = (decode_linear(x, m.weight) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
    else:
        nq, nkv = attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0]
        q, k, v = decode_linear(x, qkv).split((nq, nkv, nkv), dim=-1)
    q, k, v = (t.view(b, n, -1, d).transpose(1, 2) for t in (q, k, v))
    q, k = decode_op("rotary_embedding", dev)(q, k, cos, sin)
    if cache is not None:
        k, v = cache.update(k, v, attn.layer_idx)
    out = attend(attn, q, k, v, mask)
    h = h + decode_linear(out.reshape(b, n, -1), attn.o_proj.weight)
    norm = layer.post_attention_layernorm
    x = decode_op("rms_norm", dev)(h, norm.weight, float(norm.variance_epsilon))
    if gate_up is None:
        gate, up = decode_linear(x, mlp.gate_proj.weight), decode_linear(x, mlp.up_proj.weight)
    else:
        gate, up = decode_linear(x, gate_up).chunk(2, dim=-1)
    return h + decode_linear(F.silu(gate) * up, mlp.down_proj.weight)


def weight_of(linear: torch.nn.Module) -> torch.Tensor:
    """``linear.weight``, read from its parameter table where it is there: ``Module.__getattr__`` costs several
    lookups, and a step reads hundreds of weights right after kernels that left nothing of Python in the caches."""
    w = linear._parameters.get("weight")
    return w if w is not None else linear.weight


def _layer_weights(
    layer: Any, qkv: torch.Tensor | None, gate_up: torch.Tensor | None
) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """The matrices :func:`specdec_kernels.decoder_layer` takes for ``layer`` (with their int8 scales where every
    one carries an int8 pair), or None where only some do."""
    attn, mlp = layer._modules["self_attn"]._modules, layer._modules["mlp"]._modules
    if qkv is None or gate_up is None:
        mats = [weight_of(attn[name]) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
        mats += [weight_of(mlp["gate_proj"]), weight_of(mlp["up_proj"])]
    else:
        mats = [qkv, weight_of(attn["o_proj"]), gate_up]
    mats.append(weight_of(mlp["down_proj"]))
    packed = [getattr(w, INT8_ATTR, None) for w in mats]
    if packed.count(None) == len(packed):
        return mats, []
    if None in packed:
        return None
    pairs = [int8_pair(w, p) for w, p in zip(mats, packed, strict=True)]  # type: ignore[arg-type]
    return [q for q, _ in pairs], [scale for _, scale in pairs]


def native_ready(h: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """The checks of the one-call path (:func:`native_call`) that hold for every layer of a forward alike."""
    b, n, _ = h.shape
    return not (
        not attention.NATIVE_ATTENTION
        or not decode_ops_on()
        or h.device.type != "cpu"
        or h.dtype not in (torch.bfloat16, torch.float32)
        or b * n > decode_row_limit(h.dtype)
        or n == 0
        or mask is None
        or mask.dim() != 4
        or mask.dtype != h.dtype
        or torch.is_autocast_enabled("cpu")
        or (torch.is_grad_enabled() and h.requires_grad)
    )


class _LayerStatic(NamedTuple):
    """A layer's arguments of the one-call ops apart from the activations and the cache: its matrices (with their
    int8 scales where every one carries an int8 pair), norms, epsilons and score scale (``shared``), and the float
    matrices' one dtype (None: int8)."""

    weights: list[torch.Tensor]
    scales: list[torch.Tensor]
    ln1: torch.Tensor
    ln2: torch.Tensor
    shared: tuple[float, float, float]
    dtype: torch.dtype | None


def layer_static(layer: Any, qkv: torch.Tensor | None, gate_up: torch.Tensor | None) -> _LayerStatic | None:
    """:class:`_LayerStatic` of ``layer``, or None where only some matrices carry int8 pairs or the float ones
    differ in dtype."""
    found = _layer_weights(layer, qkv, gate_up)
    if found is None:
        return None
    mats, scales = found
    dtype = None if scales else mats[0].dtype
    if dtype is not None and any(w.dtype != dtype for w in mats):
        return None
    attn = layer._modules["self_attn"]
    n1, n2 = layer._modules["input_layernorm"], layer._modules["post_attention_layernorm"]
    shared = (float(n1.variance_epsilon), float(n2.variance_epsilon), float(attn.scaling))
    return _LayerStatic(mats, scales, weight_of(n1), weight_of(n2), shared, dtype)


def mask_covers(mask: torch.Tensor, b: int, n: int, end: int) -> bool:
    """Whether ``mask`` is the [1 or b, 1, n, end] mask of n new keys after ``end - n`` cached ones."""
    return mask.shape[1] == 1 and mask.shape[2] == n and mask.shape[3] == end and mask.shape[0] in (1, b)


def _layer_args(
    layer: Any,
    h: torch.Tensor,
    mask: torch.Tensor,
    cache: Any,
    qkv: torch.Tensor | None,
    gate_up: torch.Tensor | None,
) -> tuple[_LayerStatic, Any] | None:
    """What the one-call path passes for ``layer`` once :func:`native_ready` holds, and the cache slot layer it
    writes; None where the layer's call is not taken (no slot layer, mixed weight kinds, float weights of another
    dtype than ``h``, a mask that does not cover exactly the cache and the new keys)."""
    b, n, _ = h.shape
    idx, layers = layer._modules["self_attn"].layer_idx, getattr(cache, "layers", None)
    slot = layers[idx] if isinstance(layers, list) and isinstance(idx, int) and 0 <= idx < len(layers) else None
    if not isinstance(slot, slot_layer_class()):
        return None
    static = layer_static(layer, qkv, gate_up)
    if static is None or (static.dtype is not None and static.dtype != h.dtype):
        return None
    if not mask_covers(mask, b, n, slot.get_seq_length() + n):
        return None
    return static, slot


def native_call(
    layer: Any,
    h: torch.Tensor,
    mask: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache: Any,
    qkv: torch.Tensor | None,
    gate_up: torch.Tensor | None,
) -> torch.Tensor | None:
    """:func:`fused_decoder_layer` in one :func:`specdec_kernels.decoder_layer` call once :func:`native_ready`
    holds, for the calls where the op-by-op path would run the cpu kernels throughout (every projection through
    skinny_linear, attention through decode_attention): the same kernels, so the same bits. None for any other call
    (the op-by-op path then runs): no cache slot layer with cached keys yet, mixed or other weight dtypes, a mask
    that does not cover exactly the cache and the new keys."""
    args = _layer_args(layer, h, mask, cache, qkv, gate_up)
    if args is None:
        return None
    static, slot = args
    n = h.shape[1]
    room = slot.slots(n)  # may grow the buffers: asked only once the call is taken
    if room is None:
        return None
    k_cache, v_cache, length = room
    out = decode_op("decoder_layer", h.device)(
        h,
        static.weights,
        static.scales,
        static.ln1,
        static.ln2,
        cos,
        sin,
        k_cache,
        v_cache,
        length,
        mask,
        *static.shared,
    )
    slot.commit(length + n)
    return out
