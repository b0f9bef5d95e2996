"""Deliberately wrong variants (negative controls, docs/exactness.md).

Each node-level control is a :class:`~specdec_kernels.testing.chains.ChainVerifier`: a callable with the interface
of ``specdec_kernels.verify_node`` (analytic and sampling mode), so it can be pushed through exactly the same
exact-enumeration and Monte Carlo checks as the real op. The tests must show that every control FAILS them.
``sbs_step_untruncated`` has the interface of ``specdec_kernels.sbs_step``. ``TREE_CONTROLS`` are chains for the
end-to-end law tests, put in place of the torch backend's node chain with :func:`torch_node_chain`. Never use these
outside tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..ops import SBSStep
from .chains import ChainVerifier
from .oracles import Chain, normalize, residual


def _rrs_skip_duplicates(method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None) -> Chain:
    """RRS that skips a repeated candidate without the residual update (SpecHub authors' EAGLE baseline)."""
    tests = []
    seen: set[int] = set()
    r = q
    for j, x in enumerate(cand):
        if x in seen:
            continue
        seen.add(x)
        tests.append((j, p[x], r[x]))
        r = residual(r, p)
    return tests, r


def _kseq_gamma_one(method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None) -> Chain:
    """K-SEQ with gamma = 1 instead of gamma* (the residual numerator goes negative and is clamped)."""
    k = len(cand)
    beta = float(np.minimum(p, q).sum())
    tests = [(j, p[x], q[x]) for j, x in enumerate(cand)]
    if beta <= 0:
        return tests, q
    c = (1.0 - (1.0 - beta) ** k) / beta
    num = np.maximum(q - c * np.minimum(p, q), 0.0)
    return tests, (q if num.sum() <= 0 else num / num.sum())


def _rrsw_unrenormalized(method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None) -> Chain:
    """RRSw that keeps the original p in the ratio and the residual instead of p^(k)."""
    tests = []
    r = q
    for j, x in enumerate(cand):
        tests.append((j, p[x], r[x]))
        r = residual(r, p)
    return tests, r


def _rrsw_next_residual(method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None) -> Chain:
    """RRSw whose residual subtracts p^(k+1) (the next candidate's law) instead of p^(k).

    The last candidate has no successor, so its residual keeps p^(K); this reproduces the TVs pinned in
    tests/ops/test_verify_node.py (CONTROL_TV).
    """
    tests = []
    r, s = q, p
    for j, x in enumerate(cand):
        tests.append((j, s[x], r[x]))
        rest = s.copy()
        rest[x] = 0.0
        nxt = normalize(rest) if rest.sum() > 0 else rest
        r = residual(r, nxt if j + 1 < len(cand) else s)
        s = nxt
    return tests, r


def _gds_unrenormalized(method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None) -> Chain:
    """gds that tests the drawn candidate against p instead of p without the greedy tokens (and subtracts p from the
    residual): the draw's law is taken for the draft's."""
    *det, x = cand
    tests = [(len(det), p[x], q[x])]
    r = residual(q, p)
    left = 1.0
    for j, d in enumerate(det):
        tests.append((j, left, r[d]))
        left -= r[d]
    fin = r.copy()
    fin[det] = 0.0
    return tests, (q if fin.sum() <= 0 else normalize(fin))


def gds_greedy_first_chain(cand: Sequence[int], p: np.ndarray, q: np.ndarray) -> Chain:
    """gds with the greedy tokens tested before the drawn one (each token of D against what q has left, then the
    draw against its law), in that test order: exact, but it spends target mass on D that the drawn candidate could
    have taken, so it accepts less than the optimum (a control for the optimality tests, not for the law tests)."""
    *det, x = cand
    tests = []
    r = q
    for j, d in enumerate(det):
        tests.append((j, 1.0, r[d]))
        rest = r.copy()
        rest[d] = 0.0
        r = normalize(rest) if rest.sum() > 1e-12 else r
    s = p.copy()
    s[det] = 0.0
    s = normalize(s)
    tests.append((len(det), s[x], r[x]))
    return tests, residual(r, s)


rrs_skip_duplicates = ChainVerifier(_rrs_skip_duplicates, "rrs_skip_duplicates", methods=("rrs",))
kseq_gamma_one = ChainVerifier(_kseq_gamma_one, "kseq_gamma_one", methods=("kseq",))
rrsw_unrenormalized = ChainVerifier(_rrsw_unrenormalized, "rrsw_unrenormalized", methods=("rrsw",))
rrsw_next_residual = ChainVerifier(_rrsw_next_residual, "rrsw_next_residual", methods=("rrsw",))

gds_unrenormalized = ChainVerifier(_gds_unrenormalized, "gds_unrenormalized", methods=("gds",))

NODE_CONTROLS = {
    v.name: v
    for v in (
        rrs_skip_duplicates,
        kseq_gamma_one,
        rrsw_unrenormalized,
        rrsw_next_residual,
        gds_unrenormalized,
    )
}


def sbs_step_untruncated(
    logp: torch.Tensor,
    sigma: torch.Tensor,
    gamma: torch.Tensor,
    beam_valid: torch.Tensor,
    w_out: int,
    *,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    backend: str | None = None,
) -> SBSStep:
    """SBS step selecting the top-W by the untruncated perturbed scores (RSD Alg. 9 line 7 read literally)."""
    batch, w_in, vocab = logp.shape
    if noise is None:
        if generator is None:
            generator = torch.Generator().manual_seed(0 if seed is None else seed)
        noise = torch.rand(logp.shape, dtype=torch.float64, generator=generator).clamp_min(2.0**-60)
    phi = sigma.double()[..., None] + logp.double()
    phit = (phi - torch.log(-torch.log(noise.double()))).masked_fill(~beam_valid[..., None], float("-inf"))
    score, idx = torch.sort(phit.reshape(batch, -1), dim=-1, descending=True, stable=True)
    score, idx = score[:, :w_out], idx[:, :w_out]
    valid = score > float("-inf")
    parent = torch.div(idx, vocab, rounding_mode="floor").masked_fill(~valid, -1)
    tokens = (idx % vocab).masked_fill(~valid, -1)
    sig = torch.gather(phi.reshape(batch, -1), 1, idx).masked_fill(~valid, float("-inf"))
    return SBSStep(parent, tokens, sig, score, valid)


# ---------------------------------------------------------------------------------------------------------------
# Controls for the end-to-end law tests: each one replaces the node chain of one decoder's verifier inside the torch
# backend's tree walk (see :func:`torch_node_chain`), so the decoder still drafts, verifies and commits as usual.


def _residual_q(method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None) -> Chain:
    """SD / RRS that never subtracts the draft: every candidate is tested against q and a rejection samples q."""
    return [(j, p[x], q[x]) for j, x in enumerate(cand)], q


def _rrs_no_renormalization(method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None) -> Chain:
    """RRS whose residual (r - p)^+ is not renormalised, so every later candidate is tested against too little mass
    (sampling the final residual is scale-free: only the later tests are wrong)."""
    tests = []
    r = q
    for j, x in enumerate(cand):
        tests.append((j, p[x], r[x]))
        r = np.maximum(r - p, 0.0)
    return tests, (q if r.sum() <= 0 else r)


def _spechub_chain(
    cand: Sequence[int],
    p: np.ndarray,
    q: np.ndarray,
    hub: int | None,
    pair_law: Callable[[np.ndarray, int], np.ndarray],
) -> Chain:
    """The SpecHub chain in the dtype of ``p``, with Q(a, i) = ``pair_law(p, a)``."""
    if len(cand) == 1:
        return [(0, p[cand[0]], q[cand[0]])], residual(q, p)
    assert hub is not None
    a = hub
    qai = pair_law(p, a)
    off = np.arange(len(p)) != a
    zero = np.zeros_like(p)
    a1 = np.where(off, np.minimum(p, q), zero)
    q1 = np.where(off, q - a1, zero)
    r1 = np.where(off, p - a1, zero)
    qai = np.where(off, qai, zero)
    a2 = np.minimum(qai, q1)
    q2 = q1 - a2
    s_ai, s_ia = (qai - a2).sum(), r1.sum()
    a3 = min(q[a], s_ai)
    a4 = min(q[a] - a3, s_ia)
    fin = q2.copy()
    fin[a] = max(q[a] - a3 - a4, 0)
    fin = q if fin.sum() <= 0 else fin
    if cand[0] == a:
        i = cand[1]
        return [(1, qai[i], q1[i]), (0, s_ai, q[a])], fin
    i = cand[0]
    return [(0, p[i], q[i]), (1, s_ia, q[a] - a3)], fin


def _spechub_qai_unnormalized(method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None) -> Chain:
    """SpecHub with Q(a, i) = p(a) p(i), the 1 / (1 - p(a)) factor dropped."""
    return _spechub_chain(cand, p, q, hub, lambda p, a: p[a] * p)


def _spechub_fp32_one_minus_pa(
    method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None
) -> Chain:
    """SpecHub with Q(a, i) = p(a) p(i) / (1 - p(a)) and the whole chain in float32: once 1 - p(a) is a few ulps of
    1, the subtraction has lost the digits of the non-hub mass the sampler drew the second draft from."""
    p32, q32 = p.astype(np.float32), q.astype(np.float32)
    return _spechub_chain(cand, p32, q32, hub, lambda p, a: p[a] * p / (np.float32(1) - p[a]))


residual_q = ChainVerifier(_residual_q, "residual_q", methods=("sd", "rrs"))
rrs_no_renormalization = ChainVerifier(_rrs_no_renormalization, "rrs_no_renormalization", methods=("rrs",))
spechub_qai_unnormalized = ChainVerifier(_spechub_qai_unnormalized, "spechub_qai_unnormalized", methods=("spechub",))
spechub_fp32_one_minus_pa = ChainVerifier(_spechub_fp32_one_minus_pa, "spechub_fp32_one_minus_pa", methods=("spechub",))

TREE_CONTROLS = {
    v.name: v
    for v in (
        residual_q,
        rrs_no_renormalization,
        rrs_skip_duplicates,
        rrsw_unrenormalized,
        rrsw_next_residual,
        kseq_gamma_one,
        spechub_qai_unnormalized,
        spechub_fp32_one_minus_pa,
        gds_unrenormalized,
    )
}


def torch_node_chain(
    control: ChainVerifier,
) -> Callable[..., tuple[list[tuple[int, torch.Tensor, torch.Tensor]], torch.Tensor]]:
    """``control``'s chain with the signature of ``specdec_kernels.reference.verify.node_chain`` (torch vectors in,
    float64 tensors out), to stand in for it in the torch backend's ``verify_tree``."""

    def node_chain(
        method: str, cand: list[int], p: torch.Tensor, q: torch.Tensor, hub: int | None
    ) -> tuple[list[tuple[int, torch.Tensor, torch.Tensor]], torch.Tensor]:
        if control.methods is not None and method not in control.methods:
            raise ValueError(f"{control.name} is defined for methods {control.methods}, got {method!r}")
        tests, fin = control.chain_fn(method, cand, p.double().numpy(), q.double().numpy(), hub)
        f64 = torch.float64
        out = [(j, torch.tensor(float(den), dtype=f64), torch.tensor(float(num), dtype=f64)) for j, den, num in tests]
        return out, torch.from_numpy(np.clip(np.asarray(fin, dtype=np.float64), 0.0, None))

    return node_chain


def block_walk_token_residual(
    chain: list[int], tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor, u: torch.Tensor, noise: torch.Tensor
) -> tuple[int, int]:
    """Block verification drawing its correction from the token-level residual Norm[(q - p)^+] instead of the block
    residual (vllm-ascend #7807's bug), with the signature of ``specdec_kernels.reference.verify.block_walk``: it
    stands in for it in the torch backend's ``verify_tree``."""
    from .block import block_chain  # the float64 oracle, made wrong by one flag

    toks = [int(tokens[m]) for m in chain[1:]]
    rows = torch.tensor(chain)
    return block_chain(
        toks,
        p[rows].double().numpy(),
        q[rows].double().numpy(),
        [float(u[m]) for m in chain[1:]],
        noise.double().numpy(),
        weighted=False,
    )


def traversal_walk_raw_q(
    children: list[list[int]],
    parent: list[int],
    tokens: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    u: torch.Tensor,
    noise: torch.Tensor,
    swor: bool,
) -> tuple[int, int]:
    """Traversal verification drawing the token after the accepted node from the target's raw row instead of the
    node's updated residual, with the signature of ``specdec_kernels.reference.verify.traversal_walk``: it stands in
    for it in the torch backend's ``verify_tree``. Reads the whole tree (padding excluded by ``children``)."""
    from .oracles_tree import sample_gumbel_max
    from .traversal import walk_tests  # the float64 oracle, made wrong by one flag

    ids = [0]
    for m in ids:  # level order over the valid nodes
        ids.extend(children[m])
    ids.sort()
    local = {m: i for i, m in enumerate(ids)}
    par = [-1] + [local[parent[m]] for m in ids[1:]]
    toks = [int(tokens[m]) for m in ids]
    rows = torch.tensor(ids)
    tests = walk_tests(par, toks, p[rows].double().numpy(), q[rows].double().numpy(), swor=swor, wrong="raw_q")
    fin = noise.double().numpy()
    for node, den, num, law in tests:
        if node == 0 or float(u[ids[node]]) * den < num:
            return ids[node], sample_gumbel_max(law, fin)
    raise AssertionError("the root always passes")
