"""Node test chains of every verifier, derived from first principles, and :class:`ChainVerifier`.

A node's *test chain* lists, in test order, each candidate's acceptance test ``(slot, den, num)`` (candidate
``cand[slot]`` is accepted iff ``U[slot] * den < num``) and the law the node samples when every test fails. The chains
here are derived from the definitions of docs/methods.md, not from the reference's code:

* sd, rrs, rrsw are instances of recursive rejection sampling (RSD's general form): candidate k is tested against the
  law it was drawn from given the earlier candidates, ``p_k``, and the target's residual after k - 1 rejections. Each
  ``p_k`` is read off the drafting scheme's own sequence probabilities (a product of ``p`` for i.i.d. drafts, the
  Plackett-Luce probabilities of sampling without replacement for rrsw), and the residuals are carried unnormalized
  (``u_1 = q``, ``u_{k+1} = (u_k - |u_k| p_k)^+``, the zero-mass rule on ``|u_{k+1}| / |u_k|``).
* kseq tests every candidate against ``gamma p``; its final law is what exactness leaves of ``q`` once the walk's
  acceptances are taken out (the probability of emitting token v through some candidate, summed over the K i.i.d.
  draws).
* spechub's tests read the transport plan of the pair law (:func:`~specdec_kernels.testing.oracles.spechub_parts`):
  the first test of a pair is the plan's mass routed to its first-tested token over the pair's draft mass; the hub's
  test is the hub mass the plan spreads over the pairs of that type, over their leftover draft mass (the same for every
  pair of the type, so it is defined for a pair without leftover too).

:class:`ChainVerifier` turns any chain function into a callable with the interface of ``specdec_kernels.verify_node``
(``testing.wrong``'s deliberately wrong variants use it too); :data:`oracle_verifier` is the one built on
:func:`node_chain`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..ops import NodeVerdict
from .oracles import ZERO_MASS_TOL, Chain, ChainFn, _gumbel, _log, as_law, kseq_gamma, spechub_parts


def _iid_law(p: np.ndarray, earlier: Sequence[int]) -> np.ndarray:
    """The law of the next of K i.i.d. draws from ``p``, whatever came before."""
    return p


def _swor_law(p: np.ndarray, earlier: Sequence[int]) -> np.ndarray:
    """The law of the next draw without replacement: the Plackett-Luce probability of (earlier, v) over that of
    ``earlier`` is p(v) over the mass not drawn yet (0 for a drawn token, and everywhere once nothing is left)."""
    left = np.ones_like(p, dtype=bool)
    left[list(earlier)] = False
    mass = float(p[left].sum())
    return np.where(left, p, 0.0) / mass if mass > 0 else np.zeros_like(p)


_NEXT_LAW = {"sd": _iid_law, "rrs": _iid_law, "rrsw": _swor_law}


def _recursive_chain(method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray) -> Chain:
    """Recursive rejection sampling over the candidates, each tested against the law it was drawn from."""
    next_law = _NEXT_LAW[method]
    return _rejection_chain([(k, x, next_law(p, cand[:k])) for k, x in enumerate(cand)], q)


def _gds_chain(cand: Sequence[int], p: np.ndarray, q: np.ndarray) -> Chain:
    """Greedy draft sampling: rejection sampling with each candidate's own draft law, the sampled one (last slot,
    drawn from p without the others) first, then the others as draws that were certain (point masses)."""
    *det, x = cand

    def point(d: int) -> np.ndarray:
        one = np.zeros_like(p)
        one[d] = 1.0
        return one

    tests, fin = _rejection_chain([(len(det), x, _swor_law(p, det))] + [(j, d, point(d)) for j, d in enumerate(det)], q)
    off = np.ones(len(p), dtype=bool)
    off[det] = False
    # never reached when nothing is left outside D; the op then samples q
    return tests, (fin if fin[off].sum() > ZERO_MASS_TOL else q)


def _rejection_chain(order: Sequence[tuple[int, int, np.ndarray]], q: np.ndarray) -> Chain:
    """Rejection sampling along ``order`` = [(slot, token, the law it was drawn from)] against the target mass
    still unassigned."""
    u = q.copy()
    tests: list[tuple[int, float, float]] = []
    for k, x, law in order:
        size = float(u.sum())
        tests.append((k, float(law[x]), float(u[x]) / size))
        left = np.maximum(u - size * law, 0.0)
        if left.sum() > ZERO_MASS_TOL * size:  # else the zero-mass rule keeps the current target
            u = left
    return tests, u / u.sum()


def _kseq_chain(cand: Sequence[int], p: np.ndarray, q: np.ndarray) -> Chain:
    """K-SEQ: each of the K i.i.d. candidates is tested against gamma p; the final law is q less what the walk emits."""
    k = len(cand)
    g, _ = kseq_gamma(p, q, k)
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = np.where(p > 0, np.minimum(1.0, q / (g * p)), 0.0)  # a candidate v passes its test w.p. accept(v)
    per_draw = p * accept  # one draw is v and passes
    miss = 1.0 - float(per_draw.sum())  # one draw fails
    reach = sum(miss**j for j in range(k))  # expected number of draws the walk makes before it accepts or ends
    emitted = per_draw * reach  # probability that the walk emits v through some candidate
    left = np.maximum(q - emitted, 0.0)
    final = q.copy() if left.sum() <= ZERO_MASS_TOL else left / left.sum()
    return [(j, g * float(p[x]), float(q[x])) for j, x in enumerate(cand)], final


def _spechub_chain(cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None) -> Chain:
    """SpecHub: the tests read off the pair law's transport plan; one candidate is a plain SD node."""
    if len(cand) == 1:
        return _recursive_chain("sd", cand, p, q)
    plan = spechub_parts(p, q, hub)
    a = plan.hub
    if cand[0] == a:  # pair (a, i): the plan routes A2(i) of Q(a, i) to i, then A3 of the pairs' leftover S_ai to a
        i = cand[1]
        return [(1, float(plan.qai[i]), float(plan.a2[i])), (0, plan.s_ai, plan.a3)], plan.final
    i = cand[0]  # pair (i, a): A1(i) of Q(i, a) to i, then A4 of the pairs' leftover S_ia to a
    q_ia = float(p[i]) / float(p.sum())
    return [(0, q_ia, float(plan.a1[i])), (1, plan.s_ia, plan.a4)], plan.final


