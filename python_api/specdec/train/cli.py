"""``python -m specdec.train STAGE``: the draft-training pipeline, one stage each. Plain draft and its acceptance
head: ``data``, ``evalset``, ``distill``, ``eval``, ``head``, ``ship`` (``all`` runs them in order); feature draft:
``feature-data``, ``evalset``, ``feature-distill``, ``feature-eval``, ``feature-ship``, ``feature-head``
(``feature-all``); Max-Gram's bigram table: ``bigram``.

Every stage reads and writes ``--workdir`` (default ``$SPECDEC_TRAIN_DIR`` or ``~/.cache/specdec/train``), resumes
from what is there, and records its configuration, data hash, steps and metrics in ``<workdir>/manifest.json``. The
data stages (``data``, ``feature-data``, ``evalset``) read ``gsm8k_train.jsonl`` and ``vicuna_bench_questions.jsonl``
from the folder named by ``$SPECDEC_DATA_DIR``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import default_workdir, set_threads

STAGES = ("data", "evalset", "distill", "eval", "head", "ship", "all")
# Max-Gram's bigram table (CS Drafting), written into specdec/assets/ (--name) from JSONL chats (--corpus)
EXTRA_STAGES = ("bigram",)
# The feature draft (EAGLE-style, reads the target's hidden states): its own data, training, eval and ship stages.
FEATURE_STAGES = ("feature-data", "evalset", "feature-distill", "feature-eval", "feature-ship", "feature-head")


def _target(dtype: str = "bf16"):  # noqa: ANN202
    from ..smollm2 import load_smollm2

    return load_smollm2(dtype)


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    _check_args(ap, args)
    set_threads(args.threads)
    workdir = args.workdir or default_workdir()
    workdir.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    if args.stage == "all":
        stages: tuple[str, ...] = ("data", "evalset", "distill", "eval", "head", "ship")
    elif args.stage == "feature-all":
        stages = FEATURE_STAGES
    else:
        stages = (args.stage,)
    t_all = time.time()
    for stage in stages:
        t0 = time.time()
        print(f"[specdec.train] stage {stage} in {workdir}", flush=True)
        info = _RUNS[stage](args, workdir, progress, ap)
        print(json.dumps({"stage": stage, "seconds": round(time.time() - t0, 1), **_brief(info)}, default=str))
    print(f"[specdec.train] done in {time.time() - t_all:.0f} s", flush=True)
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m specdec.train", description=__doc__)
    ap.add_argument("stage", choices=list(dict.fromkeys((*STAGES, *FEATURE_STAGES, "feature-all", *EXTRA_STAGES))))
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="distillation steps (default: DistillConfig)")
    ap.add_argument(
        "--lr", type=float, default=None, help="peak learning rate of distillation (default: DistillConfig)"
    )
    ap.add_argument("--head-steps", type=int, default=None, help="acceptance-head steps (default: HeadConfig)")
    ap.add_argument(
        "--name",
        default=None,
        help="asset name for the ship stages (smollm2-distill, smollm2-eagle), feature-head (the feature draft whose "
        "head it trains) and bigram",
    )
    ap.add_argument(
        "--draft",
        default=None,
        help="feature-eval only: score this saved feature draft (asset name such as smollm2-eagle, or a path) "
        "instead of the workdir's final.pt; printed, not written to the workdir's manifest",
    )
    ap.add_argument(
        "--corpus",
        type=Path,
        action="append",
        help="bigram only: a JSONL file of chats (question/prompt/text + answer/response); repeatable; default "
        "$SPECDEC_DATA_DIR/gsm8k_train.jsonl",
    )
    plain = ap.add_argument_group("plain draft size and data (data, distill; defaults: DataConfig, DraftConfig)")
    plain.add_argument("--gsm8k-label", type=int, default=None, help="GSM8K-train solutions labelled by the target")
    plain.add_argument(
        "--gsm8k-sample",
        type=int,
        default=None,
        help="GSM8K-train questions answered by the target itself (at --answer-temperature), other questions "
        "than --gsm8k-label's",
    )
    plain.add_argument(
        "--gsm8k-cue",
        default=None,
        help='text appended on a new line to each --gsm8k-sample question (e.g. "Let\'s think step by step.")',
    )
    plain.add_argument(
        "--code-sample",
        type=int,
        default=None,
        help="Python stubs (signature + docstring) from the standard library answered by the target (at "
        "--answer-temperature)",
    )
    plain.add_argument(
        "--answer-temperature",
        type=float,
        default=None,
        help="temperature at which the target's answers are drawn (default 1; the stored labels are its T = 1 law)",
    )
    plain.add_argument(
        "--magpie",
        type=int,
        default=None,
        help="self-written instructions answered by the target (feature-head: prompts of its rollouts, default "
        "RolloutConfig)",
    )
    plain.add_argument("--layers", type=int, default=None, help="decoder layers of the plain draft")
    plain.add_argument("--width", type=int, default=None, help="hidden size of the plain draft (MLP: 3x)")
    plain.add_argument("--head-vocab", type=int, default=None, help="tokens of the plain draft's reduced head")
    plain.add_argument(
        "--from-target-layers",
        type=_layer_list,
        default=None,
        metavar="I,J,...",
        help="start the plain draft's body as these decoder layers of the target (its width, heads and MLP; "
        "then trained); excludes --layers and --width",
    )
    ap.add_argument("--no-progress", action="store_true")
    return ap


def _check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse out-of-range numbers and flags that exclude each other (argparse's one-line error, exit 2)."""
    counts = ("gsm8k_label", "gsm8k_sample", "code_sample", "magpie")
    for flag in ("steps", "head_steps", *counts, "layers", "width", "head_vocab"):
        value = getattr(args, flag)
        if value is not None and value < (0 if flag in counts else 1):
            ap.error(f"--{flag.replace('_', '-')} must be >= {0 if flag in counts else 1}")
    if args.from_target_layers is not None and (args.layers is not None or args.width is not None):
        ap.error("--from-target-layers takes the target's layer shape: do not give --layers or --width with it")
    for flag in ("lr", "answer_temperature"):
        value = getattr(args, flag)
        if value is not None and not (0 < value < float("inf")):
            ap.error(f"--{flag.replace('_', '-')} must be a positive finite number, got {value}")


