"""RSD-S: draft trees grown by stochastic beam search with truncated Gumbels (docs/methods.md, RRSw and RSD).

Each level keeps the W (parent, token) pairs with the largest truncated scores; the level is regrouped by parent
(stable, so each parent's children stay in descending score = draft order, the sibling order of docs/kernels.md)
and becomes the next beam. Verification is RRSw against each node's *conditional* draft law. Greedy mode runs a
deterministic beam search over summed draft log-probs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

import specdec_kernels as sk

from ...tree import DraftTree
from .base import Children, TreeBuilder, greedy_topk, op_seed

if TYPE_CHECKING:
    from ..spec import MethodConfig


class BeamTreeBuilder(TreeBuilder):
    draw = "beam"

    def __init__(self, config: MethodConfig) -> None:
        super().__init__(config)
        self.width = int(config.beam_width or 1)

    def reset(self, batch: int, device: torch.device) -> None:
        # Root: Sigma = Gamma = 0 (RSD footnote 1).
        self.sigma = torch.zeros((batch, 1), dtype=torch.float64, device=device)
        self.gamma = torch.zeros((batch, 1), dtype=torch.float64, device=device)

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
        batch, n, vocab = logits.shape
        w_out = min(self.width, n * vocab)
        dev = tree.device

        def empty() -> tuple[torch.Tensor, ...]:  # slot, tokens, sigma, gamma, valid of rows without a beam
            neg = torch.full((batch, w_out), float("-inf"), dtype=torch.float64, device=dev)
            return (
                torch.full((batch, w_out), -1, dtype=torch.long, device=dev),
                torch.zeros((batch, w_out), dtype=torch.long, device=dev),
                neg,
                neg.clone(),
                torch.zeros((batch, w_out), dtype=torch.bool, device=dev),
            )

        if greedy:
            slot, tokens, sigma, gamma, valid = empty()
            phi = self.sigma[..., None] + torch.log_softmax(logits.double(), dim=-1)
            phi = phi.masked_fill(~live[..., None], float("-inf")).reshape(batch, n * vocab)
            idx, valid = greedy_topk(phi, w_out)
            slot = torch.where(valid, idx // vocab, slot)
            tokens = torch.where(valid, idx % vocab, tokens)
            sigma = torch.gather(phi, 1, idx)
            gamma = sigma
        else:
            assert logp is not None
            seed = op_seed(generator)
            row_live = live.any(dim=1)
            if bool(row_live.all()):  # the common case: every row has a live beam, no scatter into padding
                step = sk.sbs_step(logp, self.sigma, self.gamma, live, w_out, seed=seed, validate=False)
                slot, tokens, valid = step.parent_slot, step.tokens.clamp_min(0), step.valid
                sigma, gamma = step.sigma, step.gamma
            else:
                slot, tokens, sigma, gamma, valid = empty()
                rows = row_live.nonzero().squeeze(1)
                sigma_in, gamma_in = self.sigma[rows], self.gamma[rows]
                step = sk.sbs_step(logp[rows], sigma_in, gamma_in, live[rows], w_out, seed=seed, validate=False)
                slot[rows], tokens[rows], valid[rows] = step.parent_slot, step.tokens.clamp_min(0), step.valid
                sigma[rows], gamma[rows] = step.sigma, step.gamma
        # Regroup by parent; invalid entries go last. Stable, so siblings keep descending scores (draft order).
        key = torch.where(valid, slot, torch.full_like(slot, n))
        order = torch.argsort(key, dim=1, stable=True)
        width = int(valid.sum(dim=1).max())
        order = order[:, :width]
        pick = lambda t: torch.gather(t, 1, order)  # noqa: E731
        valid = pick(valid)
        self.sigma, self.gamma = pick(sigma), pick(gamma)
        parent = lo + pick(slot).clamp_min(0)
        return Children(pick(tokens), parent, valid, None, None)
