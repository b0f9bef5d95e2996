"""The feature draft (EAGLE-style): a one-layer Llama that reads the target's final hidden states.

Input at draft position i: the pair (f_i, x_{i+1}) — the target's final hidden state after token i (what its
lm_head reads) and the embedding of the next token — mixed by a trained ``Linear(2E, H)``
(:class:`PairEmbedding`). The output h_i at position i is trained two ways: as the next target feature
f_{i+1} (smooth-L1 regression) and, through a reduced-vocabulary head initialised from the target's output
embedding, as the target's law of token x_{i+2}. When drafting deeper than one token the draft feeds its own h
back in place of the target feature it does not have yet (one level at a time; :class:`specdec.FeatureDrafter`).

Exactness does not depend on any of this: the draft law p is whatever the model outputs, a deterministic
function of the committed prefix (the target's hidden states are themselves such a function), and every verifier
is exact for any p.

The class looks like an HF causal LM to :class:`specdec.models.HFCausalLM` (``config``, ``get_decoder``,
``get_output_embeddings``), so KV caches, tree masks and KV filtering are the driver's usual ones; the decoder
module takes an extra ``features`` argument.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdec_kernels import decode_attention, rms_norm

from ...models import (
    CACHE_KEYWORDS,
    cache_argument,
    concat_weights,
    decode_linear,
    fused_decoder_layer,
    native_ready,
    native_stack,
    rotary_rows,
    stack_plan,
    tensor_version,
)
from ..store import resolve_asset
from .draft import ReducedHead, check_fingerprint, check_target_vocab, load_trained, target_embedding

FEATURE_DRAFT = "smollm2-eagle"


@dataclass
class FeatureDraftConfig:
    """Shape of the feature draft; the width is the target's (its features are read and predicted directly)."""

    num_layers: int = 1
    intermediate_size: int = 1024
    num_heads: int = 9
    num_kv_heads: int = 3
    head_vocab: int = 6144
    # target decoder layers whose inputs are read besides the final hidden state (EAGLE-3-style fusion); () = none
    extra_layers: tuple[int, ...] = ()


