"""Drafters: what proposes draft tokens. A neural drafter (an HF model with its own KV cache) and the Max-Gram
prompt-lookup drafter (docs/methods.md, Drafts), behind one interface that the decoders drive level by level.

A drafter returns raw logits for the next token after each requested node; the decoder turns them into the draft
law with the shared processing function (config.SamplingConfig.process) and samples the children itself. A
deterministic drafter returns one-hot logits (0 at its proposal, -inf elsewhere), whose law is the point mass on
the proposal; verification against it is exact (docs/methods.md, Drafts).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from .models import HFCausalLM, KVState
from .tree import DraftTree


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


class ModelDrafter(Drafter):
    """A neural draft model (HF causal LM, same vocabulary as the target) with a KV cache kept in sync with the
    committed tokens: after each round only the accepted nodes that the draft processed are kept."""

    def __init__(self, model: Any, *, name: str = "draft") -> None:
        self.lm = model if isinstance(model, HFCausalLM) else HFCausalLM(model, name=name)
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


def max_gram_proposal(seq: list[int] | np.ndarray, n: int, bigram: np.ndarray | None = None) -> list[int]:
    """Max-Gram proposal of up to ``n`` tokens after ``seq`` (decoder-only form).

    The search text is ``seq`` without its last token (the prompt is part of ``seq``): find the longest suffix of
    ``seq`` that occurs in it, take its earliest occurrence and propose the tokens that follow; if fewer than ``n``
    came out, search once more from the extended sequence; then fill with the greedy ``bigram`` table, if any.
    """
    out = longest_match(seq, n)[1]
    if 0 < len(out) < n:
        ext = np.concatenate([np.asarray(seq, dtype=np.int64), np.asarray(out, dtype=np.int64)])
        out += longest_match(ext, n - len(out))[1]
    if bigram is not None and len(seq) and len(out) < n:
        last = out[-1] if out else int(seq[-1])
        while len(out) < n:
            last = int(bigram[last])
            out.append(last)
    return out


def bigram_array(bigram: Any) -> np.ndarray:
    """A bigram table as given (array, list, tensor) as int64, refusing anything but integer token ids (a float
    table would be truncated silently). Shape: -> [V]; the caller checks V and the id range."""
    table = bigram.detach().cpu().numpy() if isinstance(bigram, torch.Tensor) else np.asarray(bigram)
    if table.ndim != 1 or not (np.issubdtype(table.dtype, np.integer) and table.dtype != np.bool_):
        raise ValueError(f"bigram must be a 1-D table of integer token ids, got {table.dtype} of shape {table.shape}")
    return table.astype(np.int64)


def bigram_table(corpus: Iterable[Sequence[int]], vocab_size: int, default: int | None = None) -> np.ndarray:
    """Max-Gram's greedy bigram table from token sequences: ``table[a] = argmax_b count(a, b)``, ties to the lowest
    id; a token never followed by another maps to ``default`` (None: the corpus's most frequent token, lowest id on
    ties; 0 for an empty corpus). Shape: -> [vocab_size] int64. Raises ValueError for ids outside [0, vocab_size)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be an int >= 1, got {vocab_size!r}")
    if default is not None and (
        isinstance(default, bool) or not isinstance(default, int) or not 0 <= default < vocab_size
    ):
        raise ValueError(f"default must be a token id in [0, {vocab_size}) or None, got {default!r}")
    keys, freq = [], np.zeros(vocab_size, dtype=np.int64)
    for i, seq in enumerate(corpus):
        arr = np.asarray(seq, dtype=np.int64).reshape(-1)
        if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
            raise ValueError(f"corpus sequence {i} holds token ids outside [0, {vocab_size})")
        keys.append(arr[:-1] * vocab_size + arr[1:])
        freq += np.bincount(arr, minlength=vocab_size)
    fill = (int(np.argmax(freq)) if freq.any() else 0) if default is None else default
    table = np.full(vocab_size, fill, dtype=np.int64)
    pairs, counts = np.unique(np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64), return_counts=True)
    first, second = pairs // vocab_size, pairs % vocab_size
    order = np.lexsort((second, -counts, first))  # per first token: the largest count, then the lowest id
    head = np.ones(order.size, dtype=bool)
    head[1:] = first[order][1:] != first[order][:-1]
    table[first[order][head]] = second[order][head]
    return table


