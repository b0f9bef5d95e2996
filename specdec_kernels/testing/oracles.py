"""Independent float64 NumPy oracles for the node-level ops (docs/methods.md, docs/exactness.md).

Written independently of ``specdec_kernels.reference``, so that the tests compare two implementations. Contents:

* closed-form acceptance probabilities of every node verifier (each draft process's optimum: ``testing.optimum``);
* exact drafting laws: i.i.d. tuples, sampling without replacement (SWOR), SpecHub's hub pairs and greedy draft
  sampling, and the sequence-level SWOR law used by the stochastic-beam-search oracle;
* the node test chains of every verifier live in ``testing.chains`` (``node_chain``, :class:`ChainVerifier`,
  ``oracle_verifier``), derived from the definitions by another route than the reference's;
* the exact-enumeration harness (:func:`enumerate_node`, docs/exactness.md), which feeds every candidate tuple with
  positive drafting probability to a verifier in analytic mode and accumulates the output law, and a Monte Carlo harness
  (:func:`node_trials`) that drafts with the public sampling ops and verifies in sampling mode.

Vectors are 1-D float64 arrays over the vocabulary; ``p`` is the draft law, ``q`` the target law (the notation of
docs/methods.md).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..ops import NodeVerdict, gds_sample, gumbel_topk, sample_categorical, spechub_sample, verify_node

ZERO_MASS_TOL = 1e-12  # zero-mass rule (docs/exactness.md), fp64 oracles
SWOR_MASS_EPS = 1e-7  # Gumbel-top-k: no further draws once the remaining draft mass is this small

Chain = tuple[list[tuple[int, float, float]], np.ndarray]
ChainFn = Callable[[str, Sequence[int], np.ndarray, np.ndarray, "int | None"], Chain]
Verifier = Callable[..., NodeVerdict]


def as_law(x: Sequence[float] | np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def normalize(x: np.ndarray) -> np.ndarray:
    return x / x.sum()


def residual(r: np.ndarray, s: np.ndarray, tol: float = ZERO_MASS_TOL) -> np.ndarray:
    """res(r, s) = Norm[(r - s)^+]; keeps r when the mass is numerically zero (the zero-mass rule)."""
    m = np.maximum(r - s, 0.0)
    tot = m.sum()
    return r.copy() if tot <= tol else m / tot


def hub_of(p: np.ndarray) -> int:
    """SpecHub hub token: argmax p, lowest id on ties (np.argmax returns the first maximum)."""
    return int(np.argmax(p))


def exact_tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(as_law(a) - as_law(b)).sum())


# ---------------------------------------------------------------------------------------------------------------
# Closed-form acceptance


@dataclass(frozen=True)
class Acceptance:
    total: float
    per_slot: np.ndarray  # unconditional probability that slot j (draft position) is the accepted one


def sd_acceptance(p: np.ndarray, q: np.ndarray) -> float:
    return float(np.minimum(p, q).sum())


def rrs_acceptance(p: np.ndarray, q: np.ndarray, k: int) -> Acceptance:
    """K i.i.d. drafts: beta_k = sum min(p, r_k), r_{k+1} = res(r_k, p)."""
    r = q
    reach = 1.0
    slots = []
    for _ in range(k):
        beta = float(np.minimum(p, r).sum())
        slots.append(reach * beta)
        reach *= 1.0 - beta
        r = residual(r, p)
    return Acceptance(1.0 - reach, np.array(slots))


def _without(s: np.ndarray, x: int) -> np.ndarray:
    t = s.copy()
    t[x] = 0.0
    return t


def _rrsw_total(s: np.ndarray, r: np.ndarray, k: int, mass: float) -> float:
    """A(s, r, k); ``mass`` = original draft mass left (SWOR stops below 1e-7)."""
    if k == 0 or mass <= SWOR_MASS_EPS:
        return 0.0
    acc = np.minimum(s, r)
    total = float(acc.sum())
    r_next = residual(r, s)
    for x in np.flatnonzero(s > acc):
        rest = _without(s, x)
        if rest.sum() <= 0:
            continue
        total += float(s[x] - acc[x]) * _rrsw_total(normalize(rest), r_next, k - 1, mass * (1.0 - s[x]))
    return total


def rrsw_acceptance(p: np.ndarray, q: np.ndarray, k: int) -> Acceptance:
    """Drafts without replacement: recursion A(p, q, K); slot j rate = A(.., j+1) - A(.., j)."""
    cum = [0.0] + [_rrsw_total(p, q, j, 1.0) for j in range(1, k + 1)]
    return Acceptance(cum[-1], np.diff(cum))


def kseq_gamma(p: np.ndarray, q: np.ndarray, k: int, iters: int = 200) -> tuple[float, float]:
    """Smallest g in [1, K] with h(g) = sum min(g p, q) - 1 + (1 - beta(g))^K >= 0 (K-SEQ), and beta(g)."""

    def beta(g: float) -> float:
        return float(np.minimum(p, q / g).sum())

    def h(g: float) -> float:
        return float(np.minimum(g * p, q).sum()) - 1.0 + (1.0 - beta(g)) ** k

    # p = q: beta(1) is the rows' common mass (which an fp32 row only approximates by 1), so gamma = 1
    if k <= 1 or beta(1.0) >= max(p.sum(), q.sum()) - 1e-12 or h(1.0) >= 0.0:
        return 1.0, beta(1.0)
    lo, hi = 1.0, float(k)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if h(mid) >= 0.0:
            hi = mid
        else:
            lo = mid
    return hi, beta(hi)


def kseq_acceptance(p: np.ndarray, q: np.ndarray, k: int) -> Acceptance:
    _, beta = kseq_gamma(p, q, k)
    slots = np.array([beta * (1.0 - beta) ** j for j in range(k)])
    return Acceptance(1.0 - (1.0 - beta) ** k, slots)


@dataclass(frozen=True)
class HubParts:
    """The SpecHub transport plan (vectors over the vocabulary, hub entry 0)."""

    hub: int
    qai: np.ndarray  # Q(a, i), the sampler's law of the pair (a, i)
    a1: np.ndarray
    a2: np.ndarray
    a3: float
    a4: float
    s_ai: float
    s_ia: float
    final: np.ndarray  # normalized final residual (zero-mass rule: q)


def spechub_parts(p: np.ndarray, q: np.ndarray, hub: int | None = None) -> HubParts:
    """SpecHub's transport plan built on the pair law of the sampler's two draws (Gumbel-top-2 of p, as in
    :func:`draft_law`): Q(i, a) = P(y1 = i) and Q(a, i) = P(y1 = a) P(y2 = i | y1 = a), each draw normalised by the
    mass it was drawn from, so a verifier that normalises Q(a, i) otherwise disagrees with this plan."""
    a = hub_of(p) if hub is None else hub
    # The two draws of the sampler, each over what is left, with its own normaliser (the sum of what is left); a node
    # with two candidates had a second draw, whatever side of the cut-off p(a) lies on here.
    off = np.ones_like(p, dtype=bool)
    off[a] = False
    w = as_law(p)
    first = w / w.sum()  # law of y1
    left_after_hub = w[off].sum()  # what the second draw of a pair (a, i) is normalised by
    q_ia = np.where(off, first, 0.0)  # Q(i, a) = P(y1 = i)
    q_ai = np.where(off, first[a] * w / left_after_hub, 0.0) if left_after_hub > 0 else np.zeros_like(w)
    a1 = np.where(off, np.minimum(q_ia, q), 0.0)
    q1 = np.where(off, q - a1, 0.0)
    a2 = np.minimum(q_ai, q1)
    s_ai, s_ia = float((q_ai - a2).sum()), float((q_ia - a1).sum())
    a3 = min(float(q[a]), s_ai)
    a4 = min(float(q[a]) - a3, s_ia)
    fin = q1 - a2
    fin[a] = max(float(q[a]) - a3 - a4, 0.0)
    tot = fin.sum()
    fin = q.copy() if tot <= ZERO_MASS_TOL else fin / tot
    return HubParts(a, q_ai, a1, a2, a3, a4, s_ai, s_ia, fin)


def spechub_acceptance(p: np.ndarray, q: np.ndarray) -> Acceptance:
    """Total min(1, q(a) + sum_{i != a} min(q(i), p(i) / p(not a))); slots (sum A1 + A3, sum A2 + A4)."""
    a = hub_of(p)
    if 1.0 - p[a] <= SWOR_MASS_EPS:  # single draft: plain SD
        alpha = sd_acceptance(p, q)
        return Acceptance(alpha, np.array([alpha, 0.0]))
    hp = spechub_parts(p, q, a)
    off = np.arange(len(p)) != a
    total = min(1.0, float(q[a] + np.minimum(q[off], p[off] / p[off].sum()).sum()))
    return Acceptance(total, np.array([hp.a1.sum() + hp.a3, hp.a2.sum() + hp.a4]))


def gds_split(p: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy draft sampling's parts: D, the k - 1 most likely tokens (ties to the lower id; at most all but one
    token of p's support, so that a draw is left), and the law of the sampled draft, p without D renormalised."""
    p = normalize(as_law(p))
    support = int((p > 0).sum())
    top = np.argsort(-p, kind="stable")[: max(0, min(k - 1, support - 1))]
    rest = p.copy()
    rest[top] = 0.0
    return top, rest / rest.sum()


