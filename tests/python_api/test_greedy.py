"""Greedy mode: every method returns exactly the target's greedy decoding, token for token,
with a left-padded batch of prompts of different lengths whose rows accept different numbers of tokens and
finish independently."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import specdec
import specdec.methods.builders.auto as auto_module
import torch
from specdec.autotree import CostCurve
from specdec.drafters.cascade import CascadeDrafter
from tiny_models import left_pad, noisy_copy, reference_greedy, tiny_llama

VOCAB = 64
N_NEW = 40
METHODS = {
    "ar": {},
    "sd": {"draft_length": 3},
    "rrs": {"branching": (2, 2)},
    "rrsw": {"parents": (-1, 0, 0, 0, 1, 1, 2, 4)},
    "rsd_c": {"branching": (3, 2, 1)},
    "rsd_s": {"beam_width": 3, "draft_length": 4},
    "spectr": {"num_chains": 3, "draft_length": 3},
    "spechub": {"branching": (2, 1, 2)},
    "gds": {"branching": (3, 1, 2)},
    "csd": {"draft_length": 6},
}


@pytest.fixture(scope="module")
def setup():
    target = tiny_llama(3, vocab=VOCAB, std=0.2)
    # A perturbed copy agrees with the target often but not always: long acceptances and rejections both occur.
    draft = noisy_copy(target, 5, 0.1)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (1, 4, 7, 2, 9, 5)]
    refs = []
    for p in prompts:
        toks, gap = reference_greedy(target, p, N_NEW)
        # Tie-free logits: a smaller top-2 gap could flip under legitimate float reordering.
        assert gap > 1e-3, f"reference greedy decoding has a near-tie ({gap:.1e}); pick another seed"
        refs.append(toks)
    return target, draft, prompts, refs


def test_every_method_without_a_head_has_a_greedy_case() -> None:
    """specdec_pp (needs an acceptance head) has its greedy test in test_train_specdec_pp.py."""
    assert set(METHODS) == {m for m in specdec.methods.available() if not specdec.methods.get(m).needs_head}


@pytest.mark.parametrize("method", list(METHODS))
def test_greedy_equals_target_greedy(setup, method: str) -> None:
    target, draft, prompts, refs = setup
    if method == "csd":  # the draft reviews Max-Gram's blocks (more cascades: test_cascade.py)
        draft = CascadeDrafter([draft], bigram=np.arange(1, VOCAB + 1) % VOCAB)
    ids, mask = left_pad(prompts)
    out = specdec.generate(
        target, draft, ids, method=method, attention_mask=mask, max_new_tokens=N_NEW, do_sample=False, **METHODS[method]
    )
    assert out.new_tokens == refs
    assert out.sequences.shape == (len(prompts), ids.shape[1] + N_NEW)
    assert out.sequences[:, ids.shape[1] :].tolist() == refs
    stats = out.stats
    assert stats.new_tokens == len(prompts) * N_NEW
    if not specdec.methods.get(method).drafts:
        assert stats.block_efficiency == 1.0 and stats.draft_calls == 0
    else:
        assert stats.block_efficiency > 1.2, f"{method}: the draft should often be accepted ({stats.block_efficiency})"
        assert stats.target_calls < N_NEW
        assert stats.acceptance_by_depth and stats.acceptance_by_depth[0] > 0.2


def test_temperature_zero_is_greedy(setup) -> None:
    target, draft, prompts, refs = setup
    ids, mask = left_pad(prompts[:2])
    out = specdec.generate(
        target, draft, ids, method="rsd_c", attention_mask=mask, max_new_tokens=N_NEW, do_sample=False
    )
    assert out.new_tokens == refs[:2]


def test_eos_stops_rows_independently(setup) -> None:
    """Rows stop right after their first EOS (any of several ids); no token follows an accepted EOS."""
    target, draft, prompts, refs = setup
    eos = [refs[0][10], refs[3][25]]
    expected = []
    for r in refs:
        cut = next((i for i, t in enumerate(r) if t in eos), len(r) - 1)
        expected.append(r[: cut + 1])
    ids, mask = left_pad(prompts)
    for method in ("sd", "rsd_s", "spectr"):
        out = specdec.generate(
            target,
            draft,
            ids,
            method=method,
            attention_mask=mask,
            max_new_tokens=N_NEW,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=VOCAB - 1,
            **METHODS[method],
        )
        assert out.new_tokens == expected, method
        for b, toks in enumerate(expected):
            tail = out.sequences[b, ids.shape[1] + len(toks) :]
            assert bool((tail == VOCAB - 1).all())


def test_generation_config_and_decoder_reuse(setup) -> None:
    transformers = pytest.importorskip("transformers")
    target, draft, prompts, refs = setup
    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=12)
    ids, mask = left_pad(prompts[1:4])
    # With the default auto trees each call's shapes follow the machine's timings, so only the tokens repeat.
    auto = specdec.SpeculativeDecoder(target, draft, method="spechub")
    first = auto.generate(ids, mask, generation_config=config)
    second = auto.generate(ids, mask, generation_config=config)
    assert first.new_tokens == second.new_tokens == [r[:12] for r in refs[1:4]]
    assert auto.last_stats is second.stats and second.stats.new_tokens == first.stats.new_tokens
    # A fixed tree makes the rounds repeat too: the second call's stats are its own, not added to the first's.
    fixed = specdec.SpeculativeDecoder(target, draft, method="spechub", **METHODS["spechub"])
    first = fixed.generate(ids, mask, generation_config=config)
    stats_first = fixed.last_stats
    second = fixed.generate(ids, mask, generation_config=config)
    assert first.new_tokens == second.new_tokens == [r[:12] for r in refs[1:4]]
    assert stats_first is not None and stats_first.target_calls == second.stats.target_calls


def test_ngram_drafter_greedy_and_speedup() -> None:
    """Max-Gram on a prompt the target will copy: exact greedy output, several tokens per target call."""
    target = tiny_llama(7, vocab=VOCAB, std=0.2)
    prompt = [5, 9, 13, 2, 40, 33, 7]
    ref, _ = reference_greedy(target, prompt, 30)
    # The prompt repeats the first part of the target's own continuation, so lookups find matches.
    copy_prompt = prompt + ref[:20] + prompt
    ref_copy, gap = reference_greedy(target, copy_prompt, 20)
    assert gap > 1e-4
    ids, mask = left_pad([copy_prompt, prompt])
    out = specdec.generate(target, "ngram", ids, method="sd", attention_mask=mask, max_new_tokens=20, do_sample=False)
    assert out.new_tokens == [ref_copy, ref[:20]]
    assert out.stats.draft_ratio == 0.0 and out.stats.mbsu == out.stats.block_efficiency


def test_bf16_models_run() -> None:
    """bf16 weights: probabilities stay fp32; the mask takes the model dtype. Greedy output equals the bf16
    target's own greedy decoding with the same tree shapes only approximately, so check shape and stats."""
    target = tiny_llama(3, vocab=VOCAB, std=0.2, dtype=torch.bfloat16)
    draft = tiny_llama(4, vocab=VOCAB, std=0.2, dtype=torch.bfloat16)
    out = specdec.generate(target, draft, torch.tensor([[1, 2, 3]]), method="rsd_c", max_new_tokens=8, seed=0)
    assert len(out.new_tokens[0]) == 8 and out.stats.target_calls >= 1


