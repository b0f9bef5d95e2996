"""Backend "triton": @triton.jit kernels and their launchers.

Every kernel runs one program per row and loops over the vocabulary in chunks of ``BLOCK`` entries, so the
same code serves any V. Noise arrives as float64 uniforms, or (``RNG=True``, the launchers' ``noise=None``
path) the kernels draw the Philox-4x32-10 stream of ``specdec_kernels._rng`` themselves, bit for bit. Gumbel
scores are formed in float64 from fp32 log-probs exactly as in the reference, and argmax ties break to the
lowest index (``tie_break_left`` within a chunk, strict ``>`` across chunks). On CPU tensors the kernels only
run under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _rng

BLOCK = 1024
ZERO_MASS_TOL = tl.constexpr(1e-6)  # zero-mass rule in fp32 (docs/exactness.md), same as the reference for fp32 inputs
ZERO_MASS_TOL_F64 = tl.constexpr(1e-12)  # zero-mass rule in fp64: SpecHub's plan is fp64
SWOR_MASS_EPS = tl.constexpr(1e-7)  # Gumbel-top-k: stop drawing once the remaining draft mass is this small


def _block(vocab: int) -> int:
    return max(16, min(BLOCK, triton.next_power_of_2(vocab)))


# ----------------------------------------------------------------------------------------------------------------
# shared device helpers


@triton.jit
def _gumbel(u):
    return -tl.log(-tl.log(u))


# ----------------------------------------------------------------------------------------------------------------
# counter-based noise (docs/kernels.md, Randomness contract; ``specdec_kernels._rng``): with RNG=True a kernel draws
# the uniforms of the stream (seed, purpose) itself instead of reading a noise tensor; the bits equal
# ``_rng.philox_uniform``.

DRAFT = tl.constexpr(_rng.DRAFT)  # the `noise` of the drafting ops
ACCEPT = tl.constexpr(_rng.ACCEPT)  # acceptance uniforms
FINAL = tl.constexpr(_rng.FINAL)  # final (corrected / bonus) sample


def _seed_args(seed: int) -> tuple[int, int]:
    """The key words (seed mod 2**32, seed >> 32) as signed 32-bit values, so every seed launches the same
    "i32" kernel signature (the kernels reinterpret them as uint32)."""
    seed = _rng.check_seed(int(seed))
    lo, hi = seed & 0xFFFFFFFF, seed >> 32
    return lo - (1 << 32) if lo >= 1 << 31 else lo, hi


@triton.jit
def _philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox-4x32-10 (Salmon et al., SC'11) on uint32 tensors of one shape: 10 rounds of two 32x32->64-bit
    products (high word by umulhi, low word by the wrapping product), Weyl key schedule."""
    for _ in tl.static_range(10):
        hi0 = tl.umulhi(c0, 0xD2511F53)
        lo0 = c0 * 0xD2511F53
        hi1 = tl.umulhi(c2, 0xCD9E8D57)
        lo1 = c2 * 0xCD9E8D57
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def _philox_uniform(seed_lo, seed_hi, PURPOSE: tl.constexpr, row, idx):
    """float64 uniform in (0, 1) of the stream (seed, PURPOSE) at (row, idx), the layout of ``_rng``:
    counter (idx >> 1, row mod 2**32, row >> 32, PURPOSE), key (seed_lo, seed_hi); words (0, 1) for an even
    idx, (2, 3) for an odd one; U = (2m + 1) 2**-53 with m = (a >> 12) 2**32 + b (exact in float64).

    row: int scalar (< 2**63); idx: int scalar or block (>= 0); seed_lo, seed_hi: 32-bit ints (any signedness)."""
    i = tl.zeros((), tl.int64) + idx  # also accepts Python ints (constexpr)
    r = tl.zeros((), tl.int64) + row
    c0 = (i >> 1).to(tl.uint32)
    zero = c0 ^ c0  # uint32 zeros of idx's shape
    c1 = zero + r.to(tl.uint32)  # truncation = row mod 2**32
    c2 = zero + (r >> 32).to(tl.uint32)
    c3 = zero + tl.full((), PURPOSE, tl.uint32)
    k0 = zero + seed_lo.to(tl.uint32)
    k1 = zero + seed_hi.to(tl.uint32)
    o0, o1, o2, o3 = _philox4x32_10(c0, c1, c2, c3, k0, k1)
    odd = (i & 1) != 0
    a = tl.where(odd, o2, o0)
    b = tl.where(odd, o3, o1)
    m = ((a >> 12).to(tl.uint64) << 32) | b.to(tl.uint64)
    return (m * 2 + 1).to(tl.float64) * 1.1102230246251565e-16  # 2**-53, exact in fp32 and fp64


