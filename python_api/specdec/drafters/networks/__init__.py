"""The shipped draft networks: the distilled draft (:mod:`.draft`: a narrow Llama over the target's embedding with a
reduced head), the feature draft (:mod:`.feature_draft`, EAGLE-style) and the SpecDec++ acceptance head
(:mod:`.head`). Training them is :mod:`specdec.train`'s."""

from .draft import DraftConfig, ReducedHead, build_draft, check_compatible
from .feature_draft import FEATURE_DRAFT, FeatureDraft, FeatureDraftConfig, load_feature_draft
from .head import AcceptanceHead, load_head

__all__ = [
    "FEATURE_DRAFT",
    "AcceptanceHead",
    "DraftConfig",
    "FeatureDraft",
    "FeatureDraftConfig",
    "ReducedHead",
    "build_draft",
    "check_compatible",
    "load_feature_draft",
    "load_head",
]
