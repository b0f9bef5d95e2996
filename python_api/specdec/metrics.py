"""Per-call statistics of a generation: calls, block efficiency, acceptance vectors, MBSU, wall time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

TIME_BUCKETS = ("prefill", "draft", "target", "verify", "other")


@dataclass
class GenerationStats:
    """Counters of one ``generate`` call. Derived metrics are properties.

    * ``target_calls``: target forwards during decoding (one per round; prompt catch-up counted in
      ``prefill_calls``); ``draft_calls``: drafter calls (model forwards for a neural draft, lookups for n-gram).
    * ``row_rounds``: sum over rounds of the rows still decoding; block efficiency = emitted / row_rounds.
    * ``accepted_hist[m]``: row-rounds that accepted exactly m draft tokens.
    * ``rank_accepts[k]``: verification steps (visited nodes that had draft children) that accepted the child of
      sibling rank k (draft order); ``verify_steps``: their number.
    * ``times``: seconds per bucket: prefill (prompt catch-up of the target), draft (drafter + child sampling;
      a neural drafter reads the prompt inside its first draft call),
      target (target forward + lm_head), verify (target processing + tree verification), other (bookkeeping,
      KV filtering); ``wall_time``: the whole call.
    """

    method: str
    batch_size: int = 0
    draft_depth: int = 0
    target_params: int = 0
    draft_params: int = 0
    new_tokens: int = 0
    target_calls: int = 0
    prefill_calls: int = 0
    draft_calls: int = 0
    row_rounds: int = 0
    emitted: int = 0
    accepted_hist: list[int] = field(default_factory=list)
    rank_accepts: list[int] = field(default_factory=list)
    verify_steps: int = 0
    times: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIME_BUCKETS, 0.0))
    wall_time: float = 0.0

    @contextmanager
    def timer(self, bucket: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[bucket] += time.perf_counter() - t0

    def record_round(self, n_accepted: int, emitted: int, ranks: list[int], steps: int) -> None:
        """One row's outcome in one round."""
        self.row_rounds += 1
        self.emitted += emitted
        if n_accepted >= len(self.accepted_hist):
            self.accepted_hist.extend([0] * (n_accepted + 1 - len(self.accepted_hist)))
        self.accepted_hist[n_accepted] += 1
        for r in ranks:
            if r >= len(self.rank_accepts):
                self.rank_accepts.extend([0] * (r + 1 - len(self.rank_accepts)))
            self.rank_accepts[r] += 1
        self.verify_steps += steps

    @property
    def block_efficiency(self) -> float:
        """Tokens emitted per row per target call (accepted + the correction/bonus token; AR = 1)."""
        return self.emitted / self.row_rounds if self.row_rounds else 0.0

    @property
    def acceptance_by_depth(self) -> list[float]:
        """[d-1] = fraction of row-rounds that accepted at least d draft tokens, d = 1..max accepted."""
        total = sum(self.accepted_hist)
        if not total:
            return []
        out, tail = [], total
        for m in range(1, len(self.accepted_hist)):
            tail -= self.accepted_hist[m - 1]
            out.append(tail / total)
        return out

    @property
    def acceptance_by_rank(self) -> list[float]:
        """[k] = fraction of verification steps that accepted the sibling of rank k."""
        if not self.verify_steps:
            return []
        return [c / self.verify_steps for c in self.rank_accepts]

    @property
    def acceptance_rate(self) -> float:
        """Fraction of verification steps that accepted some draft child."""
        return sum(self.rank_accepts) / self.verify_steps if self.verify_steps else 0.0

    @property
    def draft_ratio(self) -> float:
        """r = draft parameters / target parameters (0 for statistical drafters)."""
        return self.draft_params / self.target_params if self.target_params else 0.0

    @property
    def mbsu(self) -> float:
        """Memory-bound speed-up eta / (L r + 1), L = draft depth."""
        return self.block_efficiency / (self.draft_depth * self.draft_ratio + 1.0)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain-data summary (for tables, CSV or JSON)."""
        return {
            "method": self.method,
            "batch_size": self.batch_size,
            "new_tokens": self.new_tokens,
            "target_calls": self.target_calls,
            "prefill_calls": self.prefill_calls,
            "draft_calls": self.draft_calls,
            "block_efficiency": self.block_efficiency,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_by_depth": self.acceptance_by_depth,
            "acceptance_by_rank": self.acceptance_by_rank,
            "mbsu": self.mbsu,
            "draft_ratio": self.draft_ratio,
            "tokens_per_second": self.tokens_per_second,
            "wall_time": self.wall_time,
            **{f"time_{k}": v for k, v in self.times.items()},
        }

    def merge(self, other: GenerationStats) -> None:
        """Add ``other``'s counters (e.g. to aggregate several calls of one method)."""
        self.batch_size += other.batch_size
        self.new_tokens += other.new_tokens
        self.target_calls += other.target_calls
        self.prefill_calls += other.prefill_calls
        self.draft_calls += other.draft_calls
        self.verify_steps += other.verify_steps
        self.row_rounds += other.row_rounds
        self.emitted += other.emitted
        for dst, src in ((self.accepted_hist, other.accepted_hist), (self.rank_accepts, other.rank_accepts)):
            if len(dst) < len(src):
                dst.extend([0] * (len(src) - len(dst)))
            for i, v in enumerate(src):
                dst[i] += v
        for k, v in other.times.items():
            self.times[k] = self.times.get(k, 0.0) + v
        self.wall_time += other.wall_time
        self.draft_depth = max(self.draft_depth, other.draft_depth)
        self.target_params = self.target_params or other.target_params
        self.draft_params = self.draft_params or other.draft_params
