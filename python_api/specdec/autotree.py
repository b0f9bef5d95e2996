"""Trees chosen for the machine (``branching="auto"``): pick the rounds' draft-tree shape from this machine's cost
curve and the acceptance seen so far, in the spirit of Sequoia (Chen et al., 2024, arXiv:2402.12374).

* :class:`CostCurve`: seconds of a target forward over n new rows (a verification pass of n tree nodes, summed
  over the batch) and of a draft step over r rows, measured once per (model, dtype, CPU model and variant, threads)
  and cached as JSON under ``$SPECDEC_CACHE`` (default ``~/.cache/specdec``) ``/costs``. The draft step is
  re-estimated from the rounds as they run (a mean per row count, recent rounds weighing more), since drafters
  differ in what one step does.
* :class:`AcceptanceModel`: g[d][k] = P(the child of sibling rank k is accepted | a node at depth d - 1 was reached,
  has more than k children, and its children of ranks below k were rejected), counted from the verifier's accepted
  ranks with a few prior pseudo-counts. Recursive rejection tries the siblings in rank order, so the chance that
  rank k is tried and accepted does not depend on how many further siblings exist, and one count serves every
  branching. The auto trees read each count optimistically (``optimism``: the posterior mean plus EXPLORE standard
  deviations), since a level or rank counts only in rounds whose shape reaches it, and an estimate below the truth
  would otherwise keep every shape away from it for good.
* :func:`choose`: over constant-branching shapes (b_1 >= b_2 >= ... per level, at most ``max_nodes`` nodes with the
  root) and no draft at all, the one that maximises expected tokens per second:
  E = 1 + sum_d prod_{j <= d} A_j(b_j), A_j(b) = 1 - prod_{k < b} (1 - g[j][k]);
  cost = target(B * nodes) + sum_levels draft(B * rows of the level), where target() is the measured pass times
  the ratio the rounds showed a round's verification side to cost against it (a + b * nodes, fitted as they run).

The choice reads only past rounds and the machine's costs, never the current round's draws, so every round is an
ordinary fixed tree verified exactly: the output law stays the target's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

from .errors import CacheDirError

if TYPE_CHECKING:
    from .distributed import Ranks

log = logging.getLogger(__name__)

#: deepest auto tree (levels below the root)
AUTO_MAX_DEPTH = 6
#: deepest level with its own acceptance counts; deeper levels share the last one
MAX_DEPTH_BUCKETS = 4
#: widest sibling rank with its own counts (and the widest level auto trees use)
MAX_WIDTH = 4
#: prior acceptance by rank once the ranks before it were rejected (pseudo-counts PRIOR_WEIGHT each): a first draft
#: accepted about half the time, later ranks less likely (together: a level of 2 siblings accepted 65 % of the time)
PRIOR = (0.5, 0.3, 0.2, 0.15)
PRIOR_WEIGHT = 4.0
#: standard deviations of an acceptance estimate's posterior added to it when the auto trees choose a shape
#: (AcceptanceModel.optimism): about 0.2 on a cell never reached, 0.02 after 500 trials
EXPLORE = 1.0
#: prior chance that a track node (a hybrid draft's chain below the tree) is drafted and accepted once the node above
#: it was accepted (pseudo-counts PRIOR_WEIGHT)
TRACK_PRIOR = 0.5
#: weight of the earlier observations against a new one, in the fit of a round's pass cost and in the means of the
#: draft steps' costs: recent rounds weigh more, since the cost grows with the context and a shared machine's speed
#: drifts (both sides then follow the same recent rounds, so a uniform slowdown scales every cost alike)
COST_DECAY = 0.97
#: rounds observed before the fit of the pass cost is used
PASS_MIN_ROUNDS = 4
#: ridge on the fit's slope, in rows^2: the slope is shrunk by var / (var + PASS_SLOPE_RIDGE) for the (decayed)
#: variance var of the rounds' node counts, so that rounds of nearly one size, or a few rounds of another size
#: during a slow spell of a shared machine, do not tilt the curve (the curve's own growth with rows is measured)
PASS_SLOPE_RIDGE = 4.0
#: the least fitted ratio of a round's pass to the measured one (a line extrapolated far from the rounds' sizes must
#: not make a pass look nearly free)
PASS_MIN_RATIO = 0.5
#: row counts a cost curve is measured at (linear interpolation between them; beyond the last, the cost per row of
#: the last): up to a batch of 8 trees of 16 nodes each
CURVE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec")) / "costs"


def _interp(points: dict[int, float], n: float, proportional: bool = False) -> float:
    """Linear interpolation; beyond the last point the last slope, or with ``proportional`` the cost per row of the
    last point."""
    xs = sorted(points)
    if n <= xs[0]:
        return points[xs[0]] * n / xs[0] if xs[0] > 1 else points[xs[0]]
    for a, b in zip(xs, xs[1:], strict=False):
        if n <= b:
            return points[a] + (points[b] - points[a]) * (n - a) / (b - a)
    a, b = xs[-2], xs[-1]
    if proportional:
        return points[b] * n / b
    return points[b] + (points[b] - points[a]) / (b - a) * (n - b)


def _means(seen: dict[int, tuple[float, float]]) -> dict[int, float]:
    return {r: s / c for r, (s, c) in seen.items() if c}


def _add(seen: dict[int, tuple[float, float]], rows: int, seconds: float) -> None:
    """One more observation into a decayed mean (COST_DECAY per observation at these rows)."""
    s, c = seen.get(rows, (0.0, 0.0))
    seen[rows] = (COST_DECAY * s + seconds, COST_DECAY * c + 1.0)


def _step_cost(points: dict[int, float], rows: float) -> float:
    """A draft step's cost at ``rows`` from its costs at the rows seen (one point: +10 % per doubling of rows)."""
    if len(points) == 1:
        ((r0, s0),) = points.items()
        return s0 * (1 + 0.1 * (rows - r0) / max(r0, 1))
    return max(_interp(points, rows), 1e-6)