def gds_acceptance(p: np.ndarray, q: np.ndarray, k: int) -> Acceptance:
    """The optimum q(D) + sum_{x not in D} min(q(x), p'(x)): slot j < |D| at rate q(d_j), the draw sum min(q, p')."""
    top, sampled = gds_split(p, k)
    off = np.ones(len(q), dtype=bool)
    off[top] = False
    slots = np.zeros(k)
    slots[: len(top)] = q[top]
    slots[len(top)] = float(np.minimum(q[off], sampled[off]).sum())
    return Acceptance(float(slots.sum()), slots)


def acceptance(method: str, p: np.ndarray, q: np.ndarray, k: int) -> Acceptance:
    """Closed-form acceptance of ``method`` with ``k`` candidates."""
    p, q = as_law(p), as_law(q)
    if method == "sd":
        if k != 1:
            raise ValueError(f"sd has K = 1, got {k}")
        alpha = sd_acceptance(p, q)
        return Acceptance(alpha, np.array([alpha]))
    if method == "rrs":
        return rrs_acceptance(p, q, k)
    if method == "rrsw":
        return rrsw_acceptance(p, q, k)
    if method == "kseq":
        return kseq_acceptance(p, q, k)
    if method == "spechub":
        if k != 2:
            raise ValueError(f"spechub has K = 2, got {k}")
        return spechub_acceptance(p, q)
    if method == "gds":
        return gds_acceptance(p, q, k)
    raise ValueError(f"unknown method {method!r}")


