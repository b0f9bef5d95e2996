"""Max-Gram drafter semantics (docs/methods.md, Drafts) and statistics bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest
import specdec
import torch
from specdec import max_gram_proposal
from specdec.metrics import GenerationStats
from tiny_models import tiny_llama


def test_longest_suffix_earliest_occurrence() -> None:
    # Suffix [4, 5] occurs at positions 3-4 and 8-9 of the search text; the earliest one is used.
    seq = [9, 1, 2, 4, 5, 6, 7, 8, 4, 5, 3, 0, 4, 5]
    assert max_gram_proposal(seq, 3) == [6, 7, 8]
    # The longest suffix that occurs is [3, 4, 5] (only at the start), not the later [4, 5].
    seq2 = [3, 4, 5, 1, 1, 4, 5, 2, 3, 4, 5]
    assert max_gram_proposal(seq2, 2) == [1, 1]


def test_second_search_extends_short_proposals() -> None:
    # The first match ends near the end of the search text; the second search continues from the extension.
    seq = [1, 2, 3, 1, 2]
    assert max_gram_proposal(seq, 4) == [3, 1, 2, 3]


def test_no_match_and_bigram_fill() -> None:
    assert max_gram_proposal([1, 2, 3], 4) == []
    bigram = np.array([1, 2, 3, 0])
    assert max_gram_proposal([1, 2, 3], 3, bigram) == [0, 1, 2]
    table = specdec.NGramDrafter.bigram_table([[0, 1, 0, 1, 0, 2, 3]], 5)
    assert table.tolist() == [1, 0, 3, 0, 0]


def test_ngram_sampling_is_exact_on_one_hot_laws() -> None:
    """A one-hot draft under sampling: every emitted token still comes from the target (smoke: runs, accepts)."""
    target = tiny_llama(0, vocab=16, hidden=32)
    prompt = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]])
    out = specdec.generate(
        target, "ngram", prompt, method="sd", max_new_tokens=10, do_sample=True, temperature=1.0, seed=0
    )
    assert len(out.new_tokens[0]) == 10
    assert out.stats.draft_params == 0 and out.stats.draft_calls > 0


def test_stats_bookkeeping() -> None:
    target, draft = tiny_llama(0, vocab=16, hidden=32), tiny_llama(1, vocab=16, hidden=32)
    out = specdec.generate(
        target, draft, torch.tensor([[1, 2, 3]]), method="rsd_c", branching=(2, 2), max_new_tokens=15, seed=0
    )
    s = out.stats
    assert s.emitted == s.new_tokens == 15
    assert s.row_rounds == s.target_calls  # batch 1
    assert abs(s.block_efficiency - 15 / s.target_calls) < 1e-12
    assert sum(s.accepted_hist) == s.row_rounds
    assert abs(sum(s.acceptance_by_rank) - s.acceptance_rate) < 1e-12
    assert 0 < s.draft_ratio < 1.5 and s.mbsu <= s.block_efficiency
    assert s.wall_time >= sum(v for k, v in s.times.items()) * 0.99
    d = s.as_dict()
    assert d["method"] == "rsd_c(b=2,2)" and d["new_tokens"] == 15
    total = GenerationStats(method="x")
    total.merge(s)
    total.merge(s)
    assert total.new_tokens == 30 and total.block_efficiency == s.block_efficiency


@pytest.mark.parametrize(("method", "kw"), [("rsd_c", {"branching": (3, 2, 1)}), ("spechub", {"branching": (2, 2)})])
def test_static_level_plan_matches_the_template(method, kw):
    """StaticTreeBuilder._plan (host-side, cached) against a direct reading of the template: children wanted per
    node, the child slots that may be filled, and the children's parent and template ids, for random live masks
    and padding nodes (template -1)."""
    from specdec.methods import make_method
    from specdec.methods.builders import make_builder

    cfg = make_method(method, **kw)
    builder = make_builder(cfg)
    parents = list(cfg.parents)
    kids = [[c for c in range(1, len(parents)) if parents[c] == t] for t in range(len(parents))]
    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        batch, n = int(torch.randint(1, 4, (), generator=g)), int(torch.randint(1, 5, (), generator=g))
        tmpl = torch.randint(-1, len(parents), (batch, n), generator=g)
        live = torch.rand((batch, n), generator=g) < 0.7
        vocab = 2 if trial % 5 == 0 else 50
        for _ in range(2):  # the second call is served from the cache
            counts, k, wanted, parent, child, full = builder._plan(tmpl, live, 7, vocab)
            want = [
                [len(kids[t]) if a and t >= 0 else 0 for t, a in zip(r, ra, strict=True)]
                for r, ra in zip(tmpl.tolist(), live.tolist(), strict=True)
            ]
            assert counts.tolist() == want
            assert k == min(max(max(r) for r in want), vocab)
            assert wanted.shape == (batch, n, k) and parent.shape == child.shape == (batch, n * k)
            assert full == bool(wanted.all())  # the host flag that lets a level skip its padding handling
            for b in range(batch):
                for i in range(n):
                    t = int(tmpl[b, i])
                    for j in range(k):
                        assert bool(wanted[b, i, j]) == (j < want[b][i])
                        assert int(parent[b, i * k + j]) == 7 + i
                        expect = kids[t][j] if t >= 0 and j < len(kids[t]) else -1
                        assert int(child[b, i * k + j]) == expect


def test_has_children_marks_the_parents_of_valid_nodes():
    from specdec.tree import DraftTree

    tree = DraftTree.from_roots(torch.tensor([5, 6]))
    tree.append_level(
        torch.tensor([[1, 2], [3, 0]]), torch.tensor([[0, 0], [0, 0]]), torch.tensor([[1, 1], [1, 0]]).bool()
    )
    tree.append_level(torch.tensor([[4], [0]]), torch.tensor([[2], [1]]), torch.tensor([[1], [0]]).bool())
    assert tree.has_children() == [[True, False, True, False], [True, False, False, False]]
    # padding nodes were stored with parent 0, token 0 and template -1
    assert tree.parent.tolist()[1] == [-1, 0, 0, 0] and tree.tokens.tolist()[1] == [6, 3, 0, 0]
    assert tree.template.tolist()[1][2:] == [-1, -1]


def _resized(model: torch.nn.Module, vocab: int) -> torch.nn.Module:
    """``model`` with its embedding and head cut or padded (random rows) to ``vocab`` rows: the same tokenizer with
    another output layer size, as the small and large models of one family often have."""
    cfg = type(model.config)(**{**model.config.to_dict(), "vocab_size": vocab})
    out = type(model)(cfg).eval()
    state = model.state_dict()
    g = torch.Generator().manual_seed(5)
    for key in ("model.embed_tokens.weight", "lm_head.weight"):
        w = state[key]
        extra = torch.randn((max(vocab - w.shape[0], 0), w.shape[1]), generator=g) * 0.2
        state[key] = torch.cat([w[:vocab], extra])
    out.load_state_dict(state)
    out.generation_config.eos_token_id = None
    return out


@pytest.mark.parametrize("draft_vocab", [40, 56])
def test_a_draft_with_another_output_size_drafts_over_the_shared_ids(draft_vocab: int) -> None:
    """Greedy output equals the target's with a draft whose output layer is cut (its missing ids in the prompt are
    read as its last one) or padded, and the draft still gets accepted."""
    from tiny_models import left_pad

    target = tiny_llama(1, vocab=48, std=0.2)
    draft = _resized(target, draft_vocab)
    ids, mask = left_pad([[3, 45, 5, 47, 21], [11, 2, 44]])  # ids past a cut draft's rows
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12)
    for method, params in (("sd", {"draft_length": 3}), ("rsd_c", {"branching": (2, 2)}), ("spectr", {})):
        out = specdec.generate(target, draft, ids, attention_mask=mask, method=method, do_sample=False,
                               max_new_tokens=12, **params)  # fmt: skip
        assert torch.equal(out.sequences, ref), method
        assert out.stats.block_efficiency > 1.1, method  # its proposals are accepted (the cut one less often)
    hooked = target.generate(ids, attention_mask=mask, custom_generate=specdec.custom_generate,
                             assistant_model=draft, method="sd", do_sample=False, max_new_tokens=12)  # fmt: skip
    assert torch.equal(hooked, ref)
    sampled = specdec.generate(target, draft, ids, attention_mask=mask, method="spechub", do_sample=True,
                               max_new_tokens=12, seed=0)  # fmt: skip
    assert int(sampled.sequences.max()) < 48
