"""Adaptive draft depth from an acceptance head: SpecDec++ (docs/methods.md) and its extension to draft trees.

The head maps the draft's final hidden state of a drafted node to Phat = the predicted probability that the node
is accepted given that its parent was. Each node carries the predicted probability that its whole path is accepted
(the product of Phat along the path). After a row draws a new level, it stops drafting once the predicted
probability that even the best path of the previous level holds a rejection, ``1 - max cum``, exceeds the
threshold ``h``; the hard cap is the method's depth. For a chain this is exactly SpecDec++'s rule: after drawing
Y_k, stop once 1 - prod_{i<k} Phat_i > h (the candidate just drawn is never predicted). The rule reads draft-side
information only, so verification and the output law are unchanged (exactness is kept by construction and tested).
"""

from __future__ import annotations

from typing import Any

import torch

from ...drafters import Drafter, HiddenStateDrafter
from ...tree import DraftTree

DEFAULT_THRESHOLD = 0.7  # SpecDec++ stopping threshold h when head= is given without threshold=


class AdaptiveStop:
    """Per-row stopping rule for :meth:`TreeBuilder.build`. ``head``: module/callable hidden [..., H] -> Phat
    [...] (or logits [..., 2]), e.g. :func:`specdec.train.load_head`; ``threshold``: h in [0, 1]."""

    def __init__(self, head: Any, threshold: float) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must lie in [0, 1], got {threshold!r}")
        if not callable(head):
            raise TypeError(f"head must be callable (hidden [..., H] -> Phat), got {type(head).__name__}")
        self.head = head
        self.threshold = float(threshold)
        self.round_lengths: list[list[int]] = []  # levels drafted per row, every round of the latest call
        self._cum = torch.ones(0, 0)
        self._best = torch.ones(0)
        self._stopped = torch.zeros(0, dtype=torch.bool)
        self._levels = torch.zeros(0, dtype=torch.long)

    def _phat(self, hidden: torch.Tensor) -> torch.Tensor:
        prob = getattr(self.head, "prob", None)
        out = prob(hidden.float()) if prob is not None else self.head(hidden.float())
        if out.dim() == hidden.dim():  # logits [..., 2] from a plain callable
            out = torch.softmax(out.float(), dim=-1)[..., 1]
        return out.float()

    def start(self, tree: DraftTree, drafter: Drafter) -> None:
        if not isinstance(drafter, HiddenStateDrafter):
            raise TypeError("an acceptance head needs a HiddenStateDrafter (a neural draft with visible hidden states)")
        batch = tree.batch
        self._cum = torch.ones((batch, 1), device=tree.device)  # root: accepted by definition
        self._best = torch.ones(batch, device=tree.device)
        self._stopped = torch.zeros(batch, dtype=torch.bool, device=tree.device)
        self._levels = torch.zeros(batch, dtype=torch.long)

    @torch.no_grad()
    def live(self, level: int, tree: DraftTree, lo: int, hi: int, live: torch.Tensor, drafter: Drafter) -> torch.Tensor:
        """Before drawing children of nodes lo..hi-1: score those nodes (their forward just ran) and mask stopped
        rows. Shape: live [B, hi - lo]."""
        if level >= 1:  # level 0 holds only the root, which needs no prediction
            hidden = getattr(drafter, "last_hidden", None)
            assert hidden is not None and hidden.shape[1] == hi - lo
            phat = self._phat(hidden.to(tree.device))
            parent = tree.parent[:, lo:hi].clamp_min(0)
            cum = torch.gather(self._cum, 1, parent) * phat
            cum = torch.where(tree.valid[:, lo:hi], cum, torch.zeros((), device=cum.device))
            pad = torch.zeros((tree.batch, lo - self._cum.shape[1]), device=cum.device)
            self._cum = torch.cat([self._cum, pad, cum], dim=1)
            self._best = torch.where(self._stopped, self._best, cum.amax(dim=1))
        return live & ~self._stopped[:, None]

    def keep_drafting(self, valid: torch.Tensor) -> bool:
        """After a level was drawn (valid [B, w] of the new nodes): update the stops; False once every row stopped."""
        drew = valid.any(dim=1)
        self._levels += drew.cpu().long()
        self._stopped |= (drew & (1.0 - self._best > self.threshold)) | ~drew
        return not bool(self._stopped.all())

    def finish(self) -> None:
        self.round_lengths.append(self._levels.tolist())
