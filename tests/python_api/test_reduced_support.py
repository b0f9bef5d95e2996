"""Reduced-vocabulary drafts (ReducedHead): the drafter proposes logits over the head's support only
(DraftLogits.support) and the tree builder processes and samples those S columns, then maps them to token ids.

* the same draft run with full-vocabulary rows (-inf outside the head) and with reduced rows gives identical greedy
  trees and identical draft laws (the law stored for the verifier is the full-vocabulary one, zero outside);
* every drawn token lies in the support (a builder that forgot the column -> token map would draw column indices);
* unsorted head_ids are put in token-id order (lowest id first on greedy ties);
* the exactness of the reduced path is proven by the law tests of test_feature_draft.py and
  test_train_specdec_pp.py, which use reduced heads with p = 0 on two of eight tokens.
"""

from __future__ import annotations

import pytest
import specdec
import torch
from specdec.drafters import DraftLogits, FeatureDrafter, ModelDrafter
from specdec.methods import make_method
from specdec.methods.builders import make_builder
from specdec.sampling import SamplingConfig
from test_feature_draft import feature_draft
from test_train_specdec_pp import reduced_draft
from tiny_models import left_pad, tiny_llama

METHODS = [
    ("sd", {"draft_length": 3}),
    ("rrs", {"branching": (2, 2)}),
    ("rsd_c", {"branching": (3, 2)}),
    ("rsd_s", {"beam_width": 3, "draft_length": 3}),
    ("spectr", {"num_chains": 2, "draft_length": 2}),
    ("spechub", {"branching": (2, 2)}),
]
HEAD = [0, 1, 2, 4, 5, 7, 9, 12, 20, 31]
UNSORTED = [20, 0, 31, 2, 7, 1, 12, 9, 5, 4]


def twins(kind: str, target, head: list[int]):
    """The same draft model behind a reduced and a full-vocabulary drafter."""
    model = feature_draft(target, head, seed=3) if kind == "feature" else reduced_draft(target, head, seed=3)
    cls = FeatureDrafter if kind == "feature" else ModelDrafter
    reduced, dense = cls(model), cls(model)
    dense.support = None
    return reduced, dense


def first_round(drafter, target, method: str, kw: dict, sampling: SamplingConfig, prompts: list[list[int]]):
    builder = make_builder(make_method(method, **kw))
    drafter.start(prompts)
    if drafter.reads_target_features:  # the target's features of every committed token but the last
        for p in prompts:
            assert len(p) >= 2
        ids, _ = left_pad([p[:-1] for p in prompts])
        hid = target.model(input_ids=ids).last_hidden_state
        drafter.observe_target(hid, torch.tensor([len(p) - 1 for p in prompts]))
    roots = torch.tensor([p[-1] for p in prompts])
    gen = torch.Generator().manual_seed(7)
    with torch.inference_mode():
        return builder.build(drafter, roots, prompts, sampling, gen, 10)


@pytest.mark.parametrize("kind", ["plain", "feature"])
@pytest.mark.parametrize(("method", "kw"), METHODS)
def test_reduced_rows_give_the_full_rows_tree(kind, method, kw):
    target = tiny_llama(0, vocab=32, hidden=32, std=0.3)
    reduced, dense = twins(kind, target, HEAD)
    assert reduced.support is not None and reduced.support.tolist() == HEAD
    prompts = [[3, 1, 4, 1, 5], [2, 7, 6]]
    # greedy: the very same trees
    t_red = first_round(reduced, target, method, kw, SamplingConfig(do_sample=False), prompts)
    t_den = first_round(dense, target, method, kw, SamplingConfig(do_sample=False), prompts)
    assert t_red.num_levels > 1
    for name in ("tokens", "parent", "valid", "depth"):
        assert torch.equal(getattr(t_red, name), getattr(t_den, name)), name
    # sampling: the root's law (what the verifier reads) is the same; every drawn token is in the head
    sampling = SamplingConfig(temperature=0.8)
    t_red = first_round(reduced, target, method, kw, sampling, prompts)
    t_den = first_round(dense, target, method, kw, sampling, prompts)
    p_red, p_den = t_red.p_rows(32)[:, :1], t_den.p_rows(32)[:, :1]
    assert p_red.shape == p_den.shape == (2, 1, 32)
    assert t_red.p_levels[0].shape == (2, 1, len(HEAD)) and t_den.p_levels[0].shape == (2, 1, 32)
    torch.testing.assert_close(p_red, p_den, atol=1e-6, rtol=1e-5)
    outside = torch.ones(32, dtype=torch.bool)
    outside[HEAD] = False
    assert bool((p_red[..., outside] == 0).all())
    drawn = t_red.tokens[:, 1:][t_red.valid[:, 1:]]
    assert drawn.numel() > 0 and bool(torch.isin(drawn, torch.tensor(HEAD)).all())
    if method == "spechub":
        hubs = t_red.hub()[:, 0]
        assert bool(torch.isin(hubs, torch.tensor(HEAD)).all())


