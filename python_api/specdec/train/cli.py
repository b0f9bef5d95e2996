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
from pathlib import Path

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
    args = ap.parse_args(argv)
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
        if stage == "data":
            from .data import DataConfig, build_data

            model, tok = _target()
            dcfg = DataConfig(seed=args.seed)
            if args.gsm8k_label is not None:
                dcfg.n_gsm8k_label = args.gsm8k_label
            if args.gsm8k_sample is not None:
                dcfg.n_gsm8k_sample = args.gsm8k_sample
            if args.gsm8k_cue is not None:
                dcfg.gsm8k_cue = args.gsm8k_cue
            if args.magpie is not None:
                dcfg.n_magpie = args.magpie
            if args.code_sample is not None:
                dcfg.n_code_sample = args.code_sample
            if args.answer_temperature is not None:
                dcfg.answer_temperature = args.answer_temperature
            info = build_data(model, tok, workdir, dcfg, progress=progress)
        elif stage == "evalset":
            from .evalset import build_eval_set

            model, tok = _target()
            ev = build_eval_set(model, tok, workdir, seed=args.seed)
            info = {"eval_sequences": len(ev["records"])}
        elif stage == "distill":
            from .distill import DistillConfig, run_distill
            from .draft import DraftConfig

            cfg = DistillConfig(seed=args.seed)
            if args.steps is not None:
                cfg.steps = args.steps
            if args.lr is not None:
                cfg.lr = args.lr
            if args.layers is not None:
                cfg.draft.num_layers = args.layers
            if args.width is not None:
                # heads of 64 dims, 2 query heads per KV head where the width allows it, the MLP 3x wide
                heads = max(1, args.width // 64)
                cfg.draft.hidden_size, cfg.draft.num_heads = args.width, heads
                cfg.draft.num_kv_heads = heads // 2 if heads % 2 == 0 else heads
                cfg.draft.intermediate_size = 3 * args.width
            if args.head_vocab is not None:
                cfg.draft.head_vocab = args.head_vocab
            target = None
            if args.from_target_layers is not None:
                target, _ = _target()
                try:
                    cfg.draft = DraftConfig.from_target_layers(
                        target.config, args.from_target_layers, cfg.draft.head_vocab
                    )
                except ValueError as e:
                    ap.error(f"--from-target-layers: {e}")
            info = run_distill(workdir, cfg, target=target, progress=progress)
        elif stage == "eval":
            from .evaluate import run_eval

            info = run_eval(workdir, seed=args.seed)
        elif stage == "head":
            from .head import HeadConfig, run_head

            hcfg = HeadConfig(seed=args.seed)
            if args.head_steps is not None:
                hcfg.steps = args.head_steps
            info = run_head(workdir, hcfg, progress=progress)
        elif stage == "feature-data":
            from .feature_data import FeatureDataConfig, build_feature_data

            model, tok = _target()
            info = build_feature_data(model, tok, workdir, FeatureDataConfig(seed=args.seed), progress=progress)
        elif stage == "feature-distill":
            from .feature_distill import FeatureDistillConfig, run_feature_distill

            fcfg = FeatureDistillConfig(seed=args.seed)
            if args.steps is not None:
                fcfg.steps = args.steps
            info = run_feature_distill(workdir, fcfg, progress=progress)
        elif stage == "feature-eval":
            from .feature_distill import run_feature_eval

            info = run_feature_eval(workdir, seed=args.seed, draft=args.draft, record=args.draft is None)
        elif stage == "feature-head":
            from .feature_draft import FEATURE_DRAFT
            from .feature_head import RolloutConfig, run_feature_head

            rcfg = RolloutConfig(seed=args.seed)
            rcfg.head.seed = args.seed
            if args.head_steps is not None:
                rcfg.head.steps = args.head_steps
            if args.magpie is not None:
                rcfg.n_magpie = args.magpie
            info = run_feature_head(workdir, rcfg, args.name or FEATURE_DRAFT, progress=progress)
        elif stage == "bigram":
            from .bigram import DEFAULT_BIGRAM, build_bigram, default_corpus

            model, tok = _target()
            info = build_bigram(tok, int(model.config.vocab_size), args.corpus or default_corpus(),
                                name=args.name or DEFAULT_BIGRAM)  # fmt: skip
        elif stage == "feature-ship":
            from .feature_distill import ship_feature_draft
            from .feature_draft import FEATURE_DRAFT

            info = ship_feature_draft(workdir, args.name or FEATURE_DRAFT)
        else:
            from .assets import DEFAULT_DRAFT, ship

            info = ship(workdir, args.name or DEFAULT_DRAFT)
        print(json.dumps({"stage": stage, "seconds": round(time.time() - t0, 1), **_brief(info)}, default=str))
    print(f"[specdec.train] done in {time.time() - t_all:.0f} s", flush=True)
    return 0


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
