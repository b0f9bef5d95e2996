"""transformers' generation settings mapped onto the driver's (docs/methods.md, "Generation settings").

``SpeculativeDecoder.generate`` hands its arguments to the target's own ``generate`` with a ``custom_generate``
callable, so transformers resolves them exactly as ``model.generate`` does (the model's ``generation_config``, then
the one passed, then keyword arguments, then transformers' defaults such as ``top_k=50``) and builds its logits
processors and stopping criteria. This module reads the result: every field that shapes the output is either
implemented here or refused with an error naming it, and every processor in transformers' list must be one whose
law the driver reproduces.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .errors import UnsupportedSettingError
from .sampling import SamplingConfig

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

#: values of unsupported settings that transformers itself runs as plain decoding (nothing suppressed, no guidance,
#: no contrastive search, top-h off): accepted as the defaults are
NO_OP_VALUES: dict[str, Any] = {
    "suppress_tokens": [],
    "begin_suppress_tokens": [],
    "guidance_scale": 1.0,
    "penalty_alpha": 0.0,
    "top_h": 1.0,
}

#: processors that suppress the tokens of one attribute: with none listed they change no logit
EMPTY_SUPPRESSION = {
    "SuppressTokensLogitsProcessor": "suppress_tokens",
    "SuppressTokensAtBeginLogitsProcessor": "begin_suppress_tokens",
}

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
        if name in NO_OP_VALUES and _no_op(value, NO_OP_VALUES[name]):
            continue
        raise UnsupportedSettingError(
            f"generation setting {name}={value!r} is not supported by speculative generation "
            f"(supported: {', '.join(sorted(SUPPORTED_FIELDS))})"
        )
    # transformers adds the prompt length to max_new_tokens as given: 3.5 would silently become 3
    for name in ("max_new_tokens", "min_new_tokens", "max_length", "min_length"):
        value = getattr(generation_config, name, None)
        if value is not None and token_id(value) is None:
            raise ValueError(f"{name} must be an int, got {value!r}")


def _no_op(value: Any, no_op: Any) -> bool:
    """Whether ``value`` is the no-op value ``no_op``: an empty list, tuple or tensor of token ids, or a number."""
    if isinstance(no_op, list):
        return value.numel() == 0 if isinstance(value, torch.Tensor) else isinstance(value, (list, tuple)) and not value
    return isinstance(value, (int, float)) and not isinstance(value, bool) and float(value) == no_op


def token_id(value: Any) -> int | None:
    """``value`` as a token id where it is an integer (a Python or numpy int, a 0-d integer tensor), else None."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def token_ids(value: Any) -> list[int | None]:
    """The items of a token id, a list of them or a tensor, each as :func:`token_id` reads it."""
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        items = list(value.flatten())
    elif isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
        items = list(value)
    else:
        items = [value]
    return [token_id(i) for i in items]


def _ids(value: Any) -> set[int | None]:
    return set(token_ids(value))


def _same(got: Any, want: Any, ids: bool) -> bool:
    if got is None or want is None:
        return got is None and want is None
    if ids:
        return _ids(got) == _ids(want)
    if isinstance(got, torch.Tensor) or isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and torch.equal(got.cpu(), want.cpu())
    return got == want


def _expected(name: str, gc: Any, eos: Sequence[int], width: int) -> dict[str, tuple[str, Any]]:
    """What transformers builds a known processor with from ``gc``: attribute -> (the setting it comes from, value).
    The repetition penalty's ``prompt_ignore_length`` is not checked: the loop follows the processor's own
    (:func:`repetition_skip`)."""
    keep = {"min_tokens_to_keep": ("min_tokens_to_keep", 1), "filter_value": ("filter_value", -math.inf)}
    table: dict[str, dict[str, tuple[str, Any]]] = {
        "TemperatureLogitsWarper": {"temperature": ("temperature", gc.temperature)},
        "TopKLogitsWarper": {"top_k": ("top_k", gc.top_k), **keep},
        "TopPLogitsWarper": {"top_p": ("top_p", gc.top_p), **keep},
        "MinPLogitsWarper": {"min_p": ("min_p", gc.min_p), **keep},
        "RepetitionPenaltyLogitsProcessor": {"penalty": ("repetition_penalty", gc.repetition_penalty)},
        "MinLengthLogitsProcessor": {
            "min_length": ("min_length", gc.min_length),
            "eos_token_id": ("eos_token_id", eos),
        },
        "MinNewTokensLengthLogitsProcessor": {
            "min_new_tokens": ("min_new_tokens", gc.min_new_tokens),
            "prompt_length_to_skip": ("the prompt's length", width),
            "eos_token_id": ("eos_token_id", eos),
        },
    }
    return table[name]


