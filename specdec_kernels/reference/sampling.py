"""Backend "torch": sampling primitives (logits processing, Gumbel-max, Gumbel-top-k, SBS, SpecHub drafting).

Noise arrives as float64 uniforms (or, when None, is drawn from the Philox stream of ``seed``); Gumbel scores are
formed in float64 from fp32 log-probs, so every backend can reproduce the same argmax decisions. Ties break to the
lowest index through stable descending sorts.
"""

from __future__ import annotations

import math

import torch

from .._registry import register
from .._rng import DRAFT, noise_or_philox

NEG_INF = float("-inf")
SWOR_MASS_EPS = 1e-7  # Gumbel-top-k: stop drawing once the remaining draft mass is this small


def gumbel(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel from uniforms in (0, 1): G = -log(-log U)."""
    return -torch.log(-torch.log(u))


def greedy_threshold() -> float:
    return 1e-5


@register("process_logits", "torch")
def process_logits(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, log: bool = True
) -> torch.Tensor:
    """Temperature -> top-k -> top-p -> fp32 log-softmax. T < 1e-5 gives the one-hot argmax row.
    ``log=False``: the probabilities, softmax of the same log-probs."""
    out = _process_logits(logits, temperature, top_k, top_p)
    return out if log else torch.softmax(out, dim=-1)


def _process_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    x = logits.float()
    if temperature < greedy_threshold():
        # Greedy mode never divides by T: the processed law is the point mass on argmax (lowest id on ties).
        out = torch.full_like(x, NEG_INF)
        out.scatter_(-1, x.argmax(-1, keepdim=True), 0.0)
        return out
    x = x / temperature
    vocab = x.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = torch.where(x >= kth, x, torch.full_like(x, NEG_INF))  # ties at the boundary are kept
    if top_p < 1.0:
        probs = torch.softmax(x, dim=-1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        cum = torch.cumsum(sorted_p.double(), dim=-1)
        mass_before = torch.cat([torch.zeros_like(cum[..., :1]), cum[..., :-1]], dim=-1)
        keep_sorted = mass_before < top_p  # shortest prefix whose mass reaches top_p
        keep_sorted[..., 0] = True
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        x = torch.where(keep, x, torch.full_like(x, NEG_INF))
    return torch.log_softmax(x, dim=-1)


@register("sample_categorical", "torch")
def sample_categorical(logp: torch.Tensor, noise: torch.Tensor | None, seed: int = 0) -> torch.Tensor:
    """Gumbel-max: argmax_v logp[v] + G[v] (torch.argmax returns the first maximum)."""
    noise = noise_or_philox(noise, seed, DRAFT, logp.shape, logp.device)
    return torch.argmax(logp.double() + gumbel(noise), dim=-1)


@register("gumbel_topk", "torch")
def gumbel_topk(
    logp: torch.Tensor, k: int, noise: torch.Tensor | None, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gumbel-top-k: the k largest perturbed log-probs, descending = a sequential draw without replacement."""
    noise = noise_or_philox(noise, seed, DRAFT, logp.shape, logp.device)
    scores = logp.double() + gumbel(noise)
    sorted_s, order = torch.sort(scores, dim=-1, descending=True, stable=True)
    score = sorted_s[..., :k].clone()
    tokens = order[..., :k].clone()
    valid = score > NEG_INF
    # Remaining draft mass before slot j; once it underflows the later candidates are not real draws.
    picked_p = torch.gather(logp.double(), -1, tokens).exp().masked_fill(~valid, 0.0)
    mass_before = torch.cumsum(picked_p, dim=-1) - picked_p
    valid &= (1.0 - mass_before) > SWOR_MASS_EPS
    tokens = tokens.masked_fill(~valid, -1)
    score = score.masked_fill(~valid, NEG_INF)
    return tokens, valid, score


def log1mexp(a: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(a)) for a <= 0, accurate on both sides of -ln 2 (Kool et al. 2019, App. B.3)."""
    return torch.where(a > -math.log(2.0), torch.log(-torch.expm1(a)), torch.log1p(-torch.exp(a)))


def truncated_gumbel(u: torch.Tensor, phit: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Stable Trunc(u, phit, Z) = u - softplus(u - phit + log1mexp(phit - Z))."""
    masked = phit == NEG_INF
    at_max = phit == z
    safe_phit = torch.where(masked, z, phit)
    v = u - safe_phit + log1mexp((safe_phit - z).clamp_max(0.0))
    out = u - (v.clamp_min(0.0) + torch.log1p(torch.exp(-v.abs())))
    out = torch.where(at_max, u.expand_as(out), out)
    return out.masked_fill(masked, NEG_INF)


@register("sbs_step", "torch")
def sbs_step(
    logp: torch.Tensor,
    sigma: torch.Tensor,
    gamma: torch.Tensor,
    beam_valid: torch.Tensor,
    w_out: int,
    noise: torch.Tensor | None,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One stochastic-beam-search expansion with truncated Gumbels, top-W over all (parent, token)."""
    noise = noise_or_philox(noise, seed, DRAFT, logp.shape, logp.device)
    batch, w_in, vocab = logp.shape
    sig = torch.where(beam_valid, sigma.double(), torch.zeros_like(sigma, dtype=torch.float64))
    gam = torch.where(beam_valid, gamma.double(), torch.zeros_like(gamma, dtype=torch.float64))
    phi = sig[..., None] + logp.double()
    phit = phi + gumbel(noise)
    z = phit.max(dim=-1, keepdim=True).values
    psi = truncated_gumbel(gam[..., None], phit, z)
    psi = psi.masked_fill(~beam_valid[..., None], NEG_INF)
    flat_psi = psi.reshape(batch, w_in * vocab)
    sorted_psi, order = torch.sort(flat_psi, dim=-1, descending=True, stable=True)
    new_gamma = sorted_psi[:, :w_out].clone()
    idx = order[:, :w_out]
    valid = new_gamma > NEG_INF
    parent_slot = torch.div(idx, vocab, rounding_mode="floor").masked_fill(~valid, -1)
    tokens = (idx % vocab).masked_fill(~valid, -1)
    new_sigma = torch.gather(phi.reshape(batch, w_in * vocab), 1, idx).masked_fill(~valid, NEG_INF)
    return parent_slot, tokens, new_sigma, new_gamma, valid


@register("spechub_sample", "torch")
def spechub_sample(
    logp: torch.Tensor, noise: torch.Tensor | None, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SpecHub drafting: hub a = argmax p; Gumbel-top-2 (y1, y2); drafts (a, y2) if y1 == a else (y1, a)."""
    noise = noise_or_philox(noise, seed, DRAFT, logp.shape, logp.device)
    hub = torch.argmax(logp, dim=-1)
    (y, y_valid, _) = gumbel_topk(logp, min(2, logp.shape[-1]), noise)
    if y.shape[-1] == 1:  # V = 1: there is no second token to draw
        y = torch.cat([y, torch.full_like(y, -1)], dim=-1)
        y_valid = torch.cat([y_valid, torch.zeros_like(y_valid)], dim=-1)
    y1, y2 = y[..., 0], y[..., 1]
    first_is_hub = y1 == hub
    # p(a) ~ 1: no second draft exists; the node is a single-candidate SD node holding a plain sample of p.
    single = (1.0 - torch.gather(logp.double(), -1, hub[..., None]).squeeze(-1).exp()) <= SWOR_MASS_EPS
    x1 = torch.where(first_is_hub, hub, y1)
    x2 = torch.where(first_is_hub, y2, hub)
    v2 = torch.where(first_is_hub, y_valid[..., 1], torch.ones_like(first_is_hub)) & ~single
    tokens = torch.stack([x1, x2.masked_fill(~v2, -1)], dim=-1)
    valid = torch.stack([torch.ones_like(v2), v2], dim=-1)
    return tokens, hub, valid


def gds_top(logp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy draft sampling's deterministic part: the k - 1 most likely tokens by row in decreasing order (ties to
    the lower id), at most all but one token of the support so that a draw is left. Returns top [..., k - 1] (-1
    past the n_top kept), n_top [...] and logp with them removed (-inf), the law of the sampled draft."""
    support = (logp > -math.inf).sum(dim=-1)
    n_top = torch.clamp(torch.clamp(support - 1, min=0), max=k - 1)
    top = _first_by_stable_sort(logp, k - 1)
    kept = torch.arange(k - 1, device=logp.device) < n_top[..., None]
    drawn = torch.zeros(logp.shape, dtype=torch.bool, device=logp.device)
    drawn.scatter_(-1, top, kept)
    return torch.where(kept, top, -1), n_top, logp.masked_fill(drawn, -math.inf)


def _first_by_stable_sort(logp: torch.Tensor, m: int) -> torch.Tensor:
    """The first ``m`` indices of a stable descending sort of each row (ties to the lower id), without sorting V:
    the entries above the m-th largest value, then the lowest ids of those equal to it, ordered by value."""
    if m == 0:
        return torch.empty((*logp.shape[:-1], 0), dtype=torch.long, device=logp.device)
    kth = torch.topk(logp, m, dim=-1).values[..., -1:]
    above = logp > kth
    tied = logp == kth
    chosen = above | (tied & (torch.cumsum(tied, dim=-1) <= m - above.sum(dim=-1, keepdim=True)))
    # the m chosen ids in ascending order, by a top-k over V - id (nonzero would sync a GPU)
    rank = logp.shape[-1] - torch.arange(logp.shape[-1], device=logp.device)
    ids = torch.topk(torch.where(chosen, rank, 0), m, dim=-1).indices
    order = torch.sort(logp.gather(-1, ids), dim=-1, descending=True, stable=True).indices
    return ids.gather(-1, order)
