"""HuggingFace causal-LM adapter: tree forwards with a 4-D additive mask, per-row KV validity, KV filtering
(:class:`HFCausalLM`; the cache layout is :mod:`specdec.models.kv`'s)."""

from __future__ import annotations

from typing import Any

import torch

import specdec_kernels as sk

from ..distributed import Ranks, tensor_parallel
from .families import (
    SOFTCAPPED_LOGITS,
    chain_mask,
    check_supported,
    layer_features,
    rope_limit,
    sliding_window,
    window_mask,
)
from .fastpath import layers as layer_path
from .fastpath import stack as stack_path
from .fastpath.int8 import INT8_ATTR
from .fastpath.layers import global_hooks, has_hooks, lean_base_classes, native_ready, rotary_rows, weight_of
from .fastpath.linear import decode_linear, decode_ops_on, skinny_linears
from .fastpath.routing import Routing, model_structure
from .fastpath.stack import StackPlan, stack_plan
from .kv import KVState, cache_argument, crop_cache, new_cache

#: torch's dropout modules (the public classes: their common base is private)
_DROPOUTS = (
    torch.nn.Dropout,
    torch.nn.Dropout1d,
    torch.nn.Dropout2d,
    torch.nn.Dropout3d,
    torch.nn.AlphaDropout,
    torch.nn.FeatureAlphaDropout,
)


class HFCausalLM:
    """Adapter around a HuggingFace causal LM for tree decoding.

    Runs the base model (``model.get_decoder()``) with a 4-D mask and explicit position ids, then applies the
    output embedding (lm_head) only to the rows whose logits are needed. Raises ``ValueError`` for unsupported
    architectures or attention implementations.

    ``fast_path``: ``"auto"`` (default) runs the CPU fast path (:mod:`specdec.models.fastpath`) for the calls it
    takes: decode-sized linears through ``specdec_kernels.skinny_linear``, sdpa attention through
    ``decode_attention``, stock Llama/Mistral layers fused, each switched on only inside the adapter's own forwards
    (:class:`~specdec.models.fastpath.routing.Routing`). ``False`` runs the model's own modules throughout: no module
    of the model is ever touched, and the logits are those of its own forward with the adapter's masks.
    """

    def __init__(self, model: Any, *, name: str = "model", fast_path: str | bool = "auto") -> None:
        if not (fast_path is False or (isinstance(fast_path, str) and fast_path == "auto")):
            raise ValueError(f"fast_path must be 'auto' or False, got {fast_path!r}")
        self.fast_path = fast_path
        config = getattr(model, "config", None)
        if config is None or not callable(getattr(model, "get_decoder", None)):
            raise TypeError(f"{name} must be a HuggingFace causal LM (PreTrainedModel), got {type(model).__name__}")
        check_supported(model, name)
        #: the process group of a target sharded by transformers' tensor parallelism (specdec.distributed), or None
        self.ranks: Ranks | None = tensor_parallel(model, name)
        model_type = config.model_type
        # sliding-window layers: the tree mask also hides keys older than the window (window_mask)
        self.window, self.typed_window = sliding_window(config, name)
        #: (tokens, RoPE type): sequences longer than this get rotary frequencies that depend on the chunking
        self.rope_limit = rope_limit(model)
        # the adapter applies the head itself, so also the cap the model's own forward puts after it
        cap = getattr(config, "final_logit_softcapping", None) if model_type in SOFTCAPPED_LOGITS else None
        self.logit_softcap: float | None = cap
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{name} has no output embedding (lm_head); pass a *ForCausalLM model")
        self.model = model
        self.name = name
        self.routing = Routing(model, enabled=fast_path == "auto")
        self.base = model.get_decoder()
        self._cache_arg = cache_argument(self.base)
        # a stock Llama/Mistral stack whose every layer runs fused: its forward is run part by part (_lean_base)
        layers = getattr(self.base, "layers", None)
        self._lean = (
            self.routing.enabled
            and type(self.base) in lean_base_classes()
            and layers is not None
            and len(layers) == int(getattr(config, "num_hidden_layers", -1))
            and {id(m) for m in layers} == {id(m) for m in self.routing.layers}
        )
        # a feature draft's base (drafters.networks.feature_draft.FeatureDecoder) runs a forward without its module call
        self._lean_features = self.routing.enabled and callable(getattr(self.base, "lean_call", None))
        self.head = head
        self._head_routed = any(m is head for m in self.routing.linears)
        self.vocab_size = int(head.weight.shape[0])
        self.num_parameters = sum(p.numel() for p in model.parameters())
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self._plan: tuple[StackPlan | None] | None = None  # the stack path's layer arguments (new_state)
        self._structure = model_structure(model)  # what the choices above rest on (refresh)
        self.last_hidden: torch.Tensor | None = None  # hidden state of the latest forward (see _run)
        # Feature drafts read [final hidden ; inputs of these layers] (set by the decoder): ``last_features``.
        self.feature_layers: tuple[int, ...] = ()
        self.last_features: torch.Tensor | None = None
        # A head that can score a sorted subset of the vocabulary only (drafters.networks.ReducedHead: exact zeros
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
        """Build the adapter again if the model changed since it was built (:func:`model_structure`: a hook, a replaced
        module, a cast, another attention); returns whether it did. Decoders call it at every generate call."""
        if model_structure(self.model) == self._structure:
            return False
        self.__init__(self.model, name=self.name, fast_path=self.fast_path)  # type: ignore[misc]
        return True

    def check_target(self) -> None:
        """Refuse what would make a target's logits differ from its own forward's: training-mode dropout (the driver
        cannot draw the masks transformers would) and int8 copies of its weights (:func:`int8_weights` applied to
        the target, or to a draft that shares modules with it)."""
        model = self.model
        if model.training:
            p = float(getattr(model.config, "attention_dropout", 0.0) or 0.0)
            drop = [m for m in model.modules() if isinstance(m, _DROPOUTS) and m.p > 0]
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
        (:func:`rope_limit`): there no decoding that verifies several tokens per forward, nor batched decoding, can
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

        ``features`` [B, n, E]: the extra input of a feature draft (specdec.drafters.networks.FeatureDraft), else None.
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
            and not global_hooks()
        )

    def _lean_base(
        self, tokens: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """The base model's forward for the adapter's calls, part by part: embedding, rotary table, the layers (in
        one :func:`specdec_kernels.decoder_stack` call where every layer takes its one-call path; else layer by
        layer, a layer with hooks as a module call so that they fire, inside :meth:`Routing.active` its forward
        being :func:`fast_decoder_layer`, which takes ``cache``), final norm. The stock forward does the same with
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
            if plan is not None:
                out = stack_path.native_stack(base.layers, h, mask, cos_sin[0], cos_sin[1], cache, plan)
        if out is not None:
            return base.norm(out)
        with self.routing.active():  # a layer's module call runs its fused forward and the routed linears
            for layer in base.layers:
                out = None
                if direct and not has_hooks(layer):
                    out = layer_path.native_call(layer, h, mask, cos_sin[0], cos_sin[1], cache, None, None)
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
                and decode_ops_on()
                and not ("forward" in head.__dict__ or has_hooks(head) or global_hooks())
            ):  # what its routed module call runs, without the call
                return self._softcap(decode_linear(hidden, weight_of(head)))
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
            and decode_ops_on()
            and not ("forward" in head.__dict__ or has_hooks(head) or global_hooks())
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
