"""Adaptive draft depth from an acceptance head (decoders.adaptive): ``method="specdec_pp"`` and tree methods
with ``head=`` stop growing a row's tree once the best path's predicted rejection risk exceeds h.

The stopping rule reads draft-side information only, so the target law must be kept exactly: the joint law of the
first two generated tokens is checked against the exact law with chi-square p >= 1e-4 (false-alarm rate
1e-4 per check, 2 prompts x 2 methods, fixed seeds) and empirical TV <= 0.08; greedy output must equal target greedy.
Tiny models and a random head, as in test_train_specdec_pp.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import specdec
import torch
from test_train_specdec_pp import PROMPTS, TEMPERATURE, VOCAB, assert_first_two_law, random_head, reduced_draft
from tiny_models import assert_target_greedy, left_pad, tiny_llama

TREES = [("rsd_c", {"branching": (2, 2, 1)}), ("rsd_s", {"beam_width": 2, "draft_length": 3})]


@pytest.mark.parametrize(("method", "kw"), TREES)
def test_adaptive_tree_keeps_the_target_law(method, kw):
    target = tiny_llama(0, vocab=VOCAB, hidden=32, std=0.3)
    draft = reduced_draft(target, [0, 1, 2, 4, 5, 7], seed=1)
    dec = specdec.SpeculativeDecoder(target, draft, method=method, head=random_head(32, 2), threshold=0.4, **kw)
    n = 3000
    ids, mask = left_pad([PROMPTS[i % 2] for i in range(2 * n)])
    out = dec.generate(ids, mask, max_new_tokens=4, do_sample=True, temperature=TEMPERATURE, seed=11)
    lengths = [x for r in dec.builder.stop_rule.round_lengths for x in r]
    assert min(lengths) < dec.config.depth  # the rule did stop some trees early
    assert_first_two_law(target, out.new_tokens)


@pytest.mark.parametrize(("method", "kw"), [*TREES, ("specdec_pp", {"draft_length": 5})])
def test_adaptive_depth_greedy_equals_target_greedy(method, kw):
    target = tiny_llama(0, vocab=32, hidden=64)
    draft = reduced_draft(target, list(range(0, 32, 2)) + [1, 3, 5], seed=4)
    g = torch.Generator().manual_seed(0)
    prompts = [[int(t) for t in torch.randint(0, 32, (int(n),), generator=g)] for n in (3, 6, 4, 5)]
    ids, mask = left_pad(prompts)
    out = specdec.generate(
        target,
        draft,
        ids,
        attention_mask=mask,
        method=method,
        head=random_head(32, 5),
        threshold=0.6,
        max_new_tokens=20,
        do_sample=False,
        **kw,
    )
    assert_target_greedy(target, prompts, out.new_tokens, 20)


def test_threshold_moves_the_tree_depth():
    target = tiny_llama(0, vocab=VOCAB, hidden=32, std=0.3)
    draft = reduced_draft(target, [0, 1, 2, 4, 5, 7], seed=1)
    ids, mask = left_pad([PROMPTS[i % 2] for i in range(64)])
    mean_depth = {}
    for h in (0.0, 1.0):
        dec = specdec.SpeculativeDecoder(
            target, draft, method="rsd_c", branching=(2, 2, 2), head=random_head(32, 2), threshold=h
        )
        dec.generate(ids, mask, max_new_tokens=5, do_sample=True, temperature=TEMPERATURE, seed=0)
        first = dec.builder.stop_rule.round_lengths[0]
        mean_depth[h] = float(np.mean(first))
        if h == 1.0:
            assert min(first) == 3  # never stops early: the full depth
        else:
            assert max(first) <= 2  # the root level is never predicted; the next level stops every row
    assert mean_depth[0.0] < mean_depth[1.0]


def test_bad_head_inputs():
    target = tiny_llama(0, vocab=VOCAB, hidden=32)
    draft = reduced_draft(target, [0, 1, 2], seed=1)
    head = random_head(32, 0)
    with pytest.raises(ValueError, match="method 'specdec_pp' needs head="):
        specdec.SpeculativeDecoder(target, draft, method="specdec_pp")
    with pytest.raises(ValueError, match="head= needs a neural draft model"):
        specdec.SpeculativeDecoder(target, "ngram", method="rsd_c", head=head)
    with pytest.raises(ValueError, match="needs a drafting method"):
        specdec.SpeculativeDecoder(target, None, method="ar", head=head)
    with pytest.raises(ValueError, match="pass head= too"):
        specdec.SpeculativeDecoder(target, draft, method="sd", threshold=0.5)
    with pytest.raises(ValueError, match=r"threshold must lie in \[0, 1\]"):
        specdec.SpeculativeDecoder(target, draft, method="rsd_s", head=head, threshold=-0.1)
    with pytest.raises(TypeError, match="head must be callable"):
        specdec.SpeculativeDecoder(target, draft, method="sd", head=3)
    with pytest.raises(ValueError, match="does not take branching"):
        specdec.SpeculativeDecoder(target, draft, method="specdec_pp", head=head, branching=(2,))


def test_a_head_brings_its_own_threshold():
    """Without threshold=, the decoder stops at the head's own h (``head.threshold``, which load_head sets to the
    shipped h), else at DEFAULT_THRESHOLD; an explicit threshold= wins, and a bad h on the head is refused."""
    from specdec.methods.builders.adaptive import DEFAULT_THRESHOLD
    from specdec.train import load_head

    target = tiny_llama(0, vocab=VOCAB, hidden=32)
    draft = reduced_draft(target, [0, 1, 2], seed=1)
    head = random_head(32, 0)
    dec = specdec.SpeculativeDecoder(target, draft, method="specdec_pp", head=head)
    assert dec.builder.stop_rule.threshold == DEFAULT_THRESHOLD
    head.threshold = 0.35
    for method in ("specdec_pp", "rsd_c"):
        assert specdec.SpeculativeDecoder(target, draft, method=method, head=head).builder.stop_rule.threshold == 0.35
    assert specdec.SpecDecPPDecoder(target, draft, head).builder.stop_rule.threshold == 0.35
    dec = specdec.SpeculativeDecoder(target, draft, method="specdec_pp", head=head, threshold=0.9)
    assert dec.builder.stop_rule.threshold == 0.9
    head.threshold = 1.5
    with pytest.raises(ValueError, match=r"threshold must lie in \[0, 1\]"):
        specdec.SpeculativeDecoder(target, draft, method="specdec_pp", head=head)
    shipped, h = load_head("smollm2-eagle-head")
    assert shipped.threshold == h and 0.0 < h < 1.0
