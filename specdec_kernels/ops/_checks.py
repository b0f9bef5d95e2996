"""Validation and noise helpers shared by the public ops (user input -> ValueError/TypeError, never assert)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .._rng import SEED_LIMIT, check_seed

METHODS = ("sd", "rrs", "rrsw", "kseq", "spechub", "gds")
#: the verify_tree methods that judge whole paths (one uniform per node) rather than a node's candidates
PATH_METHODS = ("block", "traversal", "traversalw")
TREE_METHODS = (*METHODS, *PATH_METHODS)


def check_tensor(name: str, t: object, *, ndim: int | None = None, min_ndim: int | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(t.shape)}")
    return t


def check_float(name: str, t: torch.Tensor) -> None:
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")


def check_int(name: str, t: torch.Tensor) -> None:
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {t.dtype}")


def check_bool(name: str, t: torch.Tensor) -> None:
    if t.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor, got dtype {t.dtype}")


def check_shape(name: str, t: torch.Tensor, shape: Sequence[int]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def check_same_device(**tensors: torch.Tensor | None) -> None:
    devs = {k: v.device for k, v in tensors.items() if v is not None}
    if len(set(devs.values())) > 1:
        raise ValueError(f"all tensors must be on one device, got {devs}")


def check_logp(
    name: str, t: torch.Tensor, rows: torch.Tensor | None = None, *, values: bool = True
) -> torch.Tensor | None:
    """Log-probabilities/logits: no NaN, no +inf, at least one finite entry per row. Returns the checked rows'
    maxima (None when the values were not checked).

    ``rows`` (bool, the leading shape of ``t``): check only these rows (padding rows are never read by the ops).
    One pass over ``t``: the row maximum is NaN if the row holds a NaN, +inf if it holds +inf (and no NaN), and
    -inf iff every entry is -inf. ``values=False``: only the dtype and the vocabulary size (for a kernel that makes
    the value checks in its own pass).
    """
    check_float(name, t)
    if t.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty vocabulary (last) dimension, got shape {tuple(t.shape)}")
    if not values or not t.numel():
        return None
    top = t.amax(dim=-1)
    if rows is not None:
        top = top[rows]
    if math.isfinite(float(top.sum(dtype=torch.float64))):  # the common case: one reduction, the diagnosis below
        return top  # only on failure (a float64 sum of maxima is finite iff every maximum is)
    if torch.isnan(top).any():
        raise ValueError(f"{name} contains NaN; NaN logits are rejected, fix the model output upstream")
    if torch.isposinf(top).any():
        raise ValueError(f"{name} contains +inf; only -inf (masked token) is allowed")
    if torch.isneginf(top).any():
        raise ValueError(f"{name} has a row where every entry is -inf (no token can be sampled)")


def check_probs(name: str, t: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Probability rows: finite, non-negative, each row sums to 1 within 1e-3.

    ``rows`` (bool, the leading shape of ``t``): check only these rows. Two passes over ``t``: the float64 row sum
    is not finite iff the row holds a NaN or an infinity, and the row minimum catches negative entries.
    """
    check_float(name, t)
    if t.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty vocabulary (last) dimension, got shape {tuple(t.shape)}")
    if not t.numel():
        return
    s = t.sum(dim=-1, dtype=torch.float64)
    low = t.amin(dim=-1)
    if rows is not None:
        s, low = s[rows], low[rows]
    if not torch.isfinite(s).all():
        raise ValueError(f"{name} contains NaN or inf; probabilities must be finite")
    if (low < 0).any():
        raise ValueError(f"{name} contains negative probabilities")
    bad = (s - 1).abs() > 1e-3
    if bad.any():
        raise ValueError(
            f"{name} rows must sum to 1 (within 1e-3); got a row summing to {s[bad].flatten()[0].item():.6g}. "
            "Pass probabilities, e.g. process_logits(...).exp()"
        )


