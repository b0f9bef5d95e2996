"""Sampling controls: what turns draft and target logits into laws (docs/methods.md, Generation settings).

They are resolved once per ``generate`` call into a :class:`SamplingConfig`, whose :meth:`SamplingConfig.process` is
the ONE function that turns draft and target logits into laws. Drafting and verification both use its output, so the
``p`` that verifies is exactly the ``p`` that drafted. :class:`RunContext` holds what the context-dependent controls
(minimum length, repetition penalty) read per row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

import specdec_kernels as sk

if TYPE_CHECKING:
    from .tree import DraftTree


class RunContext:
    """What the context-dependent controls read, per active row of one ``generate`` call: the length of the
    row's sequence in transformers' layout (the padded prompt plus the new tokens) and, with a repetition penalty,
    the set of tokens it holds (the prompt from its first attended position on, and the new tokens).

    Shape: lengths [B] int64, seen [B, V + 1] bool (column V absorbs masked scatters) or None.
    """

    def __init__(self, lengths: list[int], seen_rows: list[list[int]] | None, vocab: int, device: torch.device):
        self.lengths = torch.tensor(lengths, dtype=torch.long, device=device)
        self.vocab = vocab
        self.seen: torch.Tensor | None = None
        if seen_rows is not None:
            self.seen = torch.zeros((len(seen_rows), vocab + 1), dtype=torch.bool, device=device)
            for b, row in enumerate(seen_rows):
                self.seen[b, torch.tensor(row, dtype=torch.long, device=device)] = True

    def commit(self, row: int, tokens: list[int]) -> None:
        """Active row ``row`` appended ``tokens``."""
        if not tokens:
            return
        self.lengths[row] += len(tokens)
        if self.seen is not None:
            self.seen[row, torch.tensor(tokens, dtype=torch.long, device=self.seen.device)] = True

    def select_rows(self, keep: torch.Tensor) -> None:
        self.lengths = self.lengths.index_select(0, keep)
        if self.seen is not None:
            self.seen = self.seen.index_select(0, keep)

    def node_seen(self, tree: DraftTree, lo: int, hi: int) -> torch.Tensor:
        """Tokens of each node's context: its row's tokens and those on the path root -> node (the root is the
        row's last token already). Shape: [B, hi - lo, V] bool."""
        assert self.seen is not None
        batch = tree.batch
        seen = self.seen[:, None, :].expand(batch, hi - lo, self.vocab + 1).clone()
        cur = torch.arange(lo, hi, device=tree.device).expand(batch, hi - lo)
        for _ in range(int(tree.depth[:, lo:hi].max()) if hi > lo else 0):
            inner = cur > 0
            tok = torch.gather(tree.tokens, 1, cur).masked_fill(~inner, self.vocab)
            seen.scatter_(2, tok[..., None], True)
            cur = torch.gather(tree.parent, 1, cur).clamp_min(0)
        return seen[..., : self.vocab]

    def node_lengths(self, tree: DraftTree, lo: int, hi: int) -> torch.Tensor:
        """Sequence length each node's logits are read at. Shape: [B, hi - lo] int64."""
        return self.lengths[:, None] + tree.depth[:, lo:hi]


@dataclass(frozen=True)
class SamplingConfig:
    """Resolved sampling controls, in transformers' order: the context-dependent ones (repetition penalty, EOS
    suppressed below a minimum length) on the raw logits in float32, then temperature, top-k, top-p and min-p.

    ``greedy`` is true when ``do_sample`` is false or ``temperature < 1e-5``; every decoder then returns exactly the
    target's greedy decoding of the processed logits. ``min_length`` counts transformers' sequence length (padded
    prompt plus new tokens); ``suppress`` holds the EOS ids it masks. ``context`` is set per ``generate`` call when a
    context-dependent control is active.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    do_sample: bool = True
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_length: int = 0
    suppress: tuple[int, ...] = ()
    context: RunContext | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {k!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {p!r}")
        if not isinstance(self.do_sample, bool):
            raise ValueError(f"do_sample must be a bool, got {self.do_sample!r}")
        if not isinstance(self.min_p, (int, float)) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1] (0 disables it), got {self.min_p!r}")
        rp = self.repetition_penalty
        if isinstance(rp, bool) or not isinstance(rp, (int, float)) or not math.isfinite(rp) or rp <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 disables it), got {rp!r}")

    @property
    def greedy(self) -> bool:
        return (not self.do_sample) or sk.is_greedy(self.temperature)

    @property
    def needs_context(self) -> bool:
        """Whether the laws depend on each node's context (a :class:`RunContext` must be attached)."""
        return self.repetition_penalty != 1.0 or (self.min_length > 0 and bool(self.suppress))

    def adjust(
        self, logits: torch.Tensor, tree: DraftTree, lo: int, hi: int, columns: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The context-dependent controls on the raw logits of nodes ``lo..hi-1`` of ``tree``; a no-op without
        them. ``columns``: the token ids of reduced logits (DraftLogits.support). Shape: logits [B, n, C] ->
        [B, n, C] (float32 when a control applies)."""
        ctx = self.context
        if ctx is None:
            return logits
        x = logits.float()
        if self.repetition_penalty != 1.0:
            seen = ctx.node_seen(tree, lo, hi)
            if columns is not None:
                seen = seen[..., columns]
            rp = self.repetition_penalty
            x = torch.where(seen, torch.where(x < 0, x * rp, x / rp), x)
        if self.min_length > 0 and self.suppress:
            short = ctx.node_lengths(tree, lo, hi) < self.min_length
            ids = torch.arange(x.shape[-1], device=x.device) if columns is None else columns
            eos = torch.isin(ids, torch.tensor(self.suppress, dtype=ids.dtype, device=ids.device))
            x = x.masked_fill(short[..., None] & eos, -math.inf)
        return x

    def process(self, logits: torch.Tensor, source: str = "model", *, log: bool = True) -> torch.Tensor:
        """The shared processing of draft AND target logits (after :meth:`adjust`); ``source`` names the model in
        errors.

        Shape: logits [..., V] (any float dtype) -> logp [..., V] float32, -inf for masked tokens (one-hot in greedy);
        ``log=False``: the law itself (= probs(logp)), in one op call.
        """
        greedy = self.greedy
        temperature = 0.0 if greedy else self.temperature
        try:
            out = sk.process_logits(logits, temperature, self.top_k, self.top_p, log=log)
        except ValueError as exc:
            if "NaN" in str(exc):
                msg = f"{source} produced NaN logits; NaN logits are rejected (check the model/dtype)"
                raise ValueError(msg) from exc
            if "+inf" in str(exc):  # also the overflow of logits / temperature
                msg = f"{source} produced +inf logits (after the sampling controls); they cannot be sampled from"
                raise ValueError(msg) from exc
            if "every entry is -inf" in str(exc):
                msg = f"{source}: every token of a row is masked (-inf logits after the sampling controls)"
                raise ValueError(msg) from exc
            raise
        if self.min_p > 0.0 and not greedy:
            # transformers' rule: drop tokens whose probability is below min_p times the row's largest
            probs = out.exp() if log else out
            drop = probs < self.min_p * probs.amax(dim=-1, keepdim=True)
            if log:
                out = out.masked_fill(drop, -math.inf)
                out = out - torch.logsumexp(out, dim=-1, keepdim=True)
            else:
                out = out.masked_fill(drop, 0.0)
                out = out / out.sum(dim=-1, keepdim=True)
        return out

    @staticmethod
    def probs(logp: torch.Tensor) -> torch.Tensor:
        """The law of processed log-probs: softmax(logp) = exp(logp) up to fp32 rounding (rows sum to 1).
        Shape: logp [..., V] (at least one finite entry per row) -> p [..., V] float32. softmax, not exp: torch's
        vectorised exp takes a slow path on -inf, which fills most of a reduced-head draft row, and softmax is not
        slower on dense rows (benchmarks/bench_process_logits.py, "law" cases). The target's law comes from
        ``process(..., log=False)`` instead, in the same op call."""
        return torch.softmax(logp, dim=-1)
