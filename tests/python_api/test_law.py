"""End-to-end exactness: the joint law of the first two generated tokens equals the target's exact law
(spec §10.8), for every sampling method, with two prompts of different lengths mixed in one left-padded batch.

Setup: target and draft are two differently seeded tiny Llamas with vocabulary 8 (64 outcomes), temperature 1.7
so the laws are neither flat nor peaked (draft/target overlap ~0.77). The exact law q(y1) q(y2 | y1) comes from
enumerating the target with the same processing function. Every generation is one batch row; rows generate
``depth + 1`` tokens so that the first round drafts a full-depth tree (a row with fewer tokens left gets a
shallower tree), and only the first two are counted.

Statistics (specdec_kernels.testing.stats.law_check): Pearson chi-square with merged bins must have p >= 1e-4
(false-alarm rate 1e-4 per check; this module makes 2 checks per method, 18 in all, so a spurious failure has
probability below 2e-3 per run; seeds are fixed, so a run is reproducible) and the empirical TV must stay below
a bound far above its sampling noise (default N = 5000 per prompt: noise ~0.04, bound 0.08; slow N = 1e5: noise
~0.009, bound 0.02). The negative control (drafting at half the temperature the verifier assumes) has exact TV
~0.15 and fails with p < 1e-50.
"""

from __future__ import annotations

import numpy as np
import pytest
import specdec
import torch
from specdec.config import SamplingConfig
from tiny_models import tiny_llama

from specdec_kernels.testing.stats import law_check

VOCAB = 8
TEMPERATURE = 1.7
PROMPTS = [[3, 1], [5, 2, 7, 4]]

CASES = {
    "sd": {"draft_length": 3},
    "rrs": {"branching": (2, 2)},
    "rrsw": {"parents": (-1, 0, 0, 0, 1, 1, 2, 4)},
    "rsd_c": {"branching": (2, 2, 1)},
    "rsd_s": {"beam_width": 3, "draft_length": 3},
    "spectr": {"num_chains": 3, "draft_length": 2},
    "spechub": {"branching": (2, 2)},
}


@pytest.fixture(scope="module")
def models():
    return tiny_llama(0, vocab=VOCAB, hidden=32, std=0.3), tiny_llama(1, vocab=VOCAB, hidden=32, std=0.3)


@torch.no_grad()
def exact_law(target, prompt: list[int], sampling: SamplingConfig) -> np.ndarray:
    """[V, V] float64: q(y1 | prompt) q(y2 | prompt, y1) under ``sampling``'s processing."""
    first = sampling.process(target(torch.tensor([prompt])).logits[0, -1]).double().exp()
    ids = torch.tensor([prompt + [y] for y in range(VOCAB)])
    second = sampling.process(target(ids).logits[:, -1]).double().exp()
    law = first[:, None] * second
    return (law / law.sum()).numpy()


def run_law(models, method: str, params: dict, n_per_prompt: int, *, seed: int = 1, **sampling) -> list:
    target, draft = models
    decoder = specdec.SpeculativeDecoder(target, draft, method=method, **params)
    rows = [PROMPTS[i % 2] for i in range(2 * n_per_prompt)]
    width = max(len(p) for p in PROMPTS)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(rows):
        ids[b, width - len(p) :] = torch.tensor(p)
        mask[b, width - len(p) :] = 1
    out = decoder.generate(
        ids, mask, max_new_tokens=max(decoder.config.depth + 1, 2), temperature=TEMPERATURE, seed=seed, **sampling
    )
    first_two = np.array([t[:2] for t in out.new_tokens])
    resolved = SamplingConfig(temperature=TEMPERATURE, **sampling)
    checks = []
    for i, prompt in enumerate(PROMPTS):
        counts = np.zeros((VOCAB, VOCAB))
        np.add.at(counts, (first_two[i::2, 0], first_two[i::2, 1]), 1)
        max_tv = 0.08 if n_per_prompt < 50_000 else 0.02
        checks.append(law_check(counts, exact_law(target, prompt, resolved), max_tv=max_tv))
    return checks


@pytest.mark.parametrize("method", sorted(CASES))
def test_first_two_tokens_follow_the_target_law(models, method: str) -> None:
    checks = run_law(models, method, CASES[method], 5000)
    for prompt, check in zip(PROMPTS, checks, strict=True):
        assert check.ok, f"{method} prompt {prompt}: {check}"


def test_law_with_top_k_and_top_p(models) -> None:
    """The filters go through the same processing for draft and target; the output law is the filtered target's."""
    checks = run_law(models, "rsd_c", {"branching": (2, 2)}, 5000, top_k=5, top_p=0.9)
    for prompt, check in zip(PROMPTS, checks, strict=True):
        assert check.ok, f"rsd_c top-k/top-p prompt {prompt}: {check}"


def test_ar_follows_the_target_law(models) -> None:
    checks = run_law(models, "ar", {}, 5000)
    assert all(c.ok for c in checks), [str(c) for c in checks]


def test_negative_control_wrong_draft_law_fails(models, monkeypatch) -> None:
    """Draft tokens drawn at half the temperature while the verifier is handed the law at the full temperature:
    the p used to verify is not the p drafted from (spec §1.3, transformers #32867). The test must catch it."""
    import specdec.decoders.base as base

    real = base.sample_categorical
    monkeypatch.setattr(base, "sample_categorical", lambda logp, **kw: real(2.0 * logp, **kw))
    checks = run_law(models, "sd", CASES["sd"], 5000)
    for check in checks:
        assert not check.ok and check.p_value < 1e-20, f"the wrong variant was not detected: {check}"


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(CASES))
def test_first_two_tokens_follow_the_target_law_big(models, method: str) -> None:
    checks = run_law(models, method, CASES[method], 100_000, seed=2)
    for prompt, check in zip(PROMPTS, checks, strict=True):
        assert check.ok, f"{method} prompt {prompt}: {check}"
