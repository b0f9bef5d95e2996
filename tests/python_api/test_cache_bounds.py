"""Batched KV caches stay bounded: after every round each row of the target's and the draft's
cache holds exactly its committed tokens in slots [0, n_cached), and the cache is no longer than the longest active
row, however differently the rows accept; greedy batch output equals each prompt's batch-1 output."""

from __future__ import annotations

import pytest
import specdec
import torch
from specdec.models import KVState
from test_feature_draft import feature_draft
from tiny_models import left_pad, noisy_copy, reference_greedy, tiny_llama

VOCAB = 64
# ragged prompts; the one-token prompt has nothing cached when its root is kept (KVState.keep's slot-0 case)
PROMPT_LENGTHS = (1, 6, 11, 3)
METHODS = [("sd", {"draft_length": 4}), ("rsd_c", {"branching": (2, 2, 1)})]


@pytest.fixture(scope="module")
def setup():
    # 2000+ positions: past the tiny config's max_position_embeddings, which RoPE does not enforce
    target = tiny_llama(3, vocab=VOCAB, hidden=32, std=0.2)
    draft = noisy_copy(target, 5, 0.1)  # accepts often but not always: rows drift apart by hundreds of tokens
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    return target, draft, prompts


class CacheChecks:
    """Checks every cache after each ``KVState.keep`` (the end of a round) and each ``select_rows`` (finished rows
    dropped): rows left-packed, length <= the longest row. Counts the checks per cache (target / draft)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, decoder: specdec.SpeculativeDecoder) -> None:
        self.decoder = decoder
        self.counts = {"target": 0, "draft": 0}
        self.longest = 0
        self.spread = 0  # largest difference between two rows' counts seen in one check
        keep, select = KVState.keep, KVState.select_rows

        def checked_keep(state: KVState, *args: torch.Tensor) -> None:
            keep(state, *args)
            self.check(state)

        def checked_select(state: KVState, rows: torch.Tensor) -> None:
            select(state, rows)
            self.check(state)

        monkeypatch.setattr(KVState, "keep", checked_keep)
        monkeypatch.setattr(KVState, "select_rows", checked_select)

    def check(self, state: KVState) -> None:
        owner = "draft" if state is getattr(self.decoder.drafter, "state", None) else "target"
        n = state.n_cached
        longest = int(n.max())
        assert state.length <= longest, f"{owner} cache holds {state.length} slots, longest row {longest}"
        packed = torch.arange(state.length)[None, :] < n[:, None]
        assert torch.equal(state.valid, packed), f"{owner} rows are not [0, n_cached): {n.tolist()}"
        if state.length:  # an empty cache may have no layer tensors yet
            assert all(t.shape[2] == state.length for t in state.layer_tensors())
        self.counts[owner] += 1
        self.longest = max(self.longest, longest)
        self.spread = max(self.spread, longest - int(n.min()))


def _bounded_greedy_equals_batch_one(
    monkeypatch, setup, method: str, kw: dict, n_new: int, draft=None, min_spread: int | None = None
) -> None:
    target, model_draft, prompts = setup
    draft = model_draft if draft is None else draft
    decoder = specdec.SpeculativeDecoder(target, draft, method=method, **kw)
    singles = [
        decoder.generate(torch.tensor([p]), max_new_tokens=n_new, do_sample=False).new_tokens[0] for p in prompts
    ]
    checks = CacheChecks(monkeypatch, decoder)
    ids, mask = left_pad(prompts)
    out = decoder.generate(ids, mask, max_new_tokens=n_new, do_sample=False)
    assert out.new_tokens == singles
    rounds = out.stats.target_calls
    assert checks.counts["target"] >= rounds and checks.counts["draft"] >= rounds // 2, checks.counts
    assert checks.longest >= max(PROMPT_LENGTHS) + n_new - 1  # checked until the longest row's last round
    # the rows drifted apart (by more than their prompts differ), so stale slots would have piled up
    want = max(PROMPT_LENGTHS) + n_new // 20 if min_spread is None else min_spread
    assert checks.spread >= want, checks.spread


@pytest.mark.parametrize(("method", "kw"), METHODS)
def test_batched_caches_stay_bounded(monkeypatch, setup, method: str, kw: dict) -> None:
    _bounded_greedy_equals_batch_one(monkeypatch, setup, method, kw, 300)


@pytest.mark.slow
@pytest.mark.parametrize(("method", "kw"), METHODS)
def test_batched_caches_stay_bounded_long(monkeypatch, setup, method: str, kw: dict) -> None:
    _bounded_greedy_equals_batch_one(monkeypatch, setup, method, kw, 2000)


def test_feature_draft_cache_stays_bounded(monkeypatch, setup) -> None:
    target, _, prompts = setup
    draft = feature_draft(target, list(range(0, VOCAB, 2)), seed=4)
    # this draft is rarely accepted: the rows stay as far apart as their prompts
    _bounded_greedy_equals_batch_one(monkeypatch, setup, "sd", {"draft_length": 3}, 150, draft=draft, min_spread=10)
    # batch 1, one-token prompt: the first round drafts nothing (no target feature yet), the next ones read the
    # features of that round's root
    one = specdec.generate(
        target, draft, torch.tensor([prompts[0]]), method="sd", draft_length=3, max_new_tokens=40, do_sample=False
    )
    ref, gap = reference_greedy(target, prompts[0], 40)
    assert gap > 1e-4 and one.new_tokens[0] == ref


@pytest.mark.parametrize(("method", "kw"), METHODS)
def test_sampling_batch_caches_stay_bounded(monkeypatch, setup, method: str, kw: dict) -> None:
    target, draft, prompts = setup
    decoder = specdec.SpeculativeDecoder(target, draft, method=method, **kw)
    checks = CacheChecks(monkeypatch, decoder)
    ids, mask = left_pad(prompts)
    runs = [
        decoder.generate(ids, mask, max_new_tokens=300, do_sample=True, temperature=1.0, seed=11).new_tokens
        for _ in range(2)
    ]
    assert runs[0] == runs[1]  # same seed, same tokens
    assert [len(t) for t in runs[0]] == [300] * len(prompts)
    assert all(0 <= t < VOCAB for row in runs[0] for t in row)
    assert checks.counts["target"] > 0 and checks.counts["draft"] > 0
    assert checks.spread > max(PROMPT_LENGTHS), checks.spread  # rows accepted differently
