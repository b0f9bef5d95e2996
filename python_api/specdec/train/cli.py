"""``python -m specdec.train {data,distill,eval,head,ship,all}``: the draft-training pipeline, one stage each.

Every stage reads and writes ``--workdir`` (default ``~/.cache/specdec/train``), resumes from what is there, and
records its configuration, data hash, steps and metrics in ``<workdir>/manifest.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .common import default_workdir, set_threads

STAGES = ("data", "evalset", "distill", "eval", "head", "ship", "all")


def _target(dtype: str = "bf16"):  # noqa: ANN202
    from ..smollm2 import load_smollm2

    return load_smollm2(dtype)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec.train", description=__doc__)
    ap.add_argument("stage", choices=STAGES)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="distillation steps (default: DistillConfig)")
    ap.add_argument("--head-steps", type=int, default=None, help="acceptance-head steps (default: HeadConfig)")
    ap.add_argument("--name", default="smollm2-distill", help="asset name for the ship stage")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    set_threads(args.threads)
    workdir = args.workdir or default_workdir()
    workdir.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    stages = ("data", "evalset", "distill", "eval", "head", "ship") if args.stage == "all" else (args.stage,)
    t_all = time.time()
    for stage in stages:
        t0 = time.time()
        print(f"[specdec.train] stage {stage} in {workdir}", flush=True)
        if stage == "data":
            from .data import DataConfig, build_data

            model, tok = _target()
            info = build_data(model, tok, workdir, DataConfig(seed=args.seed), progress=progress)
        elif stage == "evalset":
            from .evalset import build_eval_set

            model, tok = _target()
            ev = build_eval_set(model, tok, workdir, seed=args.seed)
            info = {"eval_sequences": len(ev["records"])}
        elif stage == "distill":
            from .distill import DistillConfig, run_distill

            cfg = DistillConfig(seed=args.seed)
            if args.steps is not None:
                cfg.steps = args.steps
            info = run_distill(workdir, cfg, progress=progress)
        elif stage == "eval":
            from .evaluate import run_eval

            info = run_eval(workdir, seed=args.seed)
        elif stage == "head":
            from .head import HeadConfig, run_head

            hcfg = HeadConfig(seed=args.seed)
            if args.head_steps is not None:
                hcfg.steps = args.head_steps
            info = run_head(workdir, hcfg, progress=progress)
        else:
            from .assets import ship

            info = ship(workdir, args.name)
        print(json.dumps({"stage": stage, "seconds": round(time.time() - t0, 1), **_brief(info)}, default=str))
    print(f"[specdec.train] done in {time.time() - t_all:.0f} s", flush=True)
    return 0


def _brief(info: dict) -> dict:
    return {k: v for k, v in info.items() if not isinstance(v, dict | list) or k == "metrics"}