# ---------------------------------------------------------------------------------------------------------------
# Drafting laws


def _weights(logp: np.ndarray) -> np.ndarray:
    """The sampler's unnormalised weights exp(logp) in float64; -inf gives 0 (never drawn)."""
    return np.exp(np.asarray(logp, dtype=np.float64))


def _swor(w: np.ndarray, k: int) -> dict[tuple[int, ...], float]:
    """Sequential draws without replacement as Gumbel-top-k makes them: the next item is x with
    probability w(x) / (sum w - sum of the items drawn so far); a slot exists only while the item has positive weight
    and 1 - (sum of the weights drawn so far) > 1e-7, the op's cut-off on its unnormalised weights."""
    out: dict[tuple[int, ...], float] = {}

    def rec(prefix: tuple[int, ...], prob: float, drawn: float) -> None:
        used = np.zeros(len(w), dtype=bool)
        used[list(prefix)] = True
        left = float(w[~used].sum())
        if len(prefix) == k or 1.0 - drawn <= SWOR_MASS_EPS or not (w[~used] > 0).any():
            out[prefix] = out.get(prefix, 0.0) + prob
            return
        for x in np.flatnonzero((w > 0) & ~used):
            rec(prefix + (int(x),), prob * w[x] / left, drawn + float(w[x]))

    rec((), 1.0, 0.0)
    return out


