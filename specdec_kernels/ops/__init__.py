"""Public entry points of every op: signature, shapes, validation, dispatch. No math here."""

from .decode import (
    decode_attention,
    decoder_layer,
    quantize_int8,
    rms_norm,
    rotary_embedding,
    skinny_linear,
    skinny_linear_int8,
)
from .sampling import (
    GumbelTopK,
    SBSStep,
    SpecHubDraft,
    gumbel_topk,
    is_greedy,
    process_logits,
    sample_categorical,
    sbs_step,
    spechub_sample,
)
from .tree import filter_kv, tree_mask, tree_positions
from .verify import (
    ChainVerdict,
    NodeVerdict,
    TreeVerdict,
    emission_law,
    kseq_gamma,
    verify_chain,
    verify_node,
    verify_tree,
)

__all__ = [
    "ChainVerdict",
    "GumbelTopK",
    "NodeVerdict",
    "SBSStep",
    "SpecHubDraft",
    "TreeVerdict",
    "decode_attention",
    "decoder_layer",
    "emission_law",
    "filter_kv",
    "gumbel_topk",
    "is_greedy",
    "kseq_gamma",
    "process_logits",
    "quantize_int8",
    "rms_norm",
    "rotary_embedding",
    "sample_categorical",
    "sbs_step",
    "skinny_linear",
    "skinny_linear_int8",
    "spechub_sample",
    "tree_mask",
    "tree_positions",
    "verify_chain",
    "verify_node",
    "verify_tree",
]
