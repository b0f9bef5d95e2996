"""The transformers edge of the decoders: reading ``generate``'s inputs (prompts from ``input_ids`` and the attention
mask, EOS ids), the output object (:class:`GenerationOutput`, which reads as transformers' own), the stopping criteria
and streamer as a round emits several tokens at once, and the ``generate`` arguments transformers does not hand a
``custom_generate`` callable. The round loop itself is :mod:`specdec.decoder`."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .errors import UnsupportedSettingError
from .generation import token_id, token_ids
from .metrics import GenerationStats
from .models import CACHE_KEYWORDS


@dataclass
class GenerationOutput:
    """Result of ``generate``.

    Shape: sequences [B, P + T]: the input ids as given (left padding kept) followed by each row's new tokens,
    right-padded with ``pad_token_id`` to the longest row (T). ``new_tokens[b]``: row b's generated ids.

    It reads as transformers' ``GenerateDecoderOnlyOutput`` does (what ``generate(..., return_dict_in_generate=True)``
    returns): ``out["sequences"]``, ``out[0]``, ``out.to_tuple()``, ``out.keys()``, and the attributes of outputs a
    speculative run does not produce (``scores``, ``logits``, ``attentions``, ``hidden_states``,
    ``past_key_values`` / ``cache``) are None and left out of the keys, as unrequested ones are there; the
    speculative ``new_tokens`` and ``stats`` follow ``sequences``.
    """

    sequences: torch.Tensor
    new_tokens: list[list[int]]
    stats: GenerationStats
    scores: None = None
    logits: None = None
    attentions: None = None
    hidden_states: None = None
    past_key_values: None = None
    cache: None = None

    def keys(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]

    def values(self) -> list[Any]:
        return [getattr(self, k) for k in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in self.keys()]

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(self.values())

    def __getitem__(self, key: str | int | slice) -> Any:
        if isinstance(key, str):
            if key not in self.keys():
                raise KeyError(key)
            return getattr(self, key)
        return self.to_tuple()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())


def eos_list(eos: Any, vocab: int) -> list[int]:
    if eos is None:
        return []
    ids = token_ids(eos)
    out = [i for i in ids if i is not None and 0 <= i < vocab]
    if len(out) != len(ids):
        raise ValueError(f"eos_token_id must be a token id or a list of token ids in [0, {vocab}), got {eos!r}")
    return out


def prompt_rows(input_ids: Any, attention_mask: Any, vocab: int) -> list[list[int]]:
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor [B, P] of token ids, got {type(input_ids).__name__}")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape [B, P], got {tuple(input_ids.shape)}")
    if input_ids.is_floating_point() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must be an integer tensor, got dtype {input_ids.dtype}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must hold at least one prompt token per row (empty prompt), got {tuple(input_ids.shape)}"
        )
    if attention_mask is None:
        mask = torch.ones(input_ids.shape, dtype=torch.bool)
    else:
        if not isinstance(attention_mask, torch.Tensor):
            raise TypeError(
                f"attention_mask must be a torch.Tensor like input_ids, got {type(attention_mask).__name__}"
            )
        if attention_mask.dim() == 1:
            attention_mask = attention_mask[None]
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(
                f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
                f"got {tuple(attention_mask.shape)}"
            )
        if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
            raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
        mask = attention_mask.bool().cpu()
    ids = input_ids.cpu()
    prompts = []
    for b in range(ids.shape[0]):
        row = ids[b][mask[b]].tolist()
        if not row:
            raise ValueError(f"attention_mask row {b} selects no token (empty prompt); every row needs >= 1 token")
        if not bool(mask[b, -1]):
            raise ValueError(
                f"attention_mask row {b} ends with padding (right padding): generation continues from each row's "
                "last position, so pad on the left (tokenizer.padding_side = 'left')"
            )
        prompts.append(row)
    flat = [t for p in prompts for t in p]
    if min(flat) < 0 or max(flat) >= vocab:
        raise ValueError(f"input_ids must hold token ids in [0, {vocab}) where attention_mask is 1")
    return prompts


class RoundOutputs:
    """Where new tokens go besides the output: stopping criteria called after every token (transformers calls them
    once per step; a round emits several tokens, so each prefix is checked and the row is cut after the first token
    that stops it, or held as transformers holds it, see ``hold``) and a streamer. ``rows``: each input row as
    given (padding included), the layout the criteria read."""

    def __init__(self, rows: list[list[int]], criteria: list[Any], streamer: Any | None, *, hold: bool) -> None:
        self.rows = rows
        self.criteria = criteria
        self.streamer = streamer
        # without an EOS to pad with, transformers keeps generating a stopped row until every row has stopped:
        # stop_at records where each row met a criterion, limit is the common length once all have
        self.hold = hold
        self.stop_at: dict[int, int] = {}
        self.limit: int | None = None

    def cap(self, max_new: int) -> int:
        """The most new tokens a row may have."""
        return max_new if self.limit is None else min(max_new, self.limit)

    def cut(self, r: int, done: list[int], emitted: list[int], scores: Callable[[int], torch.Tensor]) -> int | None:
        """How many of ``emitted`` row ``r`` keeps when a criterion stops it, else None."""
        if not self.criteria:
            return None
        base = self.rows[r] + done
        for j in range(len(emitted)):
            row_scores = scores(j).float()[None]
            ids = torch.tensor([base + emitted[: j + 1]], dtype=torch.long, device=row_scores.device)
            if any(bool(torch.as_tensor(c(ids, row_scores)).any()) for c in self.criteria):
                return j + 1
        return None

    def put(self, tokens: list[int]) -> None:
        if self.streamer is not None and tokens:
            self.streamer.put(torch.tensor(tokens, dtype=torch.long))

    def end(self) -> None:
        if self.streamer is not None:
            self.streamer.end()


@contextlib.contextmanager
def hidden_stop_strings(config: Any) -> Iterator[None]:
    """``config.stop_strings`` set to None while the block runs (nothing when ``config`` is None)."""
    if config is None:
        yield
        return
    stops, config.stop_strings = config.stop_strings, None
    try:
        yield
    finally:
        config.stop_strings = stops


#: the arguments of transformers' ``generate`` that it does not hand a custom_generate callable
GENERATE_LOCALS = ("assistant_model", "streamer")


def generate_call() -> dict[str, Any]:
    """``assistant_model`` and ``streamer`` of the transformers ``generate`` call that runs a custom_generate
    callable. transformers hands such a callable neither (it sends the streamer the prompt only; it passes on only
    the keyword arguments that ``GenerationMixin._sample`` does not name) and offers no other route to them, so they
    are read from that call's frame: the one kept reach into transformers' internals. Empty when not called from
    transformers' generate; a RuntimeError when called from it but its frame no longer holds both names, so that a
    transformers release that renames them fails loudly instead of dropping the draft or the streamer
    (``tests/python_api/test_hf_generate.py`` pins it in CI at both ends of the supported range)."""
    frame = sys._getframe(1)
    inside = False
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module == "transformers.generation.utils":
            inside = True
            if frame.f_code.co_name == "generate" and all(k in frame.f_locals for k in GENERATE_LOCALS):
                return {k: frame.f_locals[k] for k in GENERATE_LOCALS}
        frame = frame.f_back
    if inside:
        import transformers

        raise RuntimeError(
            f"specdec.custom_generate cannot find {' and '.join(GENERATE_LOCALS)} in transformers "
            f"{transformers.__version__}'s generate (a release outside the supported range?); pass the draft as "
            "draft= and call specdec.generate(..., streamer=...) instead"
        )
    return {}


def check_model_kwargs(model_kwargs: dict[str, Any]) -> None:
    """Refuse a model argument of ``generate`` that speculative generation cannot honour (an empty cache, the mask
    and what transformers prepares for every call pass)."""
    for key, value in model_kwargs.items():
        if key in ("attention_mask", "position_ids", "use_cache", "logits_to_keep"):
            continue
        # an empty cache as transformers prepares it, under either of its names
        if key in CACHE_KEYWORDS and (value is None or value.get_seq_length() == 0):
            continue
        raise UnsupportedSettingError(f"generate argument {key}= is not supported by speculative generation")


def pad_id(generation_config: Any, eos: list[int], vocab: int) -> int:
    """The id that fills the output's right padding: ``pad_token_id``, else the first EOS id, else 0."""
    gc = generation_config
    pad = (eos[0] if eos else 0) if gc.pad_token_id is None else token_id(gc.pad_token_id)
    if pad is None or not 0 <= pad < vocab:
        raise ValueError(
            f"pad_token_id must be a token id in [0, {vocab}) (it fills the output's right padding), got "
            f"{gc.pad_token_id!r}"
        )
    return pad


