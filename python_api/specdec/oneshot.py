"""The one-shot entry points, ``specdec.generate`` and transformers' ``custom_generate`` hook, and
:class:`SpecDecPPDecoder`: each builds a :class:`~specdec.decoder.SpeculativeDecoder` and runs it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .decoder import SpeculativeDecoder
from .edge import GenerationOutput, generate_call


class SpecDecPPDecoder(SpeculativeDecoder):
    """``method="specdec_pp"``: SD with per-row adaptive draft length (SpecDec++, docs/methods.md).

    ``draft``: HF draft model (the target's tokenizer). ``head``: acceptance head (e.g.
    :func:`specdec.train.load_head`) or any callable hidden [..., H] -> Phat. ``threshold``: h (stop once the
    predicted probability of at least one rejection exceeds h; default: the head's own ``threshold``, else 0.7).
    ``max_draft_length``: hard cap (20). ``verifier``: "token" (default) or "block" (block verification).
    """

    def __init__(
        self,
        target: Any,
        draft: Any,
        head: Any,
        *,
        threshold: float | None = None,
        max_draft_length: int = 20,
        verifier: str | None = None,
    ) -> None:
        super().__init__(
            target,
            draft,
            method="specdec_pp",
            draft_length=max_draft_length,
            head=head,
            threshold=threshold,
            verifier=verifier,
        )


#: SpeculativeDecoder's method arguments, taken out of a one-shot call's keyword arguments
DECODER_ARGS = (
    "draft_length",
    "branching",
    "parents",
    "beam_width",
    "num_chains",
    "head",
    "threshold",
    "fast_path",
    "verifier",
)


def generate(
    target: Any,
    draft: Any,
    input_ids: torch.Tensor,
    *,
    method: str = "rsd_c",
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> GenerationOutput:
    """One-shot speculative generation: ``SpeculativeDecoder(target, draft, method=..., ...).generate(...)``.

    Shape: input_ids [B, P], attention_mask [B, P] -> GenerationOutput (sequences [B, P + T], new_tokens,
    stats). ``kwargs``: the decoder's method arguments (draft_length, branching, parents, beam_width, num_chains,
    head, threshold, fast_path, verifier; :class:`SpeculativeDecoder`), then any argument of
    :meth:`SpeculativeDecoder.generate` (transformers' generation settings, stopping_criteria, streamer, tokenizer,
    seed, generator).
    """
    params = {k: kwargs.pop(k) for k in DECODER_ARGS if k in kwargs}
    decoder = SpeculativeDecoder(target, draft, method=method, **params)
    return decoder.generate(input_ids, attention_mask, **kwargs)


def custom_generate(
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    *,
    # named one by one: transformers hands a custom_generate callable only the arguments its signature names
    draft: Any = None,
    method: str = "rsd_c",
    draft_length: int | None = None,
    branching: Sequence[int] | str | None = None,
    parents: Sequence[int] | None = None,
    beam_width: int | None = None,
    num_chains: int | None = None,
    head: Any = None,
    threshold: float | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    fast_path: str | bool = "auto",
    verifier: str | None = None,
    **model_kwargs: Any,
) -> Any:
    """transformers' ``custom_generate`` hook: change one line of an existing ``generate`` call,
    ``target.generate(**inputs, custom_generate=specdec.custom_generate, assistant_model=draft, ...)``, and it
    runs speculatively with the settings transformers resolved. The draft comes from ``assistant_model=`` (an HF
    model) or ``draft=`` (also a Drafter or ``"ngram"``); ``method`` and the method parameters, ``head``/
    ``threshold``, ``seed``/``generator``, ``fast_path`` are passed like any generate argument. Returns what
    ``generate`` returns: the sequences, or (``return_dict_in_generate=True``) a :class:`GenerationOutput` with the
    speculative statistics. A decoder built once (:class:`SpeculativeDecoder`) offers the same hook as
    ``decoder.custom_generate`` without rebuilding per call. transformers hands such a callable no tokenizer, so
    ``stop_strings`` go in as ``stopping_criteria=[StopStringCriteria(tokenizer, stop_strings)]``."""
    call = generate_call()
    assistant = call.get("assistant_model")
    if assistant is not None and draft is not None:
        raise ValueError("pass the draft as assistant_model= or draft=, not both")
    decoder = SpeculativeDecoder(
        model,
        draft if draft is not None else assistant,
        method=method,
        draft_length=draft_length,
        branching=branching,
        parents=parents,
        beam_width=beam_width,
        num_chains=num_chains,
        head=head,
        threshold=threshold,
        fast_path=fast_path,
        verifier=verifier,
    )
    return decoder._generate_prepared(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        seed=seed,
        generator=generator,
        streamer=call.get("streamer"),
        **model_kwargs,
    )
