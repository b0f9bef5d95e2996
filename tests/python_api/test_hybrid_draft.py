"""The hybrid draft (specdec.drafters.HybridDrafter): a neural draft with Max-Gram's track mixed into its law.

Unit checks: the law at a track node is ``weight`` on the proposed token and the neural law on the rest; a reduced
head grows its columns when the proposal lies outside them; levels below the tree proper are the track's point mass
and run no neural forward; matches shorter than ``min_match`` give no track; auto trees hang the track chain under
their first-child path.

Law test (the main pair of test_law.py: target seed 0, draft seed 1 with its lm_head x2, vocabulary 8, T = 1.7):
prompts that repeat a token, so that Max-Gram proposes at the root and along the first drafted levels; rsd_c auto
trees pinned to one shape each ((2,): the first token from the mixture, the second from the track alone below the
tree; (1, 1): both from the mixture), and sd (L = 2), spechub (2, 2), SpecTr (3 chains of 2) and SpecInfer (3, 1) on
their static trees; weight 0.6 so that both the track token and the other tokens carry mass. The joint law of the
first two tokens is compared with the exact law by law_check: chi-square p >= 1e-4 and TV <= 0.08 (N = 5000 per
prompt: noise ~0.04). False-alarm rate 1e-4 per check, 13 checks (with the SpecTr test at the end). Negative
control: the same run with the verifier handed the neural law instead of the mixture the children were drawn from
must reach p < 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest
import specdec
import specdec.methods.builders.auto as auto_module
import torch
from specdec.autotree import CostCurve
from specdec.drafters import (
    Drafter,
    DraftLogits,
    FeatureDrafter,
    HybridDrafter,
    ModelDrafter,
    NGramDrafter,
    longest_match,
)
from specdec.methods.builders.auto import AutoTreeBuilder
from specdec.sampling import SamplingConfig
from specdec.tree import DraftTree
from test_feature_draft import feature_draft
from test_law import exact_law, sharpened
from tiny_models import assert_target_greedy, left_pad, tiny_llama

from specdec_kernels.testing.stats import law_check

VOCAB = 8
TEMPERATURE = 1.7
# both end in a token seen before: Max-Gram proposes [1, 5, 2] and [2, 6, 4] at the root
PROMPTS = [[3, 1, 5, 2, 3], [6, 2, 6, 4, 6]]
N = 5000


class FixedDrafter(Drafter):
    """A stand-in neural drafter: the same logits after every node; counts its calls."""

    def __init__(self, logits: torch.Tensor, support: torch.Tensor | None = None) -> None:
        self.logits = logits
        self.support = support
        self.vocab_size = VOCAB
        self.calls = 0

    def start(self, prompts):
        pass

    def _out(self, batch: int, n: int) -> DraftLogits:
        self.calls += 1
        logits = self.logits.expand(batch, n, -1).clone()
        return DraftLogits(logits, torch.ones((batch, n), dtype=torch.bool), self.support)

    def propose_root(self, committed):
        return self._out(len(committed), 1)

    def propose_level(self, tree, lo, hi):
        return self._out(tree.batch, hi - lo)

    def accept(self, tree, accepted_nodes, n_accepted):
        pass

    def select_rows(self, rows):
        pass


def test_longest_match_reports_the_match_length() -> None:
    assert longest_match([3, 1, 5, 2, 3], 4) == (1, [1, 5, 2])
    assert longest_match([7, 3, 1, 9, 3, 1], 2) == (2, [9, 3])
    assert longest_match([1, 2, 3], 4) == (0, [])


def test_track_node_law_is_the_mixture() -> None:
    neural = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0, -2.0, 0.3, 0.1])
    hybrid = HybridDrafter(FixedDrafter(neural), weight=0.7)
    hybrid.start([[3, 1, 5, 2, 3], [1, 2, 4]])
    out = hybrid.propose_root([[3, 1, 5, 2, 3], [1, 2, 4]])  # row 0 proposes 1, row 1 has no match
    probs = torch.softmax(out.logits[:, 0].double(), -1)
    rest = torch.softmax(neural.double(), -1)
    assert probs[0, 1].item() == pytest.approx(0.7, abs=1e-6)
    others = [t for t in range(VOCAB) if t != 1]
    torch.testing.assert_close(probs[0, others] / 0.3, rest[others] / rest[others].sum())
    torch.testing.assert_close(probs[1], rest)  # off the track: the neural law


def test_every_node_that_spells_the_proposal_gets_the_mixture() -> None:
    """I.i.d. draws (SpecTr's chains, SpecInfer's siblings) can repeat the proposed token: each copy is on the track,
    two levels down too, so that a node's law depends on its path only (K-SEQ verifies pooled copies with one law)."""
    neural = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0, -2.0, 0.3, 0.1])
    hybrid = HybridDrafter(FixedDrafter(neural), weight=0.7)
    committed = [[3, 1, 5, 2, 3]]  # proposes 1, 5, 2
    hybrid.start(committed)
    hybrid.propose_root(committed)
    tree = DraftTree.from_roots(torch.tensor([3]))
    tree.append_level(torch.tensor([[1, 4, 1]]), torch.tensor([[0, 0, 0]]), torch.tensor([[True, True, True]]))
    level1 = torch.softmax(hybrid.propose_level(tree, 1, 4).logits[0].double(), -1)
    off = torch.softmax(neural.double(), -1)[5].item()  # node 2 (token 4) is off the track
    assert level1[:, 5].tolist() == pytest.approx([0.7, off, 0.7])
    tree.append_level(torch.tensor([[5, 5, 6]]), torch.tensor([[1, 3, 3]]), torch.tensor([[True, True, True]]))
    level2 = torch.softmax(hybrid.propose_level(tree, 4, 7).logits[0].double(), -1)
    assert level2[0, 2].item() == pytest.approx(0.7) and level2[1, 2].item() == pytest.approx(0.7)
    torch.testing.assert_close(level2[2], torch.softmax(neural.double(), -1))  # 6 left the track


