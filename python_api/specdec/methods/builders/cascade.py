"""CS Drafting: the draft chain of one round is the block a :class:`~specdec.drafters.cascade.CascadeDrafter` builds by
vertical and horizontal cascades, with the law every position was emitted from (docs/methods.md, CS Drafting).

The target reviews the block as an SD chain (verifier ``sd``); exactness needs each position's law to be the law
its token was really drawn from, which the cascade hands over (spec section 6.4: the emission law E of a lenient
review, never the reviewer's row).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...drafters import Drafter
from ...drafters.cascade import CascadeDrafter
from ...tree import DraftTree
from .base import Children, TreeBuilder, op_seed

if TYPE_CHECKING:
    from ...sampling import SamplingConfig


def check_cascade(draft: object) -> None:
    """TypeError unless ``draft`` is a :class:`CascadeDrafter` (method ``csd`` drafts with nothing else)."""
    if not isinstance(draft, CascadeDrafter):
        got = getattr(draft, "name", None) or type(draft).__name__
        raise TypeError(
            "method 'csd' drafts with a cascade: pass draft=specdec.CascadeDrafter([draft models, largest "
            f"first], bigram=...) or specdec.train.load_cascade('smollm2-cascade', target), got {got!r}"
        )


class CascadeBuilder(TreeBuilder):
    """A chain whose tokens and laws come from the cascade in one call (no level-by-level drafting)."""

    draw = "cascade"

    def expand(
        self,
        tree: DraftTree,
        lo: int,
        hi: int,
        logits: torch.Tensor,
        logp: torch.Tensor | None,
        live: torch.Tensor,
        greedy: bool,
        generator: torch.Generator | None,
    ) -> Children:
        raise TypeError("method 'csd' drafts whole blocks with a CascadeDrafter; it has no per-level expansion")

    def build(
        self,
        drafter: Drafter,
        roots: torch.Tensor,
        committed: list[list[int]],
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        max_depth: int,
    ) -> DraftTree:
        """One round: the cascade's block, at most min(max_depth, draft_length) tokens per row, as a chain tree
        whose node j carries the law of token j + 1. Shape: roots [B] -> a DraftTree of depth <= that length."""
        check_cascade(drafter)
        tree = DraftTree.from_roots(roots)
        depth = min(max_depth, self.depth)
        if depth < 1:
            return tree
        tokens, laws = drafter.draft_block(committed, sampling, lambda: op_seed(generator), depth)
        width = max((len(t) for t in tokens), default=0)
        dev = tree.device
        lens = torch.tensor([len(t) for t in tokens], dtype=torch.long, device=dev)
        block = torch.zeros((tree.batch, width), dtype=torch.long)
        for b, t in enumerate(tokens):
            block[b, : len(t)] = torch.tensor(t, dtype=torch.long)
        block = block.to(dev)
        for j in range(width):
            valid = (lens > j)[:, None]
            lo, _ = tree.levels[-1]
            if laws is not None:  # node lo (depth j) holds the law of the token at depth j + 1
                tree.set_level_laws(laws[:, j : j + 1].to(dev))
            parent = torch.full((tree.batch, 1), lo, dtype=torch.long, device=dev)
            tree.append_level(block[:, j : j + 1], parent, valid)
        return tree
