"""``rsd_c``: RSD with a constant-branching tree (docs/methods.md, RRSw and RSD)."""

from __future__ import annotations

from .builders.auto import AutoTreeBuilder
from .builders.static_trees import SWORTreeBuilder
from .spec import MethodSpec, register, tree_label

SPEC = register(
    MethodSpec(
        name="rsd_c",
        description=(
            "Recursive Speculative Decoding with a constant branching factor per level (RSD-C): every node of "
            "level l gets branching[l] children drawn without replacement (Gumbel-top-k), verified by recursive "
            "rejection sampling without replacement. W. Jeon, M. Gagrani, R. Goel, J. Park, M. Lee, C. Lott, "
            "Recursive Speculative Decoding: Accelerating LLM Inference via Sampling Without Replacement, 2024, "
            "arXiv:2402.14160."
        ),
        verifier="rrsw",
        verifiers=frozenset({"token", "traversal"}),
        builder=SWORTreeBuilder,
        label=tree_label,
        defaults={"branching": "auto"},  # trees chosen per round for the machine (specdec.autotree)
        allowed=frozenset({"branching"}),
        auto_builder=AutoTreeBuilder,
    )
)
