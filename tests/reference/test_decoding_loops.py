"""Whole speculative decoding loops on toy bigram models.

Each law test runs N independent generations as the rows of one batch (drafting, tree building, verification,
bonus/correction, next iteration from the last token), records the first two tokens and compares their joint law
with the exact q(y1|0) q(y2|y1) by ``law_check``: chi-square p-value >= 1e-4 (the per-test false-alarm rate; the
TV bound sqrt(bins / N), at least 0.015, is about 2.5x the expected empirical TV and adds a negligible rate) --
about 2e-3 for the whole file. Seeds are fixed, so a run is deterministic. Negative controls plug a deliberately
wrong drafting or verification step into the same loop and must fail the same check.

Loops use the default backend (the compiled CPU backend where it is built); a parity test pins the torch reference
and requires the same tokens for the same seed. Cost: the reference verifies rows in a Python loop, so the default
run uses 5k-20k generations per test; ``slow`` reruns at N = 200k, which needs the CPU backend to
finish in minutes.
"""

from __future__ import annotations

import math

import pytest
import torch

from specdec_kernels import available_backends, binary_tree_parents, branching_parents, kseq_chain_parents
from specdec_kernels.testing import toy, toy_grown

SEQUOIA = [-1, 0, 0, 0, 1, 1, 2, 4]  # irregular static tree: 3, 2, 1 children at depth <= 1, depth 3
ROOT3 = [-1, 0, 0, 0]  # one level, three siblings
ROOT2 = [-1, 0, 0]
B21, B22 = branching_parents([2, 1]), branching_parents([2, 2])  # constant branching per level
BINARY3 = binary_tree_parents(3)  # full binary tree, 3 levels
K32, K22 = kseq_chain_parents(3, 2), kseq_chain_parents(2, 2)  # K chains of length L

HAVE_FAST = "cpu" in available_backends("verify_tree")  # auto then verifies with the compiled CPU backend


def tv_bound(n: int, bins: int) -> float:
    """Loose TV bound: the expected empirical TV is at most 0.4 * sqrt(bins / n) (Cauchy-Schwarz)."""
    return max(0.015, math.sqrt(bins / n))


def assert_exact(model: toy.ToyModel, decoder: toy.Decoder, n: int, seed: int) -> None:
    res = toy.check_first_tokens(model, decoder, n, seed=seed, max_tv=tv_bound(n, model.vocab**2))
    assert res.ok, f"{decoder.name}: {res}"


