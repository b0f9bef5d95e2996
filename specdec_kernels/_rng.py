"""Counter-based noise: Philox-4x32-10 keyed by the seed, counted by (purpose, row, index).

Every backend can draw the noise of an op itself from a ``seed`` instead of reading a noise tensor. The stream is
defined here, in plain integer torch code, and the C++ (``csrc/include/specdec/common.h``), CUDA and Triton
kernels compute the same bits, so a seeded call makes identical decisions on every backend.

Layout: the noise an op would take in test mode has a shape ``[..., n]``; its element at flat leading index ``r``
(row-major over ``...``) and last index ``i`` is::

    counter = (i >> 1, r mod 2**32, r >> 32, purpose),  key = (seed mod 2**32, seed >> 32)
    (a, b)  = words (0, 1) of Philox-4x32-10(counter, key) when i is even, words (2, 3) when i is odd
    U       = (2 * m + 1) * 2**-53,  m = (a >> 12) * 2**32 + b      (52 random bits, U in (0, 1) exactly)

``purpose`` keeps the streams independent, which exactness requires: DRAFT for drafting noise, ACCEPT for acceptance
uniforms, FINAL for the final (corrected/bonus) sample. The ops' side: docs/kernels.md, Randomness contract.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

DRAFT, ACCEPT, FINAL = 0, 1, 2
SEED_LIMIT = 2**63  # seeds are non-negative int64 (the torch op schemas carry them as int)

_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox-4x32 multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments
_MASK32 = 0xFFFFFFFF
_MASK16 = 0xFFFF


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit words of a * m for a in [0, 2**32) held in int64, without int64 overflow (16-bit limbs)."""
    a1, a0 = a >> 16, a & _MASK16
    m1, m0 = m >> 16, m & _MASK16
    mid = a1 * m0 + a0 * m1  # < 2**33
    low = a0 * m0 + ((mid & _MASK16) << 16)  # < 2**33
    hi = a1 * m1 + (mid >> 16) + (low >> 32)
    return hi & _MASK32, low & _MASK32


def philox4x32_10(
    c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor, k0: int, k1: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox-4x32 with 10 rounds on int64 tensors holding 32-bit words (Salmon et al., SC'11)."""
    for rnd in range(10):
        if rnd:
            k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    return seed


def philox_uniform(seed: int, purpose: int, shape: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """float64 uniforms in (0, 1) of ``shape`` from the stream (seed, purpose); see the module docstring."""
    shape = tuple(int(s) for s in shape)
    n = shape[-1] if shape else 1
    rows = 1
    for s in shape[:-1]:
        rows *= s
    if rows * n == 0:
        return torch.empty(shape, dtype=torch.float64, device=device)
    r = torch.arange(rows, dtype=torch.long, device=device)[:, None]
    j = torch.arange((n + 1) // 2, dtype=torch.long, device=device)[None, :]
    c0 = j.expand(rows, -1)
    c1 = (r & _MASK32).expand_as(c0)
    c2 = (r >> 32).expand_as(c0)
    c3 = torch.full_like(c0, purpose)
    o0, o1, o2, o3 = philox4x32_10(c0, c1, c2, c3, seed & _MASK32, (seed >> 32) & _MASK32)
    a = torch.stack((o0, o2), dim=-1).reshape(rows, -1)[:, :n]  # element i takes words (0,1) or (2,3)
    b = torch.stack((o1, o3), dim=-1).reshape(rows, -1)[:, :n]
    m = ((a >> 12) << 32) | b
    u = (2 * m + 1).double() * 2.0**-53
    return u.reshape(shape)


def noise_or_philox(
    noise: torch.Tensor | None, seed: int, purpose: int, shape: Sequence[int], device: torch.device
) -> torch.Tensor:
    """``noise`` itself, or the (seed, purpose) Philox uniforms of ``shape`` when the caller passed none."""
    return noise if noise is not None else philox_uniform(seed, purpose, shape, device)
