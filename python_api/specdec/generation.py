"""transformers' generation settings mapped onto the driver's (docs/api.md, "Generation settings").

``SpeculativeDecoder.generate`` hands its arguments to the target's own ``generate`` with a ``custom_generate``
callable, so transformers resolves them exactly as ``model.generate`` does (the model's ``generation_config``, then
the one passed, then keyword arguments, then transformers' defaults such as ``top_k=50``) and builds its logits
processors and stopping criteria. This module reads the result: every field that shapes the output is either
implemented here or refused with an error naming it, and every processor in transformers' list must be one whose
law the driver reproduces.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .config import SamplingConfig

#: fields whose values the driver implements
SUPPORTED_FIELDS = frozenset(
    {
        "max_length",
        "max_new_tokens",
        "min_length",
        "min_new_tokens",
        "do_sample",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "eos_token_id",
        "pad_token_id",
        "bos_token_id",
        "stop_strings",
        "max_time",
        "return_dict_in_generate",
        "num_return_sequences",
    }
)

#: fields that cannot change the tokens of a non-beam run: cache and compilation knobs of transformers' own loop,
#: beam-search and assistant settings that only its beam and assisted modes read, and bookkeeping entries
INERT_FIELDS = frozenset(
    {
        "use_cache",
        "cache_implementation",
        "cache_config",
        "max_cache_len",
        "compile_config",
        "disable_compile",
        "prefill_chunk_size",
        "low_memory",
        "continuous_batching_config",
        "early_stopping",
        "length_penalty",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "assistant_confidence_threshold",
        "assistant_lookbehind",
        "target_lookbehind",
        "is_assistant",
        "decoder_start_token_id",
        "transformers_version",
    }
)

#: transformers' processors whose law SamplingConfig reproduces, by class name
KNOWN_PROCESSORS = frozenset(
    {
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "MinPLogitsWarper",
        "RepetitionPenaltyLogitsProcessor",
        "MinLengthLogitsProcessor",
        "MinNewTokensLengthLogitsProcessor",
    }
)

#: stopping criteria the loop implements itself (the rest are called after every new token)
NATIVE_CRITERIA = frozenset({"MaxLengthCriteria", "EosTokenCriteria"})


def check_config(generation_config: Any, defaults: dict[str, Any]) -> None:
    """Refuse every field of a resolved GenerationConfig that is set to a non-default value the driver does not
    implement. ``defaults``: transformers' global defaults (``GenerationConfig._get_default_generation_params``)."""
    for name, value in generation_config.to_dict().items():
        if name.startswith("_") or name in SUPPORTED_FIELDS or name in INERT_FIELDS:
            continue
        if value is None or value is False or value == defaults.get(name):
            continue
        raise ValueError(
            f"generation setting {name}={value!r} is not supported by speculative generation "
            f"(supported: {', '.join(sorted(SUPPORTED_FIELDS))})"
        )


def sampling_from_hf(generation_config: Any, logits_processor: Any, eos: Sequence[int]) -> SamplingConfig:
    """The :class:`SamplingConfig` of a resolved GenerationConfig whose EOS ids are ``eos`` (the loop's, parsed
    once), after checking that transformers' processor list holds only processors it reproduces (a user's
    ``logits_processor`` or ``prefix_allowed_tokens_fn`` is refused: the driver cannot know the law it produces at
    each draft node)."""
    for proc in logits_processor or ():
        name = type(proc).__name__
        if name not in KNOWN_PROCESSORS:
            raise ValueError(
                f"logits processor {name} is not supported by speculative generation (it comes from "
                "logits_processor=, prefix_allowed_tokens_fn= or a generation setting without a speculative law)"
            )
    gc = generation_config
    return SamplingConfig(
        temperature=float(gc.temperature if gc.temperature is not None else 1.0),
        top_k=int(gc.top_k or 0),
        top_p=float(gc.top_p if gc.top_p is not None else 1.0),
        do_sample=bool(gc.do_sample),
        min_p=float(gc.min_p or 0.0),
        repetition_penalty=float(gc.repetition_penalty if gc.repetition_penalty is not None else 1.0),
        min_length=int(gc.min_length or 0) if eos else 0,
        suppress=tuple(eos),
    )


def split_criteria(stopping_criteria: Any) -> list[Any]:
    """The stopping criteria the loop must call after each token: all but max length and EOS, which it applies
    itself from the generation config."""
    return [c for c in stopping_criteria or () if type(c).__name__ not in NATIVE_CRITERIA]