@dataclass
class CostCurve:
    """Seconds per target pass by rows (``target``) and per draft step by rows (``draft``)."""

    target: dict[int, float]
    draft: dict[int, float] = field(default_factory=dict)
    _draft_seen: dict[int, tuple[float, float]] = field(default_factory=dict, repr=False)
    #: the first draft step of a round by rows: it also reads the newly committed tokens into the draft and finds
    #: its data pushed out of the caches by the target's pass, so it costs more than the later steps (draft_cost)
    _first_seen: dict[int, tuple[float, float]] = field(default_factory=dict, repr=False)
    #: decayed sums (count, rows, ratio, rows^2, rows * ratio) of the rounds seen by observe_pass
    _pass: list[float] = field(default_factory=lambda: [0.0] * 5, repr=False)

    def measured_pass(self, rows: float) -> float:
        # beyond the measured rows a pass costs in proportion to them: a flat last stretch of the curve must not
        # make a pass far larger than any measured look free
        return _interp(self.target, rows, proportional=True)

    def target_cost(self, rows: float) -> float:
        """A round's verification side over ``rows`` tree nodes: the measured pass times the ratio the rounds showed
        to it (:meth:`pass_ratio`)."""
        return self.measured_pass(rows) * self.pass_ratio(rows)

    def observe_pass(self, rows: int, seconds: float) -> None:
        """A round's verification side as it ran (target pass over a tree at the current context, verification,
        commit) over ``rows`` nodes. Its ratio to the measured pass is fitted as a + b * rows: what the calibration's
        chain passes at a short context leave out, and the machine's speed now against then. A ratio rather than a
        difference, since a slow spell of a shared machine scales every cost: a difference fitted during one would
        grow a one-node pass and a large tree's alike and make the large tree look cheap."""
        ratio = seconds / self.measured_pass(rows)
        for i, v in enumerate((1.0, float(rows), ratio, float(rows * rows), rows * ratio)):
            self._pass[i] = COST_DECAY * self._pass[i] + v

    def pass_ratio(self, rows: float) -> float:
        """The fitted ratio at ``rows``, at least PASS_MIN_RATIO; 1 until PASS_MIN_ROUNDS rounds were seen. Rounds
        of one size only: their mean ratio. The slope is shrunk toward 0 (PASS_SLOPE_RIDGE) unless the rounds' sizes
        vary by several nodes."""
        n, sx, sy, sxx, sxy = self._pass
        if n < PASS_MIN_ROUNDS - 0.5:  # n: the decayed count (PASS_MIN_ROUNDS rounds make about 0.1 less)
            return 1.0
        spread = n * sxx - sx * sx + PASS_SLOPE_RIDGE * n * n
        slope = (n * sxy - sx * sy) / spread
        return max((sy - slope * sx) / n + slope * rows, PASS_MIN_RATIO)

    def draft_cost(self, rows: float) -> float:
        """A later draft step of a round over ``rows`` nodes."""
        points = {**self.draft, **_means(self._draft_seen)}
        if not points:  # nothing measured yet: a draft step as a twentieth of a one-row target pass
            return 0.05 * self.target_cost(1) * (1 + 0.1 * (rows - 1))
        return _step_cost(points, rows)

    def observe_draft(self, rows: int, seconds: float) -> None:
        _add(self._draft_seen, rows, seconds)

    def first_cost(self, rows: float) -> float:
        """The first draft step of a round over ``rows`` roots (its mean as observed; draft_cost until seen)."""
        seen = _means(self._first_seen)
        return _step_cost(seen, rows) if seen else self.draft_cost(rows)

    def observe_first(self, rows: int, seconds: float) -> None:
        _add(self._first_seen, rows, seconds)

    def to_json(self) -> dict:
        return {"target": {str(k): v for k, v in self.target.items()}}

    @classmethod
    def from_json(cls, data: dict) -> CostCurve:
        return cls(target={int(k): float(v) for k, v in data["target"].items()})


