"""``branching="auto"``: static trees whose shape is chosen per round for the machine (specdec.autotree), for
the methods whose trees are given by ``branching``: rsd_c and rrsw (siblings without replacement), rrs (i.i.d.
siblings) and spechub (hub pairs, at most two children per node)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

import specdec_kernels as sk

from ... import models
from ...autotree import (
    AUTO_MAX_DEPTH,
    EXPLORE,
    MAX_WIDTH,
    AcceptanceModel,
    CostCurve,
    choose,
    curve_key,
    curve_path,
    load_or_measure,
)
from ...drafters import Drafter
from ...models.fastpath import linear as fast_linear
from ...tree import DraftTree
from .base import Children, StaticTreeBuilder, TreeBuilder
from .spechub import SpecHubBuilder
from .static_trees import IIDTreeBuilder, SWORTreeBuilder

if TYPE_CHECKING:
    from ...distributed import Ranks
    from ...sampling import SamplingConfig
    from ..spec import MethodConfig

#: cached tokens behind the calibration passes (a typical early decoding position)
CALIBRATION_CONTEXT = 128
#: rounds between two choices of the shape once the first AUTO_REFRESH rounds have each chosen (a choice weighs
#: every shape and chain length: a few tenths of a millisecond of Python, about 1 % of a round on a small model)
AUTO_REFRESH = 8


class AutoTreeBuilder(TreeBuilder):
    """The constant-branching tree with the most expected tokens per second under this machine's cost curve and
    the costs and acceptance counted so far (:func:`specdec.autotree.choose`, chosen again every AUTO_REFRESH rounds
    after the first AUTO_REFRESH), built by the static builder ``static`` of the method's draw rule; the shape
    depends on past rounds only. This class draws siblings without replacement (rsd_c, rrsw)."""

    #: the builder of one round's fixed tree (its draw rule is the method's)
    static: ClassVar[type[StaticTreeBuilder]] = SWORTreeBuilder
    draw = static.draw
    #: the widest level a shape may have
    max_width: ClassVar[int] = MAX_WIDTH

    def __init__(self, config: MethodConfig, max_nodes: int = 8) -> None:
        super().__init__(config)
        self.depth = AUTO_MAX_DEPTH
        self.max_nodes = max_nodes
        self.acceptance = AcceptanceModel(optimism=EXPLORE)
        self.curve: CostCurve | None = None  # set by the decoder from the target (needs a model to measure)
        self.shape: tuple[int, ...] = (1,)
        self.track = 0  # nodes of the hybrid draft's chain under the shape's first-child path, this round
        self.shapes_used: dict[tuple[int, ...], int] = {}
        self._builders: dict[tuple[tuple[int, ...], int], StaticTreeBuilder] = {}
        self._first_round = True
        self._call_rounds = 0  # rounds built in the current generate call
        self._rounds = 0  # rounds built by this builder (over all calls)
        self._choice: tuple[tuple[int, int], tuple[int, ...], int] | None = None  # (batch, longest), shape, track
        self.ranks: Ranks | None = None  # a tensor-parallel target's ranks (set by calibrate)

    def calibrate(self, target: models.HFCausalLM) -> None:
        """The target's pass cost by rows: from the cache, or measured once (:func:`target_curve`)."""
        self.max_nodes = fast_linear.DECODE_ROWS
        self.ranks = target.ranks
        self.curve = target_curve(target)

    def start_call(self) -> None:
        self._first_round = True
        self._call_rounds = 0

    def _builder(self, shape: tuple[int, ...], track: int = 0) -> StaticTreeBuilder:
        """The static builder of ``shape``, with a chain of ``track`` nodes under its first-child path (the draft
        track of a :class:`~specdec.drafters.HybridDrafter`)."""
        if (shape, track) not in self._builders:
            parents = sk.branching_parents(list(shape))
            node = 0
            for _ in shape:  # first-child path: each level's first child is the lowest id with that parent
                node = parents.index(node, node + 1)
            for _ in range(track):
                parents.append(node)
                node = len(parents) - 1
            config = replace(self.config, branching=shape, parents=tuple(parents), auto=False)
            self._builders[shape, track] = self.static(config)
        return self._builders[shape, track]

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
        return self._builder(self.shape).expand(tree, lo, hi, logits, logp, live, greedy, generator)

    def build(
        self,
        drafter: Drafter,
        roots: torch.Tensor,
        committed: list[list[int]],
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        max_depth: int,
    ) -> DraftTree:
        if self.curve is None:
            raise RuntimeError("branching='auto' needs the target's cost curve (set by SpeculativeDecoder)")
        batch = int(roots.shape[0])
        longest = min(drafter.track_levels, self.max_nodes - 2)  # room for a one-node tree and the root
        key = (batch, longest)
        if (
            self._choice is None
            or self._choice[0] != key
            or self._rounds < AUTO_REFRESH
            or self._rounds % AUTO_REFRESH == 0
        ):
            ranks = self.ranks
            shape, track = (), 0
            if ranks is None or ranks.leader:
                shape, track, _ = choose(
                    self.curve, self.acceptance, batch, self.max_nodes, AUTO_MAX_DEPTH, longest, self.max_width
                )
            if ranks is not None:  # the choice follows rank 0's timings: every rank drafts the same shape
                shape, track = ranks.from_leader((shape, track))
            self._choice = (key, shape, track)
        self._rounds += 1
        self._call_rounds += 1
        _, self.shape, track = self._choice
        # chain levels this round can draft (a round near the end of generation is cut short by max_depth); the
        # chain's nodes exist only where Max-Gram proposes that far, and rounds without them count as misses
        self.track = max(0, min(track, max_depth - len(self.shape)))
        self.shapes_used[self.shape] = self.shapes_used.get(self.shape, 0) + 1
        if not self.shape:  # no tree pays at this batch size: a plain one-token step
            return DraftTree.from_roots(roots)
        builder = self._builder(self.shape, self.track)
        builder.stop_rule = self.stop_rule
        if longest:
            drafter.set_tree_depth(len(self.shape))
        builder.level_marks = marks = []
        t0 = time.perf_counter()
        try:
            tree = builder.build(drafter, roots, committed, sampling, generator, max_depth)
        finally:
            builder.level_marks = None
        times = [t0, *marks, time.perf_counter()]
        first, self._first_round = self._first_round, False
        # Each draft step of the shape (the draft's forward and the sampling of the level's children), at its
        # level's rows: the first apart from the later ones; levels of the track alone below the shape run no
        # forward and count in the pass. Not on a call's first drafting round, whose first step also reads the whole
        # prompt into the draft (tens of steps' worth on a long prompt).
        if not first:
            for i in range(min(len(self.shape), len(tree.levels) - 1, len(times) - 1)):
                lo, hi = tree.levels[i]
                observe = self.curve.observe_draft if i else self.curve.observe_first
                observe((hi - lo) * batch, times[i + 1] - times[i])
        return tree

    def observe_pass(self, rows: int, seconds: float) -> None:
        # not a call's first round: it runs cold (caches, allocator) after whatever ran between two calls
        if self.curve is not None and self._call_rounds > 1:
            self.curve.observe_pass(rows, seconds)

    def observe(self, acc_rank: torch.Tensor, n_acc: torch.Tensor, tree: DraftTree) -> None:
        depth = min(len(tree.levels) - 1, len(self.shape))  # a track chain below the shape is not counted
        if depth == 0:
            return
        track = self.track if depth == len(self.shape) else 0
        for sibling_ranks, n in zip(acc_rank.tolist(), n_acc.tolist(), strict=True):
            self.acceptance.observe(self.shape, sibling_ranks, min(n, depth), depth)
            self.acceptance.observe_track(sibling_ranks, n, depth, track)