class PairEmbedding(nn.Module):
    """``Linear(2E, H)`` over [feature ; embedding(token)], the embedding table being the target's (frozen, not
    saved: it is taken from the target at load time). With ``n_extra`` extra target layers, target features arrive
    as [final ; layer inputs] ((1 + n_extra) E wide) and a ``fuse`` Linear maps them to E first; the draft's own
    outputs (E wide) are used as they are."""

    def __init__(self, table: torch.Tensor, hidden_size: int, n_extra: int = 0) -> None:
        super().__init__()
        self.register_buffer("table", table.detach(), persistent=False)
        self.proj = nn.Linear(2 * table.shape[1], hidden_size, bias=False)
        self.width = int(table.shape[1])
        self.fuse = nn.Linear((1 + n_extra) * self.width, self.width, bias=False) if n_extra else None

    def fused(self, features: torch.Tensor) -> torch.Tensor:
        """Target features ((1 + n_extra) E) -> E; E-wide features pass through."""
        w = self.proj.weight
        if features.shape[-1] == self.width:
            return features.to(w.dtype)
        if self.fuse is None or features.shape[-1] != self.fuse.in_features:
            want = self.width if self.fuse is None else f"{self.width} or {self.fuse.in_features}"
            raise ValueError(f"features must have {want} channels, got {features.shape[-1]}")
        return self.fuse(features.to(w.dtype))

    @property
    def weight(self) -> torch.Tensor:  # HF helpers read embed_tokens.weight for dtype/device
        return self.proj.weight

    def forward(self, features: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        w = self.proj.weight
        emb = self.table[input_ids].to(w.dtype)
        return decode_linear(torch.cat([self.fused(features), emb], dim=-1), w)


class FeatureDecoder(nn.Module):
    """The decoder stack: pair embedding -> Llama layers -> final norm. ``features`` [B, n, E] is required."""

    def __init__(self, llama: Any, pair: PairEmbedding) -> None:
        super().__init__()
        self.llama = llama
        self.pair = pair

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor | None = None, **kwargs: Any) -> Any:
        if features is None:
            raise ValueError("the feature draft needs features= (the target's hidden states paired with input_ids)")
        _check_pair(features, input_ids)
        mask = kwargs.get("attention_mask")
        own = cache_argument(self.llama)
        for name in CACHE_KEYWORDS:  # either name from the caller reaches the stack under the one it takes
            if name != own and name in kwargs:
                kwargs[own] = kwargs.pop(name)
        cache = kwargs.get(own)
        positions = kwargs.get("position_ids")
        lean = not (self.training or torch.is_grad_enabled() or kwargs.get("output_hidden_states"))
        lean = lean and not kwargs.get("output_attentions")
        if lean and cache is not None and positions is not None and mask is not None and _additive_4d(mask):
            from transformers.modeling_outputs import BaseModelOutputWithPast

            hidden = self.lean_forward(self.pair(features, input_ids), mask, positions, cache)  # checked above
            return BaseModelOutputWithPast(last_hidden_state=hidden)
        return self.llama(inputs_embeds=self.pair(features, input_ids), **kwargs)

    def stack_plan(self) -> Any:
        """The layers' arguments of their one-call path (:func:`specdec.models.stack_plan` with the fused [q; k; v]
        and [gate; up] matrices of :func:`_fused`), or None where a layer cannot take it. ``HFCausalLM`` reads it once
        per cache and passes it to :meth:`lean_call`."""
        return stack_plan(self.llama.layers, _fused)

    def lean_call(
        self,
        input_ids: torch.Tensor,
        features: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        plan: Any = None,
    ) -> torch.Tensor:
        """The final-norm output [B, n, E] of a decode-step forward: pair embedding, then :meth:`lean_forward` (the
        decode-step ops skinny_linear and decode_attention, skipping HF's model wrapper and module plumbing; same
        math, see lean_layer). ``mask``: additive [B, 1, n, S] over the cache after this call's keys are appended;
        ``specdec.models.HFCausalLM`` calls this directly for its decode-step forwards. ``plan``: :meth:`stack_plan`
        (None: layer by layer)."""
        _check_pair(features, input_ids)
        if not _additive_4d(mask):
            raise ValueError(f"mask must be an additive 4-D float mask, got shape {tuple(mask.shape)} {mask.dtype}")
        return self.lean_forward(self.pair(features, input_ids), mask, positions, cache, plan)

    def lean_forward(
        self, h: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any, plan: Any = None
    ) -> torch.Tensor:
        """The Llama stack on embeddings ``h`` [B, n, E] with an additive ``mask`` [B, 1, n, S] (cache appended):
        in one ``decoder_stack`` call with ``plan`` (:meth:`stack_plan`) where every layer takes it (the same
        kernels as layer by layer, so the same bits), else layer by layer."""
        cos, sin = rotary_rows(self.llama.rotary_emb, positions, h)
        direct = plan is not None and native_ready(h, mask)
        out = native_stack(self.llama.layers, h, mask, cos, sin, cache, plan) if direct else None
        if out is not None:
            h = out
        else:
            for layer in self.llama.layers:
                h = lean_layer(layer, h, mask, cos, sin, cache)
        norm = self.llama.norm
        return rms_norm(h, norm.weight, norm.variance_epsilon, validate=False)


def _check_pair(features: torch.Tensor, input_ids: torch.Tensor) -> None:
    if features.shape[:-1] != input_ids.shape:
        want = tuple(input_ids.shape)
        raise ValueError(f"features must have shape {want} + [E] to pair with input_ids, got {tuple(features.shape)}")


def _additive_4d(mask: torch.Tensor) -> bool:
    return mask.dim() == 4 and mask.is_floating_point()


