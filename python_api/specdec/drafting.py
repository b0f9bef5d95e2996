"""Deprecated: the drafters live in :mod:`specdec.drafters` (one module per drafter; the classes are also on
:mod:`specdec` itself). Importing this module warns once and hands the names on."""

from __future__ import annotations

import warnings

from .drafters import (
    Drafter,
    DraftLogits,
    FeatureDrafter,
    HiddenStateDrafter,
    HybridDrafter,
    ModelDrafter,
    NGramDrafter,
    as_drafter,
    bigram_array,
    bigram_table,
    longest_match,
    max_gram_proposal,
    neural_drafter,
)

warnings.warn(
    "specdec.drafting is deprecated: import from specdec.drafters (or specdec)", DeprecationWarning, stacklevel=2
)

__all__ = [
    "DraftLogits",
    "Drafter",
    "FeatureDrafter",
    "HiddenStateDrafter",
    "HybridDrafter",
    "ModelDrafter",
    "NGramDrafter",
    "as_drafter",
    "bigram_array",
    "bigram_table",
    "longest_match",
    "max_gram_proposal",
    "neural_drafter",
]