def repetition_skip(logits_processor: Any, batch: int) -> list[int]:
    """How many leading tokens of each row the repetition penalty leaves out, as the processor transformers built
    says: its ``prompt_ignore_length``, a tensor of one count per row (newer transformers: each row's leading
    padding) or one int for every row; None (older releases, 5.17 among them) leaves out none, padding included.
    All zeros without such a processor."""
    for proc in logits_processor or ():
        if type(proc).__name__ != "RepetitionPenaltyLogitsProcessor":
            continue
        skip = getattr(proc, "prompt_ignore_length", None)
        if skip is None:
            break
        counts = [int(x) for x in skip.flatten().tolist()] if isinstance(skip, torch.Tensor) else [int(skip)] * batch
        if len(counts) != batch:
            raise UnsupportedSettingError(
                f"RepetitionPenaltyLogitsProcessor has prompt_ignore_length for {len(counts)} rows, the batch has "
                f"{batch}"
            )
        return counts
    return [0] * batch


def check_processors(logits_processor: Any, generation_config: Any, eos: Sequence[int], width: int) -> None:
    """Refuse a processor list that is not the one transformers builds from the settings: a processor the driver
    does not reproduce (from ``logits_processor=``, ``prefix_allowed_tokens_fn=`` or a setting without a speculative
    law), or one of a known class built with other values than the settings' (a user's ``logits_processor=`` takes
    the place of transformers' own, and the driver reads the settings). ``width``: the prompt's length."""
    seen: set[str] = set()
    for proc in logits_processor or ():
        name = type(proc).__name__
        if name in EMPTY_SUPPRESSION and _no_op(getattr(proc, EMPTY_SUPPRESSION[name], None), []):
            continue  # transformers builds them from suppress_tokens=[] / begin_suppress_tokens=[]: they change nothing
        if name not in KNOWN_PROCESSORS:
            raise UnsupportedSettingError(
                f"logits processor {name} is not supported by speculative generation (it comes from "
                "logits_processor=, prefix_allowed_tokens_fn= or a generation setting without a speculative law)"
            )
        if name in seen:
            raise UnsupportedSettingError(
                f"logits processor {name} appears twice; a logits_processor= list is not supported"
            )
        seen.add(name)
        for attr, (setting, want) in _expected(name, generation_config, eos, width).items():
            got = getattr(proc, attr, None)
            if not _same(got, want, attr == "eos_token_id"):
                raise UnsupportedSettingError(
                    f"logits processor {name} has {attr}={got!r} where the generation settings give {setting}="
                    f"{want!r}: a logits_processor= list is not supported by speculative generation (set the "
                    "generation setting instead)"
                )


def sampling_from_hf(generation_config: Any, eos: Sequence[int]) -> SamplingConfig:
    """The :class:`SamplingConfig` of a resolved GenerationConfig whose EOS ids are ``eos`` (the loop's, parsed
    once). ``top_p=0`` keeps the most probable token alone, as transformers' top-p warper does (its
    ``min_tokens_to_keep`` of 1): the law of ``top_k=1``."""
    gc = generation_config
    top_p = float(gc.top_p if gc.top_p is not None else 1.0)
    top_k = int(gc.top_k or 0)
    if top_p == 0.0:
        top_p, top_k = 1.0, 1
    return SamplingConfig(
        temperature=float(gc.temperature if gc.temperature is not None else 1.0),
        top_k=top_k,
        top_p=top_p,
        do_sample=bool(gc.do_sample),
        min_p=float(gc.min_p or 0.0),
        repetition_penalty=float(gc.repetition_penalty if gc.repetition_penalty is not None else 1.0),
        min_length=int(gc.min_length or 0) if eos else 0,
        suppress=tuple(eos),
    )


def split_criteria(stopping_criteria: Any, generation_config: Any, eos: Sequence[int]) -> list[Any]:
    """The stopping criteria the loop must call after each token: all but transformers' max-length and EOS
    criteria, which the loop applies itself from the generation config. One of those two classes built with other
    values (a user's ``stopping_criteria=`` takes the place of transformers' own) is refused: set ``max_length`` or
    ``eos_token_id`` instead."""
    out = []
    for c in stopping_criteria or ():
        name = type(c).__name__
        if name == "MaxLengthCriteria" and getattr(c, "max_length", None) != generation_config.max_length:
            raise UnsupportedSettingError(
                f"stopping criterion MaxLengthCriteria(max_length={c.max_length!r}) differs from the generation "
                f"settings' max_length={generation_config.max_length!r}: set max_length= or max_new_tokens= instead"
            )
        if name == "EosTokenCriteria" and _ids(getattr(c, "eos_token_id", [])) != set(eos):
            raise UnsupportedSettingError(
                f"stopping criterion EosTokenCriteria(eos_token_id={sorted(_ids(c.eos_token_id))}) differs from the "
                f"generation settings' eos_token_id={list(eos)}: set eos_token_id= instead"
            )
        if name not in NATIVE_CRITERIA:
            out.append(c)
    return out
