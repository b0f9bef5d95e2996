"""Backend "triton": the path verifiers of verify_tree, block verification of chains and traversal verification of
trees (docs/methods.md): their kernels and launch. As the C++ and CUDA sources group them; what every kernel shares is
in ``common.py``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (
    ACCEPT,
    FINAL,
    ZERO_MASS_TOL_F64,
    _argmax_chunked,
    _block,
    _gumbel,
    _is_eos,
    _merge_chunk_best,
    _noise_at,
    _noise_block,
    _seed_args,
)

#: the verify_tree methods that judge whole paths; greedy, they walk as these node verifiers do (accept the child
#: equal to the target's argmax)
GREEDY_AS = {"block": "sd", "traversal": "rrs", "traversalw": "rrsw"}


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


def verify_path(
    method: str,
    tokens: torch.Tensor,
    parent: torch.Tensor,
    valid: torch.Tensor,
    pf: torch.Tensor,
    qf: torch.Tensor,
    accept_u: torch.Tensor,
    final_noise: torch.Tensor,
    eos_t: torch.Tensor,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    rng: bool,
    max_depth: int,
    seed: int,
) -> None:
    """Run the path verifier ``method`` (sampling mode) on every row, writing verify_tree's outputs
    ``out`` = (accepted nodes, n_accepted, next token, ranks) in place."""
    acc, n_acc, nxt, rank = out
    batch, n = tokens.shape
    vocab = qf.shape[-1]
    dev = tokens.device
    kc = max(n - 1, 1)
    if not batch:
        return
    if method in ("traversal", "traversalw"):
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
        return
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