def test_reduced_head_grows_its_columns_for_the_proposal() -> None:
    support = torch.tensor([0, 2, 3, 6])
    neural = torch.tensor([0.1, 1.0, -0.5, 0.4])
    hybrid = HybridDrafter(FixedDrafter(neural, support), weight=0.8)
    hybrid.start([[3, 1, 5, 2, 3]])
    out = hybrid.propose_root([[3, 1, 5, 2, 3]])  # proposes 1, outside the support
    assert out.support.tolist() == [0, 1, 2, 3, 6]
    dense = torch.softmax(out.dense(VOCAB)[0, 0].double(), -1)
    assert dense[1].item() == pytest.approx(0.8, abs=1e-6)
    rest = torch.softmax(neural.double(), -1)
    torch.testing.assert_close(dense[support] / 0.2, rest)


def test_levels_below_the_tree_are_the_tracks_point_mass() -> None:
    inner = FixedDrafter(torch.zeros(VOCAB))
    hybrid = HybridDrafter(inner, weight=0.9)
    committed = [[3, 1, 5, 2, 3]]
    hybrid.start(committed)
    hybrid.set_tree_depth(1)
    hybrid.propose_root(committed)
    tree = DraftTree.from_roots(torch.tensor([3]))
    tree.append_level(torch.tensor([[4, 1]]), torch.tensor([[0, 0]]), torch.tensor([[True, True]]))
    out = hybrid.propose_level(tree, 1, 3)
    assert inner.calls == 1  # only the root's neural forward
    assert out.ok.tolist() == [[False, True]]  # node 2 spells the proposal's first token
    assert out.dense(VOCAB)[0, 1].argmax().item() == 5 and torch.isinf(out.dense(VOCAB)[0, 1]).sum() == VOCAB - 1


def test_short_matches_give_no_track() -> None:
    neural = torch.zeros(VOCAB)
    hybrid = HybridDrafter(FixedDrafter(neural), min_match=2)
    hybrid.start([[3, 1, 5, 2, 3]])
    out = hybrid.propose_root([[3, 1, 5, 2, 3]])  # the match is one token long
    torch.testing.assert_close(out.logits[0, 0], neural)


def test_auto_template_hangs_the_track_under_the_first_child_path() -> None:
    config = specdec.make_method("rsd_c", branching="auto")
    builder = AutoTreeBuilder(config)
    # (2, 2): root 0, level 1 = 1, 2, level 2 = 3, 4 (of 1) and 5, 6 (of 2); the chain hangs under node 3
    assert builder._builder((2, 2), 3).config.parents == (-1, 0, 0, 1, 1, 2, 2, 3, 7, 8)
    assert builder._builder((3,), 0).config.parents == (-1, 0, 0, 0)