#: the adapter's forward path (which layers run fused, how the cache grows, how the linear and attention kernels tile,
#: prefetch and pack);
#: changing what a pass costs changes this, so that curves measured on another path are not reused
FORWARD_PATH = "decoder-stack-plan/lean-head/slot-cache/linear-l2-prefetch-wide-tiles/attention-register-pack"
#: how a curve is measured (measure_target); a change re-measures the cached curves
MEASUREMENT = "interleaved-sweeps"


def _progress(total: int, show: bool) -> Any:
    """A tqdm bar on stderr (``TQDM_DISABLE=1`` hides it; ``show`` False: one that draws nothing). tqdm comes with
    the ``hf`` extra; without it, a stand-in with the two methods the measurement calls."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return SimpleNamespace(update=lambda: None, close=lambda: None)
    desc = "specdec: measuring the pass cost for auto trees (once)"
    return tqdm(total=total, desc=desc, unit="pass", leave=False, disable=not show)


def curve_key(model: torch.nn.Module, threads: int, decode_rows: int | None = None, shards: int = 1) -> str:
    """What a cost curve depends on: the model's class, size and dtype, the CPU (its model name: a cache directory
    shared by machines of one instruction set, such as a cluster's home directory, must not lend one machine's
    curve to another), the CPU variant, the thread count, the package version and the adapter's forward path,
    including the most rows a pass runs on the decode kernels (``decode_rows``), and the number of tensor-parallel
    ranks the model is sharded over (``shards``)."""
    import specdec_kernels as sk

    p = next(model.parameters())
    n = sum(q.numel() for q in model.parameters())
    raw = f"{type(model).__name__}|{n}|{p.dtype}|{p.device.type}|{sk.cpu_model()}|{sk.cpu_isa()}"
    raw += f"|{sk.skinny_linear_isa()}|{threads}"
    raw += f"|{sk.__version__}|{FORWARD_PATH}|{MEASUREMENT}|{CURVE_ROWS}|{decode_rows}"
    if shards > 1:
        raw += f"|tp{shards}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def measure_target(
    forward: Callable[[int], None], rows: tuple[int, ...] = CURVE_ROWS, reps: int = 5, *, progress: bool = False
) -> dict[int, float]:
    """Median seconds of ``forward(n)`` (a target pass over n new rows) at each n, after one warm-up call each;
    the ``reps`` timings of each n are taken in sweeps over all the row counts, so that a machine whose speed drifts
    during the measurement shifts every n alike instead of the row counts measured last. Then cost(n) = min over
    m >= n of the medians, since a pass over more rows cannot cost less (a spike from machine load at one row count
    would otherwise steer every choice away from it)."""
    bar = _progress(len(rows) * (reps + 1), progress)
    for n in rows:
        forward(n)
        bar.update()
    times: dict[int, list[float]] = {n: [] for n in rows}
    for _ in range(reps):
        for n in rows:
            t0 = time.perf_counter()
            forward(n)
            times[n].append(time.perf_counter() - t0)
            bar.update()
    bar.close()
    out = {n: sorted(t)[len(t) // 2] for n, t in times.items()}
    low = float("inf")
    for n in sorted(out, reverse=True):
        low = out[n] = min(out[n], low)
    return out


def curve_path(key: str) -> Path:
    """Where the curve of ``key`` is cached."""
    return cache_dir() / f"{key}.json"


def cached_curve(key: str) -> CostCurve | None:
    """The cached curve of ``key``, or None (none yet, or a damaged file, which is measured again)."""
    path = curve_path(key)
    if path.is_file():
        try:
            return CostCurve.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError):
            pass
    return None


def cache_problem(key: str) -> str | None:
    """Why the curve of ``key`` could not be cached (the folder cannot be made), or None."""
    path = curve_path(key)
    try:  # before the measurement: a cache that cannot be written is reported without the wait
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return str(_cache_error(path.parent, err))
    return None


def store_curve(key: str, curve: CostCurve) -> None:
    """Write ``curve`` to the cache (atomically: a concurrent reader sees the old file or the new one)."""
    path = curve_path(key)
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(curve.to_json()))
        tmp.replace(path)
    except OSError as err:
        raise _cache_error(path.parent, err) from err


def load_or_measure(
    key: str, forward: Callable[[int], None], *, progress: bool = True, ranks: Ranks | None = None
) -> CostCurve:
    """The cached curve of ``key``, or a fresh measurement written to the cache (a log line at INFO on the
    ``specdec`` logger and, with ``progress``, a tqdm bar on stderr while it runs). Raises
    :class:`~specdec.errors.CacheDirError` naming the directory when the cache cannot be written. ``ranks``: a
    tensor-parallel target's ranks (:mod:`specdec.distributed`): rank 0's cache decides, every rank runs the
    measurement's forwards (they hold the target's collectives), every rank gets rank 0's curve and only rank 0
    writes it."""
    leader = ranks is None or ranks.leader
    found = cached_curve(key) if leader else None
    problem = cache_problem(key) if leader and found is None else None
    if ranks is not None:
        found, problem = ranks.from_leader((found, problem))
    if found is not None:
        return found
    if problem is not None:
        raise CacheDirError(problem)
    log.info("measuring this machine's target pass cost for branching='auto' (once; cached at %s)", curve_path(key))
    t0 = time.perf_counter()
    curve = CostCurve(target=measure_target(forward, progress=progress and leader))
    if ranks is not None:
        curve = ranks.from_leader(curve)
    if leader:
        store_curve(key, curve)
    log.info("measured the pass cost in %.1f s", time.perf_counter() - t0)
    return curve


def _cache_error(folder: Path, err: OSError) -> CacheDirError:
    return CacheDirError(
        f"cannot write the auto trees' cost curve under {folder} ({type(err).__name__}: {err}); set SPECDEC_CACHE "
        "to a writable directory, or pass a fixed branching (e.g. branching=(2, 1)), which measures nothing"
    )


class AcceptanceModel:
    """Acceptance by depth and sibling rank, counted from the rounds (see the module docstring)."""

    def __init__(self, optimism: float = 0.0) -> None:
        if isinstance(optimism, bool) or not isinstance(optimism, (int, float)) or not optimism >= 0.0:
            raise ValueError(f"optimism must be a number >= 0, got {optimism!r}")
        #: posterior standard deviations added to each estimate (0: the posterior mean)
        self.optimism = float(optimism)
        self.hits = [[0.0] * MAX_WIDTH for _ in range(MAX_DEPTH_BUCKETS)]
        self.trials = [[0.0] * MAX_WIDTH for _ in range(MAX_DEPTH_BUCKETS)]
        # track chain: per chain level k (the last bucket shared by deeper ones), rounds that accepted the node above
        # level k's node and those that also accepted it (the node exists only when Max-Gram proposed that far)
        self.track_hits = [0.0] * MAX_DEPTH_BUCKETS
        self.track_trials = [0.0] * MAX_DEPTH_BUCKETS

    @staticmethod
    def _bucket(depth: int) -> int:
        return min(depth, MAX_DEPTH_BUCKETS) - 1

    def _estimate(self, hits: float, trials: float, prior: float) -> float:
        """The Beta posterior's mean (``prior`` as PRIOR_WEIGHT pseudo-counts), plus ``optimism`` of its standard
        deviations; at most 0.99."""
        n = trials + PRIOR_WEIGHT
        mean = (hits + prior * PRIOR_WEIGHT) / n
        if not self.optimism:
            return mean
        return min(mean + self.optimism * (mean * (1.0 - mean) / (n + 1.0)) ** 0.5, 0.99)

    def g(self, depth: int, rank: int) -> float:
        d = self._bucket(depth)
        return self._estimate(self.hits[d][rank], self.trials[d][rank], PRIOR[rank])

    def accept(self, depth: int, width: int) -> float:
        """A_depth(width): the chance that one of ``width`` siblings at ``depth`` is accepted. Each g(depth, k) is
        conditional on the ranks before k having been rejected, so the level misses with the product of the
        siblings' chances to miss."""
        miss = 1.0
        for k in range(min(width, MAX_WIDTH)):
            miss *= 1.0 - self.g(depth, k)
        return min(1.0 - miss, 0.99)

    def observe(self, branching: tuple[int, ...], ranks: list[int], n_accepted: int, depth: int) -> None:
        """One row's round: ``ranks`` (draft-order rank of each accepted child, 0-based) of a tree of constant
        ``branching`` drafted to ``depth`` levels; the level after the accepted path was tried and rejected."""
        for level in range(min(n_accepted + 1, depth)):
            width = min(branching[level], MAX_WIDTH)
            d = self._bucket(level + 1)
            if level < n_accepted:
                r = min(ranks[level], MAX_WIDTH - 1)
                # rank r accepted: ranks 0..r were tried, r succeeded
                for k in range(r + 1):
                    self.trials[d][k] += 1
                self.hits[d][r] += 1
            else:
                for k in range(width):
                    self.trials[d][k] += 1

    def h(self, k: int) -> float:
        """P(track level ``k`` (1-based) is drafted and accepted | the node above it was accepted)."""
        d = self._bucket(k)
        return self._estimate(self.track_hits[d], self.track_trials[d], TRACK_PRIOR)

    def observe_track(self, ranks: list[int], n_accepted: int, depth: int, track: int) -> None:
        """One row's round of a tree ``depth`` levels deep with a chain of ``track`` nodes under its first-child
        path: counted only when that whole path was accepted (the chain's top was reachable)."""
        if track == 0 or n_accepted < depth or any(r != 0 for r in ranks[:depth]):
            return
        for k in range(1, track + 1):
            self.track_trials[self._bucket(k)] += 1
            if n_accepted < depth + k:
                return
            self.track_hits[self._bucket(k)] += 1

    def expected_tokens(self, branching: tuple[int, ...], track: int = 0) -> float:
        """E of the module docstring; a chain of ``track`` nodes under the first-child path adds, once that path
        is accepted (prod_d g[d][0]), prod_{i <= k} h(i) for each chain level k."""
        total, reach, first = 1.0, 1.0, 1.0
        for level, b in enumerate(branching):
            reach *= self.accept(level + 1, b)
            first *= self.g(level + 1, 0)
            total += reach
        for k in range(1, track + 1):
            first *= self.h(k)
            total += first
        return total


