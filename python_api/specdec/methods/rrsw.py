"""``rrsw``: recursive rejection sampling without replacement on any static tree (docs/methods.md, RRSw and RSD)."""

from __future__ import annotations

from .builders.auto import AutoTreeBuilder
from .builders.static_trees import SWORTreeBuilder
from .spec import MethodSpec, register, tree_label

SPEC = register(
    MethodSpec(
        name="rrsw",
        description=(
            "Recursive rejection sampling without replacement: a node's children are drawn by Gumbel-top-k, so "
            "they are distinct, and the k-th candidate is verified against p with the earlier candidates removed "
            "and renormalised. The tree is given by branching (children per level) or parents (any level-order "
            "tree). W. Jeon, M. Gagrani, R. Goel, J. Park, M. Lee, C. Lott, Recursive Speculative Decoding: "
            "Accelerating LLM Inference via Sampling Without Replacement, 2024, arXiv:2402.14160."
        ),
        verifier="rrsw",
        verifiers=frozenset({"token", "traversal"}),
        builder=SWORTreeBuilder,
        label=tree_label,
        defaults={"branching": "auto"},  # trees chosen per round for the machine (specdec.autotree)
        allowed=frozenset({"branching", "parents"}),
        auto_builder=AutoTreeBuilder,
    )
)
