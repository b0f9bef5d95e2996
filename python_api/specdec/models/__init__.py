"""The HuggingFace model side of the driver.

* :mod:`~specdec.models.adapter`: :class:`HFCausalLM`, tree and chain forwards of a causal LM with a 4-D mask.
* :mod:`~specdec.models.kv`: :class:`KVState`, the batch's cache and which slots each row attends.
* :mod:`~specdec.models.families`: the supported families, their windows, caps and masks.
* :mod:`~specdec.models.fastpath`: the CPU fast path and its ``fast_path`` switch.

Values that the fast path reads at call time (``DECODE_ROWS``, ``BF16_ROWS``) live in
:mod:`specdec.models.fastpath.linear`; the names here are copies for reading.
"""

from .adapter import HFCausalLM
from .families import SUPPORTED_ATTENTION, SUPPORTED_MODEL_TYPES, chain_mask, layer_features, window_mask
from .fastpath import (
    BF16_ROWS,
    DECODE_OPS,
    DECODE_ROWS,
    FP32_ROWS,
    INT8_ATTR,
    SPECDEC_ATTENTION,
    Routing,
    concat_weights,
    decode_linear,
    decode_row_limit,
    decode_rows,
    fused_decoder_layer,
    int8_weights,
    native_ready,
    native_stack,
    rotary_rows,
    skinny_linears,
    stack_plan,
    tensor_version,
)
from .kv import CACHE_KEYWORDS, KVState, cache_argument, crop_cache, new_cache

__all__ = [
    "BF16_ROWS",
    "CACHE_KEYWORDS",
    "DECODE_OPS",
    "DECODE_ROWS",
    "FP32_ROWS",
    "INT8_ATTR",
    "SPECDEC_ATTENTION",
    "SUPPORTED_ATTENTION",
    "SUPPORTED_MODEL_TYPES",
    "HFCausalLM",
    "KVState",
    "Routing",
    "cache_argument",
    "chain_mask",
    "concat_weights",
    "crop_cache",
    "decode_linear",
    "decode_row_limit",
    "decode_rows",
    "fused_decoder_layer",
    "int8_weights",
    "layer_features",
    "native_ready",
    "native_stack",
    "new_cache",
    "rotary_rows",
    "skinny_linears",
    "stack_plan",
    "tensor_version",
    "window_mask",
]
