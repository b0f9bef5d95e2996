"""The drafter interface: what proposes draft tokens, behind one interface that the decoders drive level by level.

A drafter returns raw logits for the next token after each requested node; the decoder turns them into the draft
law with the shared processing function (``SamplingConfig.process``) and samples the children itself. A
deterministic drafter returns one-hot logits (0 at its proposal, -inf elsewhere), whose law is the point mass on
the proposal; verification against it is exact (docs/methods.md, Drafts).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from ..models import HFCausalLM
from ..tree import DraftTree


class DraftLogits(NamedTuple):
    """Shape: logits [B, n, V] (any float; rows where ``ok`` is false are ignored), ok [B, n] bool = the drafter
    has a proposal after that node (a node without one gets no children).

    ``support`` (optional, int64 [S], strictly increasing token ids): ``logits`` are then [B, n, S], the scores
    of these tokens only, and the draft law is zero outside them (a reduced-vocabulary head). The decoder
    processes and samples the S columns and maps the drawn columns back to token ids.
    """

    logits: torch.Tensor
    ok: torch.Tensor
    support: torch.Tensor | None = None

    def dense(self, vocab: int) -> torch.Tensor:
        """Full-vocabulary logits [B, n, V] (-inf outside ``support``), e.g. to inspect a reduced proposal."""
        if self.support is None:
            return self.logits
        out = self.logits.new_full((*self.logits.shape[:-1], vocab), float("-inf"))
        return out.index_copy_(-1, self.support, self.logits)


class Drafter(ABC):
    """Interface of a drafter. One round: ``propose_root`` once, ``propose_level`` for deeper levels, then
    ``accept`` with the verdict; ``select_rows`` drops finished rows between rounds.

    Required (abstract): :meth:`start`, :meth:`propose_root`, :meth:`propose_level`, :meth:`accept`,
    :meth:`select_rows`, and the attribute ``vocab_size``. Optional (no-op defaults): :meth:`refresh`,
    :meth:`set_tree_depth`, :meth:`after_target` / :meth:`observe_target` (drafters that read the target's hidden
    states), and the class attributes ``reads_target_features``, ``feature_layers``, ``track_levels``.

    ``num_parameters`` feeds the MBSU metric (r = draft params / target params); statistical drafters have 0.
    ``calls`` counts drafting calls (model forwards for a neural drafter) for the statistics.
    """

    name: str = "drafter"
    num_parameters: int = 0
    calls: int = 0
    vocab_size: int

    @abstractmethod
    def start(self, prompts: list[list[int]]) -> None:
        """Reset for a new batch of prompts (lists of token ids)."""

    @abstractmethod
    def propose_root(self, committed: list[list[int]]) -> DraftLogits:
        """Next-token logits after each row's last committed token (the root). Shape: -> [B, 1, V]."""

    @abstractmethod
    def propose_level(self, tree: DraftTree, lo: int, hi: int) -> DraftLogits:
        """Next-token logits after tree nodes ``lo..hi-1`` (one level). Shape: -> [B, hi - lo, V]."""

    @abstractmethod
    def accept(self, tree: DraftTree, accepted_nodes: torch.Tensor, n_accepted: torch.Tensor) -> None:
        """The round's verdict: row b kept nodes ``accepted_nodes[b, :n_accepted[b]]`` (by depth)."""

    @abstractmethod
    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (int64 [B']) of the batch."""

    #: True for drafters that read the target's hidden states (EAGLE-style): they take them in ``after_target``.
    reads_target_features: bool = False
    #: target layers whose inputs such a drafter reads besides the final hidden state; the decoder asks the target
    #: to keep them (``HFCausalLM.feature_layers``) for the run
    feature_layers: tuple[int, ...] = ()

    #: levels a drafter can add below a tree's own depth along one deterministic track (:class:`HybridDrafter`);
    #: auto trees hang a chain of that many nodes under their first-child path
    track_levels: int = 0

    def refresh(self) -> None:  # noqa: B027 (optional hook)
        """Before a generate call: re-read the model(s) this drafter runs if they changed since it was built
        (:meth:`specdec.models.HFCausalLM.refresh`); nothing for a drafter without a model."""

    def set_tree_depth(self, depth: int | None) -> None:  # noqa: B027 (optional hook)
        """The depth of this round's tree proper (None: no limit); levels below it are the track's alone. Called
        by a tree builder before drafting a round whose template holds a track chain."""

    def after_target(self, target: HFCausalLM, positions: torch.Tensor | None, count: torch.Tensor) -> None:
        """Called by the decoder after every target forward whose positions become committed tokens: row b
        committed the positions ``positions[b, :count[b]]`` of that forward (None: its first ``count[b]``), in
        order, every committed token but each row's newest. A drafter that reads the target's hidden states takes
        them from ``target.last_features`` (:meth:`observe_target`); the others need nothing.

        Shape: positions [B, m] int64 or None, count [B] int64."""
        if self.reads_target_features:
            hidden = target.last_features
            assert hidden is not None
            if positions is not None:
                hidden = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
            self.observe_target(hidden, count)

    def observe_target(self, hidden: torch.Tensor, count: torch.Tensor) -> None:  # noqa: B027 (optional hook)
        """The target's hidden states of newly committed positions, in order: row b's are ``hidden[b, :count[b]]``.

        Shape: hidden [B, m, E], count [B] int64."""
