"""SpecDec++: SD chains whose length adapts per row with an acceptance-prediction head (spec §7.3).

While drafting, the draft's final hidden state of each new candidate goes through the head, giving Phat_i = the
predicted probability that candidate i is accepted. After drawing candidate Y_k a row stops drafting once the
predicted risk ``1 - prod_{i<k} Phat_i`` exceeds the threshold ``h`` (Y_k is still verified), or at the hard cap
``max_draft_length``; the first candidate is never predicted. Verification is standard SD, so the output law is
exactly the target's: the stopping rule only uses draft-side information.

Built from the driver's blocks: a :class:`ChainBuilder` whose ``build`` adds the stopping rule, and a
:class:`ModelDrafter` that also exposes the draft's last final-norm output (a forward hook on the HF model's
final norm, i.e. ``hidden_states[-1]``). :class:`SpecDecPPDecoder` wires both into a
:class:`~specdec.decoder.SpeculativeDecoder`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config import SamplingConfig, make_method
from ..decoder import SpeculativeDecoder
from ..drafting import Drafter, ModelDrafter
from ..tree import DraftTree
from .chain import ChainBuilder


class HiddenStateDrafter(ModelDrafter):
    """A :class:`ModelDrafter` that keeps the final-norm output of its latest forward (``last_hidden`` [B, n, H])."""

    def __init__(self, model: Any, *, name: str = "draft") -> None:
        super().__init__(model, name=name)
        hf = self.lm.model if hasattr(self.lm, "model") else model
        norm = _final_norm(hf)
        self.last_hidden: torch.Tensor | None = None
        norm.register_forward_hook(self._keep)

    def _keep(self, module: nn.Module, args: Any, output: torch.Tensor) -> None:
        self.last_hidden = output.detach()


def _final_norm(model: Any) -> nn.Module:
    inner = getattr(model, "model", None)
    norm = getattr(inner, "norm", None)
    if not isinstance(norm, nn.Module):
        raise ValueError(
            "SpecDec++ needs the draft's final hidden state: expected an HF causal LM with model.model.norm "
            f"(Llama/Mistral/Qwen2), got {type(model).__name__}"
        )
    return norm


class SpecDecPPBuilder(ChainBuilder):
    """Chain builder with the SpecDec++ stopping rule. ``head`` maps hidden [B, H] -> Phat [B] (or logits [B, 2])."""

    def __init__(self, config: Any, head: Any, threshold: float) -> None:
        super().__init__(config)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must lie in [0, 1], got {threshold}")
        self.head = head
        self.threshold = float(threshold)
        self.last_lengths: torch.Tensor | None = None  # drafted candidates per row in the latest round
        self.round_lengths: list[list[int]] = []  # the same for every round since construction (diagnostics)

    def _phat(self, hidden: torch.Tensor) -> torch.Tensor:
        prob = getattr(self.head, "prob", None)
        out = prob(hidden.float()) if prob is not None else self.head(hidden.float())
        if out.dim() == hidden.dim():  # logits [.., 2] from a plain callable
            out = torch.softmax(out.float(), dim=-1)[..., 1]
        return out.float()

    @torch.no_grad()
    def build(
        self,
        drafter: Drafter,
        roots: torch.Tensor,
        committed: list[list[int]],
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        max_depth: int,
    ) -> DraftTree:
        tree = DraftTree.from_roots(roots)
        depth = min(max_depth, self.depth)
        batch = tree.batch
        self.last_lengths = torch.zeros(batch, dtype=torch.long)
        if depth < 1:
            return tree
        if not isinstance(drafter, HiddenStateDrafter):
            raise TypeError("SpecDec++ needs a HiddenStateDrafter (a neural draft with visible hidden states)")
        self.reset(batch, tree.device)
        cum = torch.ones(batch, device=tree.device)
        stopped = torch.zeros(batch, dtype=torch.bool, device=tree.device)
        out = drafter.propose_root(committed)
        for level in range(depth):
            lo, hi = tree.levels[-1]
            logits = out.logits.to(tree.device)
            live = tree.valid[:, lo:hi] & out.ok.to(tree.device) & ~stopped[:, None]
            if not bool(live.any()):
                break
            if level >= 1:
                # The forward that produced these logits consumed Y_level: its hidden state predicts Y_level.
                assert drafter.last_hidden is not None
                phat = self._phat(drafter.last_hidden[:, -1].to(tree.device))
                cum = torch.where(live[:, 0], cum * phat, cum)
            if bool(torch.isnan(logits[live]).any()):
                raise ValueError(f"the draft ({drafter.name}) produced NaN logits; NaN logits are rejected")
            logits = torch.where(live[..., None], logits, torch.zeros((), dtype=logits.dtype))
            logp = None if sampling.greedy else sampling.process(logits)
            kids = self.expand(tree, lo, hi, logits, logp, live, sampling.greedy, generator)
            if logp is not None:
                tree.set_level_laws(logp.exp(), kids.hub)
            if kids.tokens.shape[1] == 0 or not bool(kids.valid.any()):
                break
            new_lo, new_hi = tree.append_level(kids.tokens, kids.parent, kids.valid, kids.template)
            drew = kids.valid.any(dim=1)
            self.last_lengths += drew.cpu().long()
            # Stop after drawing Y_k once the predicted risk over Y_1..Y_{k-1} exceeds h (spec §7.3).
            stopped |= drew & (1 - cum > self.threshold)
            stopped |= ~drew
            if level + 1 < depth and not bool(stopped.all()):
                out = drafter.propose_level(tree, new_lo, new_hi)
            else:
                break
        self.round_lengths.append(self.last_lengths.tolist())
        return tree


class SpecDecPPDecoder(SpeculativeDecoder):
    """``method="specdec_pp"``: SD with per-row adaptive draft length (spec §7).

    ``draft``: HF draft model (same vocabulary as the target). ``head``: acceptance head (e.g.
    :func:`specdec.train.load_head`) or any callable hidden [B, H] -> Phat [B]. ``threshold``: h (stop once the
    predicted probability of at least one rejection exceeds h; default 0.7). ``max_draft_length``: hard cap (20).
    """

    def __init__(
        self, target: Any, draft: Any, head: Any, *, threshold: float = 0.7, max_draft_length: int = 20
    ) -> None:
        super().__init__(target, None, method="ar")
        self.config = make_method("sd", draft_length=max_draft_length)
        self.drafter = draft if isinstance(draft, HiddenStateDrafter) else HiddenStateDrafter(draft)
        if self.drafter.vocab_size != self.target.vocab_size:
            raise ValueError(
                f"draft vocab_size={self.drafter.vocab_size} differs from target vocab_size={self.target.vocab_size}"
            )
        self.builder = SpecDecPPBuilder(self.config, head, threshold)
