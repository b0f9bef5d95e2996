"""Draft-tree builders, one module per method family (docs/methods.md)."""

from __future__ import annotations

from ..config import MethodConfig
from .base import StaticTreeBuilder, TreeBuilder
from .beam import BeamTreeBuilder
from .chain import ChainBuilder
from .spechub import SpecHubBuilder
from .spectr import SpecTrBuilder
from .static_trees import IIDTreeBuilder, SWORTreeBuilder

_BUILDERS: dict[str, type[TreeBuilder]] = {
    "sd": ChainBuilder,
    "rrs": IIDTreeBuilder,
    "rrsw": SWORTreeBuilder,
    "rsd_c": SWORTreeBuilder,
    "rsd_s": BeamTreeBuilder,
    "spectr": SpecTrBuilder,
    "spechub": SpecHubBuilder,
    "specdec_pp": ChainBuilder,  # + decoders.adaptive.AdaptiveStop, attached by SpeculativeDecoder
}


def make_builder(config: MethodConfig) -> TreeBuilder | None:
    """The tree builder of ``config.method`` (None for ``ar``)."""
    cls = _BUILDERS.get(config.method)
    return None if cls is None else cls(config)


__all__ = [
    "BeamTreeBuilder",
    "ChainBuilder",
    "IIDTreeBuilder",
    "SWORTreeBuilder",
    "SpecHubBuilder",
    "SpecTrBuilder",
    "StaticTreeBuilder",
    "TreeBuilder",
    "make_builder",
]
