"""Backend "triton": what the kernels share: block sizes and the zero-mass constants, the counter-based noise
(Philox-4x32-10 of ``specdec_kernels._rng``, drawn in-kernel with ``RNG=True``), Gumbel scores, chunked argmax and
residual sampling.

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


# verifier launches: noise and EOS


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
