"""The demo's transformers baselines (specdec.baselines): generate on the demo's settings, and the logit error of
each decoding path against a reference forward."""

from __future__ import annotations

import math
import warnings

import torch
from specdec.baselines import hf_generate, logit_error
from tiny_models import left_pad, reference_greedy, tiny_llama

VOCAB = 48


def test_hf_generate_is_transformers_greedy_with_eos_cut() -> None:
    model = tiny_llama(0, vocab=VOCAB, std=0.2)
    prompts = [[3, 4, 5], [7, 1]]
    ids, mask = left_pad(prompts)
    want = [reference_greedy(model, p, 6)[0] for p in prompts]
    rows, stats = hf_generate(
        model, ids, mask, max_new_tokens=6, temperature=0.0, top_k=0, top_p=1.0, eos_token_id=None,
        pad_token_id=0, seed=0,
    )  # fmt: skip
    assert rows == want
    assert stats.new_tokens == 12 and stats.block_efficiency == 1.0 and stats.wall_time > 0
    eos = want[0][2]
    rows, _ = hf_generate(
        model, ids, mask, max_new_tokens=6, temperature=0.0, top_k=0, top_p=1.0, eos_token_id=eos,
        pad_token_id=0, seed=0,
    )  # fmt: skip
    assert rows[0] == want[0][:3]  # up to and including the first EOS


def test_hf_generate_sampling_is_seeded() -> None:
    model = tiny_llama(1, vocab=VOCAB, std=0.2)
    ids, mask = left_pad([[2, 9, 4]])
    kw = dict(max_new_tokens=8, temperature=0.9, top_k=5, top_p=0.9, eos_token_id=None, pad_token_id=0)
    a, _ = hf_generate(model, ids, mask, seed=4, **kw)
    b, _ = hf_generate(model, ids, mask, seed=4, **kw)
    assert a == b and len(a[0]) == 8


def test_assisted_generation_reports_no_block_efficiency() -> None:
    model, helper = tiny_llama(0, vocab=VOCAB, std=0.2), tiny_llama(2, vocab=VOCAB, std=0.2)
    ids, mask = left_pad([[3, 4, 5]])
    want = reference_greedy(model, [3, 4, 5], 6)[0]
    rows, stats = hf_generate(
        model, ids, mask, max_new_tokens=6, temperature=0.0, top_k=0, top_p=1.0, eos_token_id=None,
        pad_token_id=0, seed=0, assistant_model=helper,
    )  # fmt: skip
    assert rows == [want]  # assisted greedy decoding is the target's greedy decoding
    assert stats.target_calls == 0 and stats.new_tokens == 6


def test_logit_error_against_itself_and_a_rounded_copy() -> None:
    model = tiny_llama(3, vocab=VOCAB, std=0.2)
    prompt, tokens = [5, 6, 7], [8, 9, 10, 11]
    with warnings.catch_warnings():  # transformers' own cached forward, called with its current cache keyword
        warnings.simplefilter("error", FutureWarning)
        same = logit_error(model, model, prompt, tokens)
    for path in ("specdec adapter", "transformers"):
        assert same[path]["max_abs"] < 1e-4 and same[path]["argmax_equal"] == 1.0
    rounded = tiny_llama(3, vocab=VOCAB, std=0.2).to(torch.bfloat16)
    err = logit_error(rounded, model, prompt, tokens)
    for path in ("specdec adapter", "transformers"):
        assert 1e-4 < err[path]["max_abs"] < 1.0 and err[path]["mean_abs"] <= err[path]["max_abs"]
        assert not math.isnan(err[path]["mean_abs"])
