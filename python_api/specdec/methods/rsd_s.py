"""``rsd_s``: RSD with a tree grown by stochastic beam search (docs/methods.md, RRSw and RSD)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .builders.beam import BeamTreeBuilder
from .spec import MethodSpec, register

if TYPE_CHECKING:
    from .spec import MethodConfig


def _label(config: MethodConfig) -> str:
    return f"rsd_s(W={config.beam_width},L={config.draft_length})"


SPEC = register(
    MethodSpec(
        name="rsd_s",
        description=(
            "Recursive Speculative Decoding with stochastic beam search (RSD-S): each of draft_length levels keeps "
            "the beam_width sequences with the largest truncated Gumbel scores, so a node's children are again a "
            "draw without replacement from its conditional draft law, which the rrsw verifier reads. W. Jeon, "
            "M. Gagrani, R. Goel, J. Park, M. Lee, C. Lott, Recursive Speculative Decoding: Accelerating LLM "
            "Inference via Sampling Without Replacement, 2024, arXiv:2402.14160."
        ),
        verifier="rrsw",
        builder=BeamTreeBuilder,
        label=_label,
        defaults={"beam_width": 2, "draft_length": 3},
        allowed=frozenset({"beam_width", "draft_length"}),
    )
)