def longest_match(seq: list[int] | np.ndarray, n: int) -> tuple[int, list[int]]:
    """Max-Gram's search, once: (m, up to ``n`` tokens) where m is the length of the longest suffix of ``seq`` that
    occurs earlier in ``seq`` (0: none) and the tokens follow its earliest occurrence."""
    arr = np.asarray(seq, dtype=np.int64)
    t = len(arr)
    if t < 2 or n < 1:
        return 0, []
    text = arr[:-1]
    ends = np.nonzero(text == arr[-1])[0] + 1  # end (exclusive) of every occurrence of the 1-token suffix
    if ends.size == 0:
        return 0, []
    m = 1
    while m < t - 1:
        start = ends - (m + 1)
        ok = start >= 0
        nxt = ends[ok][text[start[ok]] == arr[t - 1 - m]]
        if nxt.size == 0:
            break
        ends = nxt
        m += 1
    end = int(ends.min())  # earliest occurrence of the longest suffix
    return m, [int(x) for x in text[end : end + n]]


class HiddenStateDrafter(ModelDrafter):
    """A :class:`ModelDrafter` that exposes the final hidden state (after the final norm) of its latest forward,
    ``last_hidden`` [B, n, H], for acceptance heads (SpecDec++; adaptive tree depth)."""

    @property
    def last_hidden(self) -> torch.Tensor | None:
        return self.lm.last_hidden


class FeatureDrafter(HiddenStateDrafter):
    """EAGLE-style drafter (``specdec.train.FeatureDraft``): draft position i reads the pair (target hidden state
    after token i, token i + 1), so the first draft level sees the target's own features of the whole committed
    prefix; deeper levels feed the draft's output for the parent node in place of the feature the target has not
    computed yet. ``last_hidden`` of a level is that output, which an acceptance head reads.

    Each round the draft appends the pairs of the newly committed tokens (true target features, from
    ``observe_target``) and drafts the tree in slots after them; ``accept`` drops every tree slot, because the
    accepted nodes are re-read next round with the target's features instead of the draft's own.
    Exactness is unaffected: the draft law is a deterministic function of the committed prefix.
    """

    reads_target_features = True

    def __init__(self, model: Any, *, name: str = "draft") -> None:
        super().__init__(model, name=name)
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


