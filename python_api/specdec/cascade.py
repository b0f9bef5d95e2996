"""Deprecated: the CS Drafting cascade lives in :mod:`specdec.drafters.cascade` (``CascadeDrafter`` also on
:mod:`specdec`), its bigram tables in :mod:`specdec.drafters.ngram`. Importing this module warns once and hands the
names on."""

from __future__ import annotations

import warnings

from .drafters.cascade import INLINE_CATCH_UP, MAG_TOKENS, Block, CascadeDrafter, check_steps, default_steps
from .drafters.ngram import load_bigram, save_bigram

warnings.warn(
    "specdec.cascade is deprecated: import from specdec.drafters.cascade (or specdec)", DeprecationWarning, stacklevel=2
)

__all__ = [
    "INLINE_CATCH_UP",
    "MAG_TOKENS",
    "Block",
    "CascadeDrafter",
    "check_steps",
    "default_steps",
    "load_bigram",
    "save_bigram",
]
