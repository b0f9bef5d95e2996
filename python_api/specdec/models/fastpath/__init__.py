"""The CPU fast path of the adapter's forwards, and the switch that turns it off.

What it runs, each only for the calls it takes (the rest go to the model's own modules):

* :mod:`~specdec.models.fastpath.linear`: decode-sized linears through ``specdec_kernels.skinny_linear``
  (each weight read once for all rows); :mod:`~specdec.models.fastpath.int8` their int8 weights.
* :mod:`~specdec.models.fastpath.attention`: sdpa attention through ``specdec_kernels.decode_attention``, registered
  with transformers under its own name.
* :mod:`~specdec.models.fastpath.layers` / :mod:`~specdec.models.fastpath.stack`: stock Llama/Mistral decoder layers
  in one ``decoder_layer`` call each, or the whole stack in one ``decoder_stack`` call.
* :mod:`~specdec.models.fastpath.routing`: the one place that touches a user's modules, for the adapter's own calls
  only, every module put back on exit.

The switch is the adapter's ``fast_path`` argument (``HFCausalLM(model, fast_path=False)``, and the same argument of
``SpeculativeDecoder`` and ``specdec.generate``): ``"auto"`` (default) runs the fast path where it applies, ``False``
leaves every module of the model alone.
"""

from .attention import SPECDEC_ATTENTION
from .int8 import INT8_ATTR, concat_weights, int8_weights, tensor_version
from .layers import fused_decoder_layer, native_ready, rotary_rows
from .linear import (
    BF16_ROWS,
    DECODE_OPS,
    DECODE_ROWS,
    FP32_ROWS,
    decode_linear,
    decode_row_limit,
    decode_rows,
    skinny_linears,
)
from .routing import Routing
from .stack import native_stack, stack_plan

__all__ = [
    "BF16_ROWS",
    "DECODE_OPS",
    "DECODE_ROWS",
    "FP32_ROWS",
    "INT8_ATTR",
    "SPECDEC_ATTENTION",
    "Routing",
    "concat_weights",
    "decode_linear",
    "decode_row_limit",
    "decode_rows",
    "fused_decoder_layer",
    "int8_weights",
    "native_ready",
    "native_stack",
    "rotary_rows",
    "skinny_linears",
    "stack_plan",
    "tensor_version",
]
