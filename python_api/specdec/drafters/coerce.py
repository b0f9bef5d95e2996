"""The drafter for what a user passes as ``draft``: a :class:`~specdec.drafters.base.Drafter` as is, a model or
``"ngram"`` wrapped, checked against the target.
"""

from __future__ import annotations

from typing import Any

from ..models import HFCausalLM
from .base import Drafter
from .feature import FeatureDrafter
from .hybrid import HybridDrafter
from .model import HiddenStateDrafter, ModelDrafter
from .ngram import NGramDrafter


def neural_drafter(model: Any, name: str = "draft", *, fast_path: str | bool = "auto") -> ModelDrafter:
    """A neural draft model as its drafter: a feature draft (``reads_target_features``) as a
    :class:`FeatureDrafter`, any other model as a :class:`ModelDrafter` (``fast_path``: the adapter's switch)."""
    if getattr(model, "reads_target_features", False):
        return FeatureDrafter(model, name=name, fast_path=fast_path)
    return ModelDrafter(model, name=name, fast_path=fast_path)


def as_drafter(draft: Any, target: HFCausalLM, *, hidden: bool = False, fast_path: str | bool = "auto") -> Drafter:
    """The drafter for ``draft`` as ``generate`` takes it: a :class:`Drafter` as is, a feature draft (a model with
    ``reads_target_features``) as a :class:`FeatureDrafter`, ``"ngram"`` as an :class:`NGramDrafter`, any other
    model as a :class:`ModelDrafter`; ``hidden``: an acceptance head reads the draft's hidden states, so only a
    neural draft goes (a plain one as a :class:`HiddenStateDrafter`). Raises ValueError when draft and ``target`` do not
    fit together (vocabulary size; a feature draft's width). ``fast_path``: the adapter's switch
    (:class:`~specdec.models.HFCausalLM`) for a draft model wrapped here; a :class:`Drafter` keeps its own."""
    if hidden:  # an acceptance head reads the draft's hidden states: only a neural draft has them
        if isinstance(draft, HiddenStateDrafter):
            drafter: Drafter = draft
        elif isinstance(draft, (Drafter, str)):
            raise ValueError(
                f"head= needs a neural draft model (its hidden states feed the head), got {draft!r}; pass the HF "
                "draft model itself"
            )
        elif getattr(draft, "reads_target_features", False):
            drafter = FeatureDrafter(draft, name="draft", fast_path=fast_path)
        else:
            drafter = HiddenStateDrafter(draft, name="draft", fast_path=fast_path)
    elif isinstance(draft, Drafter):
        drafter = draft
    elif isinstance(draft, str):
        if draft != "ngram":
            raise ValueError(f"draft must be a model, a Drafter or the string 'ngram', got {draft!r}")
        drafter = NGramDrafter(target.vocab_size)
    else:
        drafter = neural_drafter(draft, fast_path=fast_path)
    inner = drafter.neural if isinstance(drafter, HybridDrafter) else drafter
    if isinstance(inner, FeatureDrafter):
        width = int(getattr(target.model.config, "hidden_size", -1))
        want = int(getattr(inner.lm.model.config, "hidden_size", -1))
        if want != width:
            raise ValueError(
                f"the feature draft reads hidden states of width {want}, but the target's hidden size is {width}; "
                "a feature draft only works with the target it was trained on"
            )
    if (
        drafter.vocab_size != target.vocab_size
        and type(inner) in (ModelDrafter, HiddenStateDrafter)
        and inner.lm.support is None
        and inner._target_vocab is None
    ):
        # one tokenizer, output layers of different sizes: draft over the ids both have
        inner.fit_vocab(target.vocab_size)
        drafter.vocab_size = target.vocab_size
    if drafter.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft vocabulary size {drafter.vocab_size} differs from the target's {target.vocab_size}; draft and "
            "target must share one tokenizer and output layer size"
        )
    return drafter