def check_uniform(name: str, t: torch.Tensor, shape: Sequence[int], *, open_low: bool) -> None:
    check_float(name, t)
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.numel():
        lo_bad = (t <= 0).any() if open_low else (t < 0).any()
        if lo_bad or (t >= 1).any() or torch.isnan(t).any():
            rng = "(0, 1)" if open_low else "[0, 1)"
            raise ValueError(f"{name} must hold uniforms in {rng}")


class NoisePlan:
    """Where an op's noise comes from (docs/kernels.md, Randomness contract).

    * explicit noise tensors (test mode) are validated and passed through;
    * ``generator=``: the op layer draws float64 uniforms with torch (53 bits);
    * ``seed=`` (or nothing: a seed is then drawn from torch's default generator): the backend draws the Philox
      stream of ``specdec_kernels._rng`` itself, in its kernels; every backend computes the same bits.
    """

    def __init__(self, generator: torch.Generator | None, seed: int | None, *, needed: bool = True) -> None:
        if generator is not None and seed is not None:
            raise ValueError("pass either generator= or seed=, not both")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        if not needed:  # the call reads no noise (greedy): draw nothing from the caller's or torch's generator
            generator, seed = None, 0 if seed is None else seed
        self.generator = generator
        if generator is None:
            if seed is None:
                seed = int(torch.randint(0, SEED_LIMIT - 1, (), dtype=torch.long))
            self.seed = check_seed(seed)
        else:
            self.seed = 0

    def noise(
        self, name: str, noise: torch.Tensor | None, shape: Sequence[int], device: torch.device, *, open_low: bool
    ) -> torch.Tensor | None:
        """The validated float64 noise tensor, or None when the backend draws it from ``self.seed``."""
        if noise is not None:
            check_tensor(name, noise)
            check_uniform(name, noise, shape, open_low=open_low)
            if noise.device != device:
                raise ValueError(f"{name} must be on {device}, got {noise.device}")
            return noise.to(torch.float64)
        if self.generator is None:
            return None
        u = torch.rand(tuple(shape), dtype=torch.float64, generator=self.generator, device=device)
        # 53 random bits (docs/kernels.md, Randomness contract); (0, 1) for Gumbel noise: 0 is nudged to 2**-60
        return u.clamp_min_(2.0**-60) if open_low else u


def check_leniency(leniency: object) -> float:
    """CS Drafting's leniency l: a finite number >= 1 (1 = exact speculative sampling)."""
    if isinstance(leniency, bool) or not isinstance(leniency, (int, float)):
        raise TypeError(f"leniency must be a number >= 1, got {type(leniency).__name__}")
    if not math.isfinite(leniency) or leniency < 1.0:
        raise ValueError(f"leniency must be a finite number >= 1 (1 = exact review), got {leniency!r}")
    return float(leniency)


def check_method(method: object, allowed: tuple[str, ...] = METHODS) -> str:
    if method not in allowed:
        raise ValueError(f"method must be one of {allowed}, got {method!r}")
    return method  # type: ignore[return-value]


def eos_tensor(eos_token_id: int | Sequence[int] | torch.Tensor | None, vocab: int) -> torch.Tensor | None:
    if eos_token_id is None:
        return None
    if isinstance(eos_token_id, torch.Tensor):
        if eos_token_id.is_floating_point() or eos_token_id.is_complex() or eos_token_id.dtype == torch.bool:
            raise ValueError(f"eos_token_id must hold integer token ids, got a {eos_token_id.dtype} tensor")
        raw: list = eos_token_id.flatten().tolist()
    elif isinstance(eos_token_id, (int, np.integer)):
        raw = [eos_token_id]
    elif isinstance(eos_token_id, (list, tuple)):
        raw = list(eos_token_id)
    else:
        raise ValueError(f"eos_token_id must be a token id, a list of them or an integer tensor, got {eos_token_id!r}")
    if any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) for i in raw):
        raise ValueError(f"eos_token_id must hold integer token ids, got {eos_token_id!r}")
    ids = [int(i) for i in raw]
    for i in ids:
        if not 0 <= i < vocab:
            raise ValueError(f"eos_token_id must be token ids in [0, {vocab}), got {i}")
    return torch.tensor(ids, dtype=torch.long)
