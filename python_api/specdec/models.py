"""HuggingFace causal-LM adapter: tree forwards with a 4-D additive mask, per-row KV validity, KV filtering.

Cache layout (one common length S for the whole batch): every row owns the same slots
``[0, S)`` of a ``DynamicCache``; ``KVState.valid[b, s]`` says whether slot s holds one of row b's committed
tokens. A forward appends every row's new tokens at the common end, so during a round a row has stale slots
(invalid, hidden by the mask) between its committed tokens and the new ones. ``KVState.keep`` ends each round by
moving every row's kept slots right after its committed ones: between rounds row b holds exactly the slots
``[0, n_cached[b])`` and S is the longest row's count, so memory and attention cost follow the longest sequence.
Position ids come from the number of committed tokens of the row, never from the slot index.

Only families whose attention takes a 4-D additive float mask plus explicit ``position_ids`` are accepted
(:data:`SUPPORTED_MODEL_TYPES`) with the ``sdpa`` or ``eager`` attention implementation; FlashAttention and
flex-attention cannot take an arbitrary tree mask. Sliding-window layers get the tree mask with every key older than
the window hidden as well (:func:`window_mask`), and the cache keeps every layer whole.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.modules import module as _torch_module

import specdec_kernels as sk

from .errors import UnsupportedModelError

# How each family applies ``config.sliding_window``: to no layer, to every layer (one mask), or to the layers that
# ``config.layer_types`` marks "sliding_attention" (the base model takes a dict of masks keyed by layer type).
_WINDOWED_LAYERS = {
    "llama": "none",
    "mistral": "all",
    "phi3": "all",
    "qwen2": "typed",
    "qwen3": "typed",
    "gemma2": "typed",
    "gemma3_text": "typed",
}
SUPPORTED_MODEL_TYPES = tuple(_WINDOWED_LAYERS)
# families whose attention applies ``config.attn_logit_softcapping``, which HF's sdpa refuses (only eager applies it)
_SOFTCAPPED_ATTENTION = ("gemma2",)
# families whose *ForCausalLM caps the logits after lm_head with ``config.final_logit_softcapping``
_SOFTCAPPED_LOGITS = ("gemma2", "gemma3_text")
SUPPORTED_ATTENTION = ("sdpa", "eager")


def decode_rows(isa: str, torch_amx: bool) -> int:
    """The most rows of a bf16 decode call (a tree pass, a batch of them) that our kernels take, for the bf16 path
    ``isa`` of :func:`specdec_kernels.skinny_linear_isa` and whether the CPU gives PyTorch AMX (``torch_amx``)."""
    return 16 if isa == "amx" or (isa == "avx512bf16" and not torch_amx) else 8


# Up to this many rows, inference linears run specdec_kernels.skinny_linear, which reads each weight once for all
# rows: a decode step reads its weights from DRAM, and BLAS's small-batch paths read them at a fraction of copy
# speed, so a verification pass of a few tree nodes would cost several one-token steps (benchmarks/
# bench_skinny_linear.py, bench_target_step.py). Where PyTorch's bf16 linear has AMX (the CPU has it, whichever
# variant of ours is loaded) it wins beyond about 8 rows; our AMX tiles multiply up to 16 rows in the time of one.
# With AVX-512-BF16 but no AMX in the CPU (AMD Zen 4), PyTorch's small-batch bf16 linear is slower than ours at every
# row count up to about 24, so decode calls go up to 16 rows there too (a pass of 16 nodes then costs about two
# one-token steps instead of four).
DECODE_ROWS = decode_rows(sk.skinny_linear_isa(), bool(torch.cpu._is_amx_tile_supported()))
# fp32 calls: without AMX our fp32 tiles lose to PyTorch's fp32 linear from about 8 rows on
FP32_ROWS = 16 if sk.skinny_linear_isa() == "amx" else 8
# bf16 calls: where skinny_linear runs its AVX2 or AVX-512F tiles, the CPU has no bf16 dot products and PyTorch's
# bf16 linear is several times slower than its fp32 one; the tiles then win at every row count (prefill included), so
# all rows go to skinny_linear.
BF16_ROWS = 1 << 40 if sk.skinny_linear_isa() in ("avx2", "avx512") else DECODE_ROWS
_skinny = threading.local()
_NATIVE_ATTENTION = "cpu" in sk.available_backends()  # else decode_attention would be the slow fp32 reference


def decode_row_limit(dtype: torch.dtype) -> int:
    """The most rows of a ``dtype`` pass that runs in one native call per layer (:func:`native_ready`); fp32 calls
    beyond :data:`FP32_ROWS` go to PyTorch's linear. Read at call time, so a caller that sets DECODE_ROWS = 0 turns
    both off."""
    return DECODE_ROWS if dtype == torch.bfloat16 else min(DECODE_ROWS, FP32_ROWS)


def decode_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` (no bias); calls on at most :data:`BF16_ROWS` rows (bf16) or
    :func:`decode_row_limit` rows (other dtypes) without autograd go to :func:`specdec_kernels.skinny_linear`
    (0: never)."""
    rows = x.numel() // max(x.shape[-1], 1)
    limit = BF16_ROWS if x.dtype == torch.bfloat16 else decode_row_limit(x.dtype)
    if (
        rows > limit
        or x.dtype != weight.dtype
        or torch.is_autocast_enabled(x.device.type)  # F.linear casts to the autocast dtype; keep its numerics
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    ):
        return F.linear(x, weight)
    packed = getattr(weight, INT8_ATTR, None)
    if packed is not None:
        return _decode_op("skinny_linear_int8", x.device)(x, *_int8_pair(weight, packed))
    # the op's own checks cost 2x the kernel call on a small layer; the kernels check what they rely on
    return _decode_op("skinny_linear", x.device)(x, weight)


#: the attribute :func:`int8_weights` sets on a weight: (q int8 [out, in], scale float32 [out], weight._version or
#: None where it is not tracked)
INT8_ATTR = "_specdec_int8"


