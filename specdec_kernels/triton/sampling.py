"""Backend "triton": the kernels and launchers of sample_categorical, gumbel_topk, process_logits.

As the C++ and CUDA sources group them; what every kernel shares is in ``common.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (
    DRAFT,
    SWOR_MASS_EPS,
    _argmax_chunked,
    _argmax_plain,
    _block,
    _gumbel,
    _merge_chunk_best,
    _noise_block,
    _seed_args,
)

# ----------------------------------------------------------------------------------------------------------------
# sample_categorical / gumbel_topk


@triton.jit(do_not_specialize=["seed_lo", "seed_hi"])
def _sample_categorical_kernel(
    logp_ptr,  # [R, V] fp32
    noise_ptr,  # [R, V] fp64 (unused when RNG)
    out_ptr,  # [R] int64
    V,
    seed_lo,
    seed_hi,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    idx = _argmax_chunked(
        logp_ptr + row * V, noise_ptr + row * V, row, seed_lo, seed_hi, V, True, True, DRAFT, RNG, BLOCK_V
    )
    tl.store(out_ptr + row, idx)


def _rows(noise: torch.Tensor | None, vocab: int, like: torch.Tensor) -> torch.Tensor:
    """The noise as contiguous [R, V] float64 rows, or a 1-element placeholder when the kernel draws it (RNG)."""
    if noise is None:
        return torch.empty(1, dtype=torch.float64, device=like.device)
    return noise.reshape(-1, vocab).contiguous()


def sample_categorical(logp: torch.Tensor, noise: torch.Tensor | None, seed: int = 0) -> torch.Tensor:
    vocab = logp.shape[-1]
    lp = logp.float().reshape(-1, vocab).contiguous()
    out = torch.empty(lp.shape[0], dtype=torch.long, device=lp.device)
    if lp.shape[0]:
        _sample_categorical_kernel[(lp.shape[0],)](
            lp, _rows(noise, vocab, lp), out, vocab, *_seed_args(seed), RNG=noise is None, BLOCK_V=_block(vocab)
        )
    return out.reshape(logp.shape[:-1])


@triton.jit(do_not_specialize=["seed_lo", "seed_hi"])
def _gumbel_topk_kernel(
    logp_ptr,  # [R, V] fp32
    noise_ptr,  # [R, V] fp64 (unused when RNG)
    tok_ptr,  # [R, K] int64
    valid_ptr,  # [R, K] int8
    score_ptr,  # [R, K] fp64
    V,
    K,
    seed_lo,
    seed_hi,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """k passes; pass j takes the largest (score desc, index asc) strictly after the previous pick."""
    row = tl.program_id(0).to(tl.int64)
    prev_s = tl.full((), float("inf"), tl.float64)
    prev_i = tl.full((), -1, tl.int64)
    mass = tl.zeros((), tl.float64)
    for j in range(0, K):
        best_val = tl.full((), float("-inf"), tl.float64)
        best_idx = tl.full((), 0, tl.int64)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            m = offs < V
            lp = tl.load(logp_ptr + row * V + offs, mask=m, other=float("-inf")).to(tl.float64)
            u = _noise_block(noise_ptr + row * V, offs, m, row, seed_lo, seed_hi, DRAFT, RNG)
            s = lp + _gumbel(u)
            after = (s < prev_s) | ((s == prev_s) & (offs > prev_i))
            s = tl.where(m & after, s, float("-inf"))
            best_val, best_idx = _merge_chunk_best(s, start, best_val, best_idx)
        finite = best_val > float("-inf")
        ok = finite & ((1.0 - mass) > SWOR_MASS_EPS)
        p_sel = tl.exp(tl.load(logp_ptr + row * V + best_idx).to(tl.float64))
        mass += tl.where(finite, p_sel, 0.0)
        tl.store(tok_ptr + row * K + j, tl.where(ok, best_idx, -1))
        tl.store(valid_ptr + row * K + j, ok.to(tl.int8))
        tl.store(score_ptr + row * K + j, tl.where(ok, best_val, float("-inf")))
        prev_s = best_val
        prev_i = best_idx


def gumbel_topk(
    logp: torch.Tensor, k: int, noise: torch.Tensor | None, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    vocab = logp.shape[-1]
    lp = logp.float().reshape(-1, vocab).contiguous()
    u = _rows(noise, vocab, lp)
    rows = lp.shape[0]
    tok = torch.empty((rows, k), dtype=torch.long, device=lp.device)
    valid = torch.empty((rows, k), dtype=torch.int8, device=lp.device)
    score = torch.empty((rows, k), dtype=torch.float64, device=lp.device)
    if rows and k:
        _gumbel_topk_kernel[(rows,)](
            lp, u, tok, valid, score, vocab, k, *_seed_args(seed), RNG=noise is None, BLOCK_V=_block(vocab)
        )
    shape = (*logp.shape[:-1], k)
    return tok.reshape(shape), valid.bool().reshape(shape), score.reshape(shape)


# ----------------------------------------------------------------------------------------------------------------
# process_logits


@triton.jit
def _order_key(x):
    """Monotone map float32 -> int64 key (larger float, larger key), for exact selection by bisection."""
    b = x.to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(b < 0, -1 - b - 2147483648, b)


@triton.jit
def _process_logits_kernel(
    x_ptr,  # [R, V] fp32 logits
    out_ptr,  # [R, V] fp32 log-probs
    V,
    temperature,
    top_k,
    top_p,
    GREEDY: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * V
    o_row = out_ptr + row * V
    if GREEDY:
        a = _argmax_plain(x_row, V, True, BLOCK_V)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            tl.store(o_row + offs, tl.where(offs == a, 0.0, float("-inf")), mask=offs < V)
    else:
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            m = offs < V
            tl.store(o_row + offs, tl.load(x_row + offs, mask=m, other=0.0) / temperature, mask=m)
        if (top_k > 0) & (top_k < V):
            # largest key t with count(key >= t) >= k is the key of the k-th largest value (ties kept)
            lo = tl.full((), -2147483648, tl.int64)
            hi = tl.full((), 2147483647, tl.int64)
            while lo < hi:
                mid = lo + (hi - lo + 1) // 2
                c = tl.zeros((), tl.int64)
                for start in range(0, V, BLOCK_V):
                    offs = start + tl.arange(0, BLOCK_V)
                    x = tl.load(o_row + offs, mask=offs < V, other=float("-inf"))
                    c += tl.sum(((_order_key(x) >= mid) & (offs < V)).to(tl.int64), axis=0)
                lo = tl.where(c >= top_k, mid, lo)
                hi = tl.where(c >= top_k, hi, mid - 1)
            for start in range(0, V, BLOCK_V):
                offs = start + tl.arange(0, BLOCK_V)
                m = offs < V
                x = tl.load(o_row + offs, mask=m, other=0.0)
                tl.store(o_row + offs, tl.where(_order_key(x) >= lo, x, float("-inf")), mask=m)
        mx = tl.full((), float("-inf"), tl.float32)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            mx = tl.maximum(mx, tl.max(tl.load(o_row + offs, mask=offs < V, other=float("-inf")), axis=0))
        se = tl.zeros((), tl.float32)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            se += tl.sum(tl.exp(tl.load(o_row + offs, mask=offs < V, other=float("-inf")) - mx), axis=0)
        if top_p < 1.0:
            # t* = smallest probability whose strictly-greater mass is < top_p (a present value by construction)
            plo = tl.full((), 0, tl.int32)
            phi = tl.full((), 2139095040, tl.int32)  # bits of +inf
            while plo < phi:
                pmid = plo + (phi - plo) // 2
                t = pmid.to(tl.float32, bitcast=True)
                mass = tl.zeros((), tl.float64)
                for start in range(0, V, BLOCK_V):
                    offs = start + tl.arange(0, BLOCK_V)
                    pv = tl.exp(tl.load(o_row + offs, mask=offs < V, other=float("-inf")) - mx) / se
                    mass += tl.sum(tl.where(pv > t, pv.to(tl.float64), 0.0), axis=0)
                phi = tl.where(mass < top_p, pmid, phi)
                plo = tl.where(mass < top_p, plo, pmid + 1)
            t_star = plo.to(tl.float32, bitcast=True)
            above = tl.zeros((), tl.float64)
            for start in range(0, V, BLOCK_V):
                offs = start + tl.arange(0, BLOCK_V)
                pv = tl.exp(tl.load(o_row + offs, mask=offs < V, other=float("-inf")) - mx) / se
                above += tl.sum(tl.where(pv > t_star, pv.to(tl.float64), 0.0), axis=0)
            ties_before = tl.zeros((), tl.int64)
            for start in range(0, V, BLOCK_V):
                offs = start + tl.arange(0, BLOCK_V)
                m = offs < V
                x = tl.load(o_row + offs, mask=m, other=float("-inf"))
                pv = tl.exp(x - mx) / se
                tie = (pv == t_star) & m
                rank = ties_before + tl.cumsum(tie.to(tl.int64), axis=0) - tie.to(tl.int64)
                keep = (pv > t_star) | (tie & (above + t_star.to(tl.float64) * rank.to(tl.float64) < top_p))
                tl.store(o_row + offs, tl.where(keep, x, float("-inf")), mask=m)
                ties_before += tl.sum(tie.to(tl.int64), axis=0)
            se = tl.zeros((), tl.float32)
            for start in range(0, V, BLOCK_V):
                offs = start + tl.arange(0, BLOCK_V)
                se += tl.sum(tl.exp(tl.load(o_row + offs, mask=offs < V, other=float("-inf")) - mx), axis=0)
        lse = tl.log(se)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            m = offs < V
            tl.store(o_row + offs, tl.load(o_row + offs, mask=m, other=0.0) - mx - lse, mask=m)


def process_logits(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, log: bool = True
) -> torch.Tensor:
    """The kernel writes log-probs; ``log=False`` takes torch's softmax of them (not fused here)."""
    out = _process_logits_logp(logits, temperature, top_k, top_p)
    return out if log else torch.softmax(out, dim=-1)


def _process_logits_logp(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    vocab = logits.shape[-1]
    x = logits.float().reshape(-1, vocab).contiguous()
    out = torch.empty_like(x)
    if x.shape[0]:
        greedy = temperature < 1e-5
        _process_logits_kernel[(x.shape[0],)](
            x,
            out,
            vocab,
            1.0 if greedy else float(temperature),
            int(top_k),
            float(top_p),
            GREEDY=greedy,
            BLOCK_V=_block(vocab),
        )
    return out.reshape(logits.shape)