def run_generator(seed: Any, generator: torch.Generator | None, *, greedy: bool) -> torch.Generator | None:
    """The generator a run draws the ops' integer seeds from: ``generator``, or a new one seeded with ``seed``; a
    private one for greedy runs (they read no noise, but a drafter's op may still ask for a seed, and no generator
    of the user's, nor torch's global one, may advance, as under ``model.generate``)."""
    if generator is not None and seed is not None:
        raise ValueError("pass either seed= or generator=, not both")
    if seed is not None:
        # the range the ops take for their seeds; manual_seed would silently wrap a negative one modulo 2**64
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")
        # the ops' integer seeds are drawn host side, whatever the model's device; each op draws its noise from its
        # own Philox stream on the tensors' device
        generator = torch.Generator()
        generator.manual_seed(seed)
    return torch.Generator() if greedy else generator


def output_sequences(input_ids: torch.Tensor, new_tokens: list[list[int]], pad: int) -> torch.Tensor:
    """[B, P + T] int64 (whatever the input's integer dtype, as transformers' generate returns): the prompts, then
    each row's new tokens right-padded with ``pad``."""
    longest = max(len(t) for t in new_tokens)
    tail = torch.full((input_ids.shape[0], longest), pad, dtype=torch.long, device=input_ids.device)
    for b, toks in enumerate(new_tokens):
        tail[b, : len(toks)] = torch.tensor(toks, dtype=torch.long)
    return torch.cat([input_ids.long(), tail], dim=1)
