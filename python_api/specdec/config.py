"""Decoding configuration: the method with its tree parameters, and the sampling controls (docs/methods.md).

Sampling controls are resolved once per ``generate`` call into a :class:`SamplingConfig`, whose
:meth:`SamplingConfig.process` is the ONE function that turns draft and target logits into laws. Drafting and
verification both use its output, so the ``p`` that verifies is exactly the ``p`` that drafted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

import specdec_kernels as sk

from . import methods
from .autotree import AUTO_MAX_DEPTH

if TYPE_CHECKING:
    from .tree import DraftTree


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class MethodConfig:
    """A decoding method and its draft-tree parameters (validated by :func:`make_method`).

    ``parents`` is the static tree (level order, node 0 = root, as in docs/kernels.md); None for a method that
    drafts nothing (``ar``) or whose builder grows the tree (``rsd_s``: stochastic beam search of width
    ``beam_width``, ``draft_length`` levels). The method's own facts are in :attr:`spec`.
    """

    method: str
    draft_length: int | None = None
    branching: tuple[int, ...] | None = None
    parents: tuple[int, ...] | None = None
    beam_width: int | None = None
    num_chains: int | None = None
    #: branching="auto": the tree's shape is chosen from the past rounds (the spec's auto_builder, specdec.autotree)
    auto: bool = False

    @property
    def spec(self) -> methods.MethodSpec:
        """The registered :class:`~specdec.methods.MethodSpec` of ``method``."""
        return methods.get(self.method)

    @property
    def verifier(self) -> str | None:
        """Node verifier name for specdec_kernels.verify_tree (None for ``ar``)."""
        return self.spec.verifier

    @property
    def depth(self) -> int:
        """Maximum draft length L (tree depth, root excluded); 0 for ``ar``. A tree grown by its builder (no
        static template) is ``draft_length`` deep; an auto tree at most AUTO_MAX_DEPTH."""
        if self.auto:
            return AUTO_MAX_DEPTH
        if self.parents is None:
            return int(self.draft_length or 0)
        depth = [0] * len(self.parents)
        for n in range(1, len(self.parents)):
            depth[n] = depth[self.parents[n]] + 1
        return max(depth)

    def describe(self) -> str:
        """Short label, e.g. ``sd(L=4)`` or ``rsd_c(b=2,2)`` (the method's ``label``)."""
        return self.spec.label(self)


def make_method(
    method: str,
    *,
    draft_length: int | None = None,
    branching: Sequence[int] | str | None = None,
    parents: Sequence[int] | None = None,
    beam_width: int | None = None,
    num_chains: int | None = None,
) -> MethodConfig:
    """Validate ``method`` and its tree parameters; fill the method's defaults.

    Parameters: ``draft_length`` (chain length L, or the hard cap of an adaptive chain), ``branching`` (children
    per level, or ``"auto"`` where the method's spec has an ``auto_builder``: a shape chosen from the past rounds),
    ``parents`` (a level-order parent list, node 0 = root), ``beam_width`` (W), ``num_chains`` (K).
    Which of them a method takes, their defaults and any extra rule (spechub: binary trees) are in the method's
    module of :mod:`specdec.methods` (``specdec.methods.get(method).allowed`` / ``.defaults``).
    """
    spec = methods.get(method)
    given = {
        k: v
        for k, v in {
            "draft_length": draft_length,
            "branching": branching,
            "parents": parents,
            "beam_width": beam_width,
            "num_chains": num_chains,
        }.items()
        if v is not None
    }
    extra = sorted(set(given) - spec.allowed)
    if extra:
        allowed = sorted(spec.allowed) or "no tree parameters"
        raise ValueError(f"method {method!r} does not take {', '.join(extra)} (it takes: {allowed})")
    if "branching" in given and "parents" in given:
        raise ValueError(f"method {method!r}: pass branching or parents, not both")
    opts = dict(spec.defaults)
    if "parents" in given:
        opts.pop("branching", None)
    opts.update(given)

    if "draft_length" in opts:
        opts["draft_length"] = _positive_int("draft_length", opts["draft_length"])
    if "beam_width" in opts:
        opts["beam_width"] = _positive_int("beam_width", opts["beam_width"])
    if "num_chains" in opts:
        opts["num_chains"] = _positive_int("num_chains", opts["num_chains"])
    tree: list[int] | None = None
    auto = isinstance(opts.get("branching"), str) and opts["branching"] == "auto"
    if auto:
        if spec.auto_builder is None:
            raise ValueError(f"method {method!r} does not take branching='auto' (trees chosen per round)")
        opts.pop("branching")
    if "branching" in opts:
        raw = opts["branching"]
        if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
            raise ValueError(f"branching must be a sequence of ints >= 1 (children per level), got {raw!r}")
        opts["branching"] = tuple(raw)
        try:
            tree = sk.branching_parents(list(raw))
        except ValueError as err:
            raise ValueError(f"branching must be a non-empty sequence of ints >= 1, got {raw!r}") from err
    if "parents" in opts:
        raw = opts["parents"]
        if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
            raise ValueError(f"parents must be a level-order list of parent ids with parents[0] = -1, got {raw!r}")
        if any(isinstance(x, bool) or not isinstance(x, int) for x in raw):
            raise ValueError(f"parents must hold ints, got {raw!r}")
        try:
            tree = sk.check_parents(list(raw))
        except ValueError as err:
            raise ValueError(f"parents is not a valid level-order tree: {err}") from err
        if len(tree) < 2:
            raise ValueError("parents must describe at least one draft node besides the root")
    if spec.template is not None:
        tree = list(spec.template(opts))
    config = MethodConfig(
        method=method,
        draft_length=opts.get("draft_length"),
        branching=opts.get("branching"),
        parents=None if tree is None else tuple(tree),
        beam_width=opts.get("beam_width"),
        num_chains=opts.get("num_chains"),
        auto=auto,
    )
    if spec.check is not None:
        spec.check(config)
    return config


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
