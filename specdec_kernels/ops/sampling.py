"""Public sampling ops: validate, draw noise when none is given, dispatch."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .._registry import resolve
from ..reference.sampling import gds_top
from ._checks import (
    NoisePlan,
    check_bool,
    check_float,
    check_logp,
    check_same_device,
    check_shape,
    check_tensor,
)

GREEDY_TEMPERATURE = 1e-5


class GumbelTopK(NamedTuple):
    tokens: torch.Tensor  # [..., k] int64, -1 where invalid
    valid: torch.Tensor  # [..., k] bool
    score: torch.Tensor  # [..., k] float64 perturbed log-probs, descending, -inf where invalid


class SBSStep(NamedTuple):
    parent_slot: torch.Tensor  # [B, Wout] int64 beam slot of the parent, -1 where invalid
    tokens: torch.Tensor  # [B, Wout] int64
    sigma: torch.Tensor  # [B, Wout] float64 sequence log-prob
    gamma: torch.Tensor  # [B, Wout] float64 truncated perturbed score, descending
    valid: torch.Tensor  # [B, Wout] bool


class SpecHubDraft(NamedTuple):
    tokens: torch.Tensor  # [..., 2] int64 (slot 0, slot 1), -1 where invalid
    hub: torch.Tensor  # [...] int64 hub token argmax p
    valid: torch.Tensor  # [..., 2] bool; slot 1 is invalid when p(hub) ~ 1 or p has a single token


class GDSDraft(NamedTuple):
    tokens: torch.Tensor  # [..., k] int64: the most likely tokens, then the sampled one (last valid slot); -1 invalid
    valid: torch.Tensor  # [..., k] bool; slots past the sampled one are invalid when p has fewer than k tokens


def is_greedy(temperature: float) -> bool:
    """True when ``temperature`` selects the greedy path (T < 1e-5)."""
    return temperature < GREEDY_TEMPERATURE


def process_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    *,
    log: bool = True,
    backend: str | None = None,
) -> torch.Tensor:
    """Temperature, then top-k, then top-p, then fp32 log-softmax (docs/methods.md, notation).

    Shape: logits [..., V] (any float dtype) -> logp [..., V] float32 with -inf for masked tokens.
    ``temperature < 1e-5`` is greedy mode: the result is the one-hot log-law of argmax (lowest id on ties).
    ``top_k = 0`` and ``top_p = 1`` disable the filters. Use the same call for sampling and verification.
    ``log=False`` returns the law itself, softmax of those log-probs (0 for masked tokens), which is what the
    verifiers read: the ``cpu`` backend writes it in the same pass instead of a second softmax over [..., V].
    """
    check_tensor("logits", logits, min_ndim=1)
    impl = resolve("process_logits", backend, logits.device)
    kernel_checks = getattr(impl, "checks_values", False)  # the kernel checks the values in its own pass (cpu)
    if not kernel_checks and logits.dtype in (torch.float16, torch.bfloat16):
        # exact, and where every backend starts anyway; the check below then reduces fp32 (faster than reducing bf16)
        logits = logits.float()
    top = check_logp("logits", logits, values=not kernel_checks)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {top_p!r}")
    if not isinstance(log, bool):
        raise TypeError(f"log must be a bool, got {type(log).__name__}")
    # every backend divides the fp32 logits by T: a finite maximum taken to +inf would make its row's softmax NaN
    # (the cpu kernel makes this check in its own pass)
    if top is not None and top.numel() and not is_greedy(temperature):
        if bool(torch.isinf(top.max().float() / float(temperature))):
            raise ValueError(
                "logits / temperature overflows float32 to +inf: logits this large cannot be scaled by this temperature"
            )
    return impl(logits, float(temperature), int(top_k), float(top_p), log)


def sample_categorical(
    logp: torch.Tensor,
    *,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    backend: str | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """One Gumbel-max sample per row.

    Shape: logp [..., V] -> tokens [...] int64. ``noise`` [..., V]: uniforms in (0, 1) (float64 preferred).
    ``seed=`` draws the noise inside the backend (Philox; docs/kernels.md, Randomness contract), ``generator=`` in
    torch.
    ``validate=False`` skips the O(V) value checks (NaN/inf/empty rows) for callers that pass the output of
    ``process_logits`` unchanged; shapes and types are still checked and the kernels still bounds-check.
    """
    check_tensor("logp", logp, min_ndim=1)
    if validate:
        check_logp("logp", logp)
    plan = NoisePlan(generator, seed)
    u = plan.noise("noise", noise, logp.shape, logp.device, open_low=True)
    return resolve("sample_categorical", backend, logp.device)(logp, u, plan.seed)


def gumbel_topk(
    logp: torch.Tensor,
    k: int,
    *,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    backend: str | None = None,
    validate: bool = True,
) -> GumbelTopK:
    """Gumbel-top-k: k draws without replacement, in draw order (RSD, docs/methods.md).

    Shape: logp [..., V] -> tokens/valid/score [..., k]. Candidates with p = 0 (score -inf) or drawn after the
    remaining mass fell below 1e-7 are invalid (token -1). ``noise`` [..., V] uniforms in (0, 1).
    ``validate=False`` skips the O(V) value checks (NaN/inf/empty rows) for callers that pass the output of
    ``process_logits`` unchanged; shapes and types are still checked and the kernels still bounds-check.
    """
    check_tensor("logp", logp, min_ndim=1)
    if validate:
        check_logp("logp", logp)
    vocab = logp.shape[-1]
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= vocab:
        raise ValueError(f"k must be an int in [0, V={vocab}], got {k!r}")
    plan = NoisePlan(generator, seed)
    u = plan.noise("noise", noise, logp.shape, logp.device, open_low=True)
    return GumbelTopK(*resolve("gumbel_topk", backend, logp.device)(logp, k, u, plan.seed))


def sbs_step(
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
    validate: bool = True,
) -> SBSStep:
    """One stochastic-beam-search expansion with truncated Gumbels (RSD-S, docs/methods.md).

    Shape: logp [B, Win, V] conditional draft log-probs of the beam entries, sigma/gamma [B, Win] (root: 0, 0),
    beam_valid [B, Win] bool -> SBSStep fields [B, Wout], sorted by descending gamma. ``noise`` [B, Win, V].
    ``validate=False`` skips the O(V) value checks (NaN/inf/empty rows) for callers that pass the output of
    ``process_logits`` unchanged; shapes and types are still checked and the kernels still bounds-check.
    """
    check_tensor("logp", logp, ndim=3)
    check_float("logp", logp)
    batch, w_in, vocab = logp.shape
    for name, t in (("sigma", sigma), ("gamma", gamma), ("beam_valid", beam_valid)):
        check_tensor(name, t, ndim=2)
        check_shape(name, t, (batch, w_in))
    check_float("sigma", sigma)
    check_float("gamma", gamma)
    check_bool("beam_valid", beam_valid)
    check_same_device(logp=logp, sigma=sigma, gamma=gamma, beam_valid=beam_valid)
    if validate:
        if beam_valid.numel() and not bool(beam_valid.any(dim=-1).all()):
            raise ValueError("beam_valid must mark at least one valid beam entry per row")
        check_logp("logp (valid beam entries)", logp, rows=beam_valid)
        live = torch.cat([sigma[beam_valid], gamma[beam_valid]])
        if bool((torch.isnan(live) | torch.isposinf(live)).any()):
            raise ValueError("sigma and gamma must not be NaN or +inf for valid beam entries")
    if isinstance(w_out, bool) or not isinstance(w_out, int) or not 1 <= w_out <= w_in * vocab:
        raise ValueError(f"w_out must be an int in [1, Win*V={w_in * vocab}], got {w_out!r}")
    plan = NoisePlan(generator, seed)
    u = plan.noise("noise", noise, logp.shape, logp.device, open_low=True)
    return SBSStep(*resolve("sbs_step", backend, logp.device)(logp, sigma, gamma, beam_valid, w_out, u, plan.seed))


def spechub_sample(
    logp: torch.Tensor,
    *,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    backend: str | None = None,
    validate: bool = True,
) -> SpecHubDraft:
    """SpecHub's two drafts through the hub a = argmax p (docs/methods.md, SpecHub).

    Shape: logp [..., V] -> tokens [..., 2], hub [...], valid [..., 2]. Store ``hub`` and pass it to the
    verifier; never recompute it. ``noise`` [..., V] uniforms in (0, 1).
    ``validate=False`` skips the O(V) value checks (NaN/inf/empty rows) for callers that pass the output of
    ``process_logits`` unchanged; shapes and types are still checked and the kernels still bounds-check.
    """
    check_tensor("logp", logp, min_ndim=1)
    if validate:
        check_logp("logp", logp)
    plan = NoisePlan(generator, seed)
    u = plan.noise("noise", noise, logp.shape, logp.device, open_low=True)
    return SpecHubDraft(*resolve("spechub_sample", backend, logp.device)(logp, u, plan.seed))


def gds_sample(
    logp: torch.Tensor,
    k: int,
    *,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    backend: str | None = None,
    validate: bool = True,
) -> GDSDraft:
    """Greedy draft sampling's k drafts (docs/methods.md, GDS): the k - 1 most likely tokens of p in decreasing order
    (ties to the lower id; at most all but one token of p's support), then one Gumbel-max draw from p without them.

    Shape: logp [..., V] -> tokens/valid [..., k]; the sampled draft is the last valid slot, which the ``gds``
    verifier reads as such. ``noise`` [..., V] uniforms in (0, 1) for the draw (``sample_categorical``'s contract).
    """
    check_tensor("logp", logp, min_ndim=1)
    if validate:
        check_logp("logp", logp)
    vocab = logp.shape[-1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= vocab:
        raise ValueError(f"k must be an int in [1, V={vocab}], got {k!r}")
    top, n_top, rest = gds_top(logp, k)
    x = sample_categorical(rest, noise=noise, generator=generator, seed=seed, backend=backend, validate=False)
    tokens = torch.full((*logp.shape[:-1], k), -1, dtype=torch.long, device=logp.device)
    tokens[..., : k - 1] = top
    tokens.scatter_(-1, n_top[..., None], x[..., None])
    slots = torch.arange(k, device=logp.device)
    return GDSDraft(tokens, slots <= n_top[..., None])
