"""Cascade Speculative Drafting (CS Drafting): the drafter of method ``csd`` (docs/methods.md, CS Drafting).

Models are ordered from the target down: neural drafters, largest first, then the Max-Gram statistical drafter
(MaG, :func:`specdec.drafters.max_gram_proposal` with a greedy bigram table). No drafter generates on its own:

* vertical cascade: a neural drafter *reviews*, in one forward pass, the block proposed by the cascade below it,
  exactly as a target reviews a draft chain, and passes up its accepted prefix plus one token of its own;
* horizontal cascade: the step-limit matrix ``steps`` (K) says how many new tokens of a block each sub-cascade
  fills: in the block reviewed by level r - 1 (the target for r = 0), drafter j >= r keeps adding its sub-cascade's
  output while the block is shorter than ``sum(steps[r][r : j + 1])``; earlier positions come from larger
  sub-cascades, later ones from smaller ones;
* leniency: a neural drafter's reviews accept x iff U p(x) < l q(x) (``specdec_kernels.verify_chain(...,
  leniency=l)``, l >= 1, one value per drafter); the target's review (the decoder's) is always exact.

Exactness (sampling): the target's review is plain speculative sampling of the block, so the output follows the
target's law as long as the law handed up with every drafted position is the law that position's token was really
drawn from. A review with l = 1 emits each token from the reviewer's row q; with l > 1 it emits from
``specdec_kernels.emission_law(p, q, l)`` (the reviewer's row only at the bonus position), and that is what goes
up. Max-Gram is deterministic: its laws are point masses. Greedy mode: reviews compare with the reviewer's argmax;
a lenient one also keeps x when p(x) < l q(x) on the temperature-1 laws (the authors' rule), and passes up the
temperature-1 probability of each token it emits (all the rule reads); a reviewer with a reduced head scores only
its support. The target's greedy review makes the output the target's greedy decoding whatever the cascade
proposes.

KV caches: each neural drafter keeps, per row, only tokens of the current sequence that it processed and that are
still there: before a review its cache is cut back to the longest prefix it shares with the sequence (never past
the token before the block), and after the target's verdict to the accepted prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

import specdec_kernels as sk

from ..models import HFCausalLM, KVState
from ..tree import DraftTree
from .base import Drafter, DraftLogits
from .model import ModelDrafter
from .ngram import bigram_array, max_gram_proposal

#: tokens per Max-Gram proposal (the authors' code uses 10)
MAG_TOKENS = 10


#: uncached tokens before a block that a review processes in the same forward (their logits are computed and
#: dropped); more than this (a prompt) are appended first by a forward without logits
INLINE_CATCH_UP = 8


def default_steps(n_neural: int) -> list[list[int]]:
    """The default step-limit matrix for ``n_neural`` neural drafters (size n_neural + 1, Max-Gram last): the
    target reviews 4 new tokens of the largest sub-cascade, every other neural drafter 2 of the one below it, and
    the smallest neural drafter one Max-Gram proposal; nothing horizontal."""
    size = n_neural + 1
    steps = [[0] * size for _ in range(size)]
    for r in range(size):
        steps[r][r] = 4 if r == 0 else (1 if r == n_neural else 2)
    return steps


def check_steps(steps: Any, size: int) -> list[list[int]]:
    """The step-limit matrix as lists: ``size`` x ``size`` ints >= 0, upper triangular. Raises ValueError naming
    ``steps``."""
    rows = [list(r) for r in steps] if isinstance(steps, (list, tuple, np.ndarray, torch.Tensor)) else None
    if rows is None or len(rows) != size or any(len(r) != size for r in rows):
        raise ValueError(
            f"steps must be a {size} x {size} matrix (one row and column per drafter, Max-Gram last), got {steps!r}"
        )
    out = []
    for i, row in enumerate(rows):
        vals = []
        for j, x in enumerate(row):
            x = x.item() if isinstance(x, (np.generic, torch.Tensor)) else x
            if isinstance(x, bool) or not isinstance(x, int) or x < 0:
                raise ValueError(f"steps must hold ints >= 0, got steps[{i}][{j}] = {x!r}")
            if j < i and x != 0:
                raise ValueError(f"steps must be upper triangular, got steps[{i}][{j}] = {x} below the diagonal")
            vals.append(int(x))
        out.append(vals)
    return out


def _lcp(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])


def _padded(tokens: list[list[int]], width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of tokens as [B, width] int64 (0-padded) and their lengths [B] (0 for rows not in a review)."""
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tokens], dtype=torch.long, device=device)
    return padded, torch.tensor([len(t) for t in tokens], dtype=torch.long, device=device)


