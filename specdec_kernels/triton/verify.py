"""Backend "triton": the kernels and launchers of verify_chain, emission_law, verify_tree.

As the C++ and CUDA sources group them; what every kernel shares is in ``common.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (
    ACCEPT,
    FINAL,
    ZERO_MASS_TOL,
    ZERO_MASS_TOL_F64,
    _argmax_chunked,
    _argmax_plain,
    _block,
    _gumbel,
    _is_eos,
    _merge_chunk_best,
    _noise_at,
    _noise_block,
    _sample_residual,
    _seed_args,
    _verify_noise,
)
from .node import (
    METHOD_CODE,
    _verify_node_row,
)


@triton.jit(do_not_specialize=["seed_lo", "seed_hi"])
def _verify_chain_kernel(
    draft_ptr,  # [B, L] int64
    p_ptr,  # [B, L, V] fp32 (unused when GREEDY)
    q_ptr,  # [B, L+1, V] fp32
    len_ptr,  # [B] int64
    u_ptr,  # [B, L] fp64 (unused when RNG)
    fin_ptr,  # [B, V] fp64 (unused when RNG)
    eos_ptr,  # [n_eos] int64
    n_eos,
    nacc_ptr,  # [B] int64
    next_ptr,  # [B] int64
    len_ptr_l,  # [1] fp64 leniency l >= 1 (a pointer: a float argument would be passed as fp32)
    L,
    V,
    seed_lo,
    seed_hi,
    GREEDY: tl.constexpr,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    n = tl.load(len_ptr + b)
    lenient = tl.load(len_ptr_l)
    j = tl.zeros((), tl.int64)
    state = tl.zeros((), tl.int32)  # 0 running, 1 rejected at j, 2 stopped at EOS
    while (state == 0) & (j < n):
        x = tl.load(draft_ptr + b * L + j)
        q_row = q_ptr + (b * (L + 1) + j) * V
        px = tl.load(p_ptr + (b * L + j) * V + x).to(tl.float64)  # greedy with l = 1: p is a placeholder (q)
        lqx = lenient * tl.load(q_row + x).to(tl.float64)
        if GREEDY:
            ok = (x == _argmax_plain(q_row, V, True, BLOCK_V)) | ((lenient > 1.0) & (px < lqx))
        else:
            ok = _noise_at(u_ptr + b * L, j, b, seed_lo, seed_hi, ACCEPT, RNG) * px < lqx
        if ok:
            j += 1
            if _is_eos(x, eos_ptr, n_eos):
                state = 2
        else:
            state = 1
    q_row = q_ptr + (b * (L + 1) + j) * V
    if state == 2:
        nxt = tl.full((), -1, tl.int64)
    elif state == 1:
        if GREEDY:
            nxt = _argmax_plain(q_row, V, True, BLOCK_V)
        else:
            nxt = _sample_residual(
                q_row, p_ptr + (b * L + j) * V, 1.0, fin_ptr + b * V, b, seed_lo, seed_hi, V, RNG, BLOCK_V
            )
    else:
        if GREEDY:
            nxt = _argmax_plain(q_row, V, True, BLOCK_V)
        else:
            nxt = _argmax_chunked(q_row, fin_ptr + b * V, b, seed_lo, seed_hi, V, True, False, FINAL, RNG, BLOCK_V)
    tl.store(nacc_ptr + b, j)
    tl.store(next_ptr + b, nxt)


def verify_chain(
    draft: torch.Tensor,
    p: torch.Tensor | None,
    q: torch.Tensor,
    lengths: torch.Tensor,
    accept_u: torch.Tensor | None,
    final_noise: torch.Tensor | None,
    greedy: bool,
    eos: torch.Tensor | None,
    seed: int = 0,
    leniency: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, length = draft.shape
    vocab = q.shape[-1]
    dev = draft.device
    rng, accept_u, final_noise = _verify_noise(accept_u, final_noise, seed, (batch, length), (batch, vocab), dev)
    qf = q.float().contiguous()
    pf = qf if p is None or (greedy and leniency == 1.0) else p.float().contiguous()
    eos_t = (torch.empty(0, dtype=torch.long) if eos is None else eos).to(dev).long().contiguous()
    n_acc = torch.empty(batch, dtype=torch.long, device=dev)
    nxt = torch.empty(batch, dtype=torch.long, device=dev)
    if batch:
        _verify_chain_kernel[(batch,)](
            draft.long().contiguous(),
            pf,
            qf,
            lengths.long().contiguous(),
            accept_u,
            final_noise,
            eos_t if eos_t.numel() else n_acc,  # any valid pointer when there is no EOS
            eos_t.numel(),
            n_acc,
            nxt,
            torch.tensor([leniency], dtype=torch.float64, device=dev),
            length,
            vocab,
            *_seed_args(seed),
            GREEDY=bool(greedy),
            RNG=rng,
            BLOCK_V=_block(vocab),
        )
    return n_acc, nxt


# ----------------------------------------------------------------------------------------------------------------
# emission_law


@triton.jit
def _emission_law_kernel(
    p_ptr,  # [R, V] fp32 or fp64 (the compute dtype)
    q_ptr,  # [R, V] same dtype
    len_ptr_l,  # [1] leniency l rounded to the compute dtype
    out_ptr,  # [R, V] same dtype
    V,
    TOL: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """E = min(p, l q) + r rho, r = sum (p - l q)^+, rho = res(q, p) (q when its mass <= TOL); sums in fp64."""
    row = tl.program_id(0).to(tl.int64)
    p_row = p_ptr + row * V
    q_row = q_ptr + row * V
    o_row = out_ptr + row * V
    lenient = tl.load(len_ptr_l)
    rejected = tl.zeros((), tl.float64)
    mass = tl.zeros((), tl.float64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        p = tl.load(p_row + offs, mask=m, other=0.0)
        q = tl.load(q_row + offs, mask=m, other=0.0)
        rejected += tl.sum(tl.maximum(p - lenient * q, 0.0).to(tl.float64), axis=0)
        mass += tl.sum(tl.maximum(q - p, 0.0).to(tl.float64), axis=0)
    r = rejected.to(lenient.dtype)
    tot = mass.to(lenient.dtype)
    use_q = tot <= TOL
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        p = tl.load(p_row + offs, mask=m, other=0.0)
        q = tl.load(q_row + offs, mask=m, other=0.0)
        rho = tl.where(use_q, q, tl.maximum(q - p, 0.0) / tl.where(use_q, 1.0, tot))
        tl.store(o_row + offs, tl.minimum(p, lenient * q) + r * rho, mask=m)


def emission_law(p: torch.Tensor, q: torch.Tensor, leniency: float) -> torch.Tensor:
    cd = torch.float64 if torch.float64 in (p.dtype, q.dtype) else torch.float32
    vocab = p.shape[-1]
    pc = p.to(cd).reshape(-1, vocab).contiguous()
    qc = q.to(cd).reshape(-1, vocab).contiguous()
    out = torch.empty_like(pc)
    if pc.shape[0] and vocab:
        _emission_law_kernel[(pc.shape[0],)](
            pc,
            qc,
            torch.tensor([leniency], dtype=cd, device=p.device),
            out,
            vocab,
            TOL=ZERO_MASS_TOL_F64 if cd == torch.float64 else ZERO_MASS_TOL,
            BLOCK_V=_block(vocab),
        )
    return out.reshape(p.shape)


# ----------------------------------------------------------------------------------------------------------------
# verify_tree: one program walks one row's tree


@triton.jit(do_not_specialize=["seed_lo", "seed_hi"])
def _verify_tree_kernel(
    tok_ptr,  # [B, N] int64
    par_ptr,  # [B, N] int64
    valid_ptr,  # [B, N] int8
    p_ptr,  # [B, N, V] fp32
    q_ptr,  # [B, N, V] fp32
    hub_ptr,  # [B, N] int64
    u_ptr,  # [B, N, KU] fp64 (unused when RNG)
    fin_ptr,  # [B, V] fp64 (unused when RNG)
    eos_ptr,  # [n_eos] int64
    n_eos,
    alive_ptr,  # [B, N] int32 scratch, -1 initialised: generation in which a node is alive
    ctok_ptr,  # [B, KC] int64 scratch: current candidate tokens
    cnode_ptr,  # [B, KC] int64 scratch: their node ids
    ones_ptr,  # [KC] int8 all ones (candidate validity)
    r_ptr,  # [B, V] fp32 scratch
    s_ptr,  # [B, V] fp32 scratch
    ap_ptr,  # [B, KC] fp32 scratch (unused output)
    acc_ptr,  # [B, L] int64 out, -1 initialised
    rank_ptr,  # [B, L] int64 out, -1 initialised
    nacc_ptr,  # [B] int64 out
    next_ptr,  # [B] int64 out
    N,
    V,
    KU,
    KC,
    L,
    seed_lo,
    seed_hi,
    METHOD: tl.constexpr,
    KSEQ: tl.constexpr,
    GREEDY: tl.constexpr,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    gen = tl.zeros((), tl.int32)
    tl.store(alive_ptr + b * N, gen)
    rep = tl.zeros((), tl.int64)
    depth = tl.zeros((), tl.int64)
    last = tl.zeros((), tl.int64)
    nxt = tl.full((), -1, tl.int64)
    state = tl.zeros((), tl.int32)  # 0 walking, 1 emitted a token, 2 stopped at EOS
    while state == 0:
        # candidates: valid nodes whose parent is alive, in flattened (= draft) order
        cnt = tl.zeros((), tl.int64)
        for n in range(1, N):
            if tl.load(valid_ptr + b * N + n) != 0:
                par = tl.load(par_ptr + b * N + n)
                if tl.load(alive_ptr + b * N + par) == gen:
                    tl.store(ctok_ptr + b * KC + cnt, tl.load(tok_ptr + b * N + n))
                    tl.store(cnode_ptr + b * KC + cnt, n + tl.zeros((), tl.int64))
                    cnt += 1
        q_row = q_ptr + (b * N + rep) * V
        chosen = tl.full((), -1, tl.int64)
        if cnt == 0:
            if GREEDY:
                nxt = _argmax_plain(q_row, V, True, BLOCK_V)
            else:
                nxt = _argmax_chunked(q_row, fin_ptr + b * V, b, seed_lo, seed_hi, V, True, False, FINAL, RNG, BLOCK_V)
            state = 1
        else:
            if GREEDY:
                target = _argmax_plain(q_row, V, True, BLOCK_V)
                for j in range(0, cnt):
                    if (chosen < 0) & (tl.load(ctok_ptr + b * KC + j) == target):
                        chosen = tl.zeros((), tl.int64) + j
                if chosen < 0:
                    nxt = target
                    state = 1
            else:
                chosen = _verify_node_row(
                    ctok_ptr + b * KC,
                    ones_ptr,
                    cnt,
                    p_ptr + (b * N + rep) * V,
                    q_row,
                    u_ptr + (b * N + rep) * KU,
                    b * N + rep,
                    seed_lo,
                    seed_hi,
                    tl.load(hub_ptr + b * N + rep),
                    r_ptr + b * V,
                    s_ptr + b * V,
                    ap_ptr + b * KC,
                    V,
                    METHOD,
                    False,
                    RNG,
                    BLOCK_V,
                )
                if chosen < 0:
                    nxt = _argmax_chunked(
                        r_ptr + b * V, fin_ptr + b * V, b, seed_lo, seed_hi, V, True, False, FINAL, RNG, BLOCK_V
                    )
                    state = 1
        if chosen >= 0:
            child = tl.load(cnode_ptr + b * KC + chosen)
            ctok = tl.load(ctok_ptr + b * KC + chosen)
            tl.store(rank_ptr + b * L + depth, chosen)
            depth += 1
            last = child
            if _is_eos(ctok, eos_ptr, n_eos):
                state = 2
            gen += 1
            rep = child
            if KSEQ:  # SpecTr: every alive chain node carrying the accepted token stays alive; rows of the first
                for j in range(0, cnt):  # one (same prefix as the others) are used next, as in the reference
                    if tl.load(ctok_ptr + b * KC + j) == ctok:
                        alive_node = tl.load(cnode_ptr + b * KC + j)
                        rep = tl.minimum(rep, alive_node)
                        tl.store(alive_ptr + b * N + alive_node, gen)
            else:
                tl.store(alive_ptr + b * N + child, gen)
    # parent-consistent accepted path, rebuilt from the last accepted node
    node = last
    d = depth - 1
    while d >= 0:
        tl.store(acc_ptr + b * L + d, node)
        node = tl.load(par_ptr + b * N + node)
        d -= 1
    tl.store(nacc_ptr + b, depth)
    tl.store(next_ptr + b, nxt)


# ----------------------------------------------------------------------------------------------------------------
# verify_tree, method "block": one program judges one row's chain (docs/methods.md, Block verification)


@triton.jit
def _block_weight(tok_ptr, chain_ptr, i, p_ptr, q_ptr, V):
    """w_i = min(1, w_{i-1} q(X_i) / p(X_i)) in float64 along the row's chain (chain_ptr: the drafted nodes)."""
    w = tl.full((), 1.0, tl.float64)
    prev = tl.zeros((), tl.int64)
    for d in range(0, i):
        node = tl.load(chain_ptr + d)
        x = tl.load(tok_ptr + node)
        qx = tl.load(q_ptr + prev * V + x).to(tl.float64)
        px = tl.load(p_ptr + prev * V + x).to(tl.float64)
        w = tl.minimum(w * qx / px, 1.0)
        prev = node
    return w