def _set(obj: Any, values: dict[str, Any]) -> None:
    """Set each attribute of ``obj`` whose value here is not None (a flag left out keeps the config's default)."""
    for name, value in values.items():
        if value is not None:
            setattr(obj, name, value)


def _run_data(args: argparse.Namespace, workdir: Path, progress: bool, ap: argparse.ArgumentParser) -> dict:
    from .data import DataConfig, build_data

    model, tok = _target()
    dcfg = DataConfig(seed=args.seed)
    _set(dcfg, {
        "n_gsm8k_label": args.gsm8k_label, "n_gsm8k_sample": args.gsm8k_sample, "gsm8k_cue": args.gsm8k_cue,
        "n_magpie": args.magpie, "n_code_sample": args.code_sample, "answer_temperature": args.answer_temperature,
    })  # fmt: skip
    return build_data(model, tok, workdir, dcfg, progress=progress)


def _run_evalset(args: argparse.Namespace, workdir: Path, progress: bool, ap: argparse.ArgumentParser) -> dict:
    from .evalset import build_eval_set

    model, tok = _target()
    ev = build_eval_set(model, tok, workdir, seed=args.seed)
    return {"eval_sequences": len(ev["records"])}


def _run_distill(args: argparse.Namespace, workdir: Path, progress: bool, ap: argparse.ArgumentParser) -> dict:
    from ..drafters.networks.draft import DraftConfig
    from .distill import DistillConfig, run_distill

    cfg = DistillConfig(seed=args.seed)
    _set(cfg, {"steps": args.steps, "lr": args.lr})
    _set(cfg.draft, {"num_layers": args.layers, "head_vocab": args.head_vocab})
    if args.width is not None:
        # heads of 64 dims, 2 query heads per KV head where the width allows it, the MLP 3x wide
        heads = max(1, args.width // 64)
        cfg.draft.hidden_size, cfg.draft.num_heads = args.width, heads
        cfg.draft.num_kv_heads = heads // 2 if heads % 2 == 0 else heads
        cfg.draft.intermediate_size = 3 * args.width
    target = None
    if args.from_target_layers is not None:
        target, _ = _target()
        try:
            cfg.draft = DraftConfig.from_target_layers(target.config, args.from_target_layers, cfg.draft.head_vocab)
        except ValueError as e:
            ap.error(f"--from-target-layers: {e}")
    return run_distill(workdir, cfg, target=target, progress=progress)


def _run_eval(args: argparse.Namespace, workdir: Path, progress: bool, ap: argparse.ArgumentParser) -> dict:
    from .evaluate import run_eval

    return run_eval(workdir, seed=args.seed)


def _run_head(args: argparse.Namespace, workdir: Path, progress: bool, ap: argparse.ArgumentParser) -> dict:
    from .head import HeadConfig, run_head

    hcfg = HeadConfig(seed=args.seed)
    _set(hcfg, {"steps": args.head_steps})
    return run_head(workdir, hcfg, progress=progress)


def _run_feature_data(args: argparse.Namespace, workdir: Path, progress: bool, ap: argparse.ArgumentParser) -> dict:
    from .feature_data import FeatureDataConfig, build_feature_data

    model, tok = _target()
    return build_feature_data(model, tok, workdir, FeatureDataConfig(seed=args.seed), progress=progress)


def _run_feature_distill(args: argparse.Namespace, workdir: Path, progress: bool, ap: argparse.ArgumentParser) -> dict:
    from .feature_distill import FeatureDistillConfig, run_feature_distill

    fcfg = FeatureDistillConfig(seed=args.seed)
    _set(fcfg, {"steps": args.steps})
    return run_feature_distill(workdir, fcfg, progress=progress)


def _run_feature_eval(args: argparse.Namespace, workdir: Path, progress: bool, ap: argparse.ArgumentParser) -> dict:
    from .feature_distill import run_feature_eval

    return run_feature_eval(workdir, seed=args.seed, draft=args.draft, record=args.draft is None)


def _run_feature_head(args: argparse.Namespace, workdir: Path, progress: bool, ap: argparse.ArgumentParser) -> dict:
    from ..drafters.networks.feature_draft import FEATURE_DRAFT
    from .feature_head import RolloutConfig, run_feature_head

    rcfg = RolloutConfig(seed=args.seed)
    rcfg.head.seed = args.seed
    _set(rcfg.head, {"steps": args.head_steps})
    _set(rcfg, {"n_magpie": args.magpie})
    return run_feature_head(workdir, rcfg, args.name or FEATURE_DRAFT, progress=progress)


def _run_bigram(args: argparse.Namespace, workdir: Path, progress: bool, ap: argparse.ArgumentParser) -> dict:
    from .bigram import DEFAULT_BIGRAM, build_bigram, default_corpus

    model, tok = _target()
    return build_bigram(
        tok, int(model.config.vocab_size), args.corpus or default_corpus(), name=args.name or DEFAULT_BIGRAM
    )


def _run_feature_ship(args: argparse.Namespace, workdir: Path, progress: bool, ap: argparse.ArgumentParser) -> dict:
    from ..drafters.networks.feature_draft import FEATURE_DRAFT
    from .feature_distill import ship_feature_draft

    return ship_feature_draft(workdir, args.name or FEATURE_DRAFT)


def _run_ship(args: argparse.Namespace, workdir: Path, progress: bool, ap: argparse.ArgumentParser) -> dict:
    from ..drafters.assets import DEFAULT_DRAFT
    from .assets import ship

    return ship(workdir, args.name or DEFAULT_DRAFT)


#: each stage's run: (parsed flags, workdir, progress bar on, the parser for errors) -> its manifest record
_RUNS: dict[str, Callable[[argparse.Namespace, Path, bool, argparse.ArgumentParser], dict]] = {
    "data": _run_data,
    "evalset": _run_evalset,
    "distill": _run_distill,
    "eval": _run_eval,
    "head": _run_head,
    "ship": _run_ship,
    "feature-data": _run_feature_data,
    "feature-distill": _run_feature_distill,
    "feature-eval": _run_feature_eval,
    "feature-ship": _run_feature_ship,
    "feature-head": _run_feature_head,
    "bigram": _run_bigram,
}


def _layer_list(text: str) -> tuple[int, ...]:
    """``"0,1,2"`` -> (0, 1, 2) for --from-target-layers."""
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated layer indices such as 0,1,2, got {text!r}"
        ) from None
    return layers


def _brief(info: dict) -> dict:
    return {k: v for k, v in info.items() if not isinstance(v, dict | list) or k == "metrics"}
