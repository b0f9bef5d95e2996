"""Exact output law of a CS Drafting round on toy bigram models, by enumeration in float64 (spec section 6).

A cascade below the target: reviewers R_1 .. R_m (bigram matrices, largest first: row x of R_i is the reviewer's
law after token x) and, last, a deterministic proposer standing for Max-Gram: ``table[x]`` is its next token after
x, and one call proposes ``proposal`` tokens by chaining the table. ``steps`` is the step-limit matrix K
((m + 1) x (m + 1), upper triangular): the block reviewed by level r - 1 (the target for r = 0) is filled by drafter
j >= r until it holds ``sum(steps[r][r : j + 1])`` new tokens. Reviewer i accepts a candidate x with probability
min(1, l_i q(x) / p(x)) and otherwise emits a draw of res(q, p); it hands up its accepted prefix and one token with,
per position, the law given by ``law_up(p, q, l_i)`` (the emission law, or a deliberately wrong one) and its own
row at the bonus position. The target's review is exact speculative sampling against those laws.

Every random event is enumerated (acceptances, corrections, bonus draws), so the result is the exact law of what
the round emits; :func:`first_tokens_law` chains rounds for the joint law of the first two generated tokens, which
must equal q(y1 | start) q(y2 | y1) for an exact cascade.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .oracles_tree import residual

#: law_up(p, q, leniency) -> the law handed up for a reviewed position (p: the candidate's law, q: the reviewer's)
LawUp = Callable[[np.ndarray, np.ndarray, float], np.ndarray]
Outcome = tuple[float, tuple[int, ...], list[np.ndarray]]  # probability, tokens, one law per token


def emission_law_np(p: np.ndarray, q: np.ndarray, leniency: float) -> np.ndarray:
    """E = sum_x p(x) [a(x) delta_x + (1 - a(x)) res(q, p)] with a(x) = min(1, l q(x) / p(x)), summed over the
    candidate x (an enumeration, not the closed form)."""
    out = np.zeros_like(q)
    rho = residual(q, p)
    for x in np.nonzero(p > 0)[0]:
        a = min(1.0, leniency * q[x] / p[x])
        out[x] += p[x] * a
        out += p[x] * (1.0 - a) * rho
    return out


@dataclass(frozen=True)
class ToyCascade:
    """Reviewers [m][V, V] (largest first), target [V, V], proposer table [V], steps (m + 1) x (m + 1), one
    leniency per reviewer, tokens per proposer call."""

    target: np.ndarray
    reviewers: Sequence[np.ndarray]
    table: np.ndarray
    steps: Sequence[Sequence[int]]
    leniency: Sequence[float]
    proposal: int

    @property
    def vocab(self) -> int:
        return int(self.target.shape[-1])


def _review(rows: np.ndarray, leniency: float, ctx: int, block: tuple[int, ...], laws: list[np.ndarray], up: LawUp):
    """Enumerated outcomes of one review by ``rows`` (a bigram matrix) of ``block`` after token ``ctx``."""
    out: list[Outcome] = []
    reach = 1.0
    prev = ctx
    handed: list[np.ndarray] = []
    for i, (x, p) in enumerate(zip(block, laws, strict=True)):
        q = rows[prev]
        a = min(1.0, leniency * q[x] / p[x]) if p[x] > 0 else float(q[x] > 0)
        law = up(p, q, leniency)
        rej = reach * (1.0 - a)
        if rej > 0:
            rho = residual(q, p)
            for t in np.nonzero(rho > 0)[0]:
                out.append((rej * rho[t], (*block[:i], int(t)), [*handed, law]))
        reach *= a
        handed.append(law)
        prev = x
        if reach == 0:
            return out
    q = rows[prev]
    for t in np.nonzero(q > 0)[0]:
        out.append((reach * q[t], (*block, int(t)), [*handed, q]))
    return out


def _propose(c: ToyCascade, j: int, ctx: tuple[int, ...], up: LawUp) -> list[Outcome]:
    m = len(c.reviewers)
    if j == m:  # the deterministic proposer: point masses
        toks, last = [], ctx[-1]
        for _ in range(c.proposal):
            last = int(c.table[last])
            toks.append(last)
        return [(1.0, tuple(toks), [np.eye(c.vocab)[t] for t in toks])]
    out = []
    for pr, block, laws in _build(c, j + 1, ctx, up):
        for pr2, toks, handed in _review(c.reviewers[j], c.leniency[j], ctx[-1], block, laws, up):
            out.append((pr * pr2, toks, handed))
    return out


def _build(c: ToyCascade, first: int, ctx: tuple[int, ...], up: LawUp) -> list[Outcome]:
    """Outcomes of the block reviewed by level ``first - 1`` after the sequence ``ctx``."""
    outcomes: list[Outcome] = [(1.0, (), [])]
    quota = 0
    for j in range(first, len(c.reviewers) + 1):
        quota += c.steps[first][j]
        done: list[Outcome] = []
        todo = outcomes
        while todo:
            more = []
            for pr, toks, laws in todo:
                if len(toks) >= quota:
                    done.append((pr, toks, laws))
                    continue
                for pr2, t2, l2 in _propose(c, j, ctx + toks, up):
                    more.append((pr * pr2, toks + t2, laws + l2))
            todo = more
        outcomes = done
    return outcomes


def round_law(c: ToyCascade, start: int, up: LawUp) -> dict[tuple[int, ...], float]:
    """Probability of each emitted sequence of one round from ``start``, cut to its first two tokens."""
    law: dict[tuple[int, ...], float] = {}
    for pr, block, laws in _build(c, 0, (start,), up):
        for pr2, toks, _ in _review(c.target, 1.0, start, block, laws, up):
            key = toks[:2]
            law[key] = law.get(key, 0.0) + pr * pr2
    return law


def first_tokens_law(c: ToyCascade, start: int, up: LawUp) -> np.ndarray:
    """Exact joint law [V, V] of the first two generated tokens: a round that emits one token y1 is followed by a
    round from y1."""
    v = c.vocab
    rounds = {s: round_law(c, s, up) for s in range(v)}
    first = np.zeros((v, v))
    for s, law in rounds.items():
        for key, pr in law.items():
            first[s, key[0]] += pr
    out = np.zeros((v, v))
    for key, pr in rounds[start].items():
        if len(key) == 2:
            out[key] += pr
        else:
            out[key[0]] += pr * first[key[0]]
    return out
