"""Deliberately wrong variants (negative controls, spec §10.10).

Each node-level control is a :class:`~specdec_kernels.testing.oracles.ChainVerifier`: a callable with the interface
of ``specdec_kernels.verify_node`` (analytic and sampling mode), so it can be pushed through exactly the same
exact-enumeration and Monte Carlo checks as the real op. The tests must show that every control FAILS them.
``sbs_step_untruncated`` has the interface of ``specdec_kernels.sbs_step``. Never use these outside tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..ops import SBSStep
from .oracles import Chain, ChainVerifier, normalize, residual


def _rrs_skip_duplicates(method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None) -> Chain:
    """RRS that skips a repeated candidate without the residual update (SpecHub authors' EAGLE baseline, §4.2)."""
    tests = []
    seen: set[int] = set()
    r = q
    for j, x in enumerate(cand):
        if x in seen:
            continue
        seen.add(x)
        tests.append((j, p[x], r[x]))
        r = residual(r, p)
    return tests, r


def _kseq_gamma_one(method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None) -> Chain:
    """K-SEQ with gamma = 1 instead of gamma* (the residual numerator goes negative and is clamped)."""
    k = len(cand)
    beta = float(np.minimum(p, q).sum())
    tests = [(j, p[x], q[x]) for j, x in enumerate(cand)]
    if beta <= 0:
        return tests, q
    c = (1.0 - (1.0 - beta) ** k) / beta
    num = np.maximum(q - c * np.minimum(p, q), 0.0)
    return tests, (q if num.sum() <= 0 else num / num.sum())


def _rrsw_unrenormalized(method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None) -> Chain:
    """RRSw that keeps the original p in the ratio and the residual instead of p^(k)."""
    tests = []
    r = q
    for j, x in enumerate(cand):
        tests.append((j, p[x], r[x]))
        r = residual(r, p)
    return tests, r


def _rrsw_next_residual(method: str, cand: Sequence[int], p: np.ndarray, q: np.ndarray, hub: int | None) -> Chain:
    """RRSw whose residual subtracts p^(k+1) (the next candidate's law) instead of p^(k).

    The last candidate has no successor, so its residual keeps p^(K); this reproduces the TVs of spec §10.10.
    """
    tests = []
    r, s = q, p
    for j, x in enumerate(cand):
        tests.append((j, s[x], r[x]))
        rest = s.copy()
        rest[x] = 0.0
        nxt = normalize(rest) if rest.sum() > 0 else rest
        r = residual(r, nxt if j + 1 < len(cand) else s)
        s = nxt
    return tests, r


rrs_skip_duplicates = ChainVerifier(_rrs_skip_duplicates, "rrs_skip_duplicates", methods=("rrs",))
kseq_gamma_one = ChainVerifier(_kseq_gamma_one, "kseq_gamma_one", methods=("kseq",))
rrsw_unrenormalized = ChainVerifier(_rrsw_unrenormalized, "rrsw_unrenormalized", methods=("rrsw",))
rrsw_next_residual = ChainVerifier(_rrsw_next_residual, "rrsw_next_residual", methods=("rrsw",))

NODE_CONTROLS = {v.name: v for v in (rrs_skip_duplicates, kseq_gamma_one, rrsw_unrenormalized, rrsw_next_residual)}


def sbs_step_untruncated(
    logp: torch.Tensor,
    sigma: torch.Tensor,
    gamma: torch.Tensor,
    beam_valid: torch.Tensor,
    w_out: int,
    *,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    backend: str | None = None,
) -> SBSStep:
    """SBS step selecting the top-W by the untruncated perturbed scores (RSD Alg. 9 line 7 read literally)."""
    batch, w_in, vocab = logp.shape
    if noise is None:
        if generator is None:
            generator = torch.Generator().manual_seed(0 if seed is None else seed)
        noise = torch.rand(logp.shape, dtype=torch.float64, generator=generator).clamp_min(2.0**-60)
    phi = sigma.double()[..., None] + logp.double()
    phit = (phi - torch.log(-torch.log(noise.double()))).masked_fill(~beam_valid[..., None], float("-inf"))
    score, idx = torch.sort(phit.reshape(batch, -1), dim=-1, descending=True, stable=True)
    score, idx = score[:, :w_out], idx[:, :w_out]
    valid = score > float("-inf")
    parent = torch.div(idx, vocab, rounding_mode="floor").masked_fill(~valid, -1)
    tokens = (idx % vocab).masked_fill(~valid, -1)
    sig = torch.gather(phi.reshape(batch, -1), 1, idx).masked_fill(~valid, float("-inf"))
    return SBSStep(parent, tokens, sig, score, valid)
