"""Draft-tree builders, one module per drafting family (docs/methods.md); each method's module of
:mod:`specdec.methods` names the builder it drafts with."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import StaticTreeBuilder, TreeBuilder
from .beam import BeamTreeBuilder
from .cascade import CascadeBuilder
from .chain import ChainBuilder
from .spechub import SpecHubBuilder
from .spectr import SpecTrBuilder
from .static_trees import IIDTreeBuilder, SWORTreeBuilder

if TYPE_CHECKING:
    from ..spec import MethodConfig


def make_builder(config: MethodConfig) -> TreeBuilder | None:
    """The tree builder of ``config.method``, from its spec (None for a method that drafts nothing, ``ar``); the
    spec's auto_builder for ``branching="auto"``."""
    factory = config.spec.auto_builder if config.auto else config.spec.builder
    return None if factory is None else factory(config)


__all__ = [
    "BeamTreeBuilder",
    "CascadeBuilder",
    "ChainBuilder",
    "IIDTreeBuilder",
    "SWORTreeBuilder",
    "SpecHubBuilder",
    "SpecTrBuilder",
    "StaticTreeBuilder",
    "TreeBuilder",
    "make_builder",
]
