"""Loading the shipped drafts by name: the distilled draft, the feature draft, the CS Drafting cascade.

A draft file holds only what was trained (projection, layers, norm, reduced head, head_ids) and a fingerprint of
the target embedding it was trained against; the embedding table itself is taken from the target at load time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .cascade import CascadeDrafter
from .networks.draft import (
    DraftConfig,
    build_draft,
    check_compatible,
    check_fingerprint,
    check_target_vocab,
    load_trained,
    target_embedding,
)
from .networks.feature_draft import load_feature_draft
from .ngram import load_bigram
from .store import resolve_asset

DEFAULT_DRAFT = "smollm2-distill"


#: the shipped CS Drafting cascade: smollm2-csd-l2 above Max-Gram with its bigram table (specdec/assets)
DEFAULT_CASCADE = "smollm2-cascade"


def load_draft(
    name_or_path: str | Path = DEFAULT_DRAFT, target: Any = None, *, dtype: torch.dtype = torch.bfloat16
) -> Any:
    """Load a shipped (or saved) draft as an HF ``LlamaForCausalLM`` in eval mode (a feature draft such as
    ``smollm2-eagle`` loads as :class:`~specdec.drafters.networks.FeatureDraft`).

    ``target``: the target model whose input embedding the draft reuses (shared, not copied, when dtypes match);
    default: SmolLM2-135M-Instruct via :func:`specdec.smollm2.load_smollm2`. Raises ValueError when the target's
    vocabulary or embedding differs from the one the draft was trained with.
    """
    from safetensors import safe_open

    path = resolve_asset(name_or_path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        if "feature_draft_config" in meta:  # an EAGLE-style feature draft (e.g. smollm2-eagle)
            return load_feature_draft(path, target, dtype=dtype)
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    cfg = DraftConfig(**json.loads(meta["draft_config"]))
    if target is None:
        from ..smollm2 import load_smollm2

        target, _ = load_smollm2(dtype)
    check_target_vocab(int(meta["vocab_size"]), target, path.name)
    table = target_embedding(target)
    check_fingerprint(tensors.pop("target_fingerprint"), table, path.name)
    draft = build_draft(cfg, target.config, table.to(dtype), tensors["lm_head.head_ids"])
    load_trained(draft, tensors, "embed_tokens.table", path.name)
    draft = draft.to(dtype).eval()
    check_compatible(draft, target)
    return draft


def load_cascade(
    name_or_path: str | Path = DEFAULT_CASCADE, target: Any = None, *, dtype: torch.dtype = torch.bfloat16
):
    """A CS Drafting cascade (:class:`~specdec.drafters.cascade.CascadeDrafter`, method ``csd``) from its recipe, a JSON
    asset (``smollm2-cascade``) or file: ``drafters`` (draft assets, largest first, loaded with :func:`load_draft`),
    ``bigram`` (Max-Gram's table, :func:`specdec.drafters.ngram.load_bigram`), ``steps`` (the step-limit matrix),
    ``leniency`` (one per drafter) and ``mag_tokens``. ``target``: as for :func:`load_draft`."""
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