class AutoIIDTreeBuilder(AutoTreeBuilder):
    """rrs: the chosen shape's siblings are i.i.d. draws, verified by recursive rejection sampling with
    replacement."""

    static = IIDTreeBuilder
    draw = static.draw


class AutoSpecHubBuilder(AutoTreeBuilder):
    """spechub: binary shapes (a node drafts one hub pair), verified by SpecHub's transport plan."""

    static = SpecHubBuilder
    draw = static.draw
    max_width = 2


def _curve_key(target: models.HFCausalLM) -> str:
    shards = target.ranks.size if target.ranks is not None else 1
    return curve_key(target.model, torch.get_num_threads(), fast_linear.DECODE_ROWS, shards)


def target_curve(target: models.HFCausalLM, *, progress: bool = True) -> CostCurve:
    """The pass cost by rows that ``branching="auto"`` reads for ``target`` at torch's current thread count: from
    the cache, or measured once (about a second per row count, with a log line and a progress bar)."""
    state: models.KVState | None = None

    def forward(n: int) -> None:
        nonlocal state
        with torch.inference_mode():
            if state is None:
                state = target.new_state(1)
                g = torch.Generator().manual_seed(0)
                ctx = torch.randint(0, target.vocab_size, (CALIBRATION_CONTEXT,), generator=g).tolist()
                target.forward_chain(state, [ctx], last_logits=False)
            target.probe_chain(state, torch.zeros((1, n), dtype=torch.long, device=target.device))

    return load_or_measure(_curve_key(target), forward, progress=progress, ranks=target.ranks)


def calibrate(model: Any, *, progress: bool = True) -> Path:
    """Measure ahead the cost curve that ``branching="auto"`` measures on its first call for ``model`` (an HF
    causal LM, at its dtype and device, and torch's current thread count), so that the first ``generate`` starts
    at once; returns the cache file. A curve already cached is kept. ``specdec calibrate`` runs it from the
    command line."""
    target = model if isinstance(model, models.HFCausalLM) else models.HFCausalLM(model, name="target")
    target_curve(target, progress=progress)
    return curve_path(_curve_key(target))
