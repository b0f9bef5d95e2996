"""SD: a chain of L draft tokens, each drawn from the draft law after the previous one (spec §4.1, §5.1)."""

from __future__ import annotations

import torch

from .base import StaticTreeBuilder, iid_children


class ChainBuilder(StaticTreeBuilder):
    """Template: sk.chain_parents(L); one child per node."""

    def sample(
        self,
        logits: torch.Tensor,
        logp: torch.Tensor | None,
        counts: torch.Tensor,
        k: int,
        greedy: bool,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        tokens, valid = iid_children(logits, logp, k, greedy, generator)
        return tokens, valid, None