def _chunks(block: Block, rows: list[int], width: int) -> Iterator[tuple[int, int, int, torch.Tensor | None]]:
    """(row, first position, positions, chunk) of ``rows``' law chunks, cut at ``width`` positions."""
    assert block.laws is not None
    for b in rows:
        at = 0
        for k, chunk in block.laws[b]:
            n = min(k, width - at)
            if n <= 0:
                break
            yield b, at, n, chunk
            at += k


class _Level:
    """One neural drafter of the cascade: its model, KV cache, leniency and, per row, the tokens its cache holds."""

    def __init__(self, lm: HFCausalLM, leniency: float) -> None:
        self.lm = lm
        self.leniency = leniency
        self.state: KVState | None = None
        self.cached: list[list[int]] = []
        self.forwards = 0
        # greedy reviews score only the head's support (S columns) plus one column that stands for every token off
        # it (probability 0): token id -> column
        self.columns: torch.Tensor | None = None
        if lm.support is not None:
            size = int(lm.support.numel())
            self.columns = torch.full((lm.vocab_size,), size, dtype=torch.long, device=lm.device)
            self.columns[lm.support] = torch.arange(size, device=lm.device)

    def start(self, batch: int) -> None:
        self.state = self.lm.new_state(batch)
        self.cached = [[] for _ in range(batch)]

    def truncate(self, keep: list[int]) -> None:
        """Cut row b's cache back to its first ``keep[b]`` tokens (a prefix of what it holds)."""
        st = self.state
        assert st is not None
        if all(k == len(c) for k, c in zip(keep, self.cached, strict=True)):
            return
        self.cached = [c[:k] for c, k in zip(self.cached, keep, strict=True)]
        n = torch.tensor(keep, dtype=torch.long, device=st.n_cached.device)
        st.n_cached = n
        st.valid = st.valid & (torch.arange(st.length, device=n.device)[None, :] < n[:, None])


class Block(NamedTuple):
    """Proposed tokens per row and, for every proposed position, the law its token was drawn from.

    ``laws[b]``: list of chunks, each a float32 tensor [k, V] (k consecutive positions) or None (k positions of
    Max-Gram: point masses on the tokens); ``laws`` is None when no law is needed. In greedy mode a chunk is the
    float32 tensor [k] of each token's probability under the row it came from (all a lenient review reads).
    """

    tokens: list[list[int]]
    laws: list[list[tuple[int, torch.Tensor | None]]] | None


@dataclass
class _Round:
    """What the cascade needs from the decoder for one round."""

    sampling: Any  # specdec.sampling.SamplingConfig
    seed: Callable[[], int]  # a fresh op seed from the run's generator


def _leniencies(leniency: float | Sequence[float], n: int) -> list[float]:
    """One leniency per neural drafter, each a finite number >= 1."""
    if isinstance(leniency, Sequence) and not isinstance(leniency, (str, bytes)):
        lens = list(leniency)
        if len(lens) != n:
            raise ValueError(f"leniency must hold one value per neural drafter ({n}), got {leniency!r}")
    else:
        lens = [leniency] * n
    for x in lens:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not np.isfinite(x) or x < 1.0:
            raise ValueError(f"leniency must be finite numbers >= 1 (1 = exact review), got {leniency!r}")
    return lens