EXACT = [
    pytest.param(toy.SPEC_TOY, toy.chain(1), 20_000, id="spec-sd-L1"),
    pytest.param(toy.SPEC_TOY, toy.chain(2), 20_000, id="spec-sd-L2"),
    pytest.param(toy.SPEC_TOY, toy.chain(3), 20_000, id="spec-sd-L3"),
    pytest.param(toy.SPEC_TOY, toy.chain(4), 20_000, id="spec-sd-L4"),
    pytest.param(toy.SPEC_TOY, toy.chain(4, ragged=True), 20_000, id="spec-sd-ragged-lengths"),
    pytest.param(toy.SPEC_TOY, toy.tree(SEQUOIA, draw="iid", verifier="rrs"), 20_000, id="spec-rrs-sequoia"),
    pytest.param(toy.SPEC_TOY, toy.tree(SEQUOIA, draw="swor", verifier="rrsw"), 20_000, id="spec-rrsw-sequoia"),
    pytest.param(toy.SPEC_TOY, toy.tree(B21, draw="swor", verifier="rrsw"), 20_000, id="spec-rsd_c-2-1"),
    pytest.param(toy.SPEC_TOY, toy.tree(B22, draw="swor", verifier="rrsw"), 20_000, id="spec-rsd_c-2-2"),
    pytest.param(toy.SPEC_TOY, toy_grown.beam(2, 2, verifier="rrsw"), 20_000, id="spec-rsd_s-W2-L2"),
    pytest.param(toy.SPEC_TOY, toy_grown.beam(3, 2, verifier="rrsw"), 20_000, id="spec-rsd_s-W3-L2"),
    pytest.param(toy.SPEC_TOY, toy.tree(K32, draw="iid", verifier="kseq"), 8_000, id="spec-spectr-3x2"),
    pytest.param(
        toy.SPEC_TOY, toy.tree(BINARY3, draw="spechub", verifier="spechub"), 12_000, id="spec-spechub-binary3"
    ),
    # Zeros in p and q: missing candidates, point-mass draft rows, drafted tokens with q = 0 -> ragged batches.
    pytest.param(toy.RAGGED_TOY, toy.chain(3, ragged=True), 10_000, id="ragged-sd-ragged-lengths"),
    pytest.param(toy.RAGGED_TOY, toy.tree(SEQUOIA, draw="swor", verifier="rrsw"), 10_000, id="ragged-rrsw-sequoia"),
    pytest.param(toy.RAGGED_TOY, toy_grown.beam(3, 2, verifier="rrsw"), 10_000, id="ragged-rsd_s-W3-L2"),
    pytest.param(
        toy.RAGGED_TOY, toy.tree(BINARY3, draw="spechub", verifier="spechub"), 10_000, id="ragged-spechub-binary3"
    ),
    # Block verification: fixed, ragged and token-dependent chain lengths (the positive partner of its control below).
    pytest.param(toy.SPEC_TOY, toy.chain(3, method="block"), 20_000, id="spec-block-L3"),
    pytest.param(toy.RAGGED_TOY, toy.chain(4, method="block"), 10_000, id="ragged-block-L4"),
    pytest.param(toy.RAGGED_TOY, toy.chain(4, method="block", ragged=True), 10_000, id="ragged-block-ragged-lengths"),
    pytest.param(toy.SPEC_TOY, toy.chain(4, method="block", stop_token=1), 20_000, id="spec-block-stopping-time"),
    # Traversal verification: i.i.d. and without-replacement trees, irregular and ragged.
    pytest.param(toy.SPEC_TOY, toy.tree(B22, draw="iid", verifier="traversal"), 20_000, id="spec-traversal-iid-2-2"),
    pytest.param(toy.SPEC_TOY, toy.tree(B22, draw="swor", verifier="traversalw"), 20_000, id="spec-traversal-swor-2-2"),
    pytest.param(
        toy.RAGGED_TOY, toy.tree(SEQUOIA, draw="swor", verifier="traversalw"), 10_000, id="ragged-traversal-sequoia"
    ),
    # Positive partners of the PEAKED_TOY negative controls below.
    pytest.param(toy.PEAKED_TOY, toy.tree(ROOT3, draw="iid", verifier="rrs"), 10_000, id="peaked-rrs-K3"),
    pytest.param(toy.PEAKED_TOY, toy.tree(ROOT2, draw="swor", verifier="rrsw"), 10_000, id="peaked-rrsw-K2"),
]


@pytest.mark.parametrize(("model", "decoder", "n"), EXACT)
def test_first_two_tokens_follow_target(model: toy.ToyModel, decoder: toy.Decoder, n: int) -> None:
    assert_exact(model, decoder, n, seed=1234)