def draft_law(method: str, logp: Sequence[float] | np.ndarray | torch.Tensor, k: int) -> dict[tuple[int, ...], float]:
    """Law of the valid candidate tuple a sampling op draws from the log-probs ``logp`` it is given, in float64.

    The draft process is enumerated step by step as the op runs it, with its own normalisers: i.i.d. Gumbel-max draws
    (sd, rrs, kseq) are w(x) / sum w with w = exp(logp); Gumbel-top-k (rrsw) divides by the weight not yet drawn and
    stops at the op's cut-off; SpecHub draws the Gumbel-top-2 (y1, y2), keeps (a, y2) if y1 is the hub a = argmax
    logp and (y1, a) otherwise, and keeps y1 alone when 1 - w(a) <= 1e-7. Nothing here uses a closed form of the
    pair law, so ``logp`` of float32 rows gives the law the kernels really draw from.
    """
    lp = as_law(logp)
    w = _weights(lp)
    if method in ("sd", "rrs", "kseq"):
        if method == "sd" and k != 1:
            raise ValueError(f"sd has K = 1, got {k}")
        law = w / w.sum()
        support = [int(x) for x in np.flatnonzero(w > 0)]
        return {t: float(np.prod([law[x] for x in t])) for t in itertools.product(support, repeat=k)}
    if method == "rrsw":
        return _swor(w, k)
    if method == "spechub":
        if k != 2:
            raise ValueError(f"spechub has K = 2, got {k}")
        a = int(np.argmax(lp))
        single = 1.0 - float(w[a]) <= SWOR_MASS_EPS
        out: dict[tuple[int, ...], float] = {}
        for ys, prob in _swor(w, 2).items():
            if ys[0] == a:
                t = (a, ys[1]) if len(ys) == 2 and not single else (a,)
            else:
                t = (ys[0],) if single else (ys[0], a)
            out[t] = out.get(t, 0.0) + prob
        return out
    if method == "gds":
        top, drawn = gds_split(w, k)
        head = tuple(int(x) for x in top)
        return {(*head, int(x)): float(drawn[x]) for x in np.flatnonzero(drawn > 0)}
    raise ValueError(f"unknown method {method!r}")


def swor_law(probs: Sequence[float] | np.ndarray, k: int) -> dict[tuple[int, ...], float]:
    """Law of the ordered draw of ``k`` items without replacement (= Gumbel-top-k order) from the law
    ``probs`` (normalised first): P(x_1..x_k) = prod_j p(x_j) / (1 - sum_{i<j} p(x_i)). Tuples are shorter than
    ``k`` when the support is exhausted or the remaining mass falls to <= 1e-7 (the op marks those slots invalid)."""
    return _swor(normalize(as_law(probs)), k)


def iid_joint(p: np.ndarray, k: int) -> dict[tuple[int, ...], float]:
    return draft_law("rrs", _log(normalize(as_law(p))), k)


def hub_joint(p: np.ndarray) -> dict[tuple[int, ...], float]:
    """SpecHub's draft pairs as the sampler draws them from the law ``p``: for i != a, Q(i, a) = p(i) and
    Q(a, i) = p(a) p(i) / p(not a), read off the enumerated draft process (:func:`draft_law`)."""
    return draft_law("spechub", _log(as_law(p)), 2)


@dataclass(frozen=True)
class DraftTuple:
    tokens: tuple[int, ...]  # valid candidates in slot order (shorter than K = missing slots)
    weight: float  # drafting probability


def draft_tuples(method: str, p: np.ndarray, k: int, logp: np.ndarray | None = None) -> list[DraftTuple]:
    """Every candidate tuple with positive drafting probability (for exact enumeration), drawn by the sampling op from
    ``logp`` (default log p)."""
    lp = _log(as_law(p)) if logp is None else as_law(logp)
    return [DraftTuple(t, w) for t, w in draft_law(method, lp, k).items() if w > 0]


