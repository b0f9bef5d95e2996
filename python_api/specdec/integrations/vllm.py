"""specdec's verifier inside vLLM (docs/distributed.md, "Inside vLLM").

A ``vllm.general_plugins`` entry point (:func:`register`) that vLLM runs in each of its processes. It does
nothing unless ``SPECDEC_VLLM=1`` is set in the environment vLLM runs in: then it replaces the rejection sampler
of vLLM's V1 model runner with :class:`SpecdecRejectionSampler`, which processes each request's target rows with
:func:`specdec_kernels.process_logits` (temperature, top-k, top-p, as the request asks) and verifies its draft chain
with :func:`specdec_kernels.verify_chain` (standard speculative sampling; the draft's own probabilities where vLLM
passes them, ``draft_sample_method="probabilistic"``, else the proposal as a point mass, as for n-gram and greedy
drafts). Works with vLLM's own proposers (ngram, draft model).

The seam is private to vLLM: the plugin runs only on the versions in :data:`CHECKED_VERSIONS` and raises at start-up
on any other, or where the sampler's ``forward`` signature moved. Requests that ask for what the verifier does not
implement (penalties, bad words, allowed token ids, logprobs, a thinking budget) fail with an error naming it.

Every random draw comes from the request's own generator (a seeded request) or from one seed drawn from torch's
global generator, which vLLM seeds alike on every worker: tensor-parallel ranks decide the same.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any

import torch

import specdec_kernels as sk

from ..distributed import env_flag

#: the environment switch that turns the plugin on
ENV = "SPECDEC_VLLM"
#: vLLM versions whose rejection-sampler seam (``vllm.v1.worker.gpu_model_runner.RejectionSampler``, its
#: ``forward(metadata, draft_probs, logits, sampling_metadata) -> SamplerOutput``) the plugin was checked on
CHECKED_VERSIONS = ("0.32.0",)
#: the parameters of the sampler's forward the plugin relies on
FORWARD_PARAMS = ("self", "metadata", "draft_probs", "logits", "sampling_metadata")
#: vLLM's temperature of a greedy request (and the sampler's padding of rejected slots)
GREEDY_TEMPERATURE = 0.0
PLACEHOLDER = -1

# under vLLM's logger, so that its handlers show the lines
log = logging.getLogger("vllm.plugins.specdec")


def enabled() -> bool:
    return env_flag(ENV)


def register() -> None:
    """vLLM's plugin hook: with ``SPECDEC_VLLM=1``, put :class:`SpecdecRejectionSampler` in the V1 model runner."""
    if not enabled():
        return
    import vllm
    from vllm.v1.worker import gpu_model_runner

    version = str(vllm.__version__).split("+")[0]
    if version not in CHECKED_VERSIONS:
        raise RuntimeError(
            f"{ENV}=1: specdec's vLLM verifier replaces a private seam checked on vLLM {', '.join(CHECKED_VERSIONS)} "
            f"only, this is vLLM {vllm.__version__}; unset {ENV} or install a checked version"
        )
    base = gpu_model_runner.RejectionSampler
    if getattr(base, "specdec", False):
        return  # registered already in this process
    params = tuple(inspect.signature(base.forward).parameters)
    if params != FORWARD_PARAMS:
        raise RuntimeError(
            f"{ENV}=1: vLLM's RejectionSampler.forward takes {params}, not {FORWARD_PARAMS}: the seam moved"
        )
    gpu_model_runner.RejectionSampler = type(
        "SpecdecRejectionSampler", (base,), {"forward": _forward, "specdec": True, "__doc__": _forward.__doc__}
    )
    log.info("specdec: vLLM %s verifies drafts with specdec_kernels.verify_chain (%s=1)", vllm.__version__, ENV)


def _forward(self: Any, metadata: Any, draft_probs: Any, logits: torch.Tensor, sampling_metadata: Any) -> Any:
    """vLLM's rejection sampler with specdec's verification: the same inputs, a SamplerOutput of
    [batch, max_spec_len + 1] int32 tokens padded with -1."""
    from vllm.v1.outputs import SamplerOutput

    check_request_settings(sampling_metadata)
    if not getattr(self, "_specdec_logged", False):
        self._specdec_logged = True
        log.info("specdec: verifying a first batch of %d requests", len(metadata.num_draft_tokens))
    tokens = verify_requests(
        draft_token_ids=metadata.draft_token_ids,
        num_draft_tokens=list(metadata.num_draft_tokens),
        target_logits_indices=metadata.target_logits_indices,
        bonus_logits_indices=metadata.bonus_logits_indices,
        logits=logits,
        draft_probs=draft_probs,
        temperature=None if sampling_metadata.all_greedy else sampling_metadata.temperature,
        top_k=sampling_metadata.top_k,
        top_p=sampling_metadata.top_p,
        generators=sampling_metadata.generators,
    )
    return SamplerOutput(sampled_token_ids=tokens, logprobs_tensors=None)


