"""SpecHub on binary trees (docs/methods.md, SpecHub): a node with two children draws the hub pair through
sk.spechub_sample and stores its hub for the verifier; a node with one child takes slot 0 of the pair, which is a
plain draw from p (SD node). Greedy: the top-2 draft tokens (= RRSw with K = 2)."""

from __future__ import annotations

import torch

import specdec_kernels as sk

from .base import StaticTreeBuilder, greedy_topk, op_seed


class SpecHubBuilder(StaticTreeBuilder):
    draw = "spechub"

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
        pair = sk.spechub_sample(logp, seed=op_seed(generator), validate=False)
        # The hub is stored per node and reused by the verifier, never recomputed.
        return pair.tokens[..., :k], pair.valid[..., :k], pair.hub
