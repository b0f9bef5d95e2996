"""The one place that touches a user's modules: :class:`Routing` swaps in the fast path's forwards for the adapter's
own calls and puts every module back on exit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from ...distributed import is_dtensor
from . import attention
from .attention import SPECDEC_ATTENTION, register_attention, stock_sdpa
from .layers import fast_decoder_layer, fast_layer_ok
from .linear import routed_linear, skinny_linears
from .sharded import sharded_forward


class Routing:
    """The fast CPU path of one model, switched on for the adapter's own forwards only (:meth:`active`).

    Inside: every bias-free ``nn.Linear`` of the model runs :func:`decode_linear` and, for a model loaded with
    ``attn_implementation="sdpa"``, its attention runs under :data:`SPECDEC_ATTENTION`. On exit the model is as it
    was: no instance ``forward`` is left on a module and the config names its own attention again, so calls of the
    user's model outside specdec (and its outputs) are those of an untouched copy. Modules that already carry an
    instance ``forward`` (hooks such as accelerate's) or a DTensor weight are left alone, but for the linears of
    transformers' tensor parallelism whose style :func:`~specdec.models.fastpath.sharded.sharded_forward` reads: their
    forward is swapped for one on the decode kernels inside, and transformers' is put back on exit.
    ``enabled=False`` (the adapter's ``fast_path=False``): nothing is routed and :meth:`active` changes nothing."""

    def __init__(self, model: Any, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.linears = [
            m
            for m in model.modules()
            if enabled
            and type(m) is torch.nn.Linear
            and m.bias is None
            and "forward" not in m.__dict__
            and not is_dtensor(m.weight)  # a shard keeps its module's own (sharded) forward
        ]
        self.forwards = [partial(routed_linear, m) for m in self.linears]
        # linears sharded by transformers' tensor parallelism: their local matmul on the decode kernels, the style's
        # collective as transformers runs it (fastpath.sharded); transformers' forward is put back on exit
        found = [(m, sharded_forward(m)) for m in model.modules()] if enabled else []
        self.sharded = [(m, m.__dict__["forward"], f) for m, f in found if f is not None]
        # the adapter's attention stands in for transformers' own sdpa only (a user's "sdpa" must run as registered)
        stock = enabled and getattr(model.config, "_attn_implementation", None) == "sdpa" and stock_sdpa()
        self.config = model.config if stock else None
        routed = {id(m) for m in self.linears}
        # whole decoder layers in fused ops where the layer is a stock one (needs sdpa: its attention is the
        # adapter's) and the kernels are there
        fused = self.config is not None and attention.NATIVE_ATTENTION
        self.layers = [m for m in model.modules() if fused and fast_layer_ok(m, routed)]
        self.layer_forwards = [partial(fast_decoder_layer, m) for m in self.layers]
        self.depth = 0
        if self.config is not None:
            register_attention()

    @contextmanager
    def active(self) -> Iterator[None]:
        if self.depth or not self.enabled:  # nested (the head after the base model): already on
            yield
            return
        self.depth = 1
        for m, f in zip(self.linears, self.forwards, strict=True):
            m.__dict__["forward"] = f  # the instance attribute shadows nn.Linear.forward
        for m, f in zip(self.layers, self.layer_forwards, strict=True):
            m.__dict__["forward"] = f
        for m, _, f in self.sharded:
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
            for m, own, _ in self.sharded:
                m.__dict__["forward"] = own
            if switched:
                self.config._attn_implementation = "sdpa"
            self.depth = 0


def model_structure(model: Any) -> tuple:
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