def check_request_settings(sampling_metadata: Any) -> None:
    """Refuse the request settings the verifier does not reproduce, naming them."""
    unsupported = []
    if not sampling_metadata.no_penalties:
        unsupported.append("presence/frequency/repetition penalties")
    if sampling_metadata.allowed_token_ids_mask is not None:
        unsupported.append("allowed_token_ids")
    if sampling_metadata.bad_words_token_ids:
        unsupported.append("bad_words")
    if sampling_metadata.max_num_logprobs is not None:
        unsupported.append("logprobs")
    holder = getattr(sampling_metadata, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        unsupported.append("a thinking token budget")
    if unsupported:
        raise NotImplementedError(
            f"specdec's vLLM verifier ({ENV}=1) does not implement {', '.join(unsupported)} in speculative "
            f"decoding; unset {ENV} to use vLLM's own sampler for such requests"
        )


def verify_requests(
    *,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: Sequence[int],
    target_logits_indices: torch.Tensor,
    bonus_logits_indices: torch.Tensor,
    logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    generators: dict[int, torch.Generator],
) -> torch.Tensor:
    """Verify vLLM's flattened batch of draft chains.

    Shape: draft_token_ids [T] (request b's chain is its ``num_draft_tokens[b]`` tokens, in order), logits
    [T + B, V] target logits with request b's rows at ``target_logits_indices`` (one per draft token) and
    ``bonus_logits_indices[b]`` (after its last draft), draft_probs [T, V] or None, temperature / top_k / top_p [B]
    or None (None temperature: every request greedy; temperature 0 marks a greedy request; top-k <= 0 or >= V and
    top-p >= 1 are off) -> int32 [B, max(num_draft_tokens) + 1]: each request's accepted drafts, then the correction
    or bonus token, padded with -1.

    Requests are verified together in one :func:`specdec_kernels.verify_chain` call per group: the greedy ones, the
    sampled ones without a generator (one seed drawn from torch's global generator), and one call per request
    with its own generator (its seed drawn from that generator).
    """
    batch = len(num_draft_tokens)
    longest = max(num_draft_tokens, default=0)
    vocab = int(logits.shape[-1])
    out = torch.full((batch, longest + 1), PLACEHOLDER, dtype=torch.int32, device=logits.device)
    if batch == 0:
        return out
    starts = [0]
    for n in num_draft_tokens:
        starts.append(starts[-1] + int(n))
    greedy = [temperature is None or float(temperature[b]) <= GREEDY_TEMPERATURE for b in range(batch)]
    groups: dict[Any, list[int]] = {}
    for b in range(batch):
        key = "greedy" if greedy[b] else (("own", b) if b in generators else "shared")
        groups.setdefault(key, []).append(b)
    for key, rows in groups.items():
        is_greedy = key == "greedy"
        width = max(int(num_draft_tokens[b]) for b in rows)
        draft = torch.zeros((len(rows), width), dtype=torch.long, device=logits.device)
        q = torch.empty((len(rows), width + 1, vocab), dtype=torch.float32, device=logits.device)
        p = None if is_greedy else torch.zeros((len(rows), width, vocab), dtype=torch.float32, device=logits.device)
        lengths = torch.tensor([int(num_draft_tokens[b]) for b in rows], dtype=torch.long, device=logits.device)
        for i, b in enumerate(rows):
            n, s = int(num_draft_tokens[b]), starts[b]
            idx = torch.cat([target_logits_indices[s : s + n].long(), bonus_logits_indices[b : b + 1].long()])
            k = int(top_k[b]) if top_k is not None else 0
            k = 0 if k <= 0 or k >= vocab else k
            t = 0.0 if is_greedy else float(temperature[b])  # type: ignore[index]
            tp = float(top_p[b]) if top_p is not None else 1.0
            law = sk.process_logits(logits[idx].float(), temperature=t, top_k=k, top_p=min(tp, 1.0), log=False)
            q[i, : n + 1] = law
            q[i, n + 1 :] = law[-1]  # rows past the chain are never read; any law keeps the checks quiet
            ids = draft_token_ids[s : s + n].long()
            draft[i, :n] = ids
            if p is not None:
                if draft_probs is not None:
                    p[i, :n] = draft_probs[s : s + n].float()
                else:  # a proposal without a law (n-gram): a point mass on the proposed token
                    p[i, torch.arange(n, device=logits.device), ids] = 1.0
                if n < width:
                    p[i, n:, 0] = 1.0
        if is_greedy:
            verdict = sk.verify_chain(draft, None, q, lengths=lengths, greedy=True, validate=False)
        else:
            gen = generators[rows[0]] if isinstance(key, tuple) else None
            seed = int(torch.randint(0, 2**63 - 1, (), generator=gen, device=gen.device if gen else None))
            verdict = sk.verify_chain(draft, p, q, lengths=lengths, seed=seed, validate=False)
        n_acc, nxt = verdict.n_accepted.tolist(), verdict.next_token.tolist()
        for i, b in enumerate(rows):
            a = int(n_acc[i])
            out[b, :a] = draft[i, :a].to(torch.int32)
            out[b, a] = int(nxt[i])
    return out