@triton.jit
def _noise_block(ptr, offs, m, row, seed_lo, seed_hi, PURPOSE: tl.constexpr, RNG: tl.constexpr):
    """Uniforms at the block ``offs`` of one noise row: read from ``ptr`` (the row's base) or drawn (RNG)."""
    if RNG:
        u = _philox_uniform(seed_lo, seed_hi, PURPOSE, row, offs)
    else:
        u = tl.load(ptr + offs, mask=m, other=0.5)
    return u


@triton.jit
def _noise_at(ptr, idx, row, seed_lo, seed_hi, PURPOSE: tl.constexpr, RNG: tl.constexpr):
    """The uniform at the scalar index ``idx`` of one noise row (see _noise_block)."""
    if RNG:
        u = _philox_uniform(seed_lo, seed_hi, PURPOSE, row, idx)
    else:
        u = tl.load(ptr + idx)
    return u


@triton.jit
def _merge_chunk_best(s, start, best_val, best_idx):
    """Fold one chunk of scores into the running (max, argmax): lowest index inside the chunk
    (tie_break_left), earlier chunks win ties (strict >), so ties go to the lowest index overall."""
    cmax = tl.max(s, axis=0)
    cidx = tl.argmax(s, axis=0, tie_break_left=True).to(tl.int64) + start
    better = cmax > best_val
    return tl.where(better, cmax, best_val), tl.where(better, cidx, best_idx)


