"""Backend "triton": the node verifiers that verify_node and verify_tree share (their launchers: ``verify.py``).

As the C++ and CUDA sources group them; what every kernel shares is in ``common.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import (
    ACCEPT,
    ZERO_MASS_TOL,
    ZERO_MASS_TOL_F64,
    _noise_at,
)

# ----------------------------------------------------------------------------------------------------------------
# node verifiers (docs/methods.md): one row's candidate chain, shared by verify_node and verify_tree

M_RRS = 0  # sd and rrs: residual against the same p every round
M_RRSW = 1
M_KSEQ = 2
M_SPECHUB = 3
M_GDS = 4
METHOD_CODE = {"sd": M_RRS, "rrs": M_RRS, "rrsw": M_RRSW, "kseq": M_KSEQ, "spechub": M_SPECHUB, "gds": M_GDS}


@triton.jit
def _ratio_prob(num, den):
    """min(1, num/den) = probability of the division-free test U * den < num."""
    return tl.where(
        den > 0, tl.minimum(tl.maximum(num / tl.where(den > 0, den, 1.0), 0.0), 1.0), tl.where(num > 0, 1.0, 0.0)
    )


@triton.jit
def _copy_row(src_ptr, dst_ptr, V, BLOCK_V: tl.constexpr):
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=m, other=0.0).to(tl.float32), mask=m)


@triton.jit
def _residual_inplace(r_ptr, s_ptr, V, BLOCK_V: tl.constexpr):
    """r <- Norm[(r - s)^+] in place, or r unchanged when the mass is numerically zero."""
    tot = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        r = tl.load(r_ptr + offs, mask=m, other=0.0)
        s = tl.load(s_ptr + offs, mask=m, other=0.0).to(tl.float32)
        tot += tl.sum(tl.maximum(r - s, 0.0), axis=0)
    if tot > ZERO_MASS_TOL:
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            m = offs < V
            r = tl.load(r_ptr + offs, mask=m, other=0.0)
            s = tl.load(s_ptr + offs, mask=m, other=0.0).to(tl.float32)
            tl.store(r_ptr + offs, tl.maximum(r - s, 0.0) / tot, mask=m)


@triton.jit
def _remove_and_renormalize(s_ptr, x, V, BLOCK_V: tl.constexpr):
    """SWOR: s(x) <- 0, s <- Norm[s] (p^(k+1) of RRSw, docs/methods.md)."""
    tl.store(s_ptr + x, 0.0)
    tot = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        tot += tl.sum(tl.load(s_ptr + offs, mask=offs < V, other=0.0), axis=0)
    if tot > 0:
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            m = offs < V
            tl.store(s_ptr + offs, tl.load(s_ptr + offs, mask=m, other=0.0) / tot, mask=m)


@triton.jit
def _kseq_sums(p_ptr, q_ptr, g, V, BLOCK_V: tl.constexpr):
    """(sum min(g p, q), beta(g) = sum min(p, q / g)) in float64."""
    a = tl.zeros((), tl.float64)
    be = tl.zeros((), tl.float64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        p = tl.load(p_ptr + offs, mask=m, other=0.0).to(tl.float64)
        q = tl.load(q_ptr + offs, mask=m, other=0.0).to(tl.float64)
        a += tl.sum(tl.minimum(g * p, q), axis=0)
        be += tl.sum(tl.minimum(p, q / g), axis=0)
    return a, be


@triton.jit
def _pow_int(x, k):
    out = tl.full((), 1.0, tl.float64)
    for _ in range(0, k):
        out = out * x
    return out


@triton.jit
def _kseq_gamma_row(p_ptr, q_ptr, k, V, BLOCK_V: tl.constexpr):
    """K-SEQ: smallest g in [1, k] with h(g) >= 0, 40 fp64 bisection steps, upper bracket."""
    a1, be1 = _kseq_sums(p_ptr, q_ptr, tl.full((), 1.0, tl.float64), V, BLOCK_V)
    # the rows' masses, summed in the order of be1: p = q gives be1 == mass exactly
    mp = tl.zeros((), tl.float64)
    mq = tl.zeros((), tl.float64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        mp += tl.sum(tl.load(p_ptr + offs, mask=m, other=0.0).to(tl.float64), axis=0)
        mq += tl.sum(tl.load(q_ptr + offs, mask=m, other=0.0).to(tl.float64), axis=0)
    mass = tl.maximum(mp, mq)
    h1 = a1 - 1.0 + _pow_int(1.0 - be1, k)
    lo = tl.full((), 1.0, tl.float64)
    hi = tl.full((), 1.0, tl.float64) * k
    if (k <= 1) | (be1 >= mass - 1e-12) | (h1 >= 0.0):  # p = q: gamma = 1 (reference KSEQ_EQUAL_TOL)
        hi = tl.full((), 1.0, tl.float64)
    else:
        for _ in range(0, 40):
            mid = 0.5 * (lo + hi)
            a, be = _kseq_sums(p_ptr, q_ptr, mid, V, BLOCK_V)
            ok = (a - 1.0 + _pow_int(1.0 - be, k)) >= 0.0
            hi = tl.where(ok, mid, hi)
            lo = tl.where(ok, lo, mid)
    _, beta = _kseq_sums(p_ptr, q_ptr, hi, V, BLOCK_V)
    return hi, beta


@triton.jit
def _hub_terms(pa, p, q, rest):
    """SpecHub's Q(a, i) = p(a) p(i) / rest, q1 = q - min(p, q) and A2 = min(Q(a, i), q1), all fp64."""
    qai = tl.where(rest > 0.0, pa * p / tl.where(rest > 0.0, rest, 1.0), 0.0)
    q1 = q - tl.minimum(p, q)
    return qai, q1, tl.minimum(qai, q1)