def seq_swor_pair_law(p1: np.ndarray, p2: np.ndarray) -> np.ndarray:
    """Sequence-level SWOR law of the ordered top-2 of length-2 sequences (the stochastic-beam-search oracle).

    ``p1`` [V] first-token law, ``p2`` [V, V] rows p(y | x). Returns P[s, s'] over flattened sequences
    s = x * V + y: P(s) P(s') / (1 - P(s)) for s != s'.
    """
    seq = (as_law(p1)[:, None] * as_law(p2)).ravel()
    law = np.zeros((seq.size, seq.size))
    for (s, s2), w in swor_law(seq, 2).items():
        law[s, s2] = w
    return law


# ---------------------------------------------------------------------------------------------------------------
# Verifier callables (the node test chains: testing/chains.py)


def test_order(method: str, cand: Sequence[int], hub: int | None) -> list[int]:
    """Order in which a node's valid candidates are tested (SpecHub (a, i) tests slot 1 first)."""
    if method == "spechub" and len(cand) == 2 and cand[0] == hub:
        return [1, 0]
    if method == "gds":  # the sampled draft (last slot) first
        return [len(cand) - 1, *range(len(cand) - 1)]
    return list(range(len(cand)))


def _gumbel(u: np.ndarray) -> np.ndarray:
    return -np.log(-np.log(u))


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(x)


# ---------------------------------------------------------------------------------------------------------------
# Exact enumeration and Monte Carlo harnesses (docs/exactness.md)


@dataclass(frozen=True)
class NodeLaw:
    law: np.ndarray  # [V] law of the emitted token
    accept: float  # probability that some candidate is accepted
    slot_rates: np.ndarray  # [K] unconditional acceptance probability of each slot

    def max_error(self, q: np.ndarray) -> float:
        return float(np.abs(self.law - as_law(q)).max())

    def tv(self, q: np.ndarray) -> float:
        return exact_tv(self.law, q)


def enumerate_node(
    method: str,
    p: Sequence[float] | np.ndarray,
    q: Sequence[float] | np.ndarray,
    k: int,
    *,
    verifier: Verifier = verify_node,
    dtype: torch.dtype = torch.float64,
) -> NodeLaw:
    """Exact output law of one node, run THROUGH ``verifier`` in analytic mode.

    As in the decoders, the sampling op draws from log p in ``dtype`` and the verifier gets softmax of those log-probs
    (float32) or p itself (float64), and q as a ``dtype`` row; the drafting law is the op's own (:func:`draft_law`),
    so a verifier whose normalisers differ from the sampler's shows up here.
    Every candidate tuple with positive drafting probability (V^K i.i.d. tuples for sd/rrs/kseq, ordered
    K-permutations for rrsw, the 2(V-1) hub pairs for spechub) becomes one row of a single verifier call; the
    returned per-slot acceptance probabilities and final residual are chained in the verifier's test order.
    """
    p, q = as_law(p), as_law(q)
    vocab = len(p)
    # The decoders' pipeline: the sampler draws from log-probs in ``dtype`` and the verifier gets their softmax.
    logp_row = torch.log(torch.tensor(p, dtype=torch.float64)).to(dtype)
    p_row = torch.tensor(p, dtype=dtype) if dtype == torch.float64 else torch.softmax(logp_row, dim=-1)
    tuples = draft_tuples(method, p, k, logp=logp_row.double().numpy())
    hub = int(torch.argmax(logp_row)) if method == "spechub" else None
    n = len(tuples)
    cand = torch.full((n, k), -1, dtype=torch.long)
    valid = torch.zeros((n, k), dtype=torch.bool)
    for b, t in enumerate(tuples):
        cand[b, : len(t.tokens)] = torch.tensor(t.tokens)
        valid[b, : len(t.tokens)] = True
    pt = p_row.expand(n, vocab).contiguous()
    qt = torch.tensor(q, dtype=dtype).expand(n, vocab).contiguous()
    hub_t = None if hub is None else torch.full((n,), hub, dtype=torch.long)
    out = verifier(method, cand, valid, pt, qt, hub=hub_t, seed=0, analytic=True)
    acc_prob = as_law(out.accept_prob)
    final = as_law(out.final_residual)
    # the final token is a Gumbel-max draw over log(final): its law is the row over its own float64 sum
    final = final / np.maximum(final.sum(axis=1, keepdims=True), np.finfo(np.float64).tiny)
    law = np.zeros(vocab)
    slot_rates = np.zeros(k)
    for b, t in enumerate(tuples):
        reach = t.weight
        for j in test_order(method, t.tokens, hub):
            a = acc_prob[b, j]
            law[t.tokens[j]] += reach * a
            slot_rates[j] += reach * a
            reach *= 1.0 - a
        law += reach * final[b]
    return NodeLaw(law, float(slot_rates.sum()), slot_rates)