def _one_vocabulary(lms: list[HFCausalLM], bigram: np.ndarray | None, vocab_size: int | None) -> int:
    """The one vocabulary size of the drafters, the bigram table and ``vocab_size`` (whichever are given)."""
    vocabs = {lm.vocab_size for lm in lms}
    if len(vocabs) > 1:
        raise ValueError(f"the drafters' vocabulary sizes differ ({sorted(vocabs)}); they must share the target's")
    if bigram is not None:
        vocabs.add(len(bigram))
    if vocab_size is not None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an int >= 1, got {vocab_size!r}")
        vocabs.add(vocab_size)
    if len(vocabs) != 1:
        what = "pass vocab_size= (no neural drafter, no bigram table)" if not vocabs else f"got {sorted(vocabs)}"
        raise ValueError(f"the cascade needs one vocabulary size for its drafters and bigram table: {what}")
    return vocabs.pop()


def _gather_rows(logits: torch.Tensor, at: list[list[int]], steps: int) -> torch.Tensor:
    """Rows ``at[b]`` of each row's logits [B, N, V] -> [B, steps + 1, V] (one slice for a batch of one)."""
    if len(at) == 1:  # one contiguous run of rows
        return logits[:, at[0][0] : at[0][0] + steps + 1]
    idx = torch.tensor(at, device=logits.device)
    return logits.gather(1, idx[..., None].expand(-1, -1, logits.shape[-1]))


