"""Static draft trees (docs/methods.md): SpecInfer RRS with i.i.d. siblings, RRSw and RSD-C with siblings drawn
without replacement (Gumbel-top-k, whose descending order is the draft order the verifier must consume), and greedy
draft sampling (the most likely tokens, then one draw from the rest)."""

from __future__ import annotations

import torch

import specdec_kernels as sk

from .base import StaticTreeBuilder, greedy_topk, iid_children, op_seed


class IIDTreeBuilder(StaticTreeBuilder):
    """rrs: every node's children are i.i.d. draws; duplicates stay separate nodes with their own subtrees (the
    verifier applies one residual update per copy)."""

    draw = "iid"

    def sample(
        self,
        logits: torch.Tensor,
        logp: torch.Tensor | None,
        counts: torch.Tensor,
        k: int,
        greedy: bool,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        tokens, valid = iid_children(logits, logp, k, greedy, generator)
        return tokens, valid, None


class SWORTreeBuilder(StaticTreeBuilder):
    """rrsw / rsd_c: Gumbel-top-k without replacement; a node gets fewer children when the draft law has fewer
    tokens with mass. Greedy: top-k of the raw draft logits."""

    draw = "swor"

    def sample(
        self,
        logits: torch.Tensor,
        logp: torch.Tensor | None,
        counts: torch.Tensor,
        k: int,
        greedy: bool,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if greedy:
            tokens, valid = greedy_topk(logits, k)
            return tokens, valid, None
        assert logp is not None
        pick = sk.gumbel_topk(logp, k, seed=op_seed(generator), validate=False)
        return pick.tokens, pick.valid, None


class GDSTreeBuilder(StaticTreeBuilder):
    """gds: a node's children are its draft law's k - 1 most likely tokens and one draw from the others (the last
    child, which the gds verifier reads as the drawn one); fewer when the law has fewer than k tokens with mass.
    Greedy: top-k of the raw draft logits."""

    draw = "gds"

    def sample(
        self,
        logits: torch.Tensor,
        logp: torch.Tensor | None,
        counts: torch.Tensor,
        k: int,
        greedy: bool,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if greedy:
            tokens, valid = greedy_topk(logits, k)
            return tokens, valid, None
        assert logp is not None
        pick = sk.gds_sample(logp, k, seed=op_seed(generator), validate=False)
        return pick.tokens, pick.valid, None