@triton.jit
def _block_excess_sum(w, p_row, q_row, V, BLOCK_V: tl.constexpr):
    """sum_v (w q(v) - p(v))^+ in float64."""
    tot = tl.zeros((), tl.float64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        q = tl.load(q_row + offs, mask=m, other=0.0).to(tl.float64)
        p = tl.load(p_row + offs, mask=m, other=0.0).to(tl.float64)
        tot += tl.sum(tl.maximum(w * q - p, 0.0), axis=0)
    return tot


@triton.jit
def _sample_block_residual(
    w, tot, p_row, q_row, noise_ptr, noise_row, seed_lo, seed_hi, V, RNG: tl.constexpr, BLOCK_V: tl.constexpr
):
    """Gumbel-max sample of Norm[(w q - p)^+] in float64, or of q when its mass ``tot`` is <= 1e-12."""
    best_val = tl.full((), float("-inf"), tl.float64)
    best_idx = tl.full((), 0, tl.int64)
    use_q = tot <= ZERO_MASS_TOL_F64
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        q = tl.load(q_row + offs, mask=m, other=0.0).to(tl.float64)
        p = tl.load(p_row + offs, mask=m, other=0.0).to(tl.float64)
        r = tl.where(use_q, q, tl.maximum(w * q - p, 0.0) / tot)
        u = _noise_block(noise_ptr, offs, m, noise_row, seed_lo, seed_hi, FINAL, RNG)
        sc = tl.where(r > 0, tl.log(r), float("-inf")) + _gumbel(u)
        sc = tl.where(m, sc, float("-inf"))
        best_val, best_idx = _merge_chunk_best(sc, start, best_val, best_idx)
    return best_idx


@triton.jit(do_not_specialize=["seed_lo", "seed_hi"])
def _verify_block_kernel(
    tok_ptr,  # [B, N] int64
    par_ptr,  # [B, N] int64
    valid_ptr,  # [B, N] int8
    p_ptr,  # [B, N, V] fp32
    q_ptr,  # [B, N, V] fp32
    u_ptr,  # [B, N, KU] fp64 (unused when RNG)
    fin_ptr,  # [B, V] fp64 (unused when RNG)
    eos_ptr,  # [n_eos] int64
    n_eos,
    chain_ptr,  # [B, KC] int64 scratch: the chain's nodes in depth order
    acc_ptr,  # [B, L] int64 out, -1 initialised
    rank_ptr,  # [B, L] int64 out, -1 initialised
    nacc_ptr,  # [B] int64 out
    next_ptr,  # [B] int64 out
    N,
    V,
    KU,
    KC,
    L,
    seed_lo,
    seed_hi,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    tok = tok_ptr + b * N
    rows_p = p_ptr + b * N * V
    rows_q = q_ptr + b * N * V
    chain = chain_ptr + b * KC
    cur = tl.zeros((), tl.int64)
    length = tl.zeros((), tl.int64)
    for n in range(1, N):  # the chain: each node's first child (the op admits chains only)
        if tl.load(valid_ptr + b * N + n) != 0:
            if tl.load(par_ptr + b * N + n) == cur:
                tl.store(chain + length, n + tl.zeros((), tl.int64))
                cur = n + tl.zeros((), tl.int64)
                length += 1
    # a scalar store is one lane's: every lane must see the chain before reading it back (global memory, no implicit
    # ordering between lanes; the same barrier follows every scratch write below)
    tl.debug_barrier()
    # tau: the deepest level whose test passes; level i < length tests U (S + 1 - w) < S, the last U < w
    tau = tl.zeros((), tl.int64)
    i = length
    while (i >= 1) & (tau == 0):
        node = tl.load(chain + i - 1)
        u = _noise_at(u_ptr + (b * N + node) * KU, 0, b * N + node, seed_lo, seed_hi, ACCEPT, RNG)
        w = _block_weight(tok, chain, i, rows_p, rows_q, V)
        if i == length:
            ok = u < w
        else:
            s = _block_excess_sum(w, rows_p + node * V, rows_q + node * V, V, BLOCK_V)
            ok = u * (s + (1.0 - w)) < s
        if ok:
            tau = i
        i -= 1
    node = tl.where(tau > 0, tl.load(chain + tl.maximum(tau - 1, 0)), 0)
    if tau == length:
        q_row = rows_q + node * V
        nxt = _argmax_chunked(q_row, fin_ptr + b * V, b, seed_lo, seed_hi, V, True, False, FINAL, RNG, BLOCK_V)
    else:
        w = _block_weight(tok, chain, tau, rows_p, rows_q, V)
        tot = _block_excess_sum(w, rows_p + node * V, rows_q + node * V, V, BLOCK_V)
        nxt = _sample_block_residual(
            w, tot, rows_p + node * V, rows_q + node * V, fin_ptr + b * V, b, seed_lo, seed_hi, V, RNG, BLOCK_V
        )
    kept = tau
    for d in range(0, tau):  # an accepted EOS ends the row
        if kept == tau:
            if _is_eos(tl.load(tok + tl.load(chain + d)), eos_ptr, n_eos):
                kept = d + 1
                nxt = tl.full((), -1, tl.int64)
    for d in range(0, kept):
        tl.store(acc_ptr + b * L + d, tl.load(chain + d))
        tl.store(rank_ptr + b * L + d, tl.zeros((), tl.int64))
    tl.store(nacc_ptr + b, kept)
    tl.store(next_ptr + b, nxt)


# ----------------------------------------------------------------------------------------------------------------
# verify_tree, methods "traversal" / "traversalw": one program walks one row's tree from the leaves up
# (docs/methods.md, Traversal verification)


@triton.jit
def _first_child_left(par_ptr, valid_ptr, removed_ptr, node, N):
    """The first child of ``node`` still in the tree (its removed children are always its first ones), or -1."""
    skip = tl.load(removed_ptr + node)
    seen = tl.zeros((), tl.int32)
    found = tl.full((), -1, tl.int64)
    for m in range(1, N):
        if found < 0:
            if tl.load(valid_ptr + m) != 0:
                if tl.load(par_ptr + m) == node:
                    if seen == skip:
                        found = m + tl.zeros((), tl.int64)
                    seen += 1
    return found


@triton.jit(do_not_specialize=["seed_lo", "seed_hi"])
def _verify_traversal_kernel(
    tok_ptr,  # [B, N] int64
    par_ptr,  # [B, N] int64
    valid_ptr,  # [B, N] int8
    p_ptr,  # [B, N, V] fp32
    q_ptr,  # [B, N, V] fp32
    u_ptr,  # [B, N, KU] fp64 (unused when RNG)
    fin_ptr,  # [B, V] fp64 (unused when RNG)
    eos_ptr,  # [n_eos] int64
    n_eos,
    removed_ptr,  # [B, N] int32 scratch, zero initialised: removed children per node
    lv_node_ptr,  # [B, L + 1] int64 scratch: the node at each depth of the walk's path
    lv_ptr,  # [B, L + 1, 3] fp64 scratch: a, den, num of each node on the path
    r_ptr,  # [B, L + 1, V] fp64 scratch: target law of each node on the path
    d_ptr,  # [B, L + 1, V] fp64 scratch: draft law of each node on the path
    acc_ptr,  # [B, L] int64 out, -1 initialised
    rank_ptr,  # [B, L] int64 out, -1 initialised
    nacc_ptr,  # [B] int64 out
    next_ptr,  # [B] int64 out
    N,
    V,
    KU,
    L,
    seed_lo,
    seed_hi,
    SWOR: tl.constexpr,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    tok = tok_ptr + b * N
    par = par_ptr + b * N
    valid = valid_ptr + b * N
    removed = removed_ptr + b * N
    lv_node = lv_node_ptr + b * (L + 1)
    lv = lv_ptr + b * (L + 1) * 3
    rows_r = r_ptr + b * (L + 1) * V
    rows_d = d_ptr + b * (L + 1) * V
    rows_p = p_ptr + b * N * V
    rows_q = q_ptr + b * N * V
    # the root: a = 1, tested (U < 1 always passes) only once it has no child left
    tl.store(lv_node, tl.zeros((), tl.int64))
    tl.store(lv + 0, 1.0)
    tl.store(lv + 1, 1.0)
    tl.store(lv + 2, 1.0)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        tl.store(rows_r + offs, tl.load(rows_q + offs, mask=m, other=0.0).to(tl.float64), mask=m)
        tl.store(rows_d + offs, tl.load(rows_p + offs, mask=m, other=0.0).to(tl.float64), mask=m)
    tl.debug_barrier()
    depth = tl.zeros((), tl.int64)
    done = tl.zeros((), tl.int32)
    nxt = tl.full((), -1, tl.int64)
    while done == 0:
        node = tl.load(lv_node + depth)
        child = _first_child_left(par, valid, removed, node, N)
        while (child >= 0) & (depth < L):  # descend to the first child left: a = min(1, a_P R_P(x) / D_P(x))
            x = tl.load(tok + child)
            a_par = tl.load(lv + depth * 3)
            rx = tl.load(rows_r + depth * V + x)
            dx = tl.load(rows_d + depth * V + x)
            a = tl.where(dx > 0, tl.minimum(a_par * rx / tl.where(dx > 0, dx, 1.0), 1.0), 0.0)
            depth += 1
            tl.store(lv_node + depth, child)
            tl.store(lv + depth * 3 + 0, a)
            tl.store(lv + depth * 3 + 1, 1.0)
            tl.store(lv + depth * 3 + 2, a)
            for start in range(0, V, BLOCK_V):
                offs = start + tl.arange(0, BLOCK_V)
                m = offs < V
                qv = tl.load(rows_q + child * V + offs, mask=m, other=0.0).to(tl.float64)
                pv = tl.load(rows_p + child * V + offs, mask=m, other=0.0).to(tl.float64)
                tl.store(rows_r + depth * V + offs, qv, mask=m)
                tl.store(rows_d + depth * V + offs, pv, mask=m)
            tl.debug_barrier()
            node = child
            child = _first_child_left(par, valid, removed, node, N)
        too_deep = child >= 0  # a path longer than L (a wrong max_depth): the row reports n_accepted = -1
        u = _noise_at(u_ptr + (b * N + node) * KU, 0, b * N + node, seed_lo, seed_hi, ACCEPT, RNG)
        den = tl.load(lv + depth * 3 + 1)
        num = tl.load(lv + depth * 3 + 2)
        if too_deep:
            depth = tl.full((), -1, tl.int64)
            done = 1
        elif (depth == 0) | (u * den < num):
            nxt = _argmax_chunked(rows_r + depth * V, fin_ptr + b * V, b, seed_lo, seed_hi, V, True, False, FINAL, RNG,
                                  BLOCK_V)  # fmt: skip
            done = 1
        else:  # rejected: the node leaves the tree, its parent is updated
            depth -= 1
            up = tl.load(lv_node + depth)
            a_p = tl.load(lv + depth * 3)
            mass = tl.zeros((), tl.float64)
            for start in range(0, V, BLOCK_V):
                offs = start + tl.arange(0, BLOCK_V)
                m = offs < V
                rv = tl.load(rows_r + depth * V + offs, mask=m, other=0.0)
                dv = tl.load(rows_d + depth * V + offs, mask=m, other=0.0)
                mass += tl.sum(tl.maximum(a_p * rv - dv, 0.0), axis=0)
            den_new = mass + (1.0 - a_p)
            a_new = tl.where(den_new > 0, mass / tl.where(den_new > 0, den_new, 1.0), a_p)
            if mass > ZERO_MASS_TOL_F64:
                for start in range(0, V, BLOCK_V):
                    offs = start + tl.arange(0, BLOCK_V)
                    m = offs < V
                    rv = tl.load(rows_r + depth * V + offs, mask=m, other=0.0)
                    dv = tl.load(rows_d + depth * V + offs, mask=m, other=0.0)
                    tl.store(rows_r + depth * V + offs, tl.maximum(a_p * rv - dv, 0.0) / mass, mask=m)
            if SWOR:  # the rejected token leaves the law the next sibling was drawn from
                gone = tl.load(tok + node)
                tot = tl.zeros((), tl.float64)
                for start in range(0, V, BLOCK_V):
                    offs = start + tl.arange(0, BLOCK_V)
                    dv = tl.load(rows_d + depth * V + offs, mask=offs < V, other=0.0)
                    tot += tl.sum(tl.where(offs == gone, 0.0, dv), axis=0)
                for start in range(0, V, BLOCK_V):
                    offs = start + tl.arange(0, BLOCK_V)
                    m = offs < V
                    dv = tl.where(offs == gone, 0.0, tl.load(rows_d + depth * V + offs, mask=m, other=0.0))
                    tl.store(rows_d + depth * V + offs, tl.where(tot > 0, dv / tl.where(tot > 0, tot, 1.0), dv), mask=m)
            tl.store(lv + depth * 3 + 0, a_new)
            tl.store(lv + depth * 3 + 1, den_new)
            tl.store(lv + depth * 3 + 2, mass)
            tl.store(removed + up, tl.load(removed + up) + 1)
            tl.debug_barrier()
    kept = depth
    for k in range(1, depth + 1):  # an accepted EOS ends the row (no iteration after an overflow: depth = -1)
        if kept == depth:
            if _is_eos(tl.load(tok + tl.load(lv_node + k)), eos_ptr, n_eos):
                kept = k + tl.zeros((), tl.int64)
                nxt = tl.full((), -1, tl.int64)
    for k in range(1, kept + 1):
        tl.store(acc_ptr + b * L + k - 1, tl.load(lv_node + k))
        tl.store(rank_ptr + b * L + k - 1, tl.load(removed + tl.load(lv_node + k - 1)).to(tl.int64))
    tl.store(nacc_ptr + b, kept)
    tl.store(next_ptr + b, nxt)


#: greedy, the path verifiers walk as these node verifiers do (accept the child equal to the target's argmax)
GREEDY_AS = {"block": "sd", "traversal": "rrs", "traversalw": "rrsw"}


def verify_tree(
    tokens: torch.Tensor,
    parent: torch.Tensor,
    valid: torch.Tensor,
    p_rows: torch.Tensor | None,
    q_rows: torch.Tensor,
    method: str,
    hub: torch.Tensor | None,
    accept_u: torch.Tensor | None,
    final_noise: torch.Tensor | None,
    greedy: bool,
    eos: torch.Tensor | None,
    max_depth: int,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, n = tokens.shape
    vocab = q_rows.shape[-1]
    dev = tokens.device
    qf = q_rows.float().contiguous()
    pf = qf if p_rows is None else p_rows.float().contiguous()
    kc = max(n - 1, 1)  # a node has at most N - 1 candidates
    # the Philox element (b * N + node, rank) does not depend on the width of accept_u
    rng, accept_u, final_noise = _verify_noise(accept_u, final_noise, seed, (batch, n, kc), (batch, vocab), dev)
    acc = torch.full((batch, max_depth), -1, dtype=torch.long, device=dev)
    rank = torch.full((batch, max_depth), -1, dtype=torch.long, device=dev)
    n_acc = torch.empty(batch, dtype=torch.long, device=dev)
    nxt = torch.empty(batch, dtype=torch.long, device=dev)
    eos_t = (torch.empty(0, dtype=torch.long) if eos is None else eos).to(dev).long().contiguous()
    if method in ("traversal", "traversalw") and not greedy:
        if batch:
            lv_n = max(max_depth, 1) + 1  # the kernel strides its path scratch by L + 1, L = max(max_depth, 1)
            _verify_traversal_kernel[(batch,)](
                tokens.long().contiguous(),
                parent.long().contiguous(),
                valid.to(torch.int8).contiguous(),
                pf,
                qf,
                accept_u,
                final_noise,
                eos_t if eos_t.numel() else n_acc,
                eos_t.numel(),
                torch.zeros((batch, n), dtype=torch.int32, device=dev),
                torch.zeros((batch, lv_n), dtype=torch.long, device=dev),
                torch.zeros((batch, lv_n, 3), dtype=torch.float64, device=dev),
                torch.empty((batch, lv_n, vocab), dtype=torch.float64, device=dev),
                torch.empty((batch, lv_n, vocab), dtype=torch.float64, device=dev),
                acc if max_depth else n_acc,
                rank if max_depth else n_acc,
                n_acc,
                nxt,
                n,
                vocab,
                1 if rng else accept_u.shape[2],
                max(max_depth, 1),
                *_seed_args(seed),
                SWOR=method == "traversalw",
                RNG=rng,
                BLOCK_V=_block(vocab),
            )
            if bool((n_acc < 0).any()):
                raise ValueError("verify_tree: a tree is deeper than max_depth; pass the tree's real depth")
        return acc, n_acc, nxt, rank
    if method == "block" and not greedy:
        if batch:
            _verify_block_kernel[(batch,)](
                tokens.long().contiguous(),
                parent.long().contiguous(),
                valid.to(torch.int8).contiguous(),
                pf,
                qf,
                accept_u,
                final_noise,
                eos_t if eos_t.numel() else n_acc,
                eos_t.numel(),
                torch.empty((batch, kc), dtype=torch.long, device=dev),
                acc if max_depth else n_acc,
                rank if max_depth else n_acc,
                n_acc,
                nxt,
                n,
                vocab,
                1 if rng else accept_u.shape[2],
                kc,
                max(max_depth, 1),
                *_seed_args(seed),
                RNG=rng,
                BLOCK_V=_block(vocab),
            )
        return acc, n_acc, nxt, rank
    r = torch.empty((batch, vocab), dtype=torch.float32, device=dev)
    if batch:
        _verify_tree_kernel[(batch,)](
            tokens.long().contiguous(),
            parent.long().contiguous(),
            valid.to(torch.int8).contiguous(),
            pf,
            qf,
            (torch.zeros_like(tokens) if hub is None else hub).long().contiguous(),
            accept_u,
            final_noise,
            eos_t if eos_t.numel() else n_acc,
            eos_t.numel(),
            torch.full((batch, n), -1, dtype=torch.int32, device=dev),
            torch.empty((batch, kc), dtype=torch.long, device=dev),
            torch.empty((batch, kc), dtype=torch.long, device=dev),
            torch.ones(kc, dtype=torch.int8, device=dev),
            r,
            torch.empty_like(r) if method in ("rrsw", "gds") else r,
            torch.empty((batch, kc), dtype=torch.float32, device=dev),
            acc if max_depth else n_acc,
            rank if max_depth else n_acc,
            n_acc,
            nxt,
            n,
            vocab,
            1 if rng else accept_u.shape[2],
            kc,
            max(max_depth, 1),
            *_seed_args(seed),
            METHOD=METHOD_CODE[GREEDY_AS.get(method, method)],
            KSEQ=method == "kseq",
            GREEDY=bool(greedy),
            RNG=rng,
            BLOCK_V=_block(vocab),
        )
    return acc, n_acc, nxt, rank
