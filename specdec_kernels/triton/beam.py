"""Backend "triton": the kernels and launchers of spechub_sample, kseq_gamma, sbs_step.

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
    _noise_at,
    _noise_block,
    _seed_args,
)
from .node import (
    _kseq_gamma_row,
)
from .sampling import (
    _rows,
)

# ----------------------------------------------------------------------------------------------------------------
# spechub_sample, kseq_gamma, filter_kv


@triton.jit(do_not_specialize=["seed_lo", "seed_hi"])
def _spechub_sample_kernel(
    logp_ptr,  # [R, V] fp32
    noise_ptr,  # [R, V] fp64 (unused when RNG)
    tok_ptr,  # [R, 2] int64
    hub_ptr,  # [R] int64
    valid_ptr,  # [R, 2] int8
    V,
    seed_lo,
    seed_hi,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Hub a = argmax p; Gumbel-top-2 (y1, y2); drafts (a, y2) if y1 == a else (y1, a) (SpecHub drafting)."""
    row = tl.program_id(0).to(tl.int64)
    lp_row = logp_ptr + row * V
    u_row = noise_ptr + row * V
    hub = _argmax_plain(lp_row, V, True, BLOCK_V)
    y1 = _argmax_chunked(lp_row, u_row, row, seed_lo, seed_hi, V, True, True, DRAFT, RNG, BLOCK_V)
    s1 = tl.load(lp_row + y1).to(tl.float64) + _gumbel(_noise_at(u_row, y1, row, seed_lo, seed_hi, DRAFT, RNG))
    best_val = tl.full((), float("-inf"), tl.float64)
    y2 = tl.full((), 0, tl.int64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        s = tl.load(lp_row + offs, mask=m, other=float("-inf")).to(tl.float64) + _gumbel(
            _noise_block(u_row, offs, m, row, seed_lo, seed_hi, DRAFT, RNG)
        )
        s = tl.where(m & ((s < s1) | ((s == s1) & (offs > y1))), s, float("-inf"))
        best_val, y2 = _merge_chunk_best(s, start, best_val, y2)
    p1 = tl.exp(tl.load(lp_row + y1).to(tl.float64))
    v2_topk = (best_val > float("-inf")) & ((1.0 - p1) > SWOR_MASS_EPS)
    single = (1.0 - tl.exp(tl.load(lp_row + hub).to(tl.float64))) <= SWOR_MASS_EPS
    first_is_hub = y1 == hub
    x2 = tl.where(first_is_hub, y2, hub)
    v2 = tl.where(first_is_hub, v2_topk, True) & (not single)
    tl.store(tok_ptr + row * 2, tl.where(first_is_hub, hub, y1))
    tl.store(tok_ptr + row * 2 + 1, tl.where(v2, x2, -1))
    tl.store(valid_ptr + row * 2, tl.full((), 1, tl.int8))
    tl.store(valid_ptr + row * 2 + 1, v2.to(tl.int8))
    tl.store(hub_ptr + row, hub)


def spechub_sample(
    logp: torch.Tensor, noise: torch.Tensor | None, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    vocab = logp.shape[-1]
    lp = logp.float().reshape(-1, vocab).contiguous()
    rows = lp.shape[0]
    tok = torch.empty((rows, 2), dtype=torch.long, device=lp.device)
    hub = torch.empty(rows, dtype=torch.long, device=lp.device)
    valid = torch.empty((rows, 2), dtype=torch.int8, device=lp.device)
    if rows:
        _spechub_sample_kernel[(rows,)](
            lp,
            _rows(noise, vocab, lp),
            tok,
            hub,
            valid,
            vocab,
            *_seed_args(seed),
            RNG=noise is None,
            BLOCK_V=_block(vocab),
        )
    lead = logp.shape[:-1]
    return tok.reshape(*lead, 2), hub.reshape(lead), valid.bool().reshape(*lead, 2)


@triton.jit
def _kseq_gamma_kernel(
    p_ptr,  # [B, V] fp32
    q_ptr,  # [B, V] fp32
    k_ptr,  # [B] int64
    gamma_ptr,  # [B] fp64
    beta_ptr,  # [B] fp64
    V,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    g, be = _kseq_gamma_row(p_ptr + b * V, q_ptr + b * V, tl.load(k_ptr + b).to(tl.int32), V, BLOCK_V)
    tl.store(gamma_ptr + b, g)
    tl.store(beta_ptr + b, be)


def kseq_gamma(p: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    batch, vocab = p.shape
    gamma = torch.empty(batch, dtype=torch.float64, device=p.device)
    beta = torch.empty(batch, dtype=torch.float64, device=p.device)
    if batch:
        _kseq_gamma_kernel[(batch,)](
            p.float().contiguous(),
            q.float().contiguous(),
            k.long().contiguous(),
            gamma,
            beta,
            vocab,
            BLOCK_V=_block(vocab),
        )
    return gamma, beta


# ----------------------------------------------------------------------------------------------------------------
# sbs_step: per-parent top-W by perturbed score, truncation of those candidates, then a global top-W


@triton.jit
def _expm1(x):
    """exp(x) - 1 accurate for small |x| (Kahan's trick; the interpreter has no libdevice)."""
    u = tl.exp(x)
    um1 = u - 1.0
    safe = tl.where((u == 1.0) | (um1 == -1.0), 1.0, um1 / tl.log(tl.where(u == 1.0, 2.0, u)))
    return tl.where(u == 1.0, x, tl.where(um1 == -1.0, -1.0, safe * x))


@triton.jit
def _log1p(x):
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.log(u) * x / tl.where(u == 1.0, 1.0, u - 1.0))


@triton.jit
def _truncated_gumbel(u, phit, z):
    """Trunc(u, phit, Z) = u - softplus(u - phit + log1mexp(phit - Z)) in a stable form, with
    phit = Z giving u and phit = -inf giving -inf."""
    a = tl.minimum(phit - z, 0.0)
    l1m = tl.where(a > -0.6931471805599453, tl.log(-_expm1(a)), _log1p(-tl.exp(a)))
    v = u - phit + l1m
    out = u - (tl.maximum(v, 0.0) + _log1p(tl.exp(-tl.abs(v))))
    out = tl.where(phit == z, u, out)
    return tl.where(phit == float("-inf"), float("-inf"), out)


@triton.jit(do_not_specialize=["seed_lo", "seed_hi"])
def _sbs_step_kernel(
    logp_ptr,  # [B, Win, V] fp32
    sigma_ptr,  # [B, Win] fp64
    gamma_ptr,  # [B, Win] fp64
    bvalid_ptr,  # [B, Win] int8
    noise_ptr,  # [B, Win, V] fp64 (unused when RNG)
    cpsi_ptr,  # [B, C] fp64 scratch, C = Win * WSEL
    cidx_ptr,  # [B, C] int64 scratch (flattened parent * V + token)
    cphi_ptr,  # [B, C] fp64 scratch
    par_ptr,  # [B, Wout] int64 out
    tok_ptr,  # [B, Wout] int64 out
    sig_out_ptr,  # [B, Wout] fp64 out
    gam_out_ptr,  # [B, Wout] fp64 out
    valid_ptr,  # [B, Wout] int8 out
    WIN,
    V,
    WSEL,
    WOUT,
    seed_lo,
    seed_hi,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    C = WIN * WSEL
    for k in range(0, WIN):
        live = tl.load(bvalid_ptr + b * WIN + k) != 0
        sig = tl.where(live, tl.load(sigma_ptr + b * WIN + k), 0.0)
        gam = tl.where(live, tl.load(gamma_ptr + b * WIN + k), 0.0)
        lp_row = logp_ptr + (b * WIN + k) * V
        u_row = noise_ptr + (b * WIN + k) * V
        prev_s = tl.full((), float("inf"), tl.float64)
        prev_i = tl.full((), -1, tl.int64)
        z = tl.full((), float("-inf"), tl.float64)
        for j in range(0, WSEL):
            best_val = tl.full((), float("-inf"), tl.float64)
            best_idx = tl.full((), 0, tl.int64)
            for start in range(0, V, BLOCK_V):
                offs = start + tl.arange(0, BLOCK_V)
                m = offs < V
                lp = tl.load(lp_row + offs, mask=m, other=float("-inf")).to(tl.float64)
                s = (sig + lp) + _gumbel(_noise_block(u_row, offs, m, b * WIN + k, seed_lo, seed_hi, DRAFT, RNG))
                s = tl.where(m & ((s < prev_s) | ((s == prev_s) & (offs > prev_i))), s, float("-inf"))
                best_val, best_idx = _merge_chunk_best(s, start, best_val, best_idx)
            z = tl.where(j == 0, best_val, z)
            psi = _truncated_gumbel(gam, best_val, z)
            psi = tl.where(live, psi, float("-inf"))
            slot = b * C + k * WSEL + j
            tl.store(cpsi_ptr + slot, psi)
            tl.store(cidx_ptr + slot, k * V + best_idx)
            tl.store(cphi_ptr + slot, sig + tl.load(lp_row + best_idx).to(tl.float64))
            prev_s = best_val
            prev_i = best_idx
    offs = tl.arange(0, BLOCK_C)
    cm = offs < C
    psi_all = tl.load(cpsi_ptr + b * C + offs, mask=cm, other=float("-inf"))
    idx_all = tl.load(cidx_ptr + b * C + offs, mask=cm, other=0)
    prev_s = tl.full((), float("inf"), tl.float64)
    prev_i = tl.full((), -1, tl.int64)
    for j in range(0, WOUT):
        after = cm & ((psi_all < prev_s) | ((psi_all == prev_s) & (idx_all > prev_i)))
        # best = largest psi, then smallest flattened index
        cand = tl.where(after, psi_all, float("-inf"))
        best_val = tl.max(cand, axis=0)
        is_best = after & (psi_all == best_val)
        best_idx = tl.min(tl.where(is_best, idx_all, 9223372036854775807), axis=0)
        pos = tl.argmax((is_best & (idx_all == best_idx)).to(tl.int32), axis=0, tie_break_left=True)
        ok = best_val > float("-inf")
        phi = tl.load(cphi_ptr + b * C + pos)
        out = b * WOUT + j
        tl.store(par_ptr + out, tl.where(ok, best_idx // V, -1))
        tl.store(tok_ptr + out, tl.where(ok, best_idx % V, -1))
        tl.store(sig_out_ptr + out, tl.where(ok, phi, float("-inf")))
        tl.store(gam_out_ptr + out, tl.where(ok, best_val, float("-inf")))
        tl.store(valid_ptr + out, ok.to(tl.int8))
        prev_s = best_val
        prev_i = best_idx


def sbs_step(
    logp: torch.Tensor,
    sigma: torch.Tensor,
    gamma: torch.Tensor,
    beam_valid: torch.Tensor,
    w_out: int,
    noise: torch.Tensor | None,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, w_in, vocab = logp.shape
    dev = logp.device
    wsel = min(w_out, vocab)  # at most w_out children of one parent can survive
    c = w_in * wsel
    outs = (
        torch.empty((batch, w_out), dtype=torch.long, device=dev),
        torch.empty((batch, w_out), dtype=torch.long, device=dev),
        torch.empty((batch, w_out), dtype=torch.float64, device=dev),
        torch.empty((batch, w_out), dtype=torch.float64, device=dev),
        torch.empty((batch, w_out), dtype=torch.int8, device=dev),
    )
    if batch:
        _sbs_step_kernel[(batch,)](
            logp.float().contiguous(),
            sigma.double().contiguous(),
            gamma.double().contiguous(),
            beam_valid.to(torch.int8).contiguous(),
            _rows(noise, vocab, logp),
            torch.empty((batch, c), dtype=torch.float64, device=dev),
            torch.empty((batch, c), dtype=torch.long, device=dev),
            torch.empty((batch, c), dtype=torch.float64, device=dev),
            *outs,
            w_in,
            vocab,
            wsel,
            w_out,
            *_seed_args(seed),
            RNG=noise is None,
            BLOCK_V=_block(vocab),
            BLOCK_C=max(16, triton.next_power_of_2(c)),
        )
    return outs[0], outs[1], outs[2], outs[3], outs[4].bool()
