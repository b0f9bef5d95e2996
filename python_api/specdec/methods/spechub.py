"""``spechub``: hub-pair drafts on binary trees, verified by an optimal-transport plan (docs/methods.md, SpecHub)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from .builders.auto import AutoSpecHubBuilder
from .builders.spechub import SpecHubBuilder
from .spec import MethodSpec, register, tree_label

if TYPE_CHECKING:
    from .spec import MethodConfig


def _binary(config: MethodConfig) -> None:
    """A node drafts one hub pair, so it has at most two children."""
    if config.branching is not None:
        if any(b > 2 for b in config.branching):
            raise ValueError(
                f"branching for method 'spechub' must hold 1s and 2s (binary trees), got {config.branching}"
            )
        return
    if max(Counter(config.parents[1:] if config.parents else ()).values(), default=0) > 2:
        raise ValueError("parents for method 'spechub' must give every node at most 2 children (binary trees)")


SPEC = register(
    MethodSpec(
        name="spechub",
        description=(
            "SpecHub: every node drafts a pair that always holds the hub, the draft's most likely token, and the "
            "verifier accepts slot 1 or 2 with the probabilities of the closed-form optimal transport plan between "
            "this sparse pair law and q, else samples the plan's residual. Trees are binary (branching of 1s and "
            "2s, or parents with at most two children per node). R. Sun, T. Zhou, X. Chen, L. Sun, SpecHub: "
            "Provable Acceleration to Multi-Draft Speculative Decoding, EMNLP 2024, arXiv:2411.05289."
        ),
        verifier="spechub",
        builder=SpecHubBuilder,
        label=tree_label,
        defaults={"branching": "auto"},  # trees chosen per round for the machine (specdec.autotree)
        allowed=frozenset({"branching", "parents"}),
        auto_builder=AutoSpecHubBuilder,
        check=_binary,
        hub_pairs=True,
    )
)
