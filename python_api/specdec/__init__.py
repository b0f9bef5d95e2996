"""specdec: exact speculative decoding of HuggingFace causal LMs on top of the specdec_kernels ops.

Quick start::

    import specdec
    out = specdec.generate(target, draft, input_ids, method="rsd_c", branching=(2, 2), max_new_tokens=64,
                           do_sample=True, temperature=0.8, seed=0)
    out.sequences, out.stats.block_efficiency

Methods: ``ar``, ``sd``, ``rrs``, ``rrsw``, ``rsd_c``, ``rsd_s``, ``spectr``, ``spechub``, ``specdec_pp``, ``csd``,
one module each in :mod:`specdec.methods` (``specdec.methods.available()``; their parameters:
:func:`specdec.methods.make_method`). Drafts: an HF model with the target's vocabulary, any :class:`Drafter`,
``"ngram"`` (:class:`NGramDrafter`, Max-Gram prompt lookup), a neural drafter with Max-Gram's track mixed into its
law (:class:`HybridDrafter`), or a feature draft that reads the target's hidden states
(EAGLE-style, :class:`FeatureDrafter`; ``specdec.train.load_draft("smollm2-eagle")``); ``csd`` drafts with a
:class:`CascadeDrafter` (``specdec.train.load_cascade("smollm2-cascade")``).
"""

import logging
from typing import Any

from specdec_kernels import __version__

from . import errors, methods
from .decoder import SpeculativeDecoder
from .drafters import (
    Drafter,
    DraftLogits,
    FeatureDrafter,
    HybridDrafter,
    ModelDrafter,
    NGramDrafter,
    max_gram_proposal,
)
from .drafters.cascade import CascadeDrafter
from .edge import GenerationOutput
from .methods import MethodConfig, make_method
from .methods.builders.auto import calibrate
from .metrics import GenerationStats
from .models import SUPPORTED_ATTENTION, SUPPORTED_MODEL_TYPES, HFCausalLM, KVState, int8_weights
from .oneshot import SpecDecPPDecoder, custom_generate, generate
from .sampling import SamplingConfig
from .tree import DraftTree

# a library's logger: silent unless the application configures logging (INFO: the auto trees' one-time measurement)
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "calibrate",
    "errors",
    "METHODS",
    "SUPPORTED_ATTENTION",
    "SUPPORTED_MODEL_TYPES",
    "CascadeDrafter",
    "DraftLogits",
    "DraftTree",
    "Drafter",
    "FeatureDrafter",
    "HybridDrafter",
    "GenerationOutput",
    "GenerationStats",
    "HFCausalLM",
    "KVState",
    "MethodConfig",
    "ModelDrafter",
    "NGramDrafter",
    "SamplingConfig",
    "SpecDecPPDecoder",
    "SpeculativeDecoder",
    "custom_generate",
    "generate",
    "int8_weights",
    "make_method",
    "max_gram_proposal",
    "methods",
]


def __getattr__(name: str) -> Any:
    # METHODS follows the registry, so a method registered after import is listed too
    if name == "METHODS":
        return methods.available()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