@dataclass(frozen=True)
class NodeTrials:
    token_counts: np.ndarray  # [V] emitted tokens
    slot_counts: np.ndarray  # [K] accepted slot
    n: int

    @property
    def accept_rate(self) -> float:
        return float(self.slot_counts.sum()) / self.n


def draft_candidates(
    method: str, p: torch.Tensor, k: int, generator: torch.Generator, logp: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Draft K candidates per row with the public sampling ops: p [N, V] -> cand, valid, hub.
    ``logp``: the log-probs the ops draw from (default log p)."""
    logp = torch.log(p) if logp is None else logp
    if method in ("sd", "rrs", "kseq"):
        cand = torch.stack([sample_categorical(logp, generator=generator) for _ in range(k)], dim=-1)
        return cand, torch.ones_like(cand, dtype=torch.bool), None
    if method == "rrsw":
        d = gumbel_topk(logp, min(k, logp.shape[-1]), generator=generator)
        pad = k - d.tokens.shape[-1]  # K > V: the missing draws are invalid slots
        tokens = torch.cat([d.tokens, torch.full_like(d.tokens[:, :1], -1).expand(-1, pad)], dim=-1)
        valid = torch.cat([d.valid, torch.zeros_like(d.valid[:, :1]).expand(-1, pad)], dim=-1)
        return tokens, valid, None
    if method == "spechub":
        d = spechub_sample(logp, generator=generator)
        return d.tokens, d.valid, d.hub
    if method == "gds":
        g = gds_sample(logp, min(k, logp.shape[-1]), generator=generator)
        pad = k - g.tokens.shape[-1]
        tokens = torch.cat([g.tokens, torch.full_like(g.tokens[:, :1], -1).expand(-1, pad)], dim=-1)
        return tokens, torch.cat([g.valid, torch.zeros_like(g.valid[:, :1]).expand(-1, pad)], dim=-1), None
    raise ValueError(f"unknown method {method!r}")


def node_trials(
    method: str,
    p: Sequence[float] | np.ndarray,
    q: Sequence[float] | np.ndarray,
    k: int,
    n: int,
    *,
    seed: int,
    verifier: Verifier = verify_node,
    dtype: torch.dtype = torch.float64,
) -> NodeTrials:
    """``n`` independent node trials as the rows of one call: fresh drafts, fresh acceptance/final noise."""
    vocab = len(p)
    gen = torch.Generator().manual_seed(seed)
    # the decoders' pipeline, as in enumerate_node: draws from log-probs in ``dtype``, the verifier gets their softmax
    logp_row = torch.log(torch.tensor(as_law(p), dtype=torch.float64)).to(dtype)
    p_row = torch.tensor(as_law(p), dtype=dtype) if dtype == torch.float64 else torch.softmax(logp_row, dim=-1)
    pt = p_row.expand(n, vocab).contiguous()
    qt = torch.tensor(as_law(q), dtype=dtype).expand(n, vocab).contiguous()
    cand, valid, hub = draft_candidates(method, pt.double(), k, gen, logp=logp_row.expand(n, vocab).contiguous())
    out = verifier(method, cand, valid, pt, qt, hub=hub, generator=gen)
    tokens = out.token.numpy()
    slots = out.slot.numpy()
    return NodeTrials(
        np.bincount(tokens, minlength=vocab).astype(np.float64),
        np.bincount(slots[slots >= 0], minlength=k).astype(np.float64),
        n,
    )


def tv_bound(n: int, bins: int, false_alarm: float = 1e-6) -> float:
    """Bound on the empirical TV of ``n`` samples from the true law, exceeded with probability <= false_alarm.

    E||p_hat - p||_1 <= sqrt((bins - 1) / n), and ||p_hat - p||_1 has bounded differences 2/n (McDiarmid), so
    P(TV > (sqrt((bins - 1)/n) + sqrt(2 ln(1/false_alarm) / n)) / 2) <= false_alarm.
    """
    return 0.5 * (math.sqrt(max(bins - 1, 1) / n) + math.sqrt(2.0 * math.log(1.0 / false_alarm) / n))


# ---------------------------------------------------------------------------------------------------------------
# Logits processing and stochastic beam search


def process_logits_oracle(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Logits processing in float64 on one row: temperature, top-k (ties kept), top-p (stable order), log-softmax."""
    x = as_law(logits).copy()
    if temperature < 1e-5:
        out = np.full_like(x, -np.inf)
        out[int(np.argmax(x))] = 0.0
        return out
    x = x / temperature
    if 0 < top_k < len(x):
        kth = np.sort(x)[::-1][top_k - 1]
        x = np.where(x >= kth, x, -np.inf)
    if top_p < 1.0:
        probs = np.exp(x - x.max())
        probs /= probs.sum()
        order = np.argsort(-probs, kind="stable")
        before = np.concatenate([[0.0], np.cumsum(probs[order])[:-1]])
        keep = np.zeros(len(x), dtype=bool)
        keep[order[before < top_p]] = True
        keep[order[0]] = True
        x = np.where(keep, x, -np.inf)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def log1mexp(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(a > -math.log(2.0), np.log(-np.expm1(a)), np.log1p(-np.exp(a)))


def trunc_stable(u: float, phit: np.ndarray, z: float) -> np.ndarray:
    """Trunc(u, phit, Z) = u - softplus(u - phit + log1mexp(phit - Z)) with the reference's guards."""
    phit = np.asarray(phit, dtype=np.float64)
    safe = np.where(np.isfinite(phit), phit, z)
    v = u - safe + log1mexp(np.minimum(safe - z, 0.0))
    out = u - (np.maximum(v, 0.0) + np.log1p(np.exp(-np.abs(v))))
    out = np.where(phit == z, u, out)
    return np.where(np.isfinite(phit), out, -np.inf)


def trunc_naive(u: float, phit: np.ndarray, z: float) -> np.ndarray:
    """RSD eq. (11) as written: -log(exp(-u) - exp(-Z) + exp(-phit)) (overflows for large scores)."""
    phit = np.asarray(phit, dtype=np.float64)
    return -np.log(np.exp(-u) - np.exp(-z) + np.exp(-phit))


def sbs_step_oracle(
    logp: np.ndarray, sigma: np.ndarray, gamma: np.ndarray, beam_valid: np.ndarray, w_out: int, noise: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One SBS step on one batch row: logp [Win, V], noise [Win, V] uniforms.

    Returns parent_slot, tokens, sigma', gamma', valid of length ``w_out`` (descending gamma', ties -> lowest
    flattened index; invalid entries -1 / -inf)."""
    w_in, vocab = logp.shape
    psi = np.full((w_in, vocab), -np.inf)
    phi = sigma[:, None] + logp
    for k in range(w_in):
        if not beam_valid[k]:
            continue
        phit = phi[k] + _gumbel(noise[k])
        psi[k] = trunc_stable(gamma[k], phit, phit.max())
    flat = psi.ravel()
    order = np.argsort(-flat, kind="stable")[:w_out]
    g = flat[order]
    valid = np.isfinite(g)
    parent = np.where(valid, order // vocab, -1)
    tokens = np.where(valid, order % vocab, -1)
    sig = np.where(valid, phi.ravel()[order], -np.inf)
    return parent, tokens, sig, g, valid
