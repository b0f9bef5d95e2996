"""Shipped drafts: small bf16 safetensors under ``specdec/assets`` (plus a JSON manifest), loadable by name.

A draft file holds only what was trained (projection, layers, norm, reduced head, head_ids) and a fingerprint of
the target embedding it was trained against; the embedding table itself is taken from the target at load time.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import torch

from ..errors import DraftMismatchError
from .common import file_sha256, write_json_atomic
from .distill import DistillConfig
from .draft import (
    DraftConfig,
    build_draft,
    check_compatible,
    check_fingerprint,
    draft_from_checkpoint,
    target_embedding,
    target_fingerprint,
    trainable_state,
)
from .store import ASSETS_DIR, resolve_asset

DEFAULT_DRAFT = "smollm2-distill"
#: the shipped CS Drafting cascade: smollm2-csd-l2 above Max-Gram with its bigram table (specdec/assets)
DEFAULT_CASCADE = "smollm2-cascade"


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


def load_draft(
    name_or_path: str | Path = DEFAULT_DRAFT, target: Any = None, *, dtype: torch.dtype = torch.bfloat16
) -> Any:
    """Load a shipped (or saved) draft as an HF ``LlamaForCausalLM`` in eval mode (a feature draft such as
    ``smollm2-eagle`` loads as :class:`~specdec.train.feature_draft.FeatureDraft`).

    ``target``: the target model whose input embedding the draft reuses (shared, not copied, when dtypes match);
    default: SmolLM2-135M-Instruct via :func:`specdec.smollm2.load_smollm2`. Raises ValueError when the target's
    vocabulary or embedding differs from the one the draft was trained with.
    """
    from safetensors import safe_open

    path = resolve_asset(name_or_path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        if "feature_draft_config" in meta:  # an EAGLE-style feature draft (e.g. smollm2-eagle)
            from .feature_draft import load_feature_draft

            return load_feature_draft(path, target, dtype=dtype)
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    cfg = DraftConfig(**json.loads(meta["draft_config"]))
    if target is None:
        from ..smollm2 import load_smollm2

        target, _ = load_smollm2(dtype)
    vocab = int(meta["vocab_size"])
    if int(target.config.vocab_size) != vocab:
        raise DraftMismatchError(
            f"{path.name}: draft trained for vocab_size={vocab}, target has vocab_size={target.config.vocab_size}; "
            "a draft must share the target's tokenizer and vocabulary"
        )
    table = target_embedding(target)
    check_fingerprint(tensors.pop("target_fingerprint"), table, path.name)
    draft = build_draft(cfg, target.config, table.to(dtype), tensors["lm_head.head_ids"])
    missing, unexpected = draft.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if not k.endswith("embed_tokens.table")]
    if missing or unexpected:
        raise ValueError(f"{path.name}: weights do not match the draft config (missing {missing}, extra {unexpected})")
    draft = draft.to(dtype).eval()
    check_compatible(draft, target)
    return draft


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


def load_cascade(
    name_or_path: str | Path = DEFAULT_CASCADE, target: Any = None, *, dtype: torch.dtype = torch.bfloat16
):
    """A CS Drafting cascade (:class:`~specdec.cascade.CascadeDrafter`, method ``csd``) from its recipe, a JSON
    asset (``smollm2-cascade``) or file: ``drafters`` (draft assets, largest first, loaded with :func:`load_draft`),
    ``bigram`` (Max-Gram's table, :func:`specdec.cascade.load_bigram`), ``steps`` (the step-limit matrix),
    ``leniency`` (one per drafter) and ``mag_tokens``. ``target``: as for :func:`load_draft`."""
    from ..cascade import CascadeDrafter, load_bigram

    path = resolve_asset(name_or_path, ".json")
    recipe = json.loads(path.read_text())
    missing = sorted({"drafters", "bigram", "steps", "leniency"} - set(recipe))
    if missing:
        raise ValueError(f"{path.name} is not a cascade recipe: it lacks {missing}")
    if target is None:
        from ..smollm2 import load_smollm2

        target, _ = load_smollm2(dtype)
    drafters = [load_draft(d, target, dtype=dtype) for d in recipe["drafters"]]
    return CascadeDrafter(
        drafters,
        bigram=load_bigram(recipe["bigram"]),
        steps=recipe["steps"],
        leniency=recipe["leniency"],
        mag_tokens=int(recipe.get("mag_tokens", 10)),
    )


def asset_manifest(name: str = DEFAULT_DRAFT) -> dict[str, Any]:
    """The JSON manifest shipped next to a draft asset (config, data hash, steps, metrics)."""
    return json.loads(resolve_asset(name, ".json").read_text())
