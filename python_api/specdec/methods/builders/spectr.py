"""SpecTr: K independent draft chains of length L verified with K-SEQ depth by depth (docs/methods.md, SpecTr).

The template is sk.kseq_chain_parents(K, L): the root has K i.i.d. children, every other node one child. The
verifier (verify_tree method "kseq") keeps the chains that agree with the accepted prefix alive. In greedy mode
all chains would be identical, so only the first is drafted.
"""

from __future__ import annotations

from .static_trees import IIDTreeBuilder


class SpecTrBuilder(IIDTreeBuilder):
    """Children of the root and of every chain node are i.i.d. draws (duplicates kept: K-SEQ counts them)."""
