"""``gds``: greedy draft sampling on a static tree, verified at the optimum of its draft process (docs/methods.md,
GDS)."""

from __future__ import annotations

from .builders.static_trees import GDSTreeBuilder
from .spec import MethodSpec, register, tree_label

SPEC = register(
    MethodSpec(
        name="gds",
        description=(
            "Greedy draft sampling: a node with k children drafts its draft law's k - 1 most likely tokens and one "
            "draw from the other tokens; the verifier tests the drawn token against the law it was drawn from, "
            "then gives each greedy token its share of the residual, which reaches the optimal acceptance of this "
            "draft process, q(D) + sum over the other tokens of min(q, p renormalised). With two children it is "
            "SpecHub's draft process. The tree is given by branching (children per level) or parents (any "
            "level-order tree). Z. Hu, T. Zheng, V. Viswanathan, Z. Chen, R. A. Rossi, Y. Wu, D. Manocha, H. Huang, "
            "Towards Optimal Multi-draft Speculative Decoding, ICLR 2025, arXiv:2502.18779."
        ),
        verifier="gds",
        builder=GDSTreeBuilder,
        label=tree_label,
        # no "auto": its acceptance model counts siblings tested in draft order, and gds tests its last child first
        defaults={"branching": (2, 2, 1)},
        allowed=frozenset({"branching", "parents"}),
    )
)