def shapes(max_nodes: int, max_depth: int, max_width: int = MAX_WIDTH) -> Iterator[tuple[int, ...]]:
    """Constant-branching shapes (non-increasing widths) of at most ``max_nodes`` nodes counting the root."""

    def grow(prefix: tuple[int, ...], nodes: int, level_size: int) -> Iterator[tuple[int, ...]]:
        if prefix:
            yield prefix
        if len(prefix) == max_depth:
            return
        top = prefix[-1] if prefix else max_width
        for b in range(1, top + 1):
            size = level_size * b
            if nodes + size <= max_nodes:
                yield from grow((*prefix, b), nodes + size, size)

    yield from grow((), 1, 1)


def round_cost(curve: CostCurve, branching: tuple[int, ...], batch: int, track: int = 0) -> float:
    """Seconds of one round: a draft step per level (its rows: the level's parents) and one target pass (over
    the tree and a chain of ``track`` more nodes, which need no draft step)."""
    nodes, size, cost = 1 + track, 1, 0.0
    for level, b in enumerate(branching):
        cost += (curve.draft_cost if level else curve.first_cost)(batch * size)
        size *= b
        nodes += size
    return cost + curve.target_cost(batch * nodes)


def choose(
    curve: CostCurve,
    model: AcceptanceModel,
    batch: int,
    max_nodes: int,
    max_depth: int,
    track: int = 0,
    max_width: int = MAX_WIDTH,
) -> tuple[tuple[int, ...], int, float]:
    """The shape with the most expected tokens per second, its track length and that rate (tokens per second per
    row). The empty shape (no draft: a plain one-token step) competes too, so where no tree pays (large batches on a
    machine whose pass cost grows with rows) the round is plain decoding. ``track``: the longest chain a hybrid
    draft can hang under the first-child path; every length 0 ... ``track`` competes, its nodes counted in
    ``max_nodes`` and, as if always drafted, in the pass cost. ``max_width``: the widest level (2 for SpecHub's
    binary trees)."""
    best: tuple[int, ...] = ()
    best_track = 0
    best_rate = 1.0 / curve.target_cost(batch)
    # E and the draft cost of a shape extend those of its prefix, so the shapes are grown as in shapes() with both
    # carried along (what expected_tokens and round_cost compute, without recomputing every prefix). chain[t]: the
    # track's gain per unit of first-child reach, sum_{k <= t} prod_{i <= k} h_i.
    chain, reach_k = [0.0], 1.0
    for k in range(1, track + 1):
        reach_k *= model.h(k)
        chain.append(chain[-1] + reach_k)

    def grow(
        shape: tuple[int, ...], nodes: int, size: int, tokens: float, reach: float, first: float, draft: float
    ) -> None:
        nonlocal best, best_track, best_rate
        for t in range(track + 1) if shape else ():
            if nodes + t > max_nodes:
                break
            rate = (tokens + first * chain[t]) / (draft + curve.target_cost(batch * (nodes + t)))
            if rate > best_rate:
                best, best_track, best_rate = shape, t, rate
        if len(shape) == max_depth:
            return
        level = len(shape) + 1
        step = draft + (curve.draft_cost if shape else curve.first_cost)(batch * size)
        first_next = first * model.g(level, 0)
        for b in range(1, (shape[-1] if shape else min(max_width, MAX_WIDTH)) + 1):
            if nodes + size * b <= max_nodes:
                r = reach * model.accept(level, b)
                grow((*shape, b), nodes + size * b, size * b, tokens + r, r, first_next, step)

    grow((), 1, 1, 1.0, 1.0, 1.0, 0.0)
    return best, best_track, best_rate
