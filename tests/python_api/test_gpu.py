"""The driver with its models on a CUDA device (marked ``gpu``; skipped without one): seeds, generators, noise and
the run context live on the model's device, and each kernel backend that runs there (torch, cuda, triton, forced
with SPECDEC_BACKEND) gives the target's greedy output and, sampling, the target's law (Pearson chi-square,
false-alarm rate 1e-4 per check, as test_law.py)."""

from __future__ import annotations

import numpy as np
import pytest
import specdec
import torch
from specdec.sampling import SamplingConfig
from test_law import CASES, PROMPTS, VOCAB, exact_law, sharpened
from tiny_models import left_pad, noisy_copy, tiny_llama

import specdec_kernels as sk
from specdec_kernels.testing.stats import law_check

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA device on this machine", allow_module_level=True)

DEV = torch.device("cuda")
BACKENDS = [b for b in ("torch", "cuda", "triton") if b in sk.available_backends()]
METHODS = ["sd", "rrs", "rrsw", "rsd_c", "rsd_s", "spectr", "spechub"]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch) -> str:
    monkeypatch.setenv("SPECDEC_BACKEND", request.param)
    return request.param


@pytest.mark.parametrize("method", METHODS)
def test_greedy_on_cuda_equals_the_targets_generate(method: str, backend: str) -> None:
    target = tiny_llama(3, vocab=64, std=0.3).to(DEV)
    draft = noisy_copy(target.cpu(), 4, 0.2).to(DEV)
    target = target.to(DEV)
    ids, mask = left_pad([[5, 9, 13, 2, 40, 22], [7, 3, 51]])
    ids, mask = ids.to(DEV), mask.to(DEV)
    kw = dict(do_sample=False, max_new_tokens=12, repetition_penalty=1.3)
    ref = target.generate(ids, attention_mask=mask, **kw)
    out = specdec.generate(target, draft, ids, method=method, attention_mask=mask, seed=0, **CASES[method], **kw)
    assert out.sequences.device.type == "cuda"
    assert torch.equal(out.sequences, ref), f"{method} on {backend}"
    hooked = target.generate(ids, attention_mask=mask, custom_generate=specdec.custom_generate, assistant_model=draft,
                             method=method, **CASES[method], **kw)  # fmt: skip
    assert torch.equal(hooked, ref)


@pytest.mark.parametrize("method", ["sd", "rsd_c", "spechub"])
def test_law_on_cuda(method: str, backend: str) -> None:
    target = tiny_llama(0, vocab=VOCAB, hidden=32, std=0.3)
    draft = sharpened(tiny_llama(1, vocab=VOCAB, hidden=32, std=0.3), 2.0)
    law = [exact_law(target, p, SamplingConfig(temperature=1.7)) for p in PROMPTS]
    target, draft = target.to(DEV), draft.to(DEV)
    decoder = specdec.SpeculativeDecoder(target, draft, method=method, **CASES[method])
    n = 5000
    ids, mask = left_pad([PROMPTS[i % 2] for i in range(2 * n)])
    out = decoder.generate(ids.to(DEV), mask.to(DEV), max_new_tokens=decoder.config.depth + 1, do_sample=True,
                           temperature=1.7, top_k=0, seed=1)  # fmt: skip
    first_two = np.array([t[:2] for t in out.new_tokens])
    for i, prompt in enumerate(PROMPTS):
        counts = np.zeros((VOCAB, VOCAB))
        np.add.at(counts, (first_two[i::2, 0], first_two[i::2, 1]), 1)
        check = law_check(counts, law[i], max_tv=0.08)
        assert check.ok, f"{method} on {backend}, prompt {prompt}: {check}"


def test_a_cuda_generator_drives_the_run() -> None:
    target = tiny_llama(3, vocab=64, std=0.3).to(DEV)
    draft = noisy_copy(target.cpu(), 4, 0.2).to(DEV)
    ids = torch.tensor([[5, 9, 13, 2]], device=DEV)
    runs = []
    for _ in range(2):
        g = torch.Generator(device=DEV).manual_seed(7)
        runs.append(specdec.generate(target, draft, ids, method="rsd_c", branching=(2, 1), do_sample=True,
                                     max_new_tokens=12, generator=g).new_tokens)  # fmt: skip
    assert runs[0] == runs[1]