class CascadeDrafter(Drafter):
    """The drafters of a CS Drafting cascade, below the target (docs/methods.md, CS Drafting); method ``csd``.

    ``drafters``: neural drafters, largest first: HF causal LMs with the target's vocabulary (or
    :class:`~specdec.models.HFCausalLM` / :class:`~specdec.drafters.ModelDrafter`); feature drafts are refused (a
    level must review a whole block in one forward, and a feature draft needs its own output at the previous
    position). May be empty: Max-Gram alone. ``bigram``: Max-Gram's greedy bigram table (length V, e.g.
    :func:`bigram_table` or :func:`load_bigram`); None: Max-Gram proposes only what it finds in the sequence.
    ``steps``: the step-limit matrix K, (n + 1) x (n + 1) ints >= 0, upper triangular, Max-Gram last (default
    :func:`default_steps`). ``leniency``: l >= 1 of each neural drafter's reviews (one number for all, or one per
    drafter). ``mag_tokens``: tokens per Max-Gram proposal. ``vocab_size``: needed only without neural drafters
    and without a bigram table.
    """

    def __init__(
        self,
        drafters: Sequence[Any] = (),
        *,
        bigram: Any = None,
        steps: Any = None,
        leniency: float | Sequence[float] = 1.0,
        mag_tokens: int = MAG_TOKENS,
        vocab_size: int | None = None,
    ) -> None:
        if isinstance(drafters, (str, bytes)) or not isinstance(drafters, Sequence):
            raise TypeError(
                f"drafters must be a sequence of draft models (largest first), got {type(drafters).__name__}"
            )
        lms = [self._as_lm(d, i) for i, d in enumerate(drafters)]
        n = len(lms)
        lens = _leniencies(leniency, n)
        if isinstance(mag_tokens, bool) or not isinstance(mag_tokens, int) or mag_tokens < 1:
            raise ValueError(f"mag_tokens must be an int >= 1, got {mag_tokens!r}")
        if bigram is not None:
            bigram = bigram_array(bigram)
        self.vocab_size = _one_vocabulary(lms, bigram, vocab_size)
        if bigram is not None and (bigram.ndim != 1 or bigram.min() < 0 or bigram.max() >= self.vocab_size):
            raise ValueError(f"bigram must be a length-{self.vocab_size} table of token ids in [0, {self.vocab_size})")
        self.levels = [_Level(lm, float(x)) for lm, x in zip(lms, lens, strict=True)]
        self.steps = check_steps(default_steps(n) if steps is None else steps, n + 1)
        self.bigram = bigram
        self.mag_tokens = mag_tokens
        self.name = "cascade"
        self.num_parameters = sum(lm.num_parameters for lm in lms)
        self.calls = 0
        self.mag_calls = 0
        self._block: list[list[int]] = []
        self._prefix: list[list[int]] = []

    @staticmethod
    def _as_lm(draft: Any, i: int) -> HFCausalLM:
        wrapped = draft.model if isinstance(draft, HFCausalLM) else None
        if getattr(draft, "reads_target_features", False) or getattr(wrapped, "reads_target_features", False):
            raise ValueError(
                f"drafters[{i}] is a feature draft (it reads the target's hidden states and its own output at the "
                "previous position), so it cannot review a block in one forward; use a plain draft model"
            )
        if isinstance(draft, ModelDrafter):
            return draft.lm
        return draft if isinstance(draft, HFCausalLM) else HFCausalLM(draft, name=f"drafters[{i}]")

    @property
    def forwards(self) -> list[int]:
        """Forward passes of each neural drafter since construction (reviews and catch-ups), largest first."""
        return [lv.forwards for lv in self.levels]

    # ---- the Drafter interface the decoder drives -------------------------------------------------------------

    def refresh(self) -> None:
        for lv in self.levels:
            lv.lm.refresh()

    def start(self, prompts: list[list[int]]) -> None:
        for lv in self.levels:
            lv.start(len(prompts))
        self._block, self._prefix = [], []

    def _refuse(self) -> DraftLogits:
        raise TypeError(
            "a CascadeDrafter drafts whole reviewed blocks, for method 'csd'; other methods take a draft model"
        )

    def propose_root(self, committed: list[list[int]]) -> DraftLogits:
        return self._refuse()

    def propose_level(self, tree: DraftTree, lo: int, hi: int) -> DraftLogits:
        return self._refuse()

    def accept(self, tree: DraftTree, accepted_nodes: torch.Tensor, n_accepted: torch.Tensor) -> None:
        """The target's verdict on the round's block: every level's cache keeps only the accepted prefix."""
        if not self._prefix:
            return
        counts = n_accepted.tolist()
        kept = [p + blk[:n] for p, blk, n in zip(self._prefix, self._block, counts, strict=True)]
        for lv in self.levels:
            lv.truncate([_lcp(c, k) for c, k in zip(lv.cached, kept, strict=True)])
        self._block, self._prefix = [], []

    def select_rows(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()
        for lv in self.levels:
            assert lv.state is not None
            lv.state.select_rows(rows.to(lv.state.n_cached.device))
            lv.cached = [lv.cached[i] for i in keep]

    # ---- one round: the block the target reviews ----------------------------------------------------------------

    def draft_block(
        self, committed: list[list[int]], sampling: Any, seed: Callable[[], int], max_len: int
    ) -> tuple[list[list[int]], torch.Tensor | None]:
        """The block of at most ``max_len`` tokens per row that the target reviews, and its laws.

        ``sampling``: the run's :class:`~specdec.sampling.SamplingConfig` (the shared processing of every drafter's
        logits); ``seed``: a fresh op seed per call. Returns tokens per row and laws [B, L, V] float32 (L = the
        longest row; row b's first ``len(tokens[b])`` rows are the laws of its positions), None in greedy mode.
        """
        rnd = _Round(sampling, seed)
        rows = list(range(len(committed)))
        prefix = [list(c) for c in committed]
        block = self._build(0, prefix, rows, rnd, need_laws=not sampling.greedy, cap=max_len)
        tokens = [t[:max_len] for t in block.tokens]
        self._prefix, self._block = prefix, tokens
        if block.laws is None:
            return tokens, None
        width = max((len(t) for t in tokens), default=0)
        return tokens, self._assemble(Block(tokens, block.laws), rows, width)

    @property
    def _device(self) -> torch.device:
        return self.levels[0].lm.device if self.levels else torch.device("cpu")

    def _assemble(self, block: Block, rows: list[int], width: int) -> torch.Tensor:
        """The laws of ``rows``' first ``width`` positions as one [B, width, V] float32 tensor (zero rows past a
        row's block); Max-Gram's point masses are written by one scatter."""
        assert block.laws is not None
        out = torch.zeros((len(block.tokens), width, self.vocab_size), dtype=torch.float32, device=self._device)
        hot: list[tuple[int, int, int]] = []
        for b, at, n, law in _chunks(block, rows, width):
            if law is None:
                hot.extend((b, at + i, block.tokens[b][at + i]) for i in range(n))
            else:
                out[b, at : at + n] = law[:n]
        if hot:
            idx = torch.tensor(hot, dtype=torch.long, device=self._device)
            out[idx[:, 0], idx[:, 1], idx[:, 2]] = 1.0
        return out

    def _build(
        self, first: int, seqs: list[list[int]], rows: list[int], rnd: _Round, *, need_laws: bool, cap: int | None
    ) -> Block:
        """The block reviewed by level ``first - 1`` (the target for 0), for ``rows``: drafters ``first..`` (Max-Gram
        is drafter len(levels)) fill it in turn up to their quotas from row ``first`` of the step matrix.
        ``seqs[b]``: row b's sequence before the block; ``cap``: no quota above this (the target's block, and every
        block below it: a longer one could not be used, and a large Max-Gram quota would otherwise run long)."""
        mag = len(self.levels)
        tokens: list[list[int]] = [[] for _ in seqs]
        laws: list[list[tuple[int, torch.Tensor | None]]] = [[] for _ in seqs]
        quota = 0
        for j in range(first, mag + 1):
            quota += self.steps[first][j]
            limit = quota if cap is None else min(quota, cap)
            todo = [b for b in rows if len(tokens[b]) < limit]
            while todo:
                cur = [s + t if t else s for s, t in zip(seqs, tokens, strict=True)]
                sub = self._propose(j, cur, todo, rnd, need_laws, cap)
                grew = []
                for b in todo:
                    if sub.tokens[b]:
                        tokens[b] += sub.tokens[b]
                        if sub.laws is not None:
                            laws[b] += sub.laws[b]
                        grew.append(b)
                # a row that got nothing (Max-Gram without a match or a bigram table) is done with this drafter
                todo = [b for b in grew if len(tokens[b]) < limit]
        return Block(tokens, laws if need_laws else None)

    def _propose(
        self, j: int, seqs: list[list[int]], rows: list[int], rnd: _Round, need_laws: bool, cap: int | None
    ) -> Block:
        """The output of the sub-cascade headed by drafter ``j`` after each of ``rows``' sequences: Max-Gram's
        proposal, or the block of the drafters below ``j`` (at most ``cap`` tokens) reviewed by ``j``."""
        if j == len(self.levels):
            self.mag_calls += 1
            tokens: list[list[int]] = [[] for _ in seqs]
            for b in rows:
                tokens[b] = max_gram_proposal(seqs[b], self.mag_tokens, self.bigram)
            return Block(tokens, [[(len(t), None)] if t else [] for t in tokens] if need_laws else None)
        level = self.levels[j]
        greedy = rnd.sampling.greedy
        # the laws of the block below feed this review's test: always in sampling mode, and in greedy mode when
        # the review is lenient (the authors' greedy rule reads them)
        below = self._build(j + 1, seqs, rows, rnd, need_laws=not greedy or level.leniency > 1.0, cap=cap)
        return self._review(level, seqs, rows, below, rnd, need_laws)

    def _catch_up(
        self, level: _Level, seqs: list[list[int]], active: list[bool]
    ) -> tuple[list[list[int]], torch.Tensor]:
        """Cut each active row's cache back to what still matches its sequence (never past the token before the
        block) and return what each row must still append before its block, with the run of slots a long catch-up
        (the prompt) appended in a forward of its own ([B] int64, zeros without one)."""
        st, lm = level.state, level.lm
        assert st is not None
        level.truncate(
            [min(_lcp(c, s), len(s) - 1) if a else len(c) for c, s, a in zip(level.cached, seqs, active, strict=True)]
        )
        done = st.n_cached.tolist()
        pending = [s[n:] if a else [] for s, n, a in zip(seqs, done, active, strict=True)]
        run_len = torch.zeros((len(seqs),), dtype=torch.long, device=lm.device)
        if max(len(p) for p in pending) - 1 > INLINE_CATCH_UP:
            lm.forward_chain(st, [p[:-1] for p in pending], last_logits=False)
            level.forwards += 1
            self.calls += 1
            run_len = torch.tensor([max(len(p) - 1, 0) for p in pending], dtype=torch.long, device=lm.device)
            pending = [p[-1:] for p in pending]
        return pending, run_len

    def _review(
        self, level: _Level, seqs: list[list[int]], rows: list[int], below: Block, rnd: _Round, need_laws: bool
    ) -> Block:
        """One forward of ``level`` over each row's block, then the (lenient) review; returns the accepted prefix
        plus one token per row, with the laws they were emitted from when ``need_laws``."""
        st = level.state
        if st is None:
            raise RuntimeError("call start(prompts) before drafting")
        lm, dev = level.lm, level.lm.device
        batch = len(seqs)
        member = set(rows)
        active = [b in member for b in range(batch)]
        run_at = st.length
        pending, run_len = self._catch_up(level, seqs, active)
        chains = [p + t for p, t in zip(pending, below.tokens, strict=True)]
        roots = [len(p) - 1 for p in pending]  # chain index of the token before the block
        width = max(len(c) for c in chains)
        toks = torch.tensor([c + [0] * (width - len(c)) for c in chains], dtype=torch.long)
        lens = torch.tensor([len(c) for c in chains], dtype=torch.long)
        cols = torch.arange(width)
        valid = cols[None, :] < lens[:, None]
        parent = (cols - 1).expand(batch, width).clone()
        depth = cols.expand(batch, width).clone()
        base = st.length
        greedy = rnd.sampling.greedy
        # greedy reviews read the head's support only (no full-vocabulary rows)
        reduced = greedy and level.columns is not None
        logits = lm.forward_tree(st, toks.to(dev), parent.to(dev), valid.to(dev), depth.to(dev), reduced=reduced)
        level.forwards += 1
        self.calls += 1
        n_block = [len(t) for t in below.tokens]
        steps = max(n_block[b] for b in rows)
        # the reviewer's rows at the token before the block and at every block token: [B, steps + 1, V] (rows of
        # padding point anywhere in the chain: they are never read)
        at = [[max(0, min(r + i, len(c) - 1)) for i in range(steps + 1)] for r, c in zip(roots, chains, strict=True)]
        rows_logits = _gather_rows(logits, at, steps)
        if greedy:
            verdict, up = self._verify_greedy(level, rows_logits, below, rows, steps, need_laws)
        else:
            verdict, up = self._verify(level, rows_logits, below, rows, n_block, steps, rnd, need_laws)
        n_acc = verdict.n_accepted.tolist()
        nxt = verdict.next_token.tolist()
        # keep [pending, accepted block tokens]; the new token is not in the cache (the next review's root)
        path_len = torch.tensor(
            [roots[b] + 1 + n_acc[b] if active[b] else 0 for b in range(batch)], dtype=torch.long, device=dev
        )
        path = base + torch.arange(width, device=dev).expand(batch, width)
        st.keep(torch.full_like(run_len, run_at), run_len, path, path_len)
        out_tokens: list[list[int]] = [[] for _ in seqs]
        out_laws: list[list[tuple[int, torch.Tensor | None]]] = [[] for _ in seqs]
        for b in rows:
            a = n_acc[b]
            level.cached[b] = seqs[b] + below.tokens[b][:a]
            out_tokens[b] = below.tokens[b][:a] + [nxt[b]]
            if up is not None:
                out_laws[b] = [(a + 1, up[b, : a + 1])]
        return Block(out_tokens, out_laws if need_laws else None)

    def _verify(
        self,
        level: _Level,
        logits: torch.Tensor,
        below: Block,
        rows: list[int],
        n_block: list[int],
        steps: int,
        rnd: _Round,
        need_laws: bool,
    ) -> tuple[sk.ChainVerdict, torch.Tensor | None]:
        """The sampling-mode review of every row's block (greedy: :meth:`_verify_greedy`): verdict and, when
        ``need_laws``, the laws of the emitted positions [B, steps + 1, V] (position j of row b: E_j for a reviewed
        position, the reviewer's row at the bonus)."""
        sampling = rnd.sampling
        dev = logits.device
        lenient = level.leniency > 1.0
        draft, lengths = _padded(below.tokens, steps, dev)
        p = None if below.laws is None else self._assemble(below, rows, steps)
        # the drafters' logits are full rows (-inf off a reduced head's support), processed like the target's
        q = sampling.process(logits, level.lm.name, log=False)
        assert p is not None
        verdict = sk.verify_chain(
            draft, p, q, lengths=lengths, leniency=level.leniency, seed=rnd.seed(), validate=False
        )
        if not need_laws:
            return verdict, None
        if not lenient:
            return verdict, q  # l = 1: each emitted token follows the reviewer's row
        up = torch.cat([sk.emission_law(p, q[:, :steps], level.leniency, validate=False), q[:, steps:]], dim=1)
        for b in rows:  # a row whose block is shorter has its bonus position earlier
            if n_block[b] < steps:
                up[b, n_block[b]] = q[b, n_block[b]]
        return verdict, up

    def _verify_greedy(
        self,
        level: _Level,
        logits: torch.Tensor,
        below: Block,
        rows: list[int],
        steps: int,
        need_laws: bool,
    ) -> tuple[sk.ChainVerdict, torch.Tensor | None]:
        """The greedy review of every row's block: accept x iff x == argmax q, or (lenient, the authors' rule)
        p(x) < l q(x) on the temperature-1 laws. ``logits`` [B, steps + 1, C] are over the reviewer's columns (its
        head's support, or the vocabulary); tokens off the support get one extra column of probability 0. Only
        p(x) and q(x) at the drafted tokens enter the test, so p is a one-column-per-row tensor. Returns the verdict
        (token ids) and, when ``need_laws``, each emitted position's probability of its token [B, steps + 1]."""
        dev = logits.device
        lenient = level.leniency > 1.0
        cols = level.columns
        draft, lengths = _padded(below.tokens, steps, dev)
        if cols is not None:
            draft = cols[draft]
            logits = torch.cat([logits, logits.new_full((*logits.shape[:-1], 1), float("-inf"))], dim=-1)
        soft = torch.softmax(logits.float(), dim=-1) if lenient or need_laws else None
        p = None
        if lenient:
            assert soft is not None
            chosen = self._token_probs(below, rows, steps, dev)
            p = soft.new_zeros((*draft.shape, soft.shape[-1])).scatter_(2, draft[..., None], chosen[..., None])
        verdict = sk.verify_chain(
            draft, p, soft if lenient else logits, lengths=lengths, greedy=True, leniency=level.leniency, validate=False
        )
        up = None
        if need_laws:
            assert soft is not None
            emitted = torch.cat([draft, draft[:, :1]], dim=1)
            emitted.scatter_(1, verdict.n_accepted[:, None], verdict.next_token[:, None].clamp_min(0))
            up = soft.gather(2, emitted[..., None])[..., 0]
        if cols is not None:
            assert level.lm.support is not None
            verdict = verdict._replace(next_token=level.lm.support[verdict.next_token.clamp_min(0)])
        return verdict, up

    @staticmethod
    def _token_probs(block: Block, rows: list[int], width: int, device: torch.device) -> torch.Tensor:
        """Greedy mode: each of ``rows``' first ``width`` block tokens' probability under the row it came from
        [B, width] float32 (1 for Max-Gram's point masses, 0 past a row's block)."""
        out = torch.zeros((len(block.tokens), width), dtype=torch.float32, device=device)
        for b, at, n, chunk in _chunks(block, rows, width):
            out[b, at : at + n] = 1.0 if chunk is None else chunk[:n]
        return out