def _fused(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """[q; k; v] and [gate; up] weights of a layer as one matrix each (fewer, larger GEMVs per draft step).
    Cached on the layer and rebuilt whenever a source weight is replaced or edited in place (``_version``)."""
    attn, mlp = layer.self_attn, layer.mlp
    src = (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, mlp.gate_proj.weight, mlp.up_proj.weight)
    key = tuple((w.data_ptr(), tensor_version(w), w.dtype) for w in src)
    hit = getattr(layer, "_specdec_fused", None)
    if hit is None or hit[0] != key:
        with torch.no_grad():
            hit = (key, concat_weights(src[:3]), concat_weights(src[3:]))
        layer._specdec_fused = hit
    return hit[1], hit[2]


def lean_layer(
    layer: Any, h: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Any
) -> torch.Tensor:
    """One ``LlamaDecoderLayer`` computed from its weights (:func:`specdec.models.fused_decoder_layer`, with the
    fused [q; k; v] and [gate; up] matrices); ``tests/python_api/test_feature_draft.py`` checks it against the HF
    module."""
    qkv, gate_up = _fused(layer)
    return fused_decoder_layer(layer, h, mask, cos, sin, cache, attend=_attend, qkv=qkv, gate_up=gate_up)


def _attend(attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return decode_attention(q, k, v, mask, attn.scaling).transpose(1, 2)


class FeatureDraft(nn.Module):
    """EAGLE-style draft. ``forward(features, input_ids, ...)`` -> (hidden [B, n, E], full-vocab logits)."""

    reads_target_features = True

    def __init__(self, cfg: FeatureDraftConfig, target_config: Any, embed_table: torch.Tensor, head_ids: Any) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaModel

        vocab = int(target_config.vocab_size)
        if embed_table.shape[0] != vocab:
            raise ValueError(f"embed_table has {embed_table.shape[0]} rows but the target vocabulary is {vocab}")
        width = int(embed_table.shape[1])
        lcfg = LlamaConfig(
            vocab_size=8,  # inputs come through inputs_embeds; avoids a V x H table
            hidden_size=width,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_kv_heads,
            max_position_embeddings=int(getattr(target_config, "max_position_embeddings", 8192)),
            rope_parameters=getattr(target_config, "rope_parameters", None),
            rms_norm_eps=float(getattr(target_config, "rms_norm_eps", 1e-5)),
            tie_word_embeddings=False,
            pad_token_id=None,
            attn_implementation="sdpa",
        )
        llama = LlamaModel(lcfg)
        llama.embed_tokens = None
        self.config = lcfg
        self.config.vocab_size = vocab
        self.config.specdec_feature_draft = asdict(cfg)
        self.draft_config = cfg
        self.decoder = FeatureDecoder(llama, PairEmbedding(embed_table, width, len(cfg.extra_layers)))
        self.feature_layers = tuple(cfg.extra_layers)  # what the driver asks the target to keep
        self.lm_head = ReducedHead(width, head_ids, vocab)

    def get_decoder(self) -> FeatureDecoder:
        return self.decoder

    def get_output_embeddings(self) -> ReducedHead:
        return self.lm_head

    def forward(self, features: torch.Tensor, input_ids: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        hidden = self.decoder(input_ids, features=features, **kwargs).last_hidden_state
        return hidden, self.lm_head(hidden)


def load_feature_draft(name_or_path: str | Path = FEATURE_DRAFT, target: Any = None, *, dtype: Any = None) -> Any:
    """Load a shipped (or saved) feature draft in eval mode; pass it as ``draft=`` to the driver.

    ``target``: the target model whose embedding and hidden states the draft reads (default: SmolLM2-135M-Instruct
    in bf16). ``dtype``: default the target's. Raises ValueError when the target's vocabulary, width or embedding
    differs from the one the draft was trained with.
    """
    from safetensors import safe_open

    path = resolve_asset(name_or_path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    if "feature_draft_config" not in meta:
        raise ValueError(f"{path.name} is not a feature draft (use specdec.drafters.load_draft for plain drafts)")
    raw = json.loads(meta["feature_draft_config"])
    cfg = FeatureDraftConfig(**{**raw, "extra_layers": tuple(raw.get("extra_layers", ()))})
    if target is None:
        from ...smollm2 import load_smollm2

        target, _ = load_smollm2(dtype or torch.bfloat16)
    dtype = dtype or next(target.parameters()).dtype
    check_target_vocab(int(meta["vocab_size"]), target, path.name)
    table = target_embedding(target)
    check_fingerprint(tensors.pop("target_fingerprint"), table, path.name)
    draft = FeatureDraft(cfg, target.config, table.to(dtype), tensors["lm_head.head_ids"])
    load_trained(draft, tensors, "pair.table", path.name)
    return draft.to(dtype).eval()