@triton.jit
def _node_rrs(
    cand_ptr,
    cvalid_ptr,
    K,
    p_ptr,
    q_ptr,
    u_ptr,
    u_row,
    seed_lo,
    seed_hi,
    r_ptr,
    s_ptr,
    ap_ptr,
    V,
    METHOD: tl.constexpr,
    ANALYTIC: tl.constexpr,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """RRS (METHOD 0: with replacement against p; 1: without, against the renormalized draft law in s_ptr): the
    candidates in slot order, the residual updated after each rejection."""
    chosen = tl.full((), -1, tl.int64)
    j = tl.zeros((), tl.int64)
    while (j < K) & ((chosen < 0) | ANALYTIC):
        if tl.load(cvalid_ptr + j) != 0:
            x = tl.load(cand_ptr + j)
            if METHOD == 1:
                den = tl.load(s_ptr + x)
            else:
                den = tl.load(p_ptr + x).to(tl.float32)
            num = tl.load(r_ptr + x)
            if ANALYTIC:
                tl.store(ap_ptr + j, _ratio_prob(num, den))
            if (chosen < 0) & (
                _noise_at(u_ptr, j, u_row, seed_lo, seed_hi, ACCEPT, RNG) * den.to(tl.float64) < num.to(tl.float64)
            ):
                chosen = tl.zeros((), tl.int64) + j
            if (chosen < 0) | ANALYTIC:
                if METHOD == 1:
                    _residual_inplace(r_ptr, s_ptr, V, BLOCK_V)
                    _remove_and_renormalize(s_ptr, x, V, BLOCK_V)
                else:
                    _residual_inplace(r_ptr, p_ptr, V, BLOCK_V)
        j += 1
    return chosen


@triton.jit
def _node_kseq(
    cand_ptr,
    cvalid_ptr,
    K,
    p_ptr,
    q_ptr,
    u_ptr,
    u_row,
    seed_lo,
    seed_hi,
    r_ptr,
    ap_ptr,
    V,
    ANALYTIC: tl.constexpr,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """K-SEQ: every candidate tested against gamma p, the residual of the whole node."""
    chosen = tl.full((), -1, tl.int64)
    n_valid = tl.zeros((), tl.int32)
    for j in range(0, K):
        n_valid += (tl.load(cvalid_ptr + j) != 0).to(tl.int32)
    g, be = _kseq_gamma_row(p_ptr, q_ptr, n_valid, V, BLOCK_V)
    g32 = g.to(tl.float32)
    if be > 0.0:
        for j in range(0, K):
            if tl.load(cvalid_ptr + j) != 0:
                x = tl.load(cand_ptr + j)
                den = g32 * tl.load(p_ptr + x).to(tl.float32)
                num = tl.load(q_ptr + x).to(tl.float32)
                if ANALYTIC:
                    tl.store(ap_ptr + j, _ratio_prob(num, den))
                if (chosen < 0) & (
                    _noise_at(u_ptr, j, u_row, seed_lo, seed_hi, ACCEPT, RNG) * den.to(tl.float64) < num.to(tl.float64)
                ):
                    chosen = tl.zeros((), tl.int64) + j
        c = ((1.0 - _pow_int(1.0 - be, n_valid)) / be).to(tl.float32)
        tot = tl.zeros((), tl.float32)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            m = offs < V
            p = tl.load(p_ptr + offs, mask=m, other=0.0).to(tl.float32)
            q = tl.load(q_ptr + offs, mask=m, other=0.0).to(tl.float32)
            tot += tl.sum(tl.maximum(q - c * tl.minimum(p, q / g32), 0.0), axis=0)
        if tot > ZERO_MASS_TOL:
            for start in range(0, V, BLOCK_V):
                offs = start + tl.arange(0, BLOCK_V)
                m = offs < V
                p = tl.load(p_ptr + offs, mask=m, other=0.0).to(tl.float32)
                q = tl.load(q_ptr + offs, mask=m, other=0.0).to(tl.float32)
                tl.store(r_ptr + offs, tl.maximum(q - c * tl.minimum(p, q / g32), 0.0) / tot, mask=m)
    return chosen


@triton.jit
def _node_hub(
    cand_ptr,
    cvalid_ptr,
    K,
    p_ptr,
    q_ptr,
    u_ptr,
    u_row,
    seed_lo,
    seed_hi,
    hub,
    r_ptr,
    ap_ptr,
    V,
    ANALYTIC: tl.constexpr,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """SpecHub: a node with one candidate as SD, with two the hub pair's plan."""
    chosen = tl.full((), -1, tl.int64)
    x0 = tl.load(cand_ptr)
    single = K < 2  # a tree node with one child; never read slot 1 then (it does not exist)
    if K >= 2:
        single = tl.load(cvalid_ptr + 1) == 0  # p(hub) ~ 1
    if single:  # a single-candidate SD node
        den = tl.load(p_ptr + x0).to(tl.float32)
        num = tl.load(q_ptr + x0).to(tl.float32)
        if ANALYTIC:
            tl.store(ap_ptr, _ratio_prob(num, den))
        if _noise_at(u_ptr, 0, u_row, seed_lo, seed_hi, ACCEPT, RNG) * den.to(tl.float64) < num.to(tl.float64):
            chosen = tl.zeros((), tl.int64)
        _residual_inplace(r_ptr, p_ptr, V, BLOCK_V)
    else:
        # The plan in fp64: when p(a) ~ 1 the pairs (a, .) carry nearly all of the draft mass, and fp32 rounding
        # of their terms would become the output law's error. Q(a, i) = p(a) p(i) / rest with rest = the
        # non-hub mass the sampler drew i from, not 1 - p(a) (docs/exactness.md). The residual alone is stored
        # in fp32.
        pa = tl.load(p_ptr + hub).to(tl.float64)
        qa = tl.load(q_ptr + hub).to(tl.float64)
        rest = tl.zeros((), tl.float64)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            m = (offs < V) & (offs != hub)
            rest += tl.sum(tl.load(p_ptr + offs, mask=m, other=0.0).to(tl.float64), axis=0)
        s_ai = tl.zeros((), tl.float64)
        s_ia = tl.zeros((), tl.float64)
        tot = tl.zeros((), tl.float64)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            m = (offs < V) & (offs != hub)
            p = tl.load(p_ptr + offs, mask=m, other=0.0).to(tl.float64)
            q = tl.load(q_ptr + offs, mask=m, other=0.0).to(tl.float64)
            qai, q1, a2 = _hub_terms(pa, p, q, rest)
            s_ia += tl.sum(p - tl.minimum(p, q), axis=0)
            s_ai += tl.sum(qai - a2, axis=0)
            tot += tl.sum(q1 - a2, axis=0)
        a3 = tl.minimum(qa, s_ai)
        a4 = tl.minimum(qa - a3, s_ia)
        fin_a = tl.maximum(qa - a3 - a4, 0.0)
        tot += fin_a
        if tot > ZERO_MASS_TOL_F64:
            for start in range(0, V, BLOCK_V):
                offs = start + tl.arange(0, BLOCK_V)
                m = offs < V
                p = tl.load(p_ptr + offs, mask=m & (offs != hub), other=0.0).to(tl.float64)
                q = tl.load(q_ptr + offs, mask=m & (offs != hub), other=0.0).to(tl.float64)
                _, q1, a2 = _hub_terms(pa, p, q, rest)
                fin = tl.where(offs == hub, fin_a, q1 - a2)
                tl.store(r_ptr + offs, (fin / tot).to(tl.float32), mask=m)
        if x0 == hub:  # pair type (a, i): the non-hub token (slot 1) is tested first
            i = tl.load(cand_ptr + 1)
            p_i = tl.load(p_ptr + i).to(tl.float64)
            q_i = tl.load(q_ptr + i).to(tl.float64)
            den1, num1, _ = _hub_terms(pa, p_i, q_i, rest)
            den0 = s_ai
            num0 = tl.where(s_ai > 0.0, qa, 0.0)  # a hub test with no leftover is never reached
        else:
            den0 = tl.load(p_ptr + x0).to(tl.float64)
            num0 = tl.load(q_ptr + x0).to(tl.float64)
            den1 = s_ia
            num1 = tl.where(s_ia > 0.0, qa - a3, 0.0)
        if ANALYTIC:
            tl.store(ap_ptr, _ratio_prob(num0, den0).to(tl.float32))
            tl.store(ap_ptr + 1, _ratio_prob(num1, den1).to(tl.float32))
        u0 = _noise_at(u_ptr, 0, u_row, seed_lo, seed_hi, ACCEPT, RNG)
        u1 = _noise_at(u_ptr, 1, u_row, seed_lo, seed_hi, ACCEPT, RNG)
        ok0 = u0 * den0 < num0
        ok1 = u1 * den1 < num1
        if x0 == hub:
            chosen = tl.where(ok1, 1, tl.where(ok0, 0, -1)).to(tl.int64)
        else:
            chosen = tl.where(ok0, 0, tl.where(ok1, 1, -1)).to(tl.int64)
    return chosen


@triton.jit
def _drop_greedy_and_normalize(
    row_ptr, cand_ptr, cvalid_ptr, K, last, fallback_ptr, V, FALLBACK: tl.constexpr, BLOCK_V: tl.constexpr
):
    """gds: zero the greedy candidates (every valid slot but ``last``) in the row, then divide it by its sum; with
    FALLBACK, the row becomes ``fallback`` when that sum is numerically zero."""
    tl.debug_barrier()  # the row's last full write lands before the single-element stores
    for j in range(0, K):
        if (tl.load(cvalid_ptr + j) != 0) & (j != last):
            tl.store(row_ptr + tl.load(cand_ptr + j), 0.0)
    tl.debug_barrier()
    tot = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        tot += tl.sum(tl.load(row_ptr + offs, mask=offs < V, other=0.0), axis=0)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        r = tl.load(row_ptr + offs, mask=m, other=0.0)
        if FALLBACK:
            f = tl.load(fallback_ptr + offs, mask=m, other=0.0).to(tl.float32)
            tl.store(row_ptr + offs, tl.where(tot > ZERO_MASS_TOL, r / tot, f), mask=m)
        else:
            tl.store(row_ptr + offs, r / tot, mask=m)
    tl.debug_barrier()


@triton.jit
def _node_gds(
    cand_ptr,
    cvalid_ptr,
    K,
    p_ptr,
    q_ptr,
    u_ptr,
    u_row,
    seed_lo,
    seed_hi,
    r_ptr,
    s_ptr,
    ap_ptr,
    V,
    ANALYTIC: tl.constexpr,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Greedy draft sampling: the last valid candidate was drawn from p without the others (the set D) and is tested
    first against that law (s_ptr); each token of D then takes its share of the residual still untested (r_ptr
    holds q on entry, the residual without D on return, q when nothing is left there)."""
    last = tl.full((), -1, tl.int64)
    for j in range(0, K):
        if tl.load(cvalid_ptr + j) != 0:
            last = tl.zeros((), tl.int64) + j
    _copy_row(p_ptr, s_ptr, V, BLOCK_V)
    _drop_greedy_and_normalize(s_ptr, cand_ptr, cvalid_ptr, K, last, p_ptr, V, False, BLOCK_V)
    x = tl.load(cand_ptr + last)
    den = tl.load(s_ptr + x)
    num = tl.load(q_ptr + x).to(tl.float32)
    if ANALYTIC:
        tl.store(ap_ptr + last, _ratio_prob(num, den))
    chosen = tl.full((), -1, tl.int64)
    if _noise_at(u_ptr, last, u_row, seed_lo, seed_hi, ACCEPT, RNG) * den.to(tl.float64) < num.to(tl.float64):
        chosen = last
    _residual_inplace(r_ptr, s_ptr, V, BLOCK_V)
    tl.debug_barrier()
    left = tl.full((), 1.0, tl.float32)
    for j in range(0, K):
        if (tl.load(cvalid_ptr + j) != 0) & (j != last):
            rd = tl.load(r_ptr + tl.load(cand_ptr + j))
            if ANALYTIC:
                tl.store(ap_ptr + j, _ratio_prob(rd, left))
            if (chosen < 0) & (
                _noise_at(u_ptr, j, u_row, seed_lo, seed_hi, ACCEPT, RNG) * left.to(tl.float64) < rd.to(tl.float64)
            ):
                chosen = tl.zeros((), tl.int64) + j
            left = left - rd
    tl.debug_barrier()
    _drop_greedy_and_normalize(r_ptr, cand_ptr, cvalid_ptr, K, last, q_ptr, V, True, BLOCK_V)
    return chosen


@triton.jit
def _verify_node_row(
    cand_ptr,  # [K] int64 candidate tokens by slot
    cvalid_ptr,  # [K] int8
    K,
    p_ptr,  # [V] fp32 draft law
    q_ptr,  # [V] fp32 target law
    u_ptr,  # [K] fp64 acceptance uniforms by slot (unused when RNG)
    u_row,  # int64 Philox row of the acceptance uniforms (RNG)
    seed_lo,
    seed_hi,
    hub,  # int64 hub token (spechub)
    r_ptr,  # [V] fp32 scratch: current target residual; holds the final residual on return
    s_ptr,  # [V] fp32 scratch: current draft law (rrsw, gds)
    ap_ptr,  # [K] fp32 accept_prob by slot (ANALYTIC)
    V,
    METHOD: tl.constexpr,
    ANALYTIC: tl.constexpr,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Returns the accepted slot (-1 = none). The final residual is left normalized in r_ptr.

    The acceptance uniform of slot j is u_ptr[j], or (RNG) element (u_row, j) of the ACCEPT stream."""
    _copy_row(q_ptr, r_ptr, V, BLOCK_V)
    if METHOD == 1:
        _copy_row(p_ptr, s_ptr, V, BLOCK_V)
    if METHOD == 4:
        chosen = _node_gds(
            cand_ptr,
            cvalid_ptr,
            K,
            p_ptr,
            q_ptr,
            u_ptr,
            u_row,
            seed_lo,
            seed_hi,
            r_ptr,
            s_ptr,
            ap_ptr,
            V,
            ANALYTIC,
            RNG,
            BLOCK_V,
        )
    elif METHOD <= 1:
        chosen = _node_rrs(
            cand_ptr,
            cvalid_ptr,
            K,
            p_ptr,
            q_ptr,
            u_ptr,
            u_row,
            seed_lo,
            seed_hi,
            r_ptr,
            s_ptr,
            ap_ptr,
            V,
            METHOD,
            ANALYTIC,
            RNG,
            BLOCK_V,
        )
    elif METHOD == 2:
        chosen = _node_kseq(
            cand_ptr,
            cvalid_ptr,
            K,
            p_ptr,
            q_ptr,
            u_ptr,
            u_row,
            seed_lo,
            seed_hi,
            r_ptr,
            ap_ptr,
            V,
            ANALYTIC,
            RNG,
            BLOCK_V,
        )
    else:
        chosen = _node_hub(
            cand_ptr,
            cvalid_ptr,
            K,
            p_ptr,
            q_ptr,
            u_ptr,
            u_row,
            seed_lo,
            seed_hi,
            hub,
            r_ptr,
            ap_ptr,
            V,
            ANALYTIC,
            RNG,
            BLOCK_V,
        )
    return chosen
