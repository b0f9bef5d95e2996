"""specdec_kernels: exact speculative-decoding ops (sampling, tree layout, verification) with several backends.

Backends: ``torch`` (reference, always available), ``cpu`` (C++ extension), ``triton``, ``cuda``. Optional
backends that fail to load are skipped by ``backend="auto"`` and reported when requested explicitly.
"""

from . import native as _native  # noqa: F401  (registers cpu/cuda when the extension is built)
from . import reference as _reference  # noqa: F401  (registers the torch backend)
from . import triton as _triton  # noqa: F401  (registers triton when the package is installed)
from ._registry import BACKENDS, BackendUnavailableError, available_backends, implementation
from ._version import __version__
from .native import cpu_isa, crop_slots, skinny_linear_isa
from .ops import (
    ChainVerdict,
    GumbelTopK,
    NodeVerdict,
    SBSStep,
    SpecHubDraft,
    TreeVerdict,
    decode_attention,
    decoder_layer,
    decoder_stack,
    emission_law,
    filter_kv,
    gumbel_topk,
    is_greedy,
    kseq_gamma,
    process_logits,
    quantize_int8,
    rms_norm,
    rotary_embedding,
    sample_categorical,
    sbs_step,
    skinny_linear,
    skinny_linear_int8,
    spechub_sample,
    tree_mask,
    tree_positions,
    verify_chain,
    verify_node,
    verify_tree,
)
from .trees import (
    binary_tree_parents,
    branching_parents,
    chain_parents,
    check_parents,
    child_counts,
    depth_from_parents,
    kseq_chain_parents,
    parents_tensor,
)

__all__ = [
    "__version__",
    "BACKENDS",
    "BackendUnavailableError",
    "ChainVerdict",
    "GumbelTopK",
    "NodeVerdict",
    "SBSStep",
    "SpecHubDraft",
    "TreeVerdict",
    "available_backends",
    "binary_tree_parents",
    "branching_parents",
    "chain_parents",
    "check_parents",
    "child_counts",
    "cpu_isa",
    "crop_slots",
    "decode_attention",
    "decoder_layer",
    "decoder_stack",
    "depth_from_parents",
    "emission_law",
    "filter_kv",
    "gumbel_topk",
    "implementation",
    "is_greedy",
    "kseq_chain_parents",
    "kseq_gamma",
    "parents_tensor",
    "process_logits",
    "quantize_int8",
    "rms_norm",
    "rotary_embedding",
    "sample_categorical",
    "sbs_step",
    "skinny_linear",
    "skinny_linear_int8",
    "skinny_linear_isa",
    "spechub_sample",
    "tree_mask",
    "tree_positions",
    "verify_chain",
    "verify_node",
    "verify_tree",
]
