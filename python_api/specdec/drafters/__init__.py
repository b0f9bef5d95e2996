"""Drafters: what proposes draft tokens, one per file, and the shipped draft networks with their loaders.

* :mod:`~specdec.drafters.base`: :class:`Drafter` (the interface the decoders drive level by level; the hooks every
  drafter must implement are abstract, the others optional) and :class:`DraftLogits`.
* :mod:`~specdec.drafters.model`: :class:`ModelDrafter` (an HF draft model), :class:`HiddenStateDrafter`.
* :mod:`~specdec.drafters.feature`: :class:`FeatureDrafter` (EAGLE-style, reads the target's hidden states).
* :mod:`~specdec.drafters.ngram`: :class:`NGramDrafter` (Max-Gram) and its bigram tables.
* :mod:`~specdec.drafters.hybrid`: :class:`HybridDrafter` (a neural draft with Max-Gram's proposal mixed in).
* :mod:`~specdec.drafters.cascade`: :class:`CascadeDrafter` (CS Drafting).
* :mod:`~specdec.drafters.coerce`: :func:`as_drafter`, the drafter for what a user passes as ``draft``.
* :mod:`~specdec.drafters.networks`: the shipped networks (distilled draft, feature draft, acceptance head);
  :mod:`~specdec.drafters.assets` loads them by name (``load_draft``, ``load_cascade``, ``load_head``).
"""

from .assets import load_cascade, load_draft
from .base import Drafter, DraftLogits
from .cascade import CascadeDrafter, check_steps, default_steps
from .coerce import as_drafter, neural_drafter
from .feature import FeatureDrafter
from .hybrid import HybridDrafter
from .model import HiddenStateDrafter, ModelDrafter
from .networks.head import load_head
from .ngram import NGramDrafter, bigram_array, bigram_table, load_bigram, longest_match, max_gram_proposal, save_bigram

__all__ = [
    "CascadeDrafter",
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
    "load_cascade",
    "load_draft",
    "load_head",
    "check_steps",
    "default_steps",
    "load_bigram",
    "longest_match",
    "max_gram_proposal",
    "neural_drafter",
    "save_bigram",
]
