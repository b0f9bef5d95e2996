"""SD: a chain of L draft tokens, each drawn from the draft law after the previous one (docs/methods.md, SD)."""

from __future__ import annotations

from .static_trees import IIDTreeBuilder


class ChainBuilder(IIDTreeBuilder):
    """Template: sk.chain_parents(L); one child per node, drawn like an i.i.d. sibling set of size one."""