def test_bad_hybrid_arguments() -> None:
    neural = FixedDrafter(torch.zeros(VOCAB))
    for kw, msg in [
        ({"weight": 0.4}, "weight must be a float in"),
        ({"weight": 1.0}, "weight must be a float in"),
        ({"min_match": 0}, "min_match must be an int >= 1"),
        ({"track_levels": -1}, "track_levels must be an int >= 0"),
        ({"max_tokens": 0}, "max_tokens must be an int >= 1"),
    ]:
        with pytest.raises(ValueError, match=msg):
            HybridDrafter(neural, **kw)
    with pytest.raises(ValueError, match="neural must be a neural drafter"):
        HybridDrafter(NGramDrafter(VOCAB))
    with pytest.raises(TypeError, match="neural must be a Drafter: wrap a draft model"):
        HybridDrafter(tiny_llama(1, vocab=VOCAB))
    for table in ([1.7, 2.2, 3.9, 0.5, 1.0, 2.0, 3.0, 4.0], np.full(VOCAB, np.nan), [[1] * VOCAB]):
        with pytest.raises(ValueError, match="bigram must be a 1-D table of integer token ids"):
            NGramDrafter(VOCAB, bigram=table)


@pytest.fixture(scope="module")
def models():
    return tiny_llama(0, vocab=VOCAB, hidden=32, std=0.3), sharpened(
        tiny_llama(1, vocab=VOCAB, hidden=32, std=0.3), 2.0
    )


class NeuralLawToVerifier(HybridDrafter):
    """Negative control: children are drawn from the mixture, but the verifier is handed the neural law."""

    def _mix(self, out, picks):
        self.plain = out
        return super()._mix(out, picks)


def hybrid_run(models, shape, monkeypatch, drafter_cls=HybridDrafter, method: str = "rsd_c", **kw) -> list:
    """``shape``: the auto tree of every round (``method`` with branching="auto"), or None for ``method`` with its
    tree parameters ``kw``."""
    target, draft = models
    monkeypatch.setattr(auto_module, "choose", lambda *a, **k: (shape, 2, 1.0))
    hybrid = drafter_cls(ModelDrafter(draft), weight=0.6, track_levels=2)
    if drafter_cls is NeuralLawToVerifier:
        sampling = SamplingConfig(temperature=TEMPERATURE)
        set_laws = DraftTree.set_level_laws

        def neural_law(tree, probs, hub=None, support=None):
            plain = getattr(hybrid, "plain", None)
            if plain is not None and plain.logits.shape[:2] == probs.shape[:2]:
                probs, support = sampling.probs(sampling.process(plain.logits.float())), plain.support
            hybrid.plain = None
            set_laws(tree, probs, hub, support)

        monkeypatch.setattr(DraftTree, "set_level_laws", neural_law)
    if shape is None:
        decoder = specdec.SpeculativeDecoder(target, hybrid, method=method, **kw)
    else:
        decoder = specdec.SpeculativeDecoder(target, hybrid, method=method, branching="auto")
        decoder.builder.curve = CostCurve(target={1: 1.0, 10**6: 1.0}, draft={1: 0.01, 32: 0.01})
    ids, mask = left_pad([PROMPTS[i % 2] for i in range(2 * N)])
    out = decoder.generate(ids, mask, max_new_tokens=3, do_sample=True, temperature=TEMPERATURE, seed=5)
    hist = out.stats.accepted_hist
    assert len(hist) > 2 and hist[2] > 0  # rounds accepted two drafts: with shape (2,), a track node below the tree
    first_two = np.array([t[:2] for t in out.new_tokens])
    checks = []
    for i, prompt in enumerate(PROMPTS):
        counts = np.zeros((VOCAB, VOCAB))
        np.add.at(counts, (first_two[i::2, 0], first_two[i::2, 1]), 1)
        law = exact_law(target, prompt, SamplingConfig(temperature=TEMPERATURE))
        checks.append(law_check(counts, law, max_tv=0.08))
    return checks