def node_chain(method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None = None) -> Chain:
    """The uniform-independent test chain of one node (``cand``: the valid candidates in slot order): ``tests`` =
    [(slot, den, num)] in test order and the normalized law sampled when every test fails."""
    if method in _NEXT_LAW:
        return _recursive_chain(method, cand, p, q)
    if method == "kseq":
        return _kseq_chain(cand, p, q)
    if method == "spechub":
        return _spechub_chain(cand, p, q, hub)
    if method == "gds":
        return _gds_chain(cand, p, q)
    raise ValueError(f"unknown method {method!r}")


class ChainVerifier:
    """A node verifier with the interface of ``specdec_kernels.verify_node``, driven by a NumPy chain function.

    ``chain_fn(method, cand, p, q, hub) -> (tests, final)`` as :func:`node_chain`. ``methods`` restricts the
    methods it accepts (a deliberately wrong variant is only defined for one). Rows sharing the same candidates,
    p, q and hub share one chain, so large Monte Carlo batches cost one chain per distinct tuple. ``backend`` is
    accepted for interface compatibility and ignored.
    """

    def __init__(self, chain_fn: ChainFn, name: str, methods: Sequence[str] | None = None) -> None:
        self.chain_fn = chain_fn
        self.name = name
        self.methods = tuple(methods) if methods is not None else None

    def __repr__(self) -> str:
        return f"ChainVerifier({self.name})"

    def __call__(
        self,
        method: str,
        cand: torch.Tensor,
        cand_valid: torch.Tensor,
        p: torch.Tensor,
        q: torch.Tensor,
        *,
        hub: torch.Tensor | None = None,
        accept_u: torch.Tensor | None = None,
        final_noise: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        analytic: bool = False,
        backend: str | None = None,
    ) -> NodeVerdict:
        if self.methods is not None and method not in self.methods:
            raise ValueError(f"{self.name} is defined for methods {self.methods}, got {method!r}")
        batch, k = cand.shape
        vocab = p.shape[-1]
        if generator is None and seed is not None:
            generator = torch.Generator().manual_seed(seed)
        # One generator for both draws keeps acceptance uniforms independent of the final noise (docs/kernels.md).
        if accept_u is None:
            accept_u = torch.rand((batch, k), dtype=torch.float64, generator=generator)
        if final_noise is None:
            final_noise = torch.rand((batch, vocab), dtype=torch.float64, generator=generator).clamp_min(2.0**-60)
        c = cand.cpu().numpy()
        cv = cand_valid.cpu().numpy()
        pn, qn = as_law(p), as_law(q)
        un, gn = as_law(accept_u), _gumbel(as_law(final_noise))
        hn = None if hub is None else hub.cpu().numpy()
        slot = np.full(batch, -1, dtype=np.int64)
        token = np.zeros(batch, dtype=np.int64)
        acc_prob = np.zeros((batch, k))
        final = np.zeros((batch, vocab))
        groups: dict[tuple, list[int]] = {}
        for b in range(batch):
            h = None if hn is None else int(hn[b])
            key = (c[b][cv[b]].tobytes(), cv[b].tobytes(), pn[b].tobytes(), qn[b].tobytes(), h)
            groups.setdefault(key, []).append(b)
        for rows_list in groups.values():
            rows = np.array(rows_list)
            b0 = rows[0]
            slots = np.flatnonzero(cv[b0])
            toks = [int(x) for x in c[b0][slots]]
            h = None if hn is None else int(hn[b0])
            tests, fin = self.chain_fn(method, toks, pn[b0], qn[b0], h)
            chosen = np.full(len(rows), -1, dtype=np.int64)
            for j, den, num in tests:
                s = slots[j]
                acc_prob[rows, s] = min(1.0, num / den) if den > 0 else float(num > 0)
                hit = (chosen < 0) & (un[rows, s] * den < num)
                chosen[hit] = s
            slot[rows] = chosen
            fin_tok = np.argmax(_log(fin)[None, :] + gn[rows], axis=1)
            token[rows] = np.where(chosen >= 0, c[rows, np.maximum(chosen, 0)], fin_tok)
            final[rows] = fin
        out_slot = torch.from_numpy(slot)
        out_tok = torch.from_numpy(token)
        if not analytic:
            return NodeVerdict(out_slot, out_tok, None, None)
        return NodeVerdict(out_slot, out_tok, torch.from_numpy(acc_prob), torch.from_numpy(final))


oracle_verifier = ChainVerifier(node_chain, "oracle")