@pytest.mark.skipif(not HAVE_FAST, reason="the default backend is the torch reference here")
@pytest.mark.parametrize(("model", "decoder", "n"), EXACT)
def test_loops_agree_with_torch_reference(
    model: toy.ToyModel, decoder: toy.Decoder, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same seed, same noise: the default backends must reproduce the reference's loop token for token, so the law
    tests above (run with the default backends) also vouch for the torch reference."""
    runs = []
    for name in ("auto", "torch"):
        monkeypatch.setenv("SPECDEC_BACKEND", name)
        runs.append(toy.generate(model, decoder, 1000, seed=8))
    assert (runs[0].tokens == runs[1].tokens).all()
    assert (runs[0].iterations == runs[1].iterations).all()


SLOW = [
    pytest.param(toy.SPEC_TOY, toy.chain(1), 200_000, id="spec-sd-L1"),
    pytest.param(toy.SPEC_TOY, toy.chain(2), 200_000, id="spec-sd-L2"),
    pytest.param(toy.SPEC_TOY, toy.chain(3), 200_000, id="spec-sd-L3"),
    pytest.param(toy.SPEC_TOY, toy.chain(4), 200_000, id="spec-sd-L4"),
    pytest.param(toy.SPEC_TOY, toy.tree(SEQUOIA, draw="iid", verifier="rrs"), 200_000, id="spec-rrs-sequoia"),
    pytest.param(toy.SPEC_TOY, toy.tree(SEQUOIA, draw="swor", verifier="rrsw"), 200_000, id="spec-rrsw-sequoia"),
    pytest.param(toy.SPEC_TOY, toy.tree(B21, draw="swor", verifier="rrsw"), 200_000, id="spec-rsd_c-2-1"),
    pytest.param(toy.SPEC_TOY, toy.tree(B22, draw="swor", verifier="rrsw"), 200_000, id="spec-rsd_c-2-2"),
    pytest.param(toy.SPEC_TOY, toy_grown.beam(2, 2, verifier="rrsw"), 200_000, id="spec-rsd_s-W2-L2"),
    pytest.param(toy.SPEC_TOY, toy_grown.beam(3, 2, verifier="rrsw"), 200_000, id="spec-rsd_s-W3-L2"),
    pytest.param(toy.SPEC_TOY, toy.tree(K32, draw="iid", verifier="kseq"), 200_000, id="spec-spectr-3x2"),
    pytest.param(
        toy.SPEC_TOY, toy.tree(BINARY3, draw="spechub", verifier="spechub"), 200_000, id="spec-spechub-binary3"
    ),
    pytest.param(toy.RAGGED_TOY, toy.chain(4, ragged=True), 200_000, id="ragged-sd-ragged-lengths"),
    pytest.param(toy.RAGGED_TOY, toy.tree(SEQUOIA, draw="swor", verifier="rrsw"), 200_000, id="ragged-rrsw-sequoia"),
    pytest.param(toy.RAGGED_TOY, toy_grown.beam(3, 2, verifier="rrsw"), 200_000, id="ragged-rsd_s-W3-L2"),
    pytest.param(
        toy.RAGGED_TOY, toy.tree(BINARY3, draw="spechub", verifier="spechub"), 200_000, id="ragged-spechub-binary3"
    ),
    pytest.param(toy.RAGGED_TOY, toy.tree(K22, draw="iid", verifier="kseq"), 200_000, id="ragged-spectr-2x2"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "decoder", "n"), SLOW)
def test_first_two_tokens_follow_target_slow(model: toy.ToyModel, decoder: toy.Decoder, n: int) -> None:
    assert_exact(model, decoder, n, seed=99)


@pytest.mark.slow
@pytest.mark.parametrize("width", [2, 3])
def test_untruncated_beam_selection_keeps_output_exact(width: int) -> None:
    """Not a negative control: selecting the beam by untruncated scores biases the beam's sequence law but
    not the verified output (see toy_grown.beam_untruncated); 200k generations agree with the exact law."""
    assert_exact(toy.SPEC_TOY, toy_grown.beam_untruncated(width, 2, verifier="rrsw"), 200_000, seed=5)


NEGATIVE = [
    pytest.param(toy.PEAKED_TOY, toy.wrong_skip_duplicates(ROOT3), 10_000, id="rrs-skip-duplicates"),
    pytest.param(toy.PEAKED_TOY, toy.wrong_unrenormalized(ROOT2), 10_000, id="rrsw-unrenormalized-p"),
    pytest.param(toy.SPEC_TOY, toy.wrong_token_order(B22, draw="swor", verifier="rrsw"), 5_000, id="rsd_c-token-order"),
    pytest.param(toy.SPEC_TOY, toy_grown.wrong_beam_token_order(2, 2, verifier="rrsw"), 5_000, id="rsd_s-token-order"),
    pytest.param(
        toy.SPEC_TOY,
        toy.wrong_token_order(BINARY3, draw="spechub", verifier="spechub"),
        5_000,
        id="spechub-token-order",
    ),
    pytest.param(toy.SPEC_TOY, toy.wrong_gamma_one(K32), 10_000, id="spectr-gamma-1"),
    pytest.param(toy.RAGGED_TOY, toy.wrong_block_token_residual(4), 20_000, id="block-token-residual"),
    pytest.param(
        toy.SPEC_TOY, toy.wrong_token_order(B22, draw="swor", verifier="traversalw"), 10_000, id="traversal-token-order"
    ),
]


@pytest.mark.parametrize(("model", "decoder", "n"), NEGATIVE)
def test_negative_control_fails_law_check(model: toy.ToyModel, decoder: toy.Decoder, n: int) -> None:
    res = toy.check_first_tokens(model, decoder, n, seed=1234, max_tv=tv_bound(n, model.vocab**2))
    # Far below the 1e-4 threshold: the check has power against each error, not just a lucky seed.
    assert res.p_value < 1e-12, f"{decoder.name} was not detected: {res}"
    assert not res.ok


GREEDY = [
    toy.chain(1, greedy=True),
    toy.chain(4, greedy=True),
    toy.chain(4, ragged=True, greedy=True),
    toy.chain(4, ragged=True, greedy=True, method="block"),
    toy.tree(SEQUOIA, draw="swor", verifier="traversalw", greedy=True),
    toy.tree(SEQUOIA, draw="iid", verifier="traversal", greedy=True),
    toy.tree(SEQUOIA, draw="iid", verifier="rrs", greedy=True),
    toy.tree(SEQUOIA, draw="swor", verifier="rrsw", greedy=True),
    toy.tree(branching_parents([3, 2, 1]), draw="swor", verifier="rrsw", greedy=True),
    toy_grown.beam(3, 3, verifier="rrsw", greedy=True),
    toy.tree(kseq_chain_parents(3, 3), draw="iid", verifier="kseq", greedy=True),
    toy.tree(binary_tree_parents(4), draw="spechub", verifier="spechub", greedy=True),
]


@pytest.mark.parametrize("vocab", [8, 12, 16])
@pytest.mark.parametrize("decoder", GREEDY, ids=[d.name for d in GREEDY])
def test_greedy_loop_equals_target_greedy(decoder: toy.Decoder, vocab: int) -> None:
    """Every method's greedy loop reproduces target greedy decoding token for token."""
    model = toy.random_toy(vocab, seed=100 + vocab)
    start = torch.arange(vocab).repeat(3)
    n_tokens = 40
    run = toy.generate(model, decoder, len(start), seed=0, n_tokens=n_tokens, start=start)
    expected = toy.target_greedy(model, start, n_tokens)
    assert (run.tokens == expected).all()
    # Drafts were accepted, so the comparison covered accepted paths, not only corrections.
    assert run.iterations.mean() < 0.8 * n_tokens


def test_greedy_trees_accept_a_non_first_child() -> None:
    """The greedy tree walk must look past rank 0: on a model where the draft's argmax never matches the target's
    but its runner-up does, RRSw/RSD-C trees still accept every drafted level."""
    vocab = 6
    g = torch.Generator().manual_seed(3)
    target = torch.softmax(torch.randn((vocab, vocab), dtype=torch.float64, generator=g) * 3, -1)
    best = target.argmax(-1)
    draft_logits = torch.zeros((vocab, vocab), dtype=torch.float64)
    draft_logits[torch.arange(vocab), (best + 1) % vocab] = 3.0  # draft argmax: a wrong token
    draft_logits[torch.arange(vocab), best] = 2.0  # runner-up: the target's argmax
    model = toy.ToyModel(torch.softmax(draft_logits, -1), target)
    start = torch.arange(vocab)
    n_tokens = 12
    run = toy.generate(
        model,
        toy.tree(B22, draw="swor", verifier="rrsw", greedy=True),
        vocab,
        seed=0,
        n_tokens=n_tokens,
        start=start,
    )
    assert (run.tokens == toy.target_greedy(model, start, n_tokens)).all()
    assert (run.iterations == n_tokens // 3).all()  # 2 accepted levels + bonus per iteration
    chain = toy.generate(model, toy.chain(2, greedy=True), vocab, seed=0, n_tokens=n_tokens, start=start)
    assert (chain.iterations == n_tokens).all()  # the chain drafts only the wrong argmax


def test_spec_toy_law_matches_spec_table() -> None:
    """The exact law of (y1, y2) for SPEC_TOY, q(y1 | 0) q(y2 | y1), written out."""
    expected = torch.tensor([[0.04, 0.10, 0.06], [0.15, 0.15, 0.20], [0.15, 0.03, 0.12]], dtype=torch.float64)
    assert torch.allclose(torch.from_numpy(toy.joint_law(toy.SPEC_TOY)), expected, atol=1e-15)


def test_generate_is_reproducible_by_seed() -> None:
    dec = toy_grown.beam(2, 2, verifier="rrsw")
    a = toy.generate(toy.SPEC_TOY, dec, 400, seed=3)
    b = toy.generate(toy.SPEC_TOY, dec, 400, seed=3)
    c = toy.generate(toy.SPEC_TOY, dec, 400, seed=4)
    assert a.tokens.shape == (400, 2)
    assert (a.tokens == b.tokens).all() and (a.iterations == b.iterations).all()
    assert (a.tokens != c.tokens).any()
    assert ((a.iterations >= 1) & (a.iterations <= 2)).all()  # every iteration emits at least one token