def _int8_pair(
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
        pairs = [_int8_pair(w, p) for w, p in zip(weights, packed, strict=True)]
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
            elif getattr(module, "reduced_output", False):  # a reduced head (specdec.train.ReducedHead)
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


#: the ops of a decode step, called straight through their implementation (:func:`_decode_op`)
DECODE_OPS = (
    "skinny_linear",
    "skinny_linear_int8",
    "rms_norm",
    "rotary_embedding",
    "decode_attention",
    "decoder_layer",
    "decoder_stack",
)


def _decode_op(op: str, device: torch.device) -> Callable[..., Any]:
    """The implementation of the decode op ``op`` on ``device`` (no argument checks: callers pass what the kernels
    take). Inside :func:`skinny_linears` on CPU it is the one resolved on entry: a step makes hundreds of these
    calls and resolving each costs about as much as a small kernel."""
    table = getattr(_skinny, "ops", None)
    if table is not None and device.type == "cpu":
        return table[op]
    return sk.implementation(op, None, device)


@contextmanager
def skinny_linears() -> Iterator[None]:
    """While active (in this thread), the linears of a model inside its adapter's forwards (:class:`Routing`) run
    `decode_linear` and its attention layers `specdec_kernels.decode_attention` (for the calls they take); the
    decode ops' CPU implementations are resolved once, on entry (``$SPECDEC_BACKEND`` as the ops read it)."""
    before = getattr(_skinny, "on", False), getattr(_skinny, "ops", None)
    _skinny.on = True
    _skinny.ops = sk.implementations(DECODE_OPS, "cpu")
    try:
        yield
    finally:
        _skinny.on, _skinny.ops = before


def _routed_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return decode_linear(x, module.weight) if getattr(_skinny, "on", False) else F.linear(x, module.weight)


def _fast_layer_classes() -> tuple[dict[type, tuple[type, type, type]], type]:
    """Decoder-layer classes whose forward :func:`_fast_decoder_layer` reproduces, mapped to their (attention, MLP,
    RMSNorm) classes, and HF's SiLU activation class."""
    from transformers.activations import SiLUActivation
    from transformers.models.llama import modeling_llama as llama
    from transformers.models.mistral import modeling_mistral as mistral

    return {
        llama.LlamaDecoderLayer: (llama.LlamaAttention, llama.LlamaMLP, llama.LlamaRMSNorm),
        mistral.MistralDecoderLayer: (mistral.MistralAttention, mistral.MistralMLP, mistral.MistralRMSNorm),
    }, SiLUActivation


def _fast_layer_ok(layer: torch.nn.Module, routed: set[int]) -> bool:
    """Whether :func:`_fast_decoder_layer` computes ``layer`` as its own forward does: a Llama/Mistral decoder layer
    of the stock classes, SiLU MLP, every projection a routed bias-free linear, no hook or instance forward
    anywhere inside (those must see their module called)."""
    classes, silu = _fast_layer_classes()
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


def _lean_base_classes() -> tuple[type, ...]:
    """Base-model classes whose forward :meth:`HFCausalLM._lean_base` reproduces."""
    from transformers.models.llama.modeling_llama import LlamaModel
    from transformers.models.mistral.modeling_mistral import MistralModel

    return (LlamaModel, MistralModel)


def _layer_hooks(module: torch.nn.Module) -> bool:
    """Whether ``module`` carries hooks that a call of it runs."""
    return bool(
        module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks
    )


def _global_module_hooks() -> bool:
    """Whether a process-wide module forward hook is registered (it must see every submodule called)."""
    return bool(_torch_module._global_forward_hooks or _torch_module._global_forward_pre_hooks)


def tensor_version(t: torch.Tensor) -> int | None:
    """``t._version`` (bumped by every in-place edit), or None for an inference tensor (a model built under
    torch.inference_mode), which has no version counter."""
    return None if t.is_inference() else t._version


#: rotary_rows' cos/sin tables, beside the user's rotary modules rather than on them (gone with the module)
_ROTARY_TABLES: weakref.WeakKeyDictionary[Any, tuple[Any, torch.Tensor, torch.Tensor]] = weakref.WeakKeyDictionary()


def rotary_rows(rotary: Any, positions: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``rotary(h, positions)`` of a HF rotary-embedding module: cos/sin [B, n, D] of ``positions``, as rows of a
    table cached on the module (one gather instead of ~10 ops). The table is the module's own output on arange(L),
    so every entry has the bits the module computes for that position. Other RoPE types (dynamic ones update
    inv_freq per call) and a module with hooks go through the module call."""
    if getattr(rotary, "rope_type", None) != "default" or _layer_hooks(rotary):
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


def _fast_decoder_layer(
    layer: Any,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cache: Any = None,
    use_cache: bool | None = False,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """The forward of a stock Llama/Mistral decoder layer (:func:`_fast_layer_ok`) inside the adapter's forwards:
    :func:`fused_decoder_layer` with the adapter's attention. Calls it does not cover (another thread's call, extra
    keyword arguments, autograd, another device) run the layer's own forward."""
    if cache is None and "past_key_values" in kwargs:  # the base model's name for it in older transformers (5.17)
        cache = kwargs.pop("past_key_values")
    if (
        kwargs
        or position_embeddings is None
        or not getattr(_skinny, "on", False)
        or _global_module_hooks()
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
            **{_cache_keyword(type(layer).forward): cache},
            **kwargs,
        )
    cos, sin = position_embeddings
    return fused_decoder_layer(layer, hidden_states, attention_mask, cos, sin, cache, attend=_adapter_attention)


def _adapter_attention(
    attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    return _specdec_attention(attn, q, k, v, mask, scaling=attn.scaling)[0]


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
    out = _native_call(layer, h, mask, cos, sin, cache, qkv, gate_up) if native_ready(h, mask) else None
    if out is not None:
        return out
    attn, mlp = layer.self_attn, layer.mlp
    b, n, _ = h.shape
    d = attn.head_dim
    norm = layer.input_layernorm
    dev = h.device
    x = _decode_op("rms_norm", dev)(h, norm.weight, float(norm.variance_epsilon))
    if qkv is None:
        q, k, v = (decode_linear(x, m.weight) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
    else:
        nq, nkv = attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0]
        q, k, v = decode_linear(x, qkv).split((nq, nkv, nkv), dim=-1)
    q, k, v = (t.view(b, n, -1, d).transpose(1, 2) for t in (q, k, v))
    q, k = _decode_op("rotary_embedding", dev)(q, k, cos, sin)
    if cache is not None:
        k, v = cache.update(k, v, attn.layer_idx)
    out = attend(attn, q, k, v, mask)
    h = h + decode_linear(out.reshape(b, n, -1), attn.o_proj.weight)
    norm = layer.post_attention_layernorm
    x = _decode_op("rms_norm", dev)(h, norm.weight, float(norm.variance_epsilon))
    if gate_up is None:
        gate, up = decode_linear(x, mlp.gate_proj.weight), decode_linear(x, mlp.up_proj.weight)
    else:
        gate, up = decode_linear(x, gate_up).chunk(2, dim=-1)
    return h + decode_linear(F.silu(gate) * up, mlp.down_proj.weight)


def _weight(linear: torch.nn.Module) -> torch.Tensor:
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
        mats = [_weight(attn[name]) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
        mats += [_weight(mlp["gate_proj"]), _weight(mlp["up_proj"])]
    else:
        mats = [qkv, _weight(attn["o_proj"]), gate_up]
    mats.append(_weight(mlp["down_proj"]))
    packed = [getattr(w, INT8_ATTR, None) for w in mats]
    if packed.count(None) == len(packed):
        return mats, []
    if None in packed:
        return None
    pairs = [_int8_pair(w, p) for w, p in zip(mats, packed, strict=True)]  # type: ignore[arg-type]
    return [q for q, _ in pairs], [scale for _, scale in pairs]


def native_ready(h: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """The checks of the one-call path (:func:`_native_call`) that hold for every layer of a forward alike."""
    b, n, _ = h.shape
    return not (
        not _NATIVE_ATTENTION
        or not getattr(_skinny, "on", False)
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


def _layer_static(layer: Any, qkv: torch.Tensor | None, gate_up: torch.Tensor | None) -> _LayerStatic | None:
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
    return _LayerStatic(mats, scales, _weight(n1), _weight(n2), shared, dtype)


def _mask_covers(mask: torch.Tensor, b: int, n: int, end: int) -> bool:
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
    if not isinstance(slot, _slot_layer_class()):
        return None
    static = _layer_static(layer, qkv, gate_up)
    if static is None or (static.dtype is not None and static.dtype != h.dtype):
        return None
    if not _mask_covers(mask, b, n, slot.get_seq_length() + n):
        return None
    return static, slot


def _native_call(
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
    out = _decode_op("decoder_layer", h.device)(
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


class _StackPlan(NamedTuple):
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
) -> _StackPlan | None:
    """The layers' part of a :func:`specdec_kernels.decoder_stack` call, or None unless every layer is a Llama layer
    of one weight kind (float of one dtype, or int8) whose epsilons and score scale all share. ``fused(layer)``:
    the layer's [q; k; v] and [gate; up] matrices as one each (a small draft's), else its seven projections."""
    found = [_layer_static(layer, *(fused(layer) if fused else (None, None))) for layer in layers]
    statics = [st for st in found if st is not None]
    index = [layer._modules["self_attn"].layer_idx for layer in layers]
    if not statics or len(statics) != len(found) or not all(isinstance(i, int) for i in index):
        return None
    if len({st.dtype for st in statics}) != 1 or len({st.shared for st in statics}) != 1:
        return None
    return _StackPlan(
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
    plan: _StackPlan,
) -> torch.Tensor | None:
    """Once :func:`native_ready` holds, every layer of ``layers`` (in order) in one
    :func:`specdec_kernels.decoder_stack` call: what each layer's one-call path computes, bit for bit, without a
    Python-level call per layer. None (nothing run) unless every layer would take that path, none has hooks, and
    all share their epsilons, score scale and weight kind (float or int8). ``plan``: :func:`stack_plan` of
    ``layers`` (the adapter makes it once per cache)."""
    for layer in layers:
        if _layer_hooks(layer):
            return None
    if plan.dtype is not None and plan.dtype != h.dtype:
        return None
    slot_class = _slot_layer_class()
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
    if not _mask_covers(mask, b, n, end):
        return None
    k_caches, v_caches = [], []
    for slot in slots:
        room = slot.slots(n)
        if room is None or room[2] != end - n:
            return None
        k_caches.append(room[0])
        v_caches.append(room[1])
    out = _decode_op("decoder_stack", h.device)(
        h, plan.weights, plan.scales, plan.ln1, plan.ln2, cos, sin, k_caches, v_caches, end - n, mask, *plan.shared
    )
    for slot in slots:
        slot.commit(end)
    return out


#: the attention implementation name of the adapter's own forwards: HF's sdpa with decode_attention for the calls it
#: takes (registered once, beside HF's own entries; "sdpa" itself is never replaced)
SPECDEC_ATTENTION = "specdec_sdpa"


class Routing:
    """The fast CPU path of one model, switched on for the adapter's own forwards only (:meth:`active`).

    Inside: every bias-free ``nn.Linear`` of the model runs :func:`decode_linear` and, for a model loaded with
    ``attn_implementation="sdpa"``, its attention runs under :data:`SPECDEC_ATTENTION`. On exit the model is as it
    was: no instance ``forward`` is left on a module and the config names its own attention again, so calls of the
    user's model outside specdec (and its outputs) are those of an untouched copy. Modules that already carry an
    instance ``forward`` (hooks such as accelerate's) are left alone."""

    def __init__(self, model: Any) -> None:
        self.linears = [
            m for m in model.modules() if type(m) is torch.nn.Linear and m.bias is None and "forward" not in m.__dict__
        ]
        self.forwards = [partial(_routed_linear, m) for m in self.linears]
        # the adapter's attention stands in for transformers' own sdpa only (a user's "sdpa" must run as registered)
        stock = getattr(model.config, "_attn_implementation", None) == "sdpa" and _stock_sdpa()
        self.config = model.config if stock else None
        routed = {id(m) for m in self.linears}
        # whole decoder layers in fused ops where the layer is a stock one (needs sdpa: its attention is the
        # adapter's) and the kernels are there
        fused = self.config is not None and _NATIVE_ATTENTION
        self.layers = [m for m in model.modules() if fused and _fast_layer_ok(m, routed)]
        self.layer_forwards = [partial(_fast_decoder_layer, m) for m in self.layers]
        self.depth = 0
        if self.config is not None:
            _register_attention()

    @contextmanager
    def active(self) -> Iterator[None]:
        if self.depth:  # nested (the head after the base model): already on
            yield
            return
        self.depth = 1
        for m, f in zip(self.linears, self.forwards, strict=True):
            m.__dict__["forward"] = f  # the instance attribute shadows nn.Linear.forward
        for m, f in zip(self.layers, self.layer_forwards, strict=True):
            m.__dict__["forward"] = f
        # only over the config's own sdpa (a model switched to another attention since keeps it), restored after
        switched = self.config is not None and self.config._attn_implementation == "sdpa"
        if switched:
            self.config._attn_implementation = SPECDEC_ATTENTION
        try:
            with skinny_linears():
                yield
        finally:
            for m in (*self.linears, *self.layers):
                m.__dict__.pop("forward", None)
            if switched:
                self.config._attn_implementation = "sdpa"
            self.depth = 0


def _kernel_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float | None
) -> torch.Tensor | None:
    """HF attention (q [B, H, n, D], k/v [B, Hkv, S, D] after the cache update, additive mask) by
    :func:`specdec_kernels.decode_attention` when the cpu kernel takes the call: CPU tensors of one dtype, at most
    :data:`DECODE_ROWS` query rows, a 4-D floating mask covering exactly the S keys. Returns [B, n, H, D] (HF's
    layout), or None for a call it leaves to the model's own attention.

    Every query row is computed alone and blocked slots add exact zeros, so with row-independent linears a tree
    node's logits in a verification pass are bitwise those of the same token in a one-token step: greedy speculative
    decoding then equals AR token for token in bf16 too, not only up to bf16 near-ties (tested)."""
    if not _NATIVE_ATTENTION or mask is None or scale is None:
        return None
    b, h, n, _ = query.shape
    if (
        n > DECODE_ROWS
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
    out = _decode_op("decode_attention", query.device)(query, key, value, mask, float(scale))
    return out.transpose(1, 2).contiguous()


def _specdec_attention(
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
        getattr(_skinny, "on", False)  # another thread calling the model meanwhile keeps HF's sdpa, as for linears
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


def _stock_sdpa() -> bool:
    """Whether transformers' attention registry still maps "sdpa" to transformers' own function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS.get("sdpa") is sdpa_attention_forward


def _structure(model: Any) -> tuple:
    """What the adapter's choices at construction rest on: every module (identity, class, hooks, an instance
    forward), the parameters' dtype and device, the attention the config names and what "sdpa" runs (the training
    flag is not among them: :meth:`HFCausalLM.check_target` reads it at every call).
    :meth:`HFCausalLM.refresh` compares it at every generate call, so that a hook added, a module replaced (e.g. by an
    adapter library), a cast or another attention after the decoder was built is seen."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    p = next(model.parameters())
    modules = tuple(
        (id(m), type(m), "forward" in m.__dict__, bool(m._forward_hooks or m._forward_pre_hooks))
        for m in model.modules()
    )
    attn = getattr(model.config, "_attn_implementation", None)
    return attn, id(ALL_ATTENTION_FUNCTIONS.get("sdpa")), p.dtype, p.device, modules


def _register_attention() -> None:
    """Register :data:`SPECDEC_ATTENTION` (and sdpa's mask function under the same name) once per process."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    if SPECDEC_ATTENTION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(SPECDEC_ATTENTION, _specdec_attention)
    if SPECDEC_ATTENTION not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(SPECDEC_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


@dataclass
class KVState:
    """A model's KV cache for a batch plus which slots each row may attend.

    Shape: valid [B, S] bool (S = cache length), n_cached [B] int64 = committed tokens of the row whose KV is in
    the cache (they sit at positions 0 .. n_cached-1).
    """

    cache: Any
    valid: torch.Tensor
    n_cached: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.valid.shape[1])

    @property
    def batch(self) -> int:
        return int(self.valid.shape[0])

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (int64 [B']) of the batch, e.g. after other rows finished."""
        if self.length:
            self.cache.batch_select_indices(rows)
        self.valid = self.valid[rows]
        self.n_cached = self.n_cached[rows]
        self._trim()

    def _trim(self) -> None:
        """Drop trailing slots that no remaining row uses (cheap: a view of every layer)."""
        if not self.length:
            return
        used = self.valid.any(dim=0).nonzero()
        new_len = int(used.max()) + 1 if used.numel() else 0
        if new_len < self.length:
            crop_cache(self.cache, self.length - new_len)
            self.valid = self.valid[:, :new_len]

    def keep(self, run_start: torch.Tensor, run_len: torch.Tensor, path: torch.Tensor, path_len: torch.Tensor) -> None:
        """End a round: row b keeps the run of slots ``run_start[b] .. run_start[b] + run_len[b] - 1``
        (the chain ``forward_chain`` appended this round, already counted in ``n_cached``) followed by the slots
        ``path[b, :path_len[b]]`` (e.g. the tree's root and accepted nodes, increasing, after the run); they move
        to the slots right after the row's earlier committed tokens, so row b holds exactly ``[0, n_cached[b])``
        afterwards, with ``n_cached`` grown by ``path_len``. Every other slot is dropped and the cache is cropped to
        the longest row.

        Shape: run_start, run_len [B] int64; path [B, M] int64 slot ids (entries past path_len are ignored);
        path_len [B] int64. Only the slots that change place are copied (specdec_kernels.filter_kv).
        """
        ends = self.n_cached + path_len
        kv = self.layer_tensors() if self.length else []
        dst0 = (self.n_cached - run_len).tolist()
        r_start, r_len, p_len = run_start.tolist(), run_len.tolist(), path_len.tolist()
        paths = path.tolist() if max(p_len, default=0) > 0 else [[] for _ in p_len]
        prefix: list[int] = []
        moves: list[list[int]] = []
        for b, dst in enumerate(dst0):
            src: list[int] = []
            if r_len[b] and r_start[b] != dst:  # a run either stays where it is or moves whole
                src = list(range(r_start[b], r_start[b] + r_len[b]))
            else:
                dst += r_len[b]
            rest = paths[b][: p_len[b]]
            if not src:  # nodes that already sit at their destination stay (batch 1: the whole path, for a chain)
                k = 0
                while k < len(rest) and rest[k] == dst + k:
                    k += 1
                dst, rest = dst + k, rest[k:]
            src += rest
            if src and dst == 0:  # filter_kv's prefix_len must be >= 1: a row with nothing cached gets slot 0 here
                for t in kv:
                    t[b, :, 0] = t[b, :, src[0]]
                dst, src = 1, src[1:]
            prefix.append(max(dst, 1))
            moves.append(src)
        width = max((len(m) for m in moves), default=0)
        if width:
            dev = self.n_cached.device
            # filter_kv moves slot P - 1 + node[j] to slot P + j
            nodes = [[s - p + 1 for s in m] + [-1] * (width - len(m)) for m, p in zip(moves, prefix, strict=True)]
            sk.filter_kv(
                kv,
                torch.tensor(prefix, dtype=torch.long, device=dev),
                torch.tensor(nodes, dtype=torch.long, device=dev),
                torch.tensor([len(m) for m in moves], dtype=torch.long, device=dev),
                validate=False,
            )
        self.n_cached = ends
        length = self.length
        top = min(int(ends.max()), length) if ends.numel() else 0
        self.valid = torch.arange(top, device=ends.device)[None, :] < ends[:, None]
        if top < length:
            crop_cache(self.cache, length - top)

    def layer_tensors(self) -> list[torch.Tensor]:
        """Every layer's keys and values, [B, H, S, D] each (the tensors filter_kv edits in place)."""
        out = []
        for layer in self.cache.layers:
            out.extend([layer.keys, layer.values])
        return out


def _slot_layer_class() -> type:
    """:class:`transformers.DynamicLayer` whose keys and values are views of buffers with room to grow (built once,
    on first use, so that importing this module does not import transformers)."""
    global _SLOT_LAYER
    if _SLOT_LAYER is not None:
        return _SLOT_LAYER
    from transformers.cache_utils import DynamicLayer

    class SlotLayer(DynamicLayer):
        """A cache layer whose ``keys``/``values`` [B, H, S, D] are views of [B, H, capacity, D] buffers.

        DynamicLayer concatenates on every update, copying the whole cache once per layer and step; here an update
        writes the new slots after the last ones and widens the view, and only a full buffer is copied into a larger
        one. Slot moves (filter_kv) and crops (crop_slots, ``crop``) edit the views in place. A layer whose views no
        longer sit in its buffers (``batch_select_indices``, ``reorder_cache`` make new tensors) starts a new
        buffer at its next update."""

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            super().lazy_initialization(key_states, value_states)
            self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None
            self._views: tuple[torch.Tensor, torch.Tensor] | None = None  # the keys/values commit made

        def _room(self, new: torch.Tensor, length: int) -> bool:
            bufs = self.buffers
            if bufs is None or length == 0:
                return bufs is not None and bufs[0].shape[:2] == new.shape[:2] and bufs[0].shape[3] == new.shape[3]
            k = self.keys
            return (
                k.data_ptr() == bufs[0].data_ptr()
                and self.values.data_ptr() == bufs[1].data_ptr()
                and k.stride() == bufs[0].stride()
                and self.values.stride() == bufs[1].stride()
                and k.shape[:2] == new.shape[:2]
                and k.shape[3] == new.shape[3]
            )

        def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, end: int) -> None:
            # grow by a quarter (at least 128 slots): a copy of the cache every few hundred tokens, not per step
            cap = -(-(end + max(128, end // 4)) // 64) * 64
            b, h, _, d = key_states.shape
            kb = key_states.new_empty((b, h, cap, d))
            vb = value_states.new_empty((b, value_states.shape[1], cap, value_states.shape[3]))
            if length:
                kb[:, :, :length].copy_(self.keys)
                vb[:, :, :length].copy_(self.values)
            self.buffers = (kb, vb)

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            length = self.get_seq_length()
            end = length + key_states.shape[-2]
            if not self._room(key_states, length) or self.buffers[0].shape[2] < end:  # type: ignore[index]
                self._grow(key_states, value_states, length, end)
            kb, vb = self.buffers  # type: ignore[misc]
            kb[:, :, length:end].copy_(key_states)
            vb[:, :, length:end].copy_(value_states)
            self.commit(end)
            return self.keys, self.values

        def slots(self, n: int) -> tuple[torch.Tensor, torch.Tensor, int] | None:
            """(k buffer, v buffer, length) with room for ``n`` slots after the ``length`` cached ones, for a caller
            that writes them itself and then calls :meth:`commit`; None where the layer caches nothing yet or its
            views left its buffers (:meth:`update` then starts new ones)."""
            if not self.is_initialized:
                return None
            views = self._views  # still commit's views (crops narrow them in place): in the buffers, no check
            ours = views is not None and self.keys is views[0] and self.values is views[1]
            if not ours and self.keys.dim() != 4:
                return None
            length = self.get_seq_length()
            if length == 0 or not (ours or self._room(self.keys, length)):
                return None
            if self.buffers[0].shape[2] < length + n:  # type: ignore[index]
                self._grow(self.keys, self.values, length, length + n)
            kb, vb = self.buffers  # type: ignore[misc]
            return kb, vb, length

        def commit(self, end: int) -> None:
            """The cache holds the first ``end`` slots of its buffers."""
            kb, vb = self.buffers  # type: ignore[misc]
            self.keys, self.values = kb.narrow(2, 0, end), vb.narrow(2, 0, end)
            self._views = (self.keys, self.values)

    _SLOT_LAYER = SlotLayer
    return SlotLayer


_SLOT_LAYER: type | None = None


def new_cache() -> Any:
    """An empty :class:`transformers.DynamicCache` whose layers (created on first update) are slot layers
    (:func:`_slot_layer_class`). No config: every layer is a plain full layer, sliding ones too (a config would make
    those drop keys past the window, while the adapter's masks index all S slots and KVState moves and crops every
    layer alike)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layer_class_to_replicate = _slot_layer_class()
    return cache


#: the keywords under which transformers passes a KV cache: ``cache`` in current releases, ``past_key_values`` in
#: older ones (5.17) and as a deprecated alias
CACHE_KEYWORDS = ("cache", "past_key_values")


def cache_argument(module: Any) -> str:
    """The keyword under which ``module.forward`` takes a KV cache: ``cache`` in current transformers, whose
    ``past_key_values`` is a deprecated alias; ``past_key_values`` for a forward that does not name ``cache``."""
    forward = module.__dict__.get("forward") or type(module).forward
    return _cache_keyword(forward)


@functools.lru_cache(maxsize=256)
def _cache_keyword(forward: Any) -> str:
    # per function, not per call: inspect.signature costs ~0.1 ms, a draft model's step a few
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def crop_cache(cache: Any, remove: int) -> None:
    """Drop the last ``remove`` slots of every layer of a DynamicCache (``cache.crop(-remove)``); a cache of plain
    CPU layers is narrowed in one kernel call (specdec_kernels.crop_slots) instead of two slices per layer."""
    layers = cache.layers
    if remove <= 0 or not any(getattr(layer, "is_initialized", True) for layer in layers):
        return  # nothing cached yet (older transformers' crop fails on a layer that holds nothing)
    plain = getattr(cache, "_specdec_plain_layers", None)
    if plain is None and layers and all(layer.is_initialized for layer in layers):
        # layer types never change, so this is decided once per cache (after its first forward)
        from transformers.cache_utils import DynamicLayer

        plain = all(type(layer) in (DynamicLayer, _slot_layer_class()) for layer in layers)
        cache._specdec_plain_layers = plain
    if plain:
        kv = [t for layer in layers for t in (layer.keys, layer.values)]
        if sk.crop_slots(kv, int(kv[0].shape[2]) - remove):
            return
    cache.crop(-remove)


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


def _sliding_window(config: Any, name: str) -> tuple[int | None, bool]:
    """The window of the model's sliding-window layers (None: no layer has one) and whether only some layers have it
    (the base model then takes a dict of masks keyed by layer type)."""
    layers = _WINDOWED_LAYERS[config.model_type]
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


def _rope_limit(model: Any) -> tuple[int, str] | None:
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


class HFCausalLM:
    """Adapter around a HuggingFace causal LM for tree decoding.

    Runs the base model (``model.get_decoder()``) with a 4-D mask and explicit position ids, then applies the
    output embedding (lm_head) only to the rows whose logits are needed. Raises ``ValueError`` for unsupported
    architectures or attention implementations.
    """

    def __init__(self, model: Any, *, name: str = "model") -> None:
        config = getattr(model, "config", None)
        if config is None or not callable(getattr(model, "get_decoder", None)):
            raise TypeError(f"{name} must be a HuggingFace causal LM (PreTrainedModel), got {type(model).__name__}")
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
        if model_type in _SOFTCAPPED_ATTENTION and softcap is not None and attn != "eager":
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
        # sliding-window layers: the tree mask also hides keys older than the window (window_mask)
        self.window, self.typed_window = _sliding_window(config, name)
        #: (tokens, RoPE type): sequences longer than this get rotary frequencies that depend on the chunking
        self.rope_limit = _rope_limit(model)
        # the adapter applies the head itself, so also the cap the model's own forward puts after it
        cap = getattr(config, "final_logit_softcapping", None) if model_type in _SOFTCAPPED_LOGITS else None
        self.logit_softcap: float | None = cap
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{name} has no output embedding (lm_head); pass a *ForCausalLM model")
        self.model = model
        self.name = name
        self.routing = Routing(model)
        self.base = model.get_decoder()
        self._cache_arg = cache_argument(self.base)
        # a stock Llama/Mistral stack whose every layer runs fused: its forward is run part by part (_lean_base)
        layers = getattr(self.base, "layers", None)
        self._lean = (
            type(self.base) in _lean_base_classes()
            and layers is not None
            and len(layers) == int(getattr(config, "num_hidden_layers", -1))
            and {id(m) for m in layers} == {id(m) for m in self.routing.layers}
        )
        # a feature draft's base (specdec.train.FeatureDecoder) can run a forward without its module call
        self._lean_features = callable(getattr(self.base, "lean_call", None))
        self.head = head
        self._head_routed = any(m is head for m in self.routing.linears)
        self.vocab_size = int(head.weight.shape[0])
        self.num_parameters = sum(p.numel() for p in model.parameters())
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self._plan: tuple[_StackPlan | None] | None = None  # the stack path's layer arguments (new_state)
        self._structure = _structure(model)  # what the choices above rest on (refresh)
        self.last_hidden: torch.Tensor | None = None  # hidden state of the latest forward (see _run)
        # Feature drafts read [final hidden ; inputs of these layers] (set by the decoder): ``last_features``.
        self.feature_layers: tuple[int, ...] = ()
        self.last_features: torch.Tensor | None = None
        # A head that can score a sorted subset of the vocabulary only (specdec.train.ReducedHead: exact zeros
        # elsewhere) lets a drafter ask for [.., S] logits over ``support`` instead of full rows that are mostly
        # -inf, so processing and sampling read S values instead of V.
        # Columns are put in token-id order (lowest id first is the greedy tie rule).
        ids = getattr(head, "head_ids", None) if getattr(head, "reduced_output", False) else None
        self.support: torch.Tensor | None = None
        self._support_order: torch.Tensor | None = None  # column permutation when head_ids are not sorted
        if isinstance(ids, torch.Tensor) and ids.dim() == 1 and ids.numel():
            ids = ids.to(self.device)
            if bool((ids[1:] > ids[:-1]).all()):
                self.support = ids
            else:
                self.support, self._support_order = torch.sort(ids)

    def refresh(self) -> bool:
        """Build the adapter again if the model changed since it was built (:func:`_structure`: a hook, a replaced
        module, a cast, another attention); returns whether it did. Decoders call it at every generate call."""
        if _structure(self.model) == self._structure:
            return False
        self.__init__(self.model, name=self.name)  # type: ignore[misc]
        return True

    def check_target(self) -> None:
        """Refuse what would make a target's logits differ from its own forward's: training-mode dropout (the driver
        cannot draw the masks transformers would) and int8 copies of its weights (:func:`int8_weights` applied to
        the target, or to a draft that shares modules with it)."""
        model = self.model
        if model.training:
            p = float(getattr(model.config, "attention_dropout", 0.0) or 0.0)
            drop = [m for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0]
            if p > 0 or any(m.training for m in drop):
                raise ValueError(
                    f"{self.name} is in training mode with dropout (attention_dropout={p:g}, {len(drop)} dropout "
                    "modules with p > 0): its logits would be random; call model.eval() before generating"
                )
        quantized = [m for m in model.modules() if hasattr(m._parameters.get("weight"), INT8_ATTR)]
        if quantized:
            raise ValueError(
                f"{self.name}: {len(quantized)} linear(s) carry int8 weights (specdec.int8_weights was applied to the "
                "target, or to a draft sharing these modules with it); the target must keep its own weights for the "
                "output to be the model's (quantize a draft that does not share modules with the target)"
            )

    def check_length(self, tokens: int) -> None:
        """Refuse a run whose sequences reach ``tokens`` tokens where the rotary frequencies would change with them
        (:func:`_rope_limit`): there no decoding that verifies several tokens per forward, nor batched decoding, can
        give the model's own one-token-at-a-time logits."""
        if self.rope_limit is not None and tokens > self.rope_limit[0]:
            limit, kind = self.rope_limit
            raise ValueError(
                f"{self.name}: rope_type {kind!r} changes its rotary frequencies once a sequence passes {limit} tokens "
                f"(here up to {tokens}: the longest prompt + max_new_tokens - 1), so the logits would depend on how "
                f"tokens are chunked and batched; keep prompt + new tokens within {limit + 1} or use a model with "
                "static rotary embeddings"
            )

    def new_state(self, batch: int) -> KVState:
        """An empty cache for ``batch`` rows. The layers' part of the one-call stack path (:func:`stack_plan`) is
        read again from the model at its first forward on the new cache."""
        self._plan = None
        return KVState(
            cache=new_cache(),
            valid=torch.zeros((batch, 0), dtype=torch.bool, device=self.device),
            n_cached=torch.zeros((batch,), dtype=torch.long, device=self.device),
        )

    def _run(
        self,
        state: KVState,
        tokens: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor,
        block_valid: torch.Tensor,
        want: torch.Tensor | None,
        features: torch.Tensor | None = None,
        reduced: bool = False,
    ) -> torch.Tensor | None:
        """One forward appending ``tokens`` [B, n] to the cache; logits [B, n, V] at ``want`` rows (else 0).

        ``features`` [B, n, E]: the extra input of a feature draft (specdec.train.FeatureDraft), else None.
        ``reduced``: logits over ``support`` only, [B, n, S] (see :meth:`project`).
        Logits keep the head's dtype: process_logits widens bf16/fp16 exactly, so a separate fp32 copy would only
        cost a pass over the vocabulary."""
        extra: dict[str, Any] = {} if features is None else {"features": features}
        if self.feature_layers:
            extra["output_hidden_states"] = True
        lean = not self.feature_layers and self._lean_now(tokens, features is not None)
        # the lean forwards call the decode ops themselves (and the routing where a module call needs it): they
        # need the ops resolved, not the linears swapped; the stock forward runs with the routing on throughout
        with skinny_linears() if lean else self.routing.active():
            if lean and features is not None:
                if self._plan is None:  # the draft's layers in one decoder_stack call where they all take it
                    plan_of = getattr(self.base, "stack_plan", None)
                    self._plan = (plan_of() if callable(plan_of) else None,)
                hidden = self.base.lean_call(tokens, features, mask, position_ids, state.cache, self._plan[0])
                out = None
            elif lean:
                hidden = self._lean_base(tokens, position_ids, mask, state.cache)
                out = None
            else:
                out = self.base(
                    input_ids=tokens,
                    attention_mask=self._layer_masks(mask),
                    position_ids=position_ids,
                    use_cache=True,
                    **{self._cache_arg: state.cache},
                    **extra,
                )
                hidden = out.last_hidden_state
            state.valid = torch.cat([state.valid, block_valid], dim=1)
            self.last_hidden = hidden.detach()  # final-norm output [B, n, H], read by acceptance heads
            self.last_features = self.last_hidden
            if self.feature_layers:
                assert out is not None
                extra_feats = layer_features(self.base, out.hidden_states, self.feature_layers)
                self.last_features = torch.cat([self.last_hidden, extra_feats.detach()], dim=-1)
            if want is None:
                return None
            # NaN logits are caught where the logits are processed (one pass there instead of one more here).
            if bool(want.all()):
                return self.project(hidden, reduced)
            rows = self.project(hidden[want], reduced)
            logits = torch.zeros((*tokens.shape, rows.shape[-1]), dtype=rows.dtype, device=tokens.device)
            logits[want] = rows
            return logits

    def _lean_now(self, tokens: torch.Tensor, features: bool = False) -> bool:
        """Whether this forward may skip the base model's module call: :meth:`_lean_base` for a stock stack of fused
        layers (``_lean``), or the base's own ``lean_call`` for a feature draft's forward (``features``); on CPU,
        without autograd, and no hook that must see the base model called."""
        base = self.base
        return (
            (self._lean_features if features else self._lean)
            and self.window is None
            and tokens.device.type == "cpu"
            and not torch.is_grad_enabled()
            and not (base._forward_hooks or base._forward_pre_hooks or "forward" in base.__dict__)
            and not _global_module_hooks()
        )

    def _lean_base(
        self, tokens: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """The base model's forward for the adapter's calls, part by part: embedding, rotary table, the layers (in
        one :func:`specdec_kernels.decoder_stack` call where every layer takes its one-call path; else layer by
        layer, a layer with hooks as a module call so that they fire, inside :meth:`Routing.active` its forward
        being :func:`_fast_decoder_layer`, which takes ``cache``), final norm. The stock forward does the same with
        an additive 4-D mask (taken as is) and costs a fixed ~0.2 ms more per call in its wrappers, which is a good
        part of a small draft's step."""
        base = self.base
        h = base.embed_tokens(tokens)
        cos_sin = rotary_rows(base.rotary_emb, position_ids, h)
        # the whole stack in one call where every layer takes its one-call path; else a layer without hooks goes
        # straight to that path where its call takes it (the checks that hold for every layer made once): what its
        # module call would run, without the module call's wrappers
        direct = native_ready(h, mask)
        out = None
        if direct:
            if self._plan is None:
                self._plan = (stack_plan(base.layers),)
            plan = self._plan[0]
            out = None if plan is None else native_stack(base.layers, h, mask, cos_sin[0], cos_sin[1], cache, plan)
        if out is not None:
            return base.norm(out)
        with self.routing.active():  # a layer's module call runs its fused forward and the routed linears
            for layer in base.layers:
                out = None
                if direct and not _layer_hooks(layer):
                    out = _native_call(layer, h, mask, cos_sin[0], cos_sin[1], cache, None, None)
                h = out if out is not None else layer(
                    h, attention_mask=mask, position_embeddings=cos_sin, position_ids=position_ids, use_cache=True,
                    **{cache_argument(layer): cache},
                )  # fmt: skip
        return base.norm(h)

    def _layer_masks(self, mask: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """The attention mask argument of the base model: ``mask`` itself, windowed for sliding-window layers."""
        if self.window is None:
            return mask
        local = window_mask(mask, self.window)
        return {"full_attention": mask, "sliding_attention": local} if self.typed_window else local

    def project(self, hidden: torch.Tensor, reduced: bool = False) -> torch.Tensor:
        """Output head. Shape: hidden [..., H] -> logits [..., V], or [..., S] over ``support`` when ``reduced``
        (only for a head with a support, see ``support``; called through the module so that forward hooks see it)."""
        if not reduced:
            head = self.head
            if (
                self._head_routed
                and getattr(_skinny, "on", False)
                and not ("forward" in head.__dict__ or _layer_hooks(head) or _global_module_hooks())
            ):  # what its routed module call runs, without the call
                return self._softcap(decode_linear(hidden, _weight(head)))
            with self.routing.active():
                return self._softcap(self.head(hidden))
        if self.support is None:
            raise ValueError(
                f"{self.name}: reduced logits need an output head that scores a subset of the vocabulary (ReducedHead)"
            )
        head = self.head
        reduced = getattr(head, "reduced", None)
        if (
            callable(reduced)
            and getattr(_skinny, "on", False)
            and not ("forward" in head.__dict__ or _layer_hooks(head) or _global_module_hooks())
        ):  # what its module call runs (ReducedHead.forward, full=False), without the call
            z = self._softcap(reduced(hidden))
        else:
            z = self._softcap(head(hidden, full=False))
        return z if self._support_order is None else z[..., self._support_order]

    def _softcap(self, logits: torch.Tensor) -> torch.Tensor:
        """``final_logit_softcapping`` as the model's own forward applies it (same ops, so the same bits)."""
        cap = self.logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def forward_chain(
        self,
        state: KVState,
        chains: list[list[int]],
        *,
        last_logits: bool,
        features: torch.Tensor | None = None,
        reduced: bool = False,
    ) -> torch.Tensor | None:
        """Append each row's ``chains[b]`` (committed tokens, possibly empty) to the cache.

        Shape: returns logits [B, V] (head dtype; [B, S] over ``support`` when ``reduced``) of the last token of
        every chain when ``last_logits`` (every chain must then be non-empty), else None. ``features``
        [B, >= longest chain, E]: a feature draft's paired input (right-padded like the chains).
        """
        batch = state.batch
        lens = torch.tensor([len(c) for c in chains], dtype=torch.long, device=self.device)
        width = int(lens.max()) if batch else 0
        if width == 0:
            if last_logits:
                raise ValueError("forward_chain: every row needs a token to produce logits")
            return None
        tokens = torch.zeros((batch, width), dtype=torch.long, device=self.device)
        for b, c in enumerate(chains):
            if c:
                tokens[b, : len(c)] = torch.tensor(c, dtype=torch.long)
        cols = torch.arange(width, device=self.device)
        block_valid = cols[None, :] < lens[:, None]
        mask = chain_mask(state.valid, block_valid, self.dtype)
        pos = state.n_cached[:, None] + cols[None, :]
        want = None
        if last_logits:
            if int(lens.min()) < 1:
                raise ValueError("forward_chain: every row needs a token to produce logits")
            want = cols[None, :] == (lens - 1)[:, None]
        feats = None if features is None else features[:, :width]
        logits = self._run(state, tokens, pos, mask, block_valid, want, feats, reduced)
        state.n_cached = state.n_cached + lens
        if logits is None:
            return None
        return logits[:, -1] if width == 1 else logits[want].reshape(batch, logits.shape[-1])

    def forward_tree(
        self,
        state: KVState,
        tokens: torch.Tensor,
        parent: torch.Tensor,
        valid: torch.Tensor,
        depth: torch.Tensor,
        reduced: bool = False,
    ) -> torch.Tensor:
        """Target evaluation of a batch of draft trees whose root is NOT cached yet.

        Shape: tokens/parent/depth [B, N] (node 0 = root = each row's last committed token), valid [B, N] bool
        -> logits [B, N, V] in the head dtype (valid nodes; zero rows for padding; [B, N, S] over ``support`` when
        ``reduced``). Node n lands in slot S + n (S = cache length before the call); the root's position is
        n_cached, node n's position n_cached + depth[n].
        """
        past = state.length
        # the driver's own trees (DraftTree.append_level): structure checks skipped, the kernel still bounds-checks
        mask = sk.tree_mask(parent, valid, past, past_valid=state.valid, dtype=self.dtype, validate=False)
        pos = sk.tree_positions(depth, state.n_cached + 1, validate=False)  # the driver's own depths and counts
        logits = self._run(state, tokens.clamp_min(0), pos, mask, valid, valid, None, reduced)
        assert logits is not None
        return logits

    def probe_chain(self, state: KVState, tokens: torch.Tensor) -> None:
        """A verification pass's cost: one forward over ``tokens`` [1, n] as a chain (a root and n - 1 drafts) after
        the cache, then the cache as it was (the n new slots dropped). Benchmarks and the auto-tree cost curve."""
        n = int(tokens.shape[1])
        parent = torch.arange(-1, n - 1, device=self.device)[None]
        depth = torch.arange(n, device=self.device)[None]
        try:
            self.forward_tree(state, tokens, parent, torch.ones_like(tokens, dtype=torch.bool), depth)
        finally:
            crop_cache(state.cache, n)
            state.valid = state.valid[:, : state.length - n]

    def forward_level(
        self,
        state: KVState,
        tokens: torch.Tensor,
        parent: torch.Tensor,
        valid: torch.Tensor,
        depth: torch.Tensor,
        lo: int,
        hi: int,
        base: int,
        features: torch.Tensor | None = None,
        reduced: bool = False,
    ) -> torch.Tensor:
        """Level-synchronous drafting: append tree nodes ``lo..hi-1`` of a tree whose root is cached.

        Shape: tokens/parent/valid/depth [B, >= hi]; the root (node 0) is a committed cached token; nodes
        1..lo-1 sit in slots base .. base+lo-2 (``base`` = cache length right after the root's block) and node n
        goes to slot base + n - 1. Returns logits [B, hi - lo, V] (head dtype) of the new nodes (valid ones).
        ``features`` [B, hi - lo, E]: a feature draft's paired input for the new nodes. ``reduced``: logits
        [B, hi - lo, S] over ``support``.
        """
        if state.length != base + lo - 1:
            raise RuntimeError(f"draft cache holds {state.length} slots, expected {base + lo - 1} before level {lo}")
        # The mask of the partial tree with the past = everything up to and including the root's block; the
        # root's own column is dropped because the root is already part of that past.
        # the partial tree is the one being drafted, built level by level by the driver (DraftTree.append_level),
        # so the structure checks are skipped; the kernel still bounds-checks
        full = sk.tree_mask(
            parent[:, :hi], valid[:, :hi], base, past_valid=state.valid[:, :base], dtype=self.dtype, validate=False
        )
        rows = full[:, :, lo:hi]
        mask = torch.cat([rows[..., :base], rows[..., base + 1 :]], dim=-1)
        # a row with nothing cached (a feature draft before its first pair) has no valid node in the level: its
        # positions are never used, the clamp only satisfies tree_positions' prefix >= 1
        pos = sk.tree_positions(depth[:, lo:hi], state.n_cached.clamp_min(1), validate=False)
        logits = self._run(
            state, tokens[:, lo:hi].clamp_min(0), pos, mask, valid[:, lo:hi], valid[:, lo:hi], features, reduced
        )
        assert logits is not None
        return logits
