"""A neural draft model (an HF causal LM with its own KV cache kept in sync with the committed tokens)."""

from __future__ import annotations

from typing import Any

import torch

from ..models import HFCausalLM, KVState
from ..tree import DraftTree
from .base import Drafter, DraftLogits


class ModelDrafter(Drafter):
    """A neural draft model (HF causal LM, same vocabulary as the target) with a KV cache kept in sync with the
    committed tokens: after each round only the accepted nodes that the draft processed are kept."""

    def __init__(self, model: Any, *, name: str = "draft", fast_path: str | bool = "auto") -> None:
        # fast_path: the adapter's switch (HFCausalLM); an adapter passed in keeps its own
        self.lm = model if isinstance(model, HFCausalLM) else HFCausalLM(model, name=name, fast_path=fast_path)
        self.name = name
        self.num_parameters = self.lm.num_parameters
        self.vocab_size = self.lm.vocab_size
        # a reduced-vocabulary head: propose logits over its support only (DraftLogits.support)
        self.support = self.lm.support
        self.state: KVState | None = None
        self.calls = 0
        self._round = False
        self._target_vocab: int | None = None  # fit_vocab
        self._last_id: int | None = None  # fit_vocab: committed ids above it are read as it

    def fit_vocab(self, vocab: int) -> None:
        """Draft for a target whose output layer has ``vocab`` rows where this draft's has another number (one
        tokenizer, output layers padded to different sizes, e.g. the small and large models of one family): the
        draft proposes over the ids both have (its logits cut to the first ``vocab`` ids, or as a support of its own
        ids when it has fewer), and a committed id past its own rows is read as its last id. The draft law stays a
        function of the prefix, so every verifier stays exact; only acceptance can change."""
        if self.lm.support is not None:
            raise ValueError(f"{self.name}: a reduced output head cannot be fitted to another vocabulary size")
        own = self.lm.vocab_size
        self._target_vocab = vocab
        self._last_id = own - 1 if vocab > own else None
        self.vocab_size = vocab
        # fewer rows: a support of its ids; more: its logits cut to the target's ids (dense again)
        self.support = torch.arange(own, device=self.lm.device) if own < vocab else None

    @property
    def _reduced(self) -> bool:
        """Whether the forwards score the head's support only (a fitted draft's support is its own ids: dense)."""
        return self.support is not None and self._target_vocab is None

    def _cut(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits over the ids the target has (fit_vocab)."""
        return logits if self._target_vocab is None else logits[..., : self._target_vocab]

    def _inputs(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids as the draft's embedding takes them (ids past its rows: its last id, see fit_vocab)."""
        return tokens if self._last_id is None else tokens.clamp_max(self._last_id)

    def refresh(self) -> None:
        if self.lm.refresh():
            self.num_parameters = self.lm.num_parameters
            self.vocab_size = self.lm.vocab_size
            self.support = self.lm.support
            if self._target_vocab is not None:
                self.fit_vocab(self._target_vocab)

    def start(self, prompts: list[list[int]]) -> None:
        self.state = self.lm.new_state(len(prompts))
        self._round = False

    def _state(self) -> KVState:
        if self.state is None:
            raise RuntimeError("call start(prompts) before drafting")
        return self.state

    def propose_root(self, committed: list[list[int]]) -> DraftLogits:
        st = self._state()
        start = st.length
        done = st.n_cached.tolist()
        pending = [c[n:] for c, n in zip(committed, done, strict=True)]
        if self._last_id is not None:  # as _inputs does for the tree's tokens
            pending = [[min(t, self._last_id) for t in p] for p in pending]
        lens = torch.tensor([len(p) for p in pending], dtype=torch.long, device=self.lm.device)
        logits = self.lm.forward_chain(st, pending, last_logits=True, reduced=self._reduced)
        assert logits is not None
        logits = self._cut(logits)
        self.calls += 1
        # The chain (ending with the root) sits in slots start .. start + lens - 1; tree node n >= 1 will live in
        # slot base + n - 1.
        self._chain = (torch.full_like(lens, start), lens)
        self._base = st.length
        self._next = 1  # first tree node id not yet in the cache
        self._round = True
        ok = torch.ones((st.batch, 1), dtype=torch.bool, device=logits.device)
        return DraftLogits(logits[:, None], ok, self.support)

    def propose_level(self, tree: DraftTree, lo: int, hi: int) -> DraftLogits:
        st = self._state()
        tokens = self._inputs(tree.tokens)
        logits = self.lm.forward_level(
            st, tokens, tree.parent, tree.valid, tree.depth, lo, hi, self._base, reduced=self._reduced
        )
        logits = self._cut(logits)
        self.calls += 1
        self._next = hi
        return DraftLogits(logits, tree.valid[:, lo:hi].clone(), self.support)

    def accept(self, tree: DraftTree, accepted_nodes: torch.Tensor, n_accepted: torch.Tensor) -> None:
        if not self._round:
            return  # the decoder did not draft this round; the committed tokens are caught up next time
        self._round = False
        st = self._state()
        cols = torch.arange(accepted_nodes.shape[1], device=accepted_nodes.device)[None, :]
        used = cols < n_accepted[:, None]
        # Only nodes that went through the draft have KV; on a path they are a prefix (shallower levels first).
        cached = used & (accepted_nodes < self._next) & (accepted_nodes >= 1)
        st.keep(*self._chain, self._base + accepted_nodes - 1, cached.sum(dim=1))

    def select_rows(self, rows: torch.Tensor) -> None:
        self._state().select_rows(rows)


class HiddenStateDrafter(ModelDrafter):
    """A :class:`ModelDrafter` that exposes the final hidden state (after the final norm) of its latest forward,
    ``last_hidden`` [B, n, H], for acceptance heads (SpecDec++; adaptive tree depth)."""

    @property
    def last_hidden(self) -> torch.Tensor | None:
        return self.lm.last_hidden