@pytest.mark.parametrize(
    ("shape", "method", "kw"),
    [
        ((2,), "rsd_c", {}),
        ((1, 1), "rsd_c", {}),
        (None, "sd", {"draft_length": 2}),
        (None, "spechub", {"branching": (2, 2)}),
        ((2,), "spechub", {}),
        (None, "spectr", {"num_chains": 3, "draft_length": 2}),
        (None, "rrs", {"branching": (3, 1)}),
    ],
)
def test_hybrid_draft_keeps_the_target_law(models, shape, method, kw, monkeypatch) -> None:
    checks = hybrid_run(models, shape, monkeypatch, method=method, **kw)
    for prompt, check in zip(PROMPTS, checks, strict=True):
        assert check.ok, f"{method} {shape or kw}, prompt {prompt}: {check}"


def test_hybrid_draft_with_the_neural_law_handed_to_the_verifier_fails(models, monkeypatch) -> None:
    checks = hybrid_run(models, (1, 1), monkeypatch, NeuralLawToVerifier)
    assert min(c.p_value for c in checks) < 1e-4, [str(c) for c in checks]


@pytest.mark.parametrize(("method", "kw"), [("rsd_c", {"branching": "auto"}), ("sd", {}), ("spechub", {})])
def test_hybrid_draft_greedy_equals_target_greedy(method, kw) -> None:
    target = tiny_llama(0, vocab=32, hidden=64)
    draft = feature_draft(target, list(range(0, 32, 2)) + [1, 3, 5], seed=4)
    g = torch.Generator().manual_seed(0)
    # repeated pieces, so that Max-Gram proposes along the way
    prompts = [(lambda p: p + p[:3] + p)([int(t) for t in torch.randint(0, 32, (n,), generator=g)]) for n in (3, 6)]
    prompts.append([5])
    ids, mask = left_pad(prompts)
    hybrid = HybridDrafter(FeatureDrafter(draft))
    decoder = specdec.SpeculativeDecoder(target, hybrid, method=method, **kw)
    if decoder.config.auto:  # rsd_c's and spechub's default
        # a flat cost curve, so that rounds draft: on this tiny model a one-token step is all per-call work, and
        # a measured curve may rightly find that drafting does not pay
        decoder.builder.curve = CostCurve(target={1: 1.0, 10**6: 1.0}, draft={1: 0.01, 32: 0.01})
    out = decoder.generate(ids, mask, max_new_tokens=20, do_sample=False)
    assert_target_greedy(target, prompts, out.new_tokens, 20)
    assert out.stats.block_efficiency > 1.0


@torch.no_grad()
def test_spectr_with_the_hybrid_draft_keeps_the_target_law() -> None:
    """SpecTr's chains are i.i.d., so several of them can spell the track; K-SEQ verifies the copies of one prefix
    with one law, which holds only if every copy was drafted from the mixture. Vocabulary 4 and a prompt whose
    proposal is [2, 0], where the first token's copies are frequent; 3 new tokens, so that a second round drafts
    after a first one that accepted; joint law of the first two tokens by law_check (chi-square p >= 1e-4,
    TV <= 0.03, N = 20000: noise ~0.012). A drafter that mixes the law at the first copy only (the others drafting
    from the neural law) reaches p < 1e-4 here."""
    vocab, prompt, temperature, n = 4, [1, 2, 0, 1, 2, 0, 1], 1.3, 20000
    target = tiny_llama(0, vocab=vocab, hidden=32, std=0.3)
    neural = sharpened(tiny_llama(1, vocab=vocab, hidden=32, std=0.3), 2.0)
    hybrid = HybridDrafter(ModelDrafter(neural), weight=0.6, track_levels=2)
    assert longest_match(prompt, hybrid.max_tokens)[1][:2] == [2, 0]
    decoder = specdec.SpeculativeDecoder(target, hybrid, method="spectr", num_chains=3, draft_length=2)
    out = decoder.generate(torch.tensor([prompt] * n), max_new_tokens=3, do_sample=True, temperature=temperature,
                           top_k=0, seed=1)  # fmt: skip
    tokens = np.array([t[:2] for t in out.new_tokens])
    counts = np.zeros((vocab, vocab))
    np.add.at(counts, (tokens[:, 0], tokens[:, 1]), 1)
    sampling = SamplingConfig(temperature=temperature)
    first = sampling.process(target(torch.tensor([prompt])).logits[0, -1]).double().exp()
    second = sampling.process(target(torch.tensor([prompt + [y] for y in range(vocab)])).logits[:, -1]).double().exp()
    law = (first[:, None] * second).numpy()
    check = law_check(counts, law / law.sum(), max_tv=0.03)
    assert check.ok, str(check)
