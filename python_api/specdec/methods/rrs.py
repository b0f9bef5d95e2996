"""``rrs``: SpecInfer's recursive rejection sampling on a static tree of i.i.d. siblings (docs/methods.md, RRS)."""

from __future__ import annotations

from .builders.auto import AutoIIDTreeBuilder
from .builders.static_trees import IIDTreeBuilder
from .spec import MethodSpec, register, tree_label

SPEC = register(
    MethodSpec(
        name="rrs",
        description=(
            "Recursive rejection sampling on a static draft tree whose siblings are i.i.d. draws from p: the "
            "children of a node are tried in draft order against the residual law left by the earlier rejections, "
            "and duplicated candidates each update the residual. The tree is given by branching (children per "
            "level) or parents (any level-order tree). X. Miao et al., SpecInfer: Accelerating Large Language "
            "Model Serving with Tree-based Speculative Inference and Verification, ASPLOS 2024, arXiv:2305.09781."
        ),
        verifier="rrs",
        verifiers=frozenset({"token", "traversal"}),
        builder=IIDTreeBuilder,
        label=tree_label,
        defaults={"branching": "auto"},  # trees chosen per round for the machine (specdec.autotree)
        allowed=frozenset({"branching", "parents"}),
        auto_builder=AutoIIDTreeBuilder,
    )
)