def test_unsorted_head_ids_are_put_in_token_order():
    target = tiny_llama(0, vocab=32, hidden=32, std=0.3)
    drafter = ModelDrafter(reduced_draft(target, UNSORTED, seed=1))
    assert drafter.support is not None and drafter.support.tolist() == sorted(UNSORTED)
    drafter.start([[3, 1, 4]])
    with torch.inference_mode():
        out = drafter.propose_root([[3, 1, 4]])
        full = drafter.lm.model(input_ids=torch.tensor([[3, 1, 4]])).logits[0, -1].float()
    assert isinstance(out, DraftLogits) and out.logits.shape == (1, 1, len(UNSORTED))
    torch.testing.assert_close(out.dense(32)[0, 0].float(), full, atol=1e-5, rtol=1e-5)
    # greedy decoding with the unsorted head equals the same draft with full rows
    prompts = [[3, 1, 4, 1, 5], [2]]
    ids, mask = left_pad(prompts)
    outs = []
    for support in (drafter.support, None):
        d = ModelDrafter(drafter.lm.model)
        d.support = support
        outs.append(
            specdec.generate(target, d, ids, attention_mask=mask, method="rsd_c", branching=(2, 2), do_sample=False)
        )
    assert outs[0].new_tokens == outs[1].new_tokens


def test_reduced_logits_need_a_support():
    target = tiny_llama(0, vocab=32, hidden=32)
    lm = ModelDrafter(target).lm
    assert lm.support is None
    with pytest.raises(ValueError, match="reduced logits need an output head that scores a subset of the vocabulary"):
        lm.project(torch.zeros(1, 32), reduced=True)


def test_law_buffer_matches_fresh_rows():
    """p_rows with a reused LawBuffer equals the freshly zero-filled result in every round, including rounds whose
    trees hold fewer law rows than the previous one (stale rows must be cleared) and a change of support."""
    from specdec.tree import DraftTree, LawBuffer

    g = torch.Generator().manual_seed(0)
    vocab, batch = 40, 2
    sup_a = torch.tensor(HEAD)
    sup_b = torch.tensor([3, 6, 8, 10, 11])
    buf = LawBuffer()
    # (support, law rows per level, tree size): shrinking, growing and equal rounds
    rounds = [(sup_a, [1, 2], 6), (sup_a, [1], 6), (sup_a, [1, 2, 1], 6), (sup_b, [1, 1], 6), (sup_a, [1], 6)]
    for support, widths, size in rounds:
        tree = DraftTree.from_roots(torch.zeros(batch, dtype=torch.long))
        for w in widths:
            probs = torch.softmax(torch.randn((batch, w, support.numel()), generator=g), dim=-1)
            tree.set_level_laws(probs, None, support)
        tree.tokens = torch.zeros((batch, size), dtype=torch.long)  # the tree's width is all p_rows reads
        assert torch.equal(tree.p_rows(vocab, buf), tree.p_rows(vocab))
