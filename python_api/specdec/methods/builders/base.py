"""Level-synchronous growth of one round's draft trees, shared by every tree decoder.

A builder asks the drafter for next-token logits level by level, turns them into the draft law with the shared
processing function, samples children with its method's rule (``expand``) and records, per internal node, the
exact law the children were drawn from. Greedy mode never samples: children are the top-K tokens of
the raw draft logits.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch

from specdec_kernels import sample_categorical

from ...drafters import Drafter
from ...tree import DraftTree, compact

if TYPE_CHECKING:
    from ...sampling import SamplingConfig
    from ..spec import MethodConfig


class Children(NamedTuple):
    """One new level. Shape: tokens/parent/template [B, w], valid [B, w] (valid first per row), hub [B, n] for
    the expanded level (SpecHub only)."""

    tokens: torch.Tensor
    parent: torch.Tensor
    valid: torch.Tensor
    template: torch.Tensor | None = None
    hub: torch.Tensor | None = None
    # True when every slot is known on the host to be valid (no padding): the level then skips the syncs and fills
    # that look for padding (compact, DraftTree.append_level, the "any child?" test)
    dense: bool = False


class TreeBuilder(ABC):
    """Grows the draft trees of one round for a batch; ``verifier`` names the node verifier to use."""

    #: how a node's children are drawn: "iid", "swor" (without replacement), "spechub" (hub pairs) or "beam"
    #: (stochastic beam search); the toy loops of specdec_kernels.testing.toy name the same rules
    draw: ClassVar[str]

    def __init__(self, config: MethodConfig) -> None:
        self.config = config
        self.verifier = config.verifier
        self.depth = config.depth
        # Optional per-row early stop from an acceptance head (decoders.adaptive.AdaptiveStop); None = fixed depth.
        self.stop_rule: Any = None
        # A list while a caller times the round's draft steps: build appends perf_counter() as each level after
        # the root's is proposed (auto trees: the first step of a round costs more than the later ones)
        self.level_marks: list[float] | None = None

    def reset(self, batch: int, device: torch.device) -> None:  # noqa: B027 (optional hook)
        """Per-round state (beam scores for RSD-S); nothing for static trees."""

    def start_call(self) -> None:  # noqa: B027 (optional hook)
        """A new generate call begins (its first round's drafter also reads the prompt)."""

    def calibrate(self, target: Any) -> None:  # noqa: B027 (optional hook)
        """Read what the builder needs from the target before the first round (auto trees: the cost curve)."""

    def observe(self, acc_rank: torch.Tensor, n_acc: torch.Tensor, tree: DraftTree) -> None:  # noqa: B027
        """A verified round: the accepted ranks [B, depth] and counts [B] (auto trees count acceptance)."""

    def observe_pass(self, rows: int, seconds: float) -> None:  # noqa: B027 (optional hook)
        """A round's verification side (target pass, verification, commit) took ``seconds`` over ``rows`` tree
        nodes summed over the batch (auto trees fit their cost)."""

    @abstractmethod
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
        """Children of nodes ``lo..hi-1``. Shape: logits/logp [B, n, V] (logp None when greedy), live [B, n]."""

    def build(
        self,
        drafter: Drafter,
        roots: torch.Tensor,
        committed: list[list[int]],
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        max_depth: int,
    ) -> DraftTree:
        """One round of drafting. Shape: roots [B] -> a DraftTree of depth <= min(max_depth, L)."""
        tree = DraftTree.from_roots(roots)
        depth = min(max_depth, self.depth)
        if depth < 1:
            return tree
        self.reset(tree.batch, tree.device)
        rule = self.stop_rule
        if rule is not None:
            rule.start(tree, drafter)
        out = drafter.propose_root(committed)
        for level in range(depth):
            lo, hi = tree.levels[-1]
            logits = out.logits.to(tree.device)
            # reduced logits [B, n, S]: everything below runs on the S columns; tokens map back after expand
            support = None if out.support is None else out.support.to(tree.device)
            # the same context-dependent controls as the target's rows (repetition penalty, minimum length)
            logits = sampling.adjust(logits, tree, lo, hi, support)
            live = tree.valid[:, lo:hi] & out.ok.to(tree.device)
            if rule is not None:
                live = rule.live(level, tree, lo, hi, live, drafter)
            n_live = int(live.sum())  # one sync for "any" and "all"
            if n_live == 0:
                break
            if n_live < live.numel():
                # Rows without a proposal are zeroed so that processing never sees an all -inf row.
                logits = torch.where(live[..., None], logits, torch.zeros((), dtype=logits.dtype))
            if sampling.greedy:  # sampling mode: process() rejects NaN logits
                logp = None
                if bool(torch.isnan(logits).any()):
                    raise ValueError(f"{drafter.name} produced NaN logits; NaN logits are rejected")
            else:
                logp = sampling.process(logits, drafter.name)
            kids = self.expand(tree, lo, hi, logits, logp, live, sampling.greedy, generator)
            if support is not None:
                kids = to_token_ids(kids, support)
            if logp is not None:  # reduced laws are widened once, for the verifier (DraftTree.p_rows)
                tree.set_level_laws(sampling.probs(logp), kids.hub, support)
            if kids.tokens.shape[1] == 0 or (not kids.dense and not bool(kids.valid.any())):
                break
            new_lo, new_hi = tree.append_level(kids.tokens, kids.parent, kids.valid, kids.template, dense=kids.dense)
            more = level + 1 < depth
            if rule is not None:
                more = rule.keep_drafting(kids.valid) and more
            if not more:
                break
            if self.level_marks is not None:
                self.level_marks.append(time.perf_counter())
            out = drafter.propose_level(tree, new_lo, new_hi)
        if rule is not None:
            rule.finish()
        return tree


def to_token_ids(kids: Children, support: torch.Tensor) -> Children:
    """Children drawn from reduced rows carry column indices into ``support``; map them (and SpecHub hubs) to
    token ids. Invalid slots may hold any index: they are clamped here and masked by DraftTree.append_level."""
    last = support.numel() - 1
    # torch.take: one gather op of the index's shape (tensor indexing costs several times more for these tiny rows)
    hub = None if kids.hub is None else torch.take(support, kids.hub.clamp(0, last))
    return kids._replace(tokens=torch.take(support, kids.tokens.clamp(0, last)), hub=hub)


def greedy_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k tokens of raw logits, descending, lowest id first on ties; -inf entries are invalid.

    Shape: logits [..., V] -> tokens [..., k], valid [..., k].
    """
    k = min(k, logits.shape[-1])
    x = logits.float()
    if k == 1:  # argmax returns the first maximum
        idx = x.argmax(dim=-1, keepdim=True)
        return idx, torch.isfinite(torch.gather(x, -1, idx))
    # topk avoids sorting the whole vocabulary; a stable re-sort of its k results restores lowest-id-first among
    # equal values (an exact tie across the k-th boundary of real logits has probability ~0).
    vals, idx = torch.topk(x, k, dim=-1)
    idx, order = torch.sort(idx, dim=-1)
    vals = torch.gather(vals, -1, order)
    vals, order = torch.sort(vals, dim=-1, descending=True, stable=True)
    return torch.gather(idx, -1, order), torch.isfinite(vals)


# Inside one generate call (seed_block), op seeds are drawn from the run's generator 64 at a time: one torch call
# per 64 ops instead of one per op. The block dies with the call, so reseeding a generator still reproduces a run.
_SEED_BLOCK: ContextVar[tuple[torch.Generator | None, list[int]] | None] = ContextVar("specdec_seeds", default=None)
SEED_BLOCK = 64


@contextmanager
def seed_block(generator: torch.Generator | None) -> Iterator[None]:
    """Serve :func:`op_seed` calls for ``generator`` from blocks of seeds while the context is open."""
    token = _SEED_BLOCK.set((generator, []))
    try:
        yield
    finally:
        _SEED_BLOCK.reset(token)


def op_seed(generator: torch.Generator | None) -> int:
    """A fresh seed for one stochastic op call, drawn from the run's generator: the op's backend then draws its
    noise itself from that Philox stream (docs/kernels.md, Randomness contract), instead of the driver materialising
    float64 noise tensors."""
    block = _SEED_BLOCK.get()
    device = generator.device if generator is not None else None  # a user's CUDA generator draws on its device
    if block is None or block[0] is not generator:
        return int(torch.randint(0, 2**63 - 1, (), generator=generator, device=device))
    if not block[1]:
        seeds = torch.randint(0, 2**63 - 1, (SEED_BLOCK,), generator=generator, device=device)
        block[1].extend(reversed(seeds.tolist()))
    return block[1].pop()


def iid_children(
    logits: torch.Tensor, logp: torch.Tensor | None, k: int, greedy: bool, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``k`` i.i.d. draws per node (SD chains, SpecInfer RRS, SpecTr). Greedy: one copy of argmax, since the
    other copies would be identical.

    Shape: logits/logp [B, n, V] -> tokens [B, n, k], valid [B, n, k] (None in sampling mode: every draw is valid).
    """
    if greedy:
        tok, ok = greedy_topk(logits, 1)
        tokens = tok.expand(*tok.shape[:-1], k).clone()
        valid = torch.zeros(tokens.shape, dtype=torch.bool, device=tokens.device)
        valid[..., 0] = ok[..., 0]
        return tokens, valid
    assert logp is not None
    # expand() shares storage, but the noise is drawn for the full [B, n, k, V] shape (one Philox row per copy).
    tokens = sample_categorical(logp.unsqueeze(2).expand(-1, -1, k, -1), seed=op_seed(generator), validate=False)
    return tokens, None  # every draw is a token (Gumbel-max never picks a zero-mass entry)


class StaticTreeBuilder(TreeBuilder):
    """Trees with a fixed topology (config.parents): node t of the template gets as many children as it has there,
    sampled by ``sample`` in draft order; children that could not be drawn (zero draft mass) drop their whole
    template subtree."""

    def __init__(self, config: MethodConfig) -> None:
        super().__init__(config)
        parents = list(config.parents or ())
        kids: list[list[int]] = [[] for _ in parents]
        for node in range(1, len(parents)):
            kids[parents[node]].append(node)
        self._kids = kids
        # (device, lo, template ids, live flags) -> the level's index tensors; every round of a batch whose rows
        # are all alive repeats the same few keys, and building these costs tens of tiny torch ops
        self._plans: dict[tuple, tuple[torch.Tensor, int, torch.Tensor, torch.Tensor, torch.Tensor, bool]] = {}

    @abstractmethod
    def sample(
        self,
        logits: torch.Tensor,
        logp: torch.Tensor | None,
        counts: torch.Tensor,
        k: int,
        greedy: bool,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Up to ``k`` children per node in draft order. Shape: logits/logp [B, n, V], counts [B, n] wanted
        children -> tokens [B, n, k], valid [B, n, k] (None: every draw is a token), hub [B, n] or None."""

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
        dev = tree.device
        batch, n = live.shape
        counts, k, wanted, parent, child_tmpl, full = self._plan(tree.template[:, lo:hi], live, lo, logits.shape[-1])
        if k == 0:
            empty = torch.zeros((batch, 0), dtype=torch.long, device=dev)
            return Children(empty, empty, empty.bool(), empty, None)
        tokens, valid, hub = self.sample(logits, logp, counts, k, greedy, generator)
        tokens = tokens.reshape(batch, n * k)
        if valid is None and full:  # every draw is a token and every node wants k of them: no padding at all
            return Children(tokens, parent, wanted.reshape(batch, n * k), child_tmpl, hub, dense=True)
        valid = (wanted if valid is None else valid & wanted).reshape(batch, n * k)
        tok, par, val, tpl = compact(tokens, parent, valid, child_tmpl)
        return Children(tok, par, val, tpl, hub)

    def _plan(
        self, template: torch.Tensor, live: torch.Tensor, lo: int, vocab: int
    ) -> tuple[torch.Tensor, int, torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """For nodes ``lo..`` with template ids ``template`` [B, n] and ``live`` [B, n]: wanted children per node
        counts [B, n], k = the most of them (<= vocab), wanted [B, n, k] (slot < count), the children's
        parent ids and template ids [B, n k], and whether every slot is wanted (computed on host lists: the tensors
        are tiny)."""
        tmpl, alive = template.tolist(), live.tolist()
        key = (template.device, lo, vocab, tuple(map(tuple, tmpl)), tuple(map(tuple, alive)))
        hit = self._plans.get(key)
        if hit is not None:
            return hit
        kids = self._kids
        counts = [
            [len(kids[t]) if a and t >= 0 else 0 for t, a in zip(r, ra, strict=True)]
            for r, ra in zip(tmpl, alive, strict=True)
        ]
        k = min(max((c for r in counts for c in r), default=0), vocab)
        wanted = [[[j < c for j in range(k)] for c in r] for r in counts]
        full = all(c == k for r in counts for c in r)
        parent = [[lo + i for i in range(len(r)) for _ in range(k)] for r in counts]
        child = [[(kids[t][j] if t >= 0 and j < len(kids[t]) else -1) for t in r for j in range(k)] for r in tmpl]
        dev = template.device
        batch, n = template.shape
        plan = (
            torch.tensor(counts, dtype=torch.long, device=dev).reshape(batch, n),
            k,
            torch.tensor(wanted, dtype=torch.bool, device=dev).reshape(batch, n, k),
            torch.tensor(parent, dtype=torch.long, device=dev).reshape(batch, n * k),
            torch.tensor(child, dtype=torch.long, device=dev).reshape(batch, n * k),
            full,
        )
        if len(self._plans) >= 256:  # ragged batches can make many keys: keep the cache small
            self._plans.clear()
        self._plans[key] = plan
        return plan
