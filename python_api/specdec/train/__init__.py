"""Training the drafts for the real model: data generation, distillation, SpecDec++ acceptance head, shipping.

The networks and their loaders live in :mod:`specdec.drafters` (nothing at run time imports this package); the
loaders are also here, under the names below.

Use the shipped draft::

    from specdec.smollm2 import load_smollm2
    from specdec.train import load_draft, load_head
    target, tok = load_smollm2("bf16")
    draft = load_draft("smollm2-distill", target)        # HF LlamaForCausalLM, full-vocab logits (-inf off-head)
    head, h = load_head("smollm2-distill-head")          # SpecDec++ acceptance head + its default threshold
    eagle = load_draft("smollm2-eagle", target)          # feature draft: reads the target's hidden states
    cascade = load_cascade("smollm2-cascade", target)    # CS Drafting (method "csd"): a draft above Max-Gram

Retrain: ``python -m specdec.train all`` (stages: data, evalset, distill, eval, head, ship; see train/README.md).
"""

from ..drafters.assets import DEFAULT_CASCADE, DEFAULT_DRAFT, asset_manifest, load_cascade, load_draft
from ..drafters.networks.draft import DraftConfig, ReducedHead, build_draft, check_compatible
from ..drafters.networks.feature_draft import FEATURE_DRAFT, FeatureDraft, FeatureDraftConfig, load_feature_draft
from ..drafters.networks.head import AcceptanceHead, load_head
from .assets import save_draft
from .head import HeadConfig

__all__ = [
    "DEFAULT_CASCADE",
    "DEFAULT_DRAFT",
    "FEATURE_DRAFT",
    "AcceptanceHead",
    "DraftConfig",
    "FeatureDraft",
    "FeatureDraftConfig",
    "HeadConfig",
    "ReducedHead",
    "asset_manifest",
    "build_draft",
    "check_compatible",
    "load_cascade",
    "load_draft",
    "load_feature_draft",
    "load_head",
    "save_draft",
]
