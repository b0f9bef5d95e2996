"""Shipping drafts: a trained draft saved as one bf16 safetensors file (its trained weights, head ids and the target
fingerprint), copied with its JSON manifest into ``specdec/assets``, and the command that retrains it. Loading by name
is :mod:`specdec.drafters.assets`'s; its names are importable from here too.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import torch

from ..drafters.assets import (  # noqa: F401 (names of the module before the networks moved)
    DEFAULT_CASCADE,
    DEFAULT_DRAFT,
    asset_manifest,
    load_cascade,
    load_draft,
)
from ..drafters.store import ASSETS_DIR
from .common import file_sha256, write_json_atomic
from .distill import DistillConfig
from .draft import (
    DraftConfig,
    draft_from_checkpoint,
    target_fingerprint,
    trainable_state,
)


def save_draft(draft: Any, path: Path, cfg: DraftConfig, *, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the trainable weights (``dtype``), head_ids and the target fingerprint as one safetensors file."""
    from dataclasses import asdict

    from safetensors.torch import save_file

    tensors = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in trainable_state(draft).items()}
    tensors["target_fingerprint"] = target_fingerprint(draft.model.embed_tokens.table)
    meta = {"draft_config": json.dumps(asdict(cfg)), "vocab_size": str(draft.config.vocab_size), "format": "1"}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=meta)
    return path


def ship(workdir: Path, name: str = DEFAULT_DRAFT, *, assets_dir: Path | None = None) -> dict[str, Any]:
    """Copy the trained draft (and acceptance head, if trained) into the assets folder with a manifest."""
    from ..smollm2 import load_smollm2

    out = assets_dir or ASSETS_DIR
    from .evaluate import check_set_alpha

    target, tok = load_smollm2("bf16")
    ck = torch.load(workdir / "distill" / "final.pt", weights_only=False)
    draft = draft_from_checkpoint(workdir / "distill" / "final.pt", target)
    files = {"draft": save_draft(draft, out / f"{name}.safetensors", DraftConfig(**ck["config"]["draft"]))}
    head_src = workdir / "head" / "head.safetensors"
    if head_src.is_file():
        files["head"] = out / f"{name}-head.safetensors"
        shutil.copyfile(head_src, files["head"])
    wm = workdir / "manifest.json"
    manifest = json.loads(wm.read_text()) if wm.is_file() else {}
    manifest["files"] = {
        k: {"file": p.name, "bytes": p.stat().st_size, "sha256": file_sha256(p)} for k, p in files.items()
    }
    shipped = load_draft(files["draft"], target)
    manifest["check_set"] = {"dtype": "bf16", **check_set_alpha(shipped, target, tok)}
    manifest["retrain"] = retrain_command(manifest, ck["config"], name)
    write_json_atomic(out / f"{name}.json", manifest)
    return {"files": {k: str(p) for k, p in files.items()}, "bytes": {k: p.stat().st_size for k, p in files.items()}}


def retrain_command(manifest: dict[str, Any], distill: dict[str, Any], name: str) -> str:
    """The train command that rebuilds a plain draft: its seed, data counts, size and steps."""
    data = manifest.get("data", {}).get("config", {})
    draft = distill["draft"]
    flags = [f"--seed {distill['seed']}", f"--name {name}", f"--steps {distill['steps']}"]
    default_lr = DistillConfig().lr
    if distill.get("lr", default_lr) != default_lr:
        flags.append(f"--lr {distill['lr']}")
    if data:
        flags += [f"--gsm8k-label {data['n_gsm8k_label']}", f"--magpie {data['n_magpie']}"]
        if data.get("n_gsm8k_sample"):
            flags.append(f"--gsm8k-sample {data['n_gsm8k_sample']}")
        if data.get("gsm8k_cue"):
            flags.append(f"--gsm8k-cue {_shell_word(data['gsm8k_cue'])}")
        if data.get("n_code_sample"):
            flags.append(f"--code-sample {data['n_code_sample']}")
        if data.get("answer_temperature", 1.0) != 1.0:
            flags.append(f"--answer-temperature {data['answer_temperature']}")
    if draft.get("target_layers"):
        flags.append("--from-target-layers " + ",".join(str(i) for i in draft["target_layers"]))
    else:
        flags += [f"--layers {draft['num_layers']}", f"--width {draft['hidden_size']}"]
    flags.append(f"--head-vocab {draft['head_vocab']}")
    return "python -m specdec.train all " + " ".join(flags)


def _shell_word(text: str) -> str:
    """``text`` as one shell word: in double quotes where none of the characters a shell expands there occurs (a
    sentence with an apostrophe reads as written), else single-quoted by shlex."""
    return f'"{text}"' if not any(c in text for c in '"$`\\!') else shlex.quote(text)
