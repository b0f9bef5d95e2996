"""Backend "triton": the kernels and launchers of verify_chain, emission_law, verify_tree and verify_node (the node
verifiers they share are in ``node.py``, verify_tree's path verifiers, block and traversal verification, in
``paths.py``).

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
    _is_eos,
    _noise_at,
    _sample_residual,
    _seed_args,
    _verify_noise,
)
from .node import (
    METHOD_CODE,
    _verify_node_row,
)
from .paths import GREEDY_AS, verify_path


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
    if method in GREEDY_AS and not greedy:  # a path verifier (paths.py)
        verify_path(method, tokens, parent, valid, pf, qf, accept_u, final_noise, eos_t, (acc, n_acc, nxt, rank), rng,
                    max_depth, seed)  # fmt: skip
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


# ----------------------------------------------------------------------------------------------------------------
# verify_node: one program verifies one row's candidates


@triton.jit(do_not_specialize=["seed_lo", "seed_hi"])
def _verify_node_kernel(
    cand_ptr,  # [B, K] int64
    cvalid_ptr,  # [B, K] int8
    p_ptr,  # [B, V] fp32
    q_ptr,  # [B, V] fp32
    u_ptr,  # [B, K] fp64 (unused when RNG)
    fin_ptr,  # [B, V] fp64 (unused when RNG)
    hub_ptr,  # [B] int64
    r_ptr,  # [B, V] fp32 scratch -> final residual
    s_ptr,  # [B, V] fp32 scratch
    ap_ptr,  # [B, K] fp32
    slot_ptr,  # [B] int64
    tok_ptr,  # [B] int64
    K,
    V,
    seed_lo,
    seed_hi,
    METHOD: tl.constexpr,
    ANALYTIC: tl.constexpr,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    hub = tl.load(hub_ptr + b)
    chosen = _verify_node_row(
        cand_ptr + b * K,
        cvalid_ptr + b * K,
        K,
        p_ptr + b * V,
        q_ptr + b * V,
        u_ptr + b * K,
        b,
        seed_lo,
        seed_hi,
        hub,
        r_ptr + b * V,
        s_ptr + b * V,
        ap_ptr + b * K,
        V,
        METHOD,
        ANALYTIC,
        RNG,
        BLOCK_V,
    )
    if chosen >= 0:
        tok = tl.load(cand_ptr + b * K + chosen)
    else:
        tok = _argmax_chunked(r_ptr + b * V, fin_ptr + b * V, b, seed_lo, seed_hi, V, True, False, FINAL, RNG, BLOCK_V)
    tl.store(slot_ptr + b, chosen)
    tl.store(tok_ptr + b, tok)


def verify_node(
    method: str,
    cand: torch.Tensor,
    cand_valid: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    accept_u: torch.Tensor | None,
    final_noise: torch.Tensor | None,
    hub: torch.Tensor | None,
    analytic: bool,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    batch, k = cand.shape
    vocab = p.shape[-1]
    dev = p.device
    rng, accept_u, final_noise = _verify_noise(accept_u, final_noise, seed, (batch, k), (batch, vocab), dev)
    r = torch.empty((batch, vocab), dtype=torch.float32, device=dev)
    s = torch.empty((batch, vocab), dtype=torch.float32, device=dev) if method in ("rrsw", "gds") else r
    ap = torch.zeros((batch, k), dtype=torch.float32, device=dev)
    slot = torch.empty(batch, dtype=torch.long, device=dev)
    tok = torch.empty(batch, dtype=torch.long, device=dev)
    hub_t = torch.zeros(batch, dtype=torch.long, device=dev) if hub is None else hub.long().contiguous()
    if batch:
        _verify_node_kernel[(batch,)](
            cand.long().contiguous(),
            cand_valid.to(torch.int8).contiguous(),
            p.float().contiguous(),
            q.float().contiguous(),
            accept_u,
            final_noise,
            hub_t,
            r,
            s,
            ap,
            slot,
            tok,
            k,
            vocab,
            *_seed_args(seed),
            METHOD=METHOD_CODE[method],
            ANALYTIC=bool(analytic),
            RNG=rng,
            BLOCK_V=_block(vocab),
        )
    if not analytic:
        return slot, tok, None, None
    return slot, tok, ap, r
