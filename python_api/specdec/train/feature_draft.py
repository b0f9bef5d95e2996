"""Training helpers of the feature draft (the network itself: :mod:`specdec.drafters.networks.feature_draft`):
initialising it from the target, the weights that are trained, saving it. The network's names are importable from
here too.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..drafters.networks.feature_draft import (  # noqa: F401 (names of the module before the networks moved)
    FEATURE_DRAFT,
    FeatureDecoder,
    FeatureDraft,
    FeatureDraftConfig,
    PairEmbedding,
    lean_layer,
    load_feature_draft,
)
from .draft import target_fingerprint


@torch.no_grad()
def init_from_target(draft: FeatureDraft, target: Any) -> None:
    """Head rows = the target's output embedding rows of the head tokens (h ~ f_{i+1} then gives p ~ q);
    the pair projection starts as [I, I] / 2 so the layer first sees the feature plus the token embedding."""
    out = target.get_output_embeddings().weight.detach().float()
    draft.lm_head.reduced_weight.copy_(out[draft.lm_head.head_ids])
    e = out.shape[1]
    eye = torch.eye(e)
    draft.decoder.pair.proj.weight.copy_(torch.cat([eye, eye], dim=1) * 0.5)
    fuse = draft.decoder.pair.fuse
    if fuse is not None:  # start from the final hidden state alone
        fuse.weight.zero_()
        fuse.weight[:, :e].copy_(eye)


def trainable_state(draft: FeatureDraft) -> dict[str, torch.Tensor]:
    """Everything that is shipped: every parameter plus head_ids (the frozen embedding table is excluded)."""
    return {k: v for k, v in draft.state_dict().items() if not k.endswith("pair.table")}


def save_feature_draft(draft: FeatureDraft, path: Path, *, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the trainable weights (``dtype``), head_ids and the target fingerprint as one safetensors file."""
    from safetensors.torch import save_file

    tensors = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in trainable_state(draft).items()}
    tensors["target_fingerprint"] = target_fingerprint(draft.decoder.pair.table)
    meta = {
        "feature_draft_config": json.dumps(asdict(draft.draft_config)),
        "vocab_size": str(draft.config.vocab_size),
        "format": "1",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=meta)
    return path
