"""Baselines the demo prints beside its own decoders: transformers' ``generate`` (plain and assisted with a draft
model) on the same prompts, and the numerics of each decoding path against an fp32 forward.

Greedy outputs of two bf16 paths can differ after a near-tie of the top two logits, because they round differently
(our adapter's routed kernels vs transformers' own bf16 forward). :func:`logit_error` measures how far each path's
next-token logits are from the fp32 model's on the same tokens, so a user sees which path is closer to fp32.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .metrics import GenerationStats
from .models import HFCausalLM, cache_argument


def sampling_kwargs(temperature: float, top_k: int, top_p: float) -> dict[str, Any]:
    """``generate`` keyword arguments for the demo's settings, the same for transformers' generate and the
    decoders: greedy at temperature 0, else sampling with every control given explicitly (top_k=0 turns off
    transformers' default of 50)."""
    if temperature == 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": temperature, "top_k": top_k, "top_p": top_p}


def hf_generate(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    eos_token_id: int | None,
    pad_token_id: int,
    seed: int,
    assistant_model: Any = None,
    prompt_lookup_num_tokens: int | None = None,
    label: str = "hf generate",
) -> tuple[list[list[int]], GenerationStats]:
    """``model.generate`` on a left-padded batch with the demo's sampling settings; the new tokens of each row (up
    to and including its first EOS) and a GenerationStats with its token count and wall time (block efficiency 1
    for plain generation: one target forward per token; not known for assisted generation, with ``assistant_model``
    or prompt lookup)."""
    kw: dict[str, Any] = {**sampling_kwargs(temperature, top_k, top_p), "max_new_tokens": max_new_tokens}
    kw["pad_token_id"] = pad_token_id
    if eos_token_id is not None:
        kw["eos_token_id"] = eos_token_id
    if assistant_model is not None:
        kw["assistant_model"] = assistant_model
    if prompt_lookup_num_tokens is not None:
        kw["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, **kw)
    wall = time.perf_counter() - t0
    rows = []
    for row in out[:, ids.shape[1] :].tolist():
        if eos_token_id is not None and eos_token_id in row:
            row = row[: row.index(eos_token_id) + 1]
        rows.append(row)
    n = sum(len(r) for r in rows)
    stats = GenerationStats(method=label, batch_size=ids.shape[0], new_tokens=n, wall_time=wall)
    if assistant_model is None and prompt_lookup_num_tokens is None:
        stats.target_calls = max(len(r) for r in rows)
        stats.row_rounds = stats.emitted = n
    return rows, stats


def _hf_steps(model: Any, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Next-token logits [T, V] (fp32) of transformers' own cached decoding: the prompt, then one token per step."""
    from transformers import DynamicCache

    cache = {cache_argument(model): DynamicCache()}  # the keyword this transformers takes, without its deprecated alias
    out = []
    with torch.inference_mode():
        logits = model(torch.tensor([prompt]), use_cache=True, **cache).logits[0, -1]
        out.append(logits.float())
        for t in tokens[:-1]:
            logits = model(torch.tensor([[t]]), use_cache=True, **cache).logits[0, -1]
            out.append(logits.float())
    return torch.stack(out)


def _adapter_steps(model: Any, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The same through specdec's adapter (the path of our AR and of every decoder's one-token steps)."""
    lm = HFCausalLM(model, name="target")
    state = lm.new_state(1)
    out = []
    with torch.inference_mode():
        out.append(lm.forward_chain(state, [prompt], last_logits=True)[0].float())
        for t in tokens[:-1]:
            out.append(lm.forward_chain(state, [[t]], last_logits=True)[0].float())
    return torch.stack(out)


def logit_error(model: Any, reference: Any, prompt: list[int], tokens: list[int]) -> dict[str, dict[str, float]]:
    """Per path ("specdec adapter", "transformers"): the max and mean |logit - fp32 logit| over the next-token logits
    after ``prompt`` and each prefix of ``tokens``, and how many argmaxes equal the fp32 model's. ``reference`` is
    the fp32 model (its full forward over prompt + tokens)."""
    with torch.inference_mode():
        full = reference(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1 :].float()
    out = {}
    for name, steps in (("specdec adapter", _adapter_steps), ("transformers", _hf_steps)):
        got = steps(model, prompt, tokens)
        err = (got - full).abs()
        out[name] = {
            "max_abs": float(err.max()),
            "mean_abs": float(err.mean()),
            "argmax_equal": float((got.argmax(-1) == full.argmax(-1)).float().mean()),
        }
    return out