@pytest.mark.parametrize("method", ["sd", "rsd_c", "rsd_s", "spechub"])
def test_self_draft_accepts_everything(setup, method: str) -> None:
    """The target as its own draft: a correct draft KV cache (filtered after every round, rows dropped as they
    finish) reproduces the target's greedy choice at every node, so every verification step accepts. A stale or
    misplaced draft KV entry would show up here as rejections (exactness alone cannot reveal it)."""
    target, _, prompts, refs = setup
    eos = [refs[2][17], refs[4][30]]
    ids, mask = left_pad(prompts)
    params = {"sd": {"draft_length": 4}, "rsd_c": {"branching": (2, 2, 1)}}.get(method, METHODS[method])
    out = specdec.generate(
        target,
        target,
        ids,
        method=method,
        attention_mask=mask,
        max_new_tokens=N_NEW,
        do_sample=False,
        eos_token_id=eos,
        **params,
    )
    assert out.stats.acceptance_rate == 1.0, out.stats.as_dict()
    sampled = specdec.generate(
        target,
        target,
        ids,
        method=method,
        attention_mask=mask,
        max_new_tokens=N_NEW,
        do_sample=True,
        temperature=1.0,
        seed=0,
        **params,
    )
    # p and q differ only by float round-off between the draft's level forwards and the target's tree forward.
    assert sampled.stats.acceptance_rate > 0.97, sampled.stats.as_dict()


@pytest.mark.parametrize("method", ["rsd_c", "rrs", "rrsw", "spechub"])
def test_auto_trees_equal_target_greedy(setup, method: str, tmp_path, monkeypatch) -> None:
    """branching="auto" changes the tree's shape between rounds; every round still returns the target's greedy
    tokens."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    target, draft, prompts, refs = setup
    ids, mask = left_pad(prompts)
    decoder = specdec.SpeculativeDecoder(target, draft, method=method, branching="auto")
    # a flat cost curve, so that the rounds draft: a curve measured on a tiny model may rightly find no tree pays
    decoder.builder.curve = CostCurve(target={1: 1.0, 10**6: 1.0}, draft={1: 0.01, 32: 0.01})
    # the shapes a choice returns, in turn (what choose picks depends on timings; here every choice moves the
    # shape), within the widest level the method's trees allow
    width = decoder.builder.max_width
    shapes = [s for s in [(2,), (3, 1), (2, 2, 1), (1, 1, 1), (4,)] if max(s) <= width]
    turns = itertools.cycle(shapes)
    monkeypatch.setattr(auto_module, "choose", lambda *a, **k: (next(turns), 0, 1.0))
    for _ in range(2):  # the second call starts from the first call's acceptance counts
        out = decoder.generate(ids, mask, max_new_tokens=N_NEW, do_sample=False)
        assert out.new_tokens == refs
    assert decoder.config.describe() == f"{method}(auto)"
    assert len(decoder.builder.shapes_used) >= 2, decoder.builder.shapes_used


def test_auto_trees_fall_back_to_plain_steps_where_no_tree_pays(setup, tmp_path, monkeypatch) -> None:
    """A cost curve on which every extra row is expensive: the rounds draft nothing and stay the target's greedy."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    target, draft, prompts, refs = setup
    ids, mask = left_pad(prompts)
    decoder = specdec.SpeculativeDecoder(target, draft, method="rsd_c", branching="auto")
    decoder.builder.curve = CostCurve(target={1: 1.0, 2: 10.0, 32: 160.0}, draft={1: 1.0})
    out = decoder.generate(ids, mask, max_new_tokens=N_NEW, do_sample=False)
    assert out.new_tokens == refs
    assert set(decoder.builder.shapes_used) == {()} and out.stats.draft_calls == 0