@triton.jit
def _argmax_chunked(
    row_ptr,
    noise_ptr,
    noise_row,
    seed_lo,
    seed_hi,
    V,
    USE_NOISE: tl.constexpr,
    LOG_INPUT: tl.constexpr,
    PURPOSE: tl.constexpr,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """argmax_v of x[v] (+ Gumbel(noise[v])) with x = row (log-probs) or log(row) (probabilities), in float64.

    Shape: row_ptr -> [V] fp32, noise_ptr -> [V] fp64 uniforms in (0, 1), or (RNG) the Philox row
    ``noise_row`` of the stream (seed, PURPOSE)."""
    best_val = tl.full((), float("-inf"), tl.float64)
    best_idx = tl.full((), 0, tl.int64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        x = tl.load(row_ptr + offs, mask=m, other=0.0).to(tl.float64)
        if LOG_INPUT:
            s = x
        else:
            s = tl.where(x > 0, tl.log(x), float("-inf"))
        if USE_NOISE:
            u = _noise_block(noise_ptr, offs, m, noise_row, seed_lo, seed_hi, PURPOSE, RNG)
            s = s + _gumbel(u)
        s = tl.where(m, s, float("-inf"))
        best_val, best_idx = _merge_chunk_best(s, start, best_val, best_idx)
    return best_idx


@triton.jit
def _argmax_plain(row_ptr, V, LOG_INPUT: tl.constexpr, BLOCK_V: tl.constexpr):
    """argmax_v of row (log-probs) or log(row) (probabilities), no noise; ties to the lowest index."""
    return _argmax_chunked(row_ptr, row_ptr, 0, 0, 0, V, False, LOG_INPUT, DRAFT, False, BLOCK_V)


@triton.jit
def _sample_residual(
    q_ptr, s_ptr, scale, noise_ptr, noise_row, seed_lo, seed_hi, V, RNG: tl.constexpr, BLOCK_V: tl.constexpr
):
    """Sample Norm[(q - scale*s)^+] by Gumbel-max; falls back to q when the mass is numerically zero.

    Shape: q_ptr, s_ptr -> [V] fp32 probabilities; noise_ptr -> [V] fp64, or (RNG) the FINAL Philox row."""
    tot = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        q = tl.load(q_ptr + offs, mask=m, other=0.0)
        s = tl.load(s_ptr + offs, mask=m, other=0.0)
        tot += tl.sum(tl.maximum(q - scale * s, 0.0), axis=0)
    best_val = tl.full((), float("-inf"), tl.float64)
    best_idx = tl.full((), 0, tl.int64)
    use_q = tot <= ZERO_MASS_TOL
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        q = tl.load(q_ptr + offs, mask=m, other=0.0)
        s = tl.load(s_ptr + offs, mask=m, other=0.0)
        r = tl.where(use_q, q, tl.maximum(q - scale * s, 0.0) / tot)
        u = _noise_block(noise_ptr, offs, m, noise_row, seed_lo, seed_hi, FINAL, RNG)
        sc = tl.where(r > 0, tl.log(r.to(tl.float64)), float("-inf")) + _gumbel(u)
        sc = tl.where(m, sc, float("-inf"))
        best_val, best_idx = _merge_chunk_best(sc, start, best_val, best_idx)
    return best_idx


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
# tree layout


@triton.jit
def _tree_positions_kernel(
    depth_ptr,  # [B, N] int64
    plen_ptr,  # [B] int64
    out_ptr,  # [B, N] int64
    N,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    p = tl.load(plen_ptr + b)
    for start in range(0, N, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        m = offs < N
        d = tl.load(depth_ptr + b * N + offs, mask=m, other=0)
        tl.store(out_ptr + b * N + offs, p - 1 + d, mask=m)


def tree_positions(depth: torch.Tensor, prefix_len: torch.Tensor) -> torch.Tensor:
    d = depth.long().contiguous()
    out = torch.empty_like(d)
    batch, n = d.shape
    if batch and n:
        _tree_positions_kernel[(batch,)](d, prefix_len.long().contiguous(), out, n, BLOCK_N=_block(n))
    return out


@triton.jit
def _tree_mask_kernel(
    parent_ptr,  # [B, N] int64
    valid_ptr,  # [B, N] int8
    past_ptr,  # [B, P] int8
    out_ptr,  # [B, N, P + N] int8 (1 = attend), zero-initialised
    N,
    P,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1).to(tl.int64)
    width = P + N
    row_valid = tl.load(valid_ptr + b * N + i) != 0
    base = out_ptr + (b * N + i) * width
    for start in range(0, P, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < P
        pv = tl.load(past_ptr + b * P + offs, mask=m, other=0)
        tl.store(base + offs, ((pv != 0) & row_valid).to(tl.int8), mask=m)
    tl.store(base + P + i, tl.full((), 1, tl.int8))
    cur = tl.where(row_valid & (i > 0), tl.load(parent_ptr + b * N + i), -1)
    while cur >= 0:  # walk the ancestors up to the root (parent[0] = -1)
        tl.store(base + P + cur, tl.full((), 1, tl.int8))
        cur = tl.load(parent_ptr + b * N + cur)


def tree_mask(parent: torch.Tensor, valid: torch.Tensor, past_valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    batch, n = parent.shape
    past = past_valid.shape[1]
    allowed = torch.zeros((batch, n, past + n), dtype=torch.int8, device=parent.device)
    if batch and n:
        _tree_mask_kernel[(batch, n)](
            parent.long().contiguous(),
            valid.to(torch.int8).contiguous(),
            past_valid.to(torch.int8).contiguous(),
            allowed,
            n,
            past,
            BLOCK=_block(max(past, 1)),
        )
    mask = torch.zeros(allowed.shape, dtype=dtype, device=parent.device)
    mask.masked_fill_(allowed == 0, torch.finfo(dtype).min)
    return mask[:, None]


# ----------------------------------------------------------------------------------------------------------------
# verify_chain


def _verify_noise(
    accept_u: torch.Tensor | None,
    final_noise: torch.Tensor | None,
    seed: int,
    u_shape: tuple[int, ...],
    fin_shape: tuple[int, ...],
    dev: torch.device,
) -> tuple[bool, torch.Tensor, torch.Tensor]:
    """(RNG, accept_u, final_noise) for a verifier launch. Both None: the kernel draws both streams (RNG, the
    tensors are placeholders). Both given: read them. One given (the op layer never does this): the other is
    materialised from the same Philox stream, so the kernel reads both."""
    if accept_u is None and final_noise is None:
        ph = torch.empty(1, dtype=torch.float64, device=dev)
        return True, ph, ph
    if accept_u is None:
        accept_u = _rng.philox_uniform(seed, _rng.ACCEPT, u_shape, dev)
    if final_noise is None:
        final_noise = _rng.philox_uniform(seed, _rng.FINAL, fin_shape, dev)
    return False, accept_u.contiguous(), final_noise.contiguous()


@triton.jit
def _is_eos(x, eos_ptr, n_eos):
    hit = x < 0  # always false: token ids are >= 0
    for e in range(0, n_eos):
        hit = hit | (x == tl.load(eos_ptr + e))
    return hit


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
# node verifiers (docs/methods.md): one row's candidate chain, shared by verify_node and verify_tree

M_RRS = 0  # sd and rrs: residual against the same p every round
M_RRSW = 1
M_KSEQ = 2
M_SPECHUB = 3
METHOD_CODE = {"sd": M_RRS, "rrs": M_RRS, "rrsw": M_RRSW, "kseq": M_KSEQ, "spechub": M_SPECHUB}


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
    s_ptr,  # [V] fp32 scratch: current draft law (rrsw)
    ap_ptr,  # [K] fp32 accept_prob by slot (ANALYTIC)
    V,
    METHOD: tl.constexpr,
    ANALYTIC: tl.constexpr,
    RNG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Returns the accepted slot (-1 = none). The final residual is left normalized in r_ptr.

    The acceptance uniform of slot j is u_ptr[j], or (RNG) element (u_row, j) of the ACCEPT stream."""
    chosen = tl.full((), -1, tl.int64)
    _copy_row(q_ptr, r_ptr, V, BLOCK_V)
    if METHOD == 1:
        _copy_row(p_ptr, s_ptr, V, BLOCK_V)
    if METHOD <= 1:
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
    elif METHOD == 2:
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
                        _noise_at(u_ptr, j, u_row, seed_lo, seed_hi, ACCEPT, RNG) * den.to(tl.float64)
                        < num.to(tl.float64)
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
    else:
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
    s = torch.empty((batch, vocab), dtype=torch.float32, device=dev) if method == "rrsw" else r
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
            torch.empty_like(r) if method == "rrsw" else r,
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
            METHOD=METHOD_CODE[method],
            KSEQ=method == "kseq",
            GREEDY=bool(greedy),
            RNG=rng,
            BLOCK_V=_block(vocab),
        )
    return acc, n_acc, nxt, rank


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


@triton.jit
def _filter_kv_kernel(
    kv_ptr,  # [B, H, S, D] contiguous
    plen_ptr,  # [B] int64
    acc_ptr,  # [B, L] int64
    nacc_ptr,  # [B] int64
    H,
    S,
    D,
    L,
    BLOCK_D: tl.constexpr,
):
    """One program per (row, head); depth order keeps the in-place moves safe (source slot >= destination)."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // H
    base = kv_ptr + pid * S * D
    p = tl.load(plen_ptr + b)
    for j in range(0, tl.load(nacc_ptr + b)):
        src = p - 1 + tl.load(acc_ptr + b * L + j)
        dst = p + j
        for start in range(0, D, BLOCK_D):
            offs = start + tl.arange(0, BLOCK_D)
            m = offs < D
            tl.store(base + dst * D + offs, tl.load(base + src * D + offs, mask=m), mask=m)


def filter_kv(
    kv: list[torch.Tensor], prefix_len: torch.Tensor, accepted_nodes: torch.Tensor, n_accepted: torch.Tensor
) -> torch.Tensor:
    batch, max_len = accepted_nodes.shape
    plen = prefix_len.long().contiguous()
    acc = accepted_nodes.long().contiguous()
    nacc = n_accepted.long().contiguous()
    for t in kv:
        if not t.is_contiguous():
            raise ValueError("filter_kv (triton): kv tensors must be contiguous [B, H, S, D]")
        _, heads, slots, dim = t.shape
        if batch and heads and max_len:
            _filter_kv_kernel[(batch * heads,)](t, plen, acc, nacc, heads, slots, dim, max_len, BLOCK_D=_block(dim))
    return prefix_len + n_accepted


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
