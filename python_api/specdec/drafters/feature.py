"""The feature drafter (EAGLE-style): a draft that reads the target's hidden states."""

from __future__ import annotations

from typing import Any

import torch

from ..tree import DraftTree
from .base import DraftLogits
from .model import HiddenStateDrafter


class FeatureDrafter(HiddenStateDrafter):
    """EAGLE-style drafter (:class:`~specdec.drafters.networks.FeatureDraft`): draft position i reads the pair
    (target hidden state after token i, token i + 1), so the first draft level sees the target's own features of
    the whole committed prefix; deeper levels feed the draft's output for the parent node in place of the feature
    the target has not computed yet. ``last_hidden`` of a level is that output, which an acceptance head reads.

    Each round the draft appends the pairs of the newly committed tokens (true target features, from
    ``observe_target``) and drafts the tree in slots after them; ``accept`` drops every tree slot, because the
    accepted nodes are re-read next round with the target's features instead of the draft's own.
    Exactness is unaffected: the draft law is a deterministic function of the committed prefix.
    """

    reads_target_features = True

    def __init__(self, model: Any, *, name: str = "draft", fast_path: str | bool = "auto") -> None:
        super().__init__(model, name=name, fast_path=fast_path)
        if not getattr(self.lm.model, "reads_target_features", False):
            raise TypeError(f"{name} is not a feature draft (no reads_target_features attribute)")
        # target layers read besides the final hidden state (FeatureDraftConfig.extra_layers)
        self.feature_layers: tuple[int, ...] = tuple(getattr(self.lm.model, "feature_layers", ()))
        self.pending: list[torch.Tensor] = []  # per row: target features not yet paired with their next token

    def start(self, prompts: list[list[int]]) -> None:
        super().start(prompts)
        self.pending = [torch.zeros((0, 0)) for _ in prompts]

    def observe_target(self, hidden: torch.Tensor, count: torch.Tensor) -> None:
        for b, n in enumerate(count.tolist()):
            if n:
                new = hidden[b, :n].to(self.lm.dtype)
                self.pending[b] = torch.cat([self.pending[b], new]) if self.pending[b].numel() else new

    def propose_root(self, committed: list[list[int]]) -> DraftLogits:
        st = self._state()
        done = st.n_cached.tolist()
        counts = [int(p.shape[0]) if p.numel() else 0 for p in self.pending]
        chains = []
        for b, (c, n, k) in enumerate(zip(committed, done, counts, strict=True)):
            if n + k != len(c) - 1:
                raise RuntimeError(
                    f"feature drafter row {b}: {n} pairs read + {k} target features pending, but {len(c)} committed "
                    "tokens (the decoder must call observe_target after every target forward)"
                )
            if k == 0 and n > 0:
                raise RuntimeError(f"feature drafter row {b}: no new target feature since the last round")
            chains.append(c[n + 1 : n + 1 + k])  # pair j = (f_j, x_{j+1})
        width = max(counts)
        dev = self.lm.device
        ok = torch.tensor([k > 0 for k in counts], dtype=torch.bool, device=dev)
        start = st.length
        lens = torch.tensor(counts, dtype=torch.long, device=dev)
        if width:
            channels = int(next(p for p in self.pending if p.numel()).shape[-1])
            feats = torch.zeros((st.batch, width, channels), dtype=self.lm.dtype, device=dev)
            for b, k in enumerate(counts):
                if k:
                    feats[b, :k] = self.pending[b]
            self.lm.forward_chain(st, chains, last_logits=False, features=feats)
            hidden = self.lm.last_hidden
            assert hidden is not None
            last = hidden[torch.arange(st.batch, device=dev), (lens - 1).clamp_min(0)]  # E wide: the draft's own
        else:  # one-token prompts in the first round: nothing to pair yet, no proposal
            last = torch.zeros((st.batch, self.lm.head.weight.shape[1]), dtype=self.lm.dtype, device=dev)
        self.pending = [torch.zeros((0, 0)) for _ in counts]
        self.calls += 1
        self._chain = (torch.full_like(lens, start), lens)
        self._base = st.length
        self._node_feat = last[:, None]  # the draft's prediction of each tree node's target feature
        self._round = True
        return DraftLogits(self.lm.project(last, self.support is not None)[:, None], ok[:, None], self.support)

    def propose_level(self, tree: DraftTree, lo: int, hi: int) -> DraftLogits:
        st = self._state()
        parent = tree.parent[:, lo:hi].clamp_min(0)
        feats = self._node_feat.gather(1, parent[..., None].expand(-1, -1, self._node_feat.shape[-1]))
        logits = self.lm.forward_level(
            st,
            tree.tokens,
            tree.parent,
            tree.valid,
            tree.depth,
            lo,
            hi,
            self._base,
            features=feats,
            reduced=self.support is not None,
        )
        hidden = self.lm.last_hidden
        assert hidden is not None
        self._node_feat = torch.cat([self._node_feat, hidden], dim=1)
        self.calls += 1
        return DraftLogits(logits, tree.valid[:, lo:hi].clone(), self.support)

    def accept(self, tree: DraftTree, accepted_nodes: torch.Tensor, n_accepted: torch.Tensor) -> None:
        if not self._round:
            return
        self._round = False
        st = self._state()
        run_start, run_len = self._chain
        no_path = torch.zeros((st.batch, 0), dtype=torch.long, device=self.lm.device)
        st.keep(run_start, run_len, no_path, torch.zeros_like(run_len))  # tree slots: re-read with target features

    def select_rows(self, rows: torch.Tensor) -> None:
        super().select_rows(rows)
        self.pending = [self.pending[i] for i in rows.tolist()]
