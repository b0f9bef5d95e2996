"""SpecTr: K independent draft chains of length L verified with K-SEQ depth by depth (spec §4.4, §5.3).

The template is sk.kseq_chain_parents(K, L): the root has K i.i.d. children, every other node one child. The
verifier (verify_tree method "kseq") keeps the chains that agree with the accepted prefix alive. In greedy mode
all chains would be identical, so only the first is drafted.
"""

from __future__ import annotations

import torch

from .base import StaticTreeBuilder, iid_children


class SpecTrBuilder(StaticTreeBuilder):
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