class NGramDrafter(Drafter):
    """Max-Gram prompt-lookup drafter (Chen et al. 2024, docs/methods.md [8]): proposes the continuation of the
    longest earlier match of the sequence's suffix. Deterministic, so its proposal law is one-hot and verification
    stays exact; costs no model forward (MBSU r = 0).

    ``max_tokens``: proposal length per round (the tree depth also caps it); ``bigram``: optional length-V greedy
    bigram table used to fill short proposals.
    """

    def __init__(self, vocab_size: int, *, max_tokens: int = 10, bigram: np.ndarray | None = None) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an int >= 1, got {vocab_size!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        if bigram is not None:
            bigram = bigram_array(bigram)
            if bigram.shape != (vocab_size,) or bigram.min() < 0 or bigram.max() >= vocab_size:
                raise ValueError(f"bigram must be a length-{vocab_size} table of token ids in [0, {vocab_size})")
        self.name = "ngram"
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens
        self.bigram = bigram
        self.num_parameters = 0
        self.calls = 0
        self._proposals: list[list[int]] = []

    @staticmethod
    def bigram_table(corpus: list[list[int]], vocab_size: int, default: int | None = None) -> np.ndarray:
        """Greedy bigram table from token sequences (:func:`bigram_table`)."""
        return bigram_table(corpus, vocab_size, default)

    def start(self, prompts: list[list[int]]) -> None:
        self._proposals = [[] for _ in prompts]

    def _one_hot(self, tokens: list[list[int | None]]) -> DraftLogits:
        batch, width = len(tokens), max((len(r) for r in tokens), default=0)
        logits = torch.full((batch, width, self.vocab_size), float("-inf"))
        ok = torch.zeros((batch, width), dtype=torch.bool)
        for b, row in enumerate(tokens):
            for j, tok in enumerate(row):
                if tok is not None:
                    logits[b, j, tok] = 0.0
                    ok[b, j] = True
        return DraftLogits(logits, ok)

    def propose_root(self, committed: list[list[int]]) -> DraftLogits:
        self.calls += 1
        self._proposals = [max_gram_proposal(c, self.max_tokens, self.bigram) for c in committed]
        return self._one_hot([[p[0] if p else None] for p in self._proposals])

    def propose_level(self, tree: DraftTree, lo: int, hi: int) -> DraftLogits:
        self.calls += 1
        rows: list[list[int | None]] = []
        for b, prop in enumerate(self._proposals):
            row: list[int | None] = []
            for node in range(lo, hi):
                path = tree.path_tokens(b, node) if bool(tree.valid[b, node]) else None
                # The point mass is a function of the path: the proposal continues only along its own prefix.
                on_track = path is not None and len(path) < len(prop) and path == prop[: len(path)]
                row.append(prop[len(path)] if on_track and path is not None else None)
            rows.append(row)
        return self._one_hot(rows)

    def accept(self, tree: DraftTree, accepted_nodes: torch.Tensor, n_accepted: torch.Tensor) -> None:
        return None

    def select_rows(self, rows: torch.Tensor) -> None:
        self._proposals = [self._proposals[int(r)] for r in rows.tolist()] if self._proposals else []


def _insert_columns(
    logits: torch.Tensor, support: torch.Tensor, new: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduced logits over the sorted union of ``support`` [S] and a few ``new`` ids (sorted, distinct, none in
    ``support``), the new columns at -inf. Placed by position arithmetic: re-sorting the S ids (torch.unique) or
    looking each of them up again (searchsorted) costs hundreds of microseconds at S = 6144.
    Shape: logits [..., S] -> [..., S + k], support -> [S + k]."""
    width, k = support.numel(), new.numel()
    at = torch.searchsorted(support, new)  # new id j goes before old column at[j]
    # old column i moves right by the number of new ids placed before it
    shift = torch.zeros(width + 1, dtype=torch.long, device=support.device).index_add_(0, at, torch.ones_like(at))
    old_to_new = torch.arange(width, device=support.device) + shift.cumsum(0)[:width]
    wider = support.new_empty(width + k)
    wider[old_to_new] = support
    wider[at + torch.arange(k, device=support.device)] = new
    grown = logits.new_full((*logits.shape[:-1], width + k), float("-inf"))
    return grown.index_copy_(-1, old_to_new, logits), wider


class HybridDrafter(Drafter):
    """A neural drafter whose law at every node on the Max-Gram track puts mass ``weight`` on Max-Gram's proposal.

    The track is every path of the tree that spells Max-Gram's proposal after the committed sequence (more than one
    where i.i.d. draws repeat a token, as SpecTr's chains and SpecInfer's siblings do): up to ``max_tokens`` tokens
    after the earliest occurrence of the longest suffix that occurred before (:func:`longest_match`), when that suffix
    is at least ``min_match`` tokens long. At a node on the track the draft law is the mixture ``weight * point mass on
    the proposal's next token + (1 - weight) * the neural law without that token`` (on raw logits, before temperature
    and truncation; ``weight >= 0.5`` makes the token the top-1 as well, so greedy trees take it as the first child).
    Off the track the law is the neural draft's. Below the tree's own depth (:meth:`set_tree_depth`; auto trees add
    ``track_levels`` such levels) only the track continues, as a point mass, without running the neural draft: code and
    other text that repeats itself get long drafts at no draft cost.

    The law at each node is a deterministic function of the committed tokens and the path to it, so every
    verifier stays exact with it (docs/methods.md, Drafts).
    """

    def __init__(
        self, neural: Drafter, *, weight: float = 0.9, min_match: int = 1, track_levels: int = 4, max_tokens: int = 16
    ) -> None:
        if isinstance(neural, (NGramDrafter, HybridDrafter)):
            raise ValueError(f"neural must be a neural drafter, got {type(neural).__name__}")
        if not isinstance(neural, Drafter):
            raise TypeError(
                "neural must be a Drafter: wrap a draft model as specdec.FeatureDrafter(model) (a feature draft) or "
                f"specdec.ModelDrafter(model), got {type(neural).__name__}"
            )
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.5 <= float(weight) < 1.0:
            raise ValueError(f"weight must be a float in [0.5, 1), got {weight!r}")
        if isinstance(min_match, bool) or not isinstance(min_match, int) or min_match < 1:
            raise ValueError(f"min_match must be an int >= 1, got {min_match!r}")
        if isinstance(track_levels, bool) or not isinstance(track_levels, int) or track_levels < 0:
            raise ValueError(f"track_levels must be an int >= 0, got {track_levels!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        self.neural = neural
        self.name = f"{neural.name}+ngram"
        self.vocab_size = neural.vocab_size
        self.num_parameters = neural.num_parameters
        self.reads_target_features = neural.reads_target_features
        self.feature_layers = neural.feature_layers
        self.weight = float(weight)
        self.min_match = min_match
        self.track_levels = track_levels
        self.max_tokens = max_tokens
        self._log_odds = math.log(self.weight / (1.0 - self.weight))
        self._tree_depth: int | None = None
        self._proposals: list[list[int]] = []
        # per row: the nodes of the newest level whose path spells the proposal so far (several where i.i.d. draws
        # repeat a token: each of them gets the mixture law, so that a node's law is a function of its path)
        self._track: list[list[int]] = []

    @property
    def calls(self) -> int:  # type: ignore[override]  # the neural forwards; track-only levels cost no forward
        return self.neural.calls

    def set_tree_depth(self, depth: int | None) -> None:
        self._tree_depth = depth

    def refresh(self) -> None:
        self.neural.refresh()
        self.num_parameters = self.neural.num_parameters

    def start(self, prompts: list[list[int]]) -> None:
        self.neural.start(prompts)
        self._tree_depth = None
        self._proposals = [[] for _ in prompts]
        self._track = [[] for _ in prompts]

    def after_target(self, target: HFCausalLM, positions: torch.Tensor | None, count: torch.Tensor) -> None:
        self.neural.after_target(target, positions, count)

    def propose_root(self, committed: list[list[int]]) -> DraftLogits:
        found = [longest_match(c, self.max_tokens) for c in committed]
        self._proposals = [prop if m >= self.min_match else [] for m, prop in found]
        self._track = [[0] if p else [] for p in self._proposals]
        out = self.neural.propose_root(committed)
        return self._mix(out, [[(0, p[0])] if p else [] for p in self._proposals])

    def propose_level(self, tree: DraftTree, lo: int, hi: int) -> DraftLogits:
        depth = len(tree.levels) - 1  # of nodes lo..hi-1
        parents, tokens, valid = (
            tree.parent[:, lo:hi].tolist(),
            tree.tokens[:, lo:hi].tolist(),
            tree.valid[:, lo:hi].tolist(),
        )
        picks: list[list[tuple[int, int]]] = []
        for b, prop in enumerate(self._proposals):
            at, track = self._track[b], []
            row: list[tuple[int, int]] = []
            if at and depth <= len(prop):
                for j in range(hi - lo):
                    if valid[b][j] and parents[b][j] in at and tokens[b][j] == prop[depth - 1]:
                        track.append(lo + j)
                        if depth < len(prop):
                            row.append((j, prop[depth]))
            self._track[b] = track
            picks.append(row)
        if self._tree_depth is None or depth < self._tree_depth:
            return self._mix(self.neural.propose_level(tree, lo, hi), picks)
        # below the tree proper: the track alone, a point mass over the few proposed tokens
        dev = tree.device
        width = hi - lo
        support = sorted({t for row in picks for _, t in row}) or [0]
        col = {t: i for i, t in enumerate(support)}
        logits = torch.full((tree.batch, width, len(support)), float("-inf"))
        ok = torch.zeros((tree.batch, width), dtype=torch.bool)
        for b, row in enumerate(picks):
            for j, t in row:
                logits[b, j, col[t]] = 0.0
                ok[b, j] = True
        return DraftLogits(logits.to(dev), ok.to(dev), torch.tensor(support, dtype=torch.long, device=dev))

    def _mix(self, out: DraftLogits, picks: list[list[tuple[int, int]]]) -> DraftLogits:
        """``out`` with the mixture law at the listed (node column, proposed token) of each row."""
        flat = [(b, j, t) for b, row in enumerate(picks) for j, t in row]
        if not flat:
            return out
        logits, ok, support = out.logits.to(torch.float32, copy=True), out.ok.clone(), out.support
        if support is not None:  # a reduced head: the proposed token may lie outside its columns
            toks = torch.tensor([t for _, _, t in flat], dtype=torch.long, device=logits.device)
            col = torch.searchsorted(support, toks).clamp_max(support.numel() - 1)
            missing = support[col] != toks
            if bool(missing.any()):
                logits, support = _insert_columns(logits, support, torch.unique(toks[missing]))
                col = torch.searchsorted(support, toks)
            cols = col.tolist()
        else:
            cols = [t for _, _, t in flat]
        dev = logits.device
        bi = torch.tensor([b for b, _, _ in flat], dtype=torch.long, device=dev)
        ji = torch.tensor([j for _, j, _ in flat], dtype=torch.long, device=dev)
        ci = torch.tensor(cols, dtype=torch.long, device=dev)
        pick = torch.arange(len(flat), device=dev)
        # a node without a neural proposal (nothing to pair yet) gets the track's point mass
        rows = torch.where(ok[bi, ji, None], logits[bi, ji], float("-inf"))
        rows[pick, ci] = float("-inf")
        rest = torch.logsumexp(rows, -1)
        rows[pick, ci] = torch.where(torch.isfinite(rest), rest + self._log_odds, torch.zeros_like(rest))
        logits[bi, ji] = rows
        ok[bi, ji] = True
        return DraftLogits(logits, ok, support)

    def accept(self, tree: DraftTree, accepted_nodes: torch.Tensor, n_accepted: torch.Tensor) -> None:
        self.neural.accept(tree, accepted_nodes, n_accepted)  # it keeps only the nodes it processed

    def select_rows(self, rows: torch.Tensor) -> None:
        self.neural.select_rows(rows)
        keep = rows.tolist()
        self._proposals = [self._proposals[i] for i in keep] if self._proposals else []
        self._track = [self._track[i] for i in keep] if self._track else []


def neural_drafter(model: Any, name: str = "draft") -> ModelDrafter:
    """A neural draft model as its drafter: a feature draft (``reads_target_features``) as a
    :class:`FeatureDrafter`, any other model as a :class:`ModelDrafter`."""
    if getattr(model, "reads_target_features", False):
        return FeatureDrafter(model, name=name)
    return ModelDrafter(model, name=name)


def as_drafter(draft: Any, target: HFCausalLM, *, hidden: bool = False) -> Drafter:
    """The drafter for ``draft`` as ``generate`` takes it: a :class:`Drafter` as is, a feature draft (a model with
    ``reads_target_features``) as a :class:`FeatureDrafter`, ``"ngram"`` as an :class:`NGramDrafter`, any other
    model as a :class:`ModelDrafter`; ``hidden``: an acceptance head reads the draft's hidden states, so only a
    neural draft goes (a plain one as a :class:`HiddenStateDrafter`). Raises ValueError when draft and ``target`` do not
    fit together (vocabulary size; a feature draft's width)."""
    if hidden:  # an acceptance head reads the draft's hidden states: only a neural draft has them
        if isinstance(draft, HiddenStateDrafter):
            drafter: Drafter = draft
        elif isinstance(draft, (Drafter, str)):
            raise ValueError(
                f"head= needs a neural draft model (its hidden states feed the head), got {draft!r}; pass the HF "
                "draft model itself"
            )
        elif getattr(draft, "reads_target_features", False):
            drafter = FeatureDrafter(draft, name="draft")
        else:
            drafter = HiddenStateDrafter(draft, name="draft")
    elif isinstance(draft, Drafter):
        drafter = draft
    elif isinstance(draft, str):
        if draft != "ngram":
            raise ValueError(f"draft must be a model, a Drafter or the string 'ngram', got {draft!r}")
        drafter = NGramDrafter(target.vocab_size)
    else:
        drafter = neural_drafter(draft)
    inner = drafter.neural if isinstance(drafter, HybridDrafter) else drafter
    if isinstance(inner, FeatureDrafter):
        width = int(getattr(target.model.config, "hidden_size", -1))
        want = int(getattr(inner.lm.model.config, "hidden_size", -1))
        if want != width:
            raise ValueError(
                f"the feature draft reads hidden states of width {want}, but the target's hidden size is {width}; "
                "a feature draft only works with the target it was trained on"
            )
    if (
        drafter.vocab_size != target.vocab_size
        and type(inner) in (ModelDrafter, HiddenStateDrafter)
        and inner.lm.support is None
        and inner._target_vocab is None
    ):
        # one tokenizer, output layers of different sizes: draft over the ids both have
        inner.fit_vocab(target.vocab_size)
        drafter.vocab_size = target.vocab_size
    if drafter.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft vocabulary size {drafter.vocab_size} differs from the target's {target.vocab_size}; draft and "
            "target must share one tokenizer and output layer size"
        )
    return drafter
