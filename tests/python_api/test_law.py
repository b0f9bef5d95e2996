"""End-to-end exactness: the joint law of the first two generated tokens equals the target's exact law
(docs/exactness.md, End to end), for every sampling method, with two prompts of different lengths mixed in one
left-padded batch; and every method's verifier swapped for a deliberately wrong variant of itself must FAIL the same
test (negative controls).

Models (tiny Llamas, vocabulary 8, 64 outcomes; ``test_model_pairs_are_in_their_regimes`` asserts the numbers):
* main pair, temperature 1.7: target seed 0; draft seed 1 with its lm_head scaled x2, sharper than the target and far
  from it (sum min(p, q) at both prompts' roots between 0.4 and 0.65): the wrong variants move the law a lot, where
  a draft close to the target would hide them;
* confident pair, temperature 1: the same target; the seed-1 draft with its lm_head scaled so that
  1 - p(top) at the second prompt's root lies between 1e-7 and 2e-7 (two or three fp32 ulps of 1, just above the
  1e-7 single-draft cut-off of the samplers), and is below 1e-4 at a third or more of the two roots and their children.
  Here a verifier that forms SpecHub's Q(a, i) with 1 - p(a) in fp32, instead of the non-hub mass the sampler drew
  the second draft from, is biased.
The exact law q(y1) q(y2 | y1) comes from enumerating the target with the same processing function. Every
generation is one batch row; rows generate ``depth + 1`` tokens so that the first round drafts a full-depth tree,
and only the first two are counted. ``specdec_pp`` runs with a random acceptance head (as in
test_train_specdec_pp.py); ``csd`` with a cascade of the pair's draft above Max-Gram (a fixed bigram table, leniency 2
at the draft's reviews; three drafting levels and the control that hands the reviewer's row up: test_cascade.py).

Negative controls: the decoder's ``sk.verify_tree`` is routed to the torch backend (token for token the default
route, ``test_torch_route_gives_the_same_tokens``) and the torch backend's node chain is replaced by a chain of
``specdec_kernels.testing.wrong.TREE_CONTROLS``; nothing else changes. Default suite, with the models, prompts and N
of the passing tests: sd, specdec_pp and csd: residual = q (no subtraction); rrs: residual not renormalised; rrsw,
rsd_c, rsd_s: the original p kept after removing a candidate; spectr: K-SEQ with gamma = 1; spechub: Q(a, i) without its
1 / (1 - p(a)) factor; spechub on the confident pair: Q(a, i) = p(a) p(i) / (1 - p(a)) in fp32. Slow (N = 20000 per
prompt): rrs with residual = q and with duplicate candidates skipped, rrsw / rsd_c / rsd_s subtracting the next
candidate's law. A control must reach chi-square p < 1e-4 on at least one prompt.

Statistics (specdec_kernels.testing.stats.law_check): Pearson chi-square with merged bins must have p >= 1e-4
and the empirical TV must stay below a bound far above its sampling noise (default N = 5000 per prompt: noise
~0.04, bound 0.08; slow N = 1e5: noise ~0.009, bound 0.02). False-alarm rate: 1e-4 per check; the default suite
makes 48 checks of a correct law (2 prompts x (9 methods x 2 pairs + top-k/top-p + ar + 2 methods x 2 drafts of
another vocabulary size)), so a spurious failure has probability below 5e-3 per run; the slow tests add 18 (below
2e-3). Seeds are fixed, so a run is reproducible.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import specdec
import specdec.decoder
import specdec.rounds
import torch
from specdec.autotree import CostCurve
from specdec.drafters.cascade import CascadeDrafter
from specdec.methods.builders.auto import AutoTreeBuilder
from specdec.sampling import SamplingConfig
from test_train_specdec_pp import random_head
from tiny_models import left_pad, tiny_llama

import specdec_kernels as sk
import specdec_kernels.reference.verify as reference_verify
from specdec_kernels.testing import wrong
from specdec_kernels.testing.stats import law_check

VOCAB = 8
TEMPERATURE = 1.7  # main pair
CONFIDENT_TEMPERATURE = 1.0
CONFIDENT_MISS = 1.5e-7  # 1 - p(top) of the confident draft at PROMPTS[1]'s root, before fp32 processing
PROMPTS = [[3, 1], [5, 2, 7, 4]]
N = 5000  # generations per prompt, default suite
N_SLOW = 100_000
N_SLOW_CONTROL = 20_000
ALPHA = 1e-4  # a control must reach chi-square p below this on some prompt

CASES = {
    "sd": {"draft_length": 3},
    "rrs": {"branching": (2, 2)},
    "rrsw": {"parents": (-1, 0, 0, 0, 1, 1, 2, 4)},
    "rsd_c": {"branching": (2, 2, 1)},
    "rsd_s": {"beam_width": 3, "draft_length": 3},
    "spectr": {"num_chains": 3, "draft_length": 2},
    "spechub": {"branching": (2, 2)},
    "gds": {"branching": (3, 2)},
    "specdec_pp": {"draft_length": 3},
    "csd": {"draft_length": 3},
}

# each node verifier, made wrong in a way the default-suite test must catch (a method's is that of its spec)
CONTROLS = {
    "sd": "residual_q",
    "rrs": "rrs_no_renormalization",
    "rrsw": "rrsw_unrenormalized",
    "kseq": "kseq_gamma_one",
    "spechub": "spechub_qai_unnormalized",
    "gds": "gds_unrenormalized",
}
SLOW_CONTROLS = [
    ("rrs", "residual_q"),
    ("rrs", "rrs_skip_duplicates"),
    ("rrsw", "rrsw_next_residual"),
    ("rsd_c", "rrsw_next_residual"),
    ("rsd_s", "rrsw_next_residual"),
]


def sharpened(model, factor: float):
    """``model`` with its lm_head weight scaled by ``factor`` in place: its laws at T are those at T / factor."""
    with torch.no_grad():
        model.lm_head.weight.mul_(factor)
    return model


@torch.no_grad()
def miss_of_top(model, prompt: list[int], temperature: float) -> float:
    """1 - p(top) at the end of ``prompt``, from the processed log-probs the sampler draws from."""
    logp = SamplingConfig(temperature=temperature).process(model(torch.tensor([prompt])).logits[0, -1])
    return float(-torch.expm1(logp.max().double()))


@torch.no_grad()
def confident_draft(seed: int, prompt: list[int], miss: float):
    """The seed's draft with its lm_head scaled so that 1 - p(top) at T = 1 is ``miss`` at ``prompt``'s root (the
    logits are linear in the scale: bisect on the unscaled logits, then scale once)."""
    draft = tiny_llama(seed, vocab=VOCAB, hidden=32, std=0.3)
    logits = draft(torch.tensor([prompt])).logits[0, -1].double()
    lo, hi = 1.0, 1000.0
    for _ in range(100):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if float(-torch.expm1(torch.log_softmax(mid * logits, -1).max())) > miss else (lo, mid)
    return sharpened(draft, hi)


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(0, vocab=VOCAB, hidden=32, std=0.3)
    return target, sharpened(tiny_llama(1, vocab=VOCAB, hidden=32, std=0.3), 2.0)


@pytest.fixture(scope="module")
def confident(models):
    return models[0], confident_draft(1, PROMPTS[1], CONFIDENT_MISS)


@torch.no_grad()
def exact_law(target, prompt: list[int], sampling: SamplingConfig) -> np.ndarray:
    """[V, V] float64: q(y1 | prompt) q(y2 | prompt, y1) under ``sampling``'s processing."""
    first = sampling.process(target(torch.tensor([prompt])).logits[0, -1]).double().exp()
    ids = torch.tensor([prompt + [y] for y in range(VOCAB)])
    second = sampling.process(target(ids).logits[:, -1]).double().exp()
    law = first[:, None] * second
    return (law / law.sum()).numpy()


def generate(
    models, method: str, n_per_prompt: int, *, seed: int, temperature: float, verifier: str = "token", **sampling
) -> list:
    """New tokens of ``n_per_prompt`` rows per prompt (rows alternate over PROMPTS)."""
    target, draft = models
    params = CASES.get(method, {})
    head = {"head": random_head(32, 2), "threshold": 0.5} if specdec.methods.get(method).needs_head else {}
    if method == "csd":  # the draft reviews Max-Gram's blocks (leniency 2), the target the draft's
        bigram = (3 * np.arange(VOCAB) + 1) % VOCAB
        draft = CascadeDrafter([draft], bigram=bigram, steps=[[2, 1], [0, 1]], leniency=2.0, mag_tokens=3)
    decoder = specdec.SpeculativeDecoder(target, draft, method=method, verifier=verifier, **params, **head)
    ids, mask = left_pad([PROMPTS[i % 2] for i in range(2 * n_per_prompt)])
    out = decoder.generate(
        ids,
        mask,
        max_new_tokens=max(decoder.config.depth + 1, 2),
        do_sample=True,
        temperature=temperature,
        seed=seed,
        **sampling,
    )
    return out.new_tokens


def first_two_checks(target, new_tokens: list, sampling: SamplingConfig, max_tv: float) -> list:
    """Law checks of the first two tokens of rows that alternate over PROMPTS, one per prompt."""
    first_two = np.array([t[:2] for t in new_tokens])
    checks = []
    for i, prompt in enumerate(PROMPTS):
        counts = np.zeros((VOCAB, VOCAB))
        np.add.at(counts, (first_two[i::2, 0], first_two[i::2, 1]), 1)
        checks.append(law_check(counts, exact_law(target, prompt, sampling), max_tv=max_tv))
    return checks


def run_law(
    models,
    method: str,
    n_per_prompt: int,
    *,
    seed: int = 1,
    temperature: float = TEMPERATURE,
    verifier: str = "token",
    **sampling,
) -> list:
    new_tokens = generate(
        models, method, n_per_prompt, seed=seed, temperature=temperature, verifier=verifier, **sampling
    )
    resolved = SamplingConfig(temperature=temperature, **sampling)
    return first_two_checks(models[0], new_tokens, resolved, 0.08 if n_per_prompt < 50_000 else 0.02)


def route_to_torch(monkeypatch, control: str | None = None) -> None:
    """The decoder's verify_tree runs on the torch backend, with ``control``'s node chain when given."""
    monkeypatch.setattr(specdec.rounds.sk, "verify_tree", functools.partial(sk.verify_tree, backend="torch"))
    if control is not None:
        monkeypatch.setattr(reference_verify, "node_chain", wrong.torch_node_chain(wrong.TREE_CONTROLS[control]))


def assert_caught(checks: list, what: str) -> None:
    assert not all(c.ok for c in checks), f"{what} was not detected: {[str(c) for c in checks]}"
    assert min(c.p_value for c in checks) < ALPHA, f"{what}: {[str(c) for c in checks]}"


@torch.no_grad()
def test_model_pairs_are_in_their_regimes(models, confident) -> None:
    """The facts the module docstring states about the two pairs, which the controls' power depends on."""
    target, draft = models
    for prompt in PROMPTS:
        sampling = SamplingConfig(temperature=TEMPERATURE)
        p = sampling.process(draft(torch.tensor([prompt])).logits[0, -1], log=False).double()
        q = sampling.process(target(torch.tensor([prompt])).logits[0, -1], log=False).double()
        assert 0.4 < float(torch.minimum(p, q).sum()) < 0.65
    sharp = confident[1]
    assert 1e-7 < miss_of_top(sharp, PROMPTS[1], CONFIDENT_TEMPERATURE) < 2e-7
    contexts = [c for prompt in PROMPTS for c in [prompt] + [prompt + [y] for y in range(VOCAB)]]
    misses = [miss_of_top(sharp, c, CONFIDENT_TEMPERATURE) for c in contexts]
    assert sum(m < 1e-4 for m in misses) >= len(contexts) / 3


@pytest.mark.parametrize("method", sorted(CASES))
def test_torch_route_gives_the_same_tokens(models, method: str, monkeypatch) -> None:
    """The negative controls' route (torch backend, real node chain) is the default route token for token, so a
    control's failure comes from its chain alone."""
    expected = generate(models, method, 200, seed=5, temperature=TEMPERATURE)
    route_to_torch(monkeypatch)
    assert generate(models, method, 200, seed=5, temperature=TEMPERATURE) == expected


@pytest.mark.parametrize("method", sorted(CASES))
def test_first_two_tokens_follow_the_target_law(models, method: str) -> None:
    checks = run_law(models, method, N)
    for prompt, check in zip(PROMPTS, checks, strict=True):
        assert check.ok, f"{method} prompt {prompt}: {check}"


def test_every_drafting_method_has_a_law_case() -> None:
    assert set(CASES) == {m for m in specdec.methods.available() if specdec.methods.get(m).drafts}


@pytest.mark.parametrize("method", sorted(CASES))
def test_wrong_verifier_fails(models, method: str, monkeypatch) -> None:
    control = CONTROLS[specdec.methods.get(method).verifier]
    route_to_torch(monkeypatch, control)
    assert_caught(run_law(models, method, N), f"{method} with {control}")


@pytest.mark.parametrize("method", sorted(CASES))
def test_confident_draft_keeps_the_target_law(confident, method: str) -> None:
    checks = run_law(confident, method, N, temperature=CONFIDENT_TEMPERATURE)
    for prompt, check in zip(PROMPTS, checks, strict=True):
        assert check.ok, f"{method} confident draft, prompt {prompt}: {check}"


def test_confident_draft_catches_spechub_fp32_normaliser(confident, monkeypatch) -> None:
    route_to_torch(monkeypatch, "spechub_fp32_one_minus_pa")
    checks = run_law(confident, "spechub", N, temperature=CONFIDENT_TEMPERATURE)
    assert_caught(checks, "spechub with Q(a, i) normalised by 1 - p(a) in fp32")


BLOCK_METHODS = sorted(m for m in specdec.methods.available() if "block" in specdec.methods.get(m).verifiers)


@pytest.mark.parametrize("method", BLOCK_METHODS)
def test_block_verification_follows_the_target_law(models, method: str) -> None:
    checks = run_law(models, method, N, verifier="block")
    for prompt, check in zip(PROMPTS, checks, strict=True):
        assert check.ok, f"{method} with verifier='block', prompt {prompt}: {check}"


TRAVERSAL_METHODS = sorted(m for m in specdec.methods.available() if "traversal" in specdec.methods.get(m).verifiers)


@pytest.mark.parametrize("method", TRAVERSAL_METHODS)
def test_traversal_verification_follows_the_target_law(models, method: str) -> None:
    checks = run_law(models, method, N, verifier="traversal")
    for prompt, check in zip(PROMPTS, checks, strict=True):
        assert check.ok, f"{method} with verifier='traversal', prompt {prompt}: {check}"


@pytest.mark.parametrize("method", ["rrs", "rsd_c"])
def test_traversal_verification_with_the_raw_target_row_fails(models, method: str, monkeypatch) -> None:
    """The negative control of traversal verification: the token after the accepted node from q's raw row instead of
    the node's updated residual."""
    monkeypatch.setattr(specdec.rounds.sk, "verify_tree", functools.partial(sk.verify_tree, backend="torch"))
    monkeypatch.setattr(reference_verify, "traversal_walk", wrong.traversal_walk_raw_q)
    checks = run_law(models, method, N, verifier="traversal")
    assert_caught(checks, f"{method}: traversal verification, raw target row")


def block_token_residual_checks(models, method: str, monkeypatch) -> list:
    """The negative control of block verification: its correction drawn from Norm[(q - p)^+]. It errs only in
    rounds that keep a token of weight < 1 and stop before the chain's end, so it needs N_SLOW_CONTROL rows."""
    monkeypatch.setattr(specdec.rounds.sk, "verify_tree", functools.partial(sk.verify_tree, backend="torch"))
    monkeypatch.setattr(reference_verify, "block_walk", wrong.block_walk_token_residual)
    return run_law(models, method, N_SLOW_CONTROL, verifier="block")


def test_block_verification_with_the_token_residual_fails(models, monkeypatch) -> None:
    assert_caught(block_token_residual_checks(models, "sd", monkeypatch), "sd: block verification, token residual")


@pytest.mark.slow
@pytest.mark.parametrize("method", [m for m in BLOCK_METHODS if m != "sd"])
def test_block_verification_with_the_token_residual_fails_slow(models, method: str, monkeypatch) -> None:
    checks = block_token_residual_checks(models, method, monkeypatch)
    assert_caught(checks, f"{method}: block verification, token residual")


def test_law_with_top_k_and_top_p(models) -> None:
    """The filters go through the same processing for draft and target; the output law is the filtered target's."""
    checks = run_law(models, "rsd_c", N, top_k=5, top_p=0.9)
    for prompt, check in zip(PROMPTS, checks, strict=True):
        assert check.ok, f"rsd_c top-k/top-p prompt {prompt}: {check}"


@pytest.mark.parametrize("method", ["rsd_c", "spechub"])
@pytest.mark.parametrize("draft_vocab", [6, 10])
def test_a_draft_with_another_output_size_keeps_the_target_law(models, method: str, draft_vocab: int) -> None:
    """A draft model whose output layer has fewer rows (ids 6 and 7 never drafted, read as 5 in its context) or more
    (its extra ids cut) than the target's: the draft's law over the shared ids is still a function of the prefix."""
    draft = sharpened(tiny_llama(1, vocab=draft_vocab, hidden=32, std=0.3), 2.0)
    checks = run_law((models[0], draft), method, N)
    assert all(c.ok for c in checks), [str(c) for c in checks]


def test_ar_follows_the_target_law(models) -> None:
    checks = run_law(models, "ar", N)
    assert all(c.ok for c in checks), [str(c) for c in checks]


def test_negative_control_wrong_draft_law_fails(models, monkeypatch) -> None:
    """Draft tokens drawn at half the temperature while the verifier is handed the law at the full temperature:
    the p used to verify is not the p drafted from (transformers #32867). The test must catch it."""
    import specdec.methods.builders.base as base

    real = base.sample_categorical
    monkeypatch.setattr(base, "sample_categorical", lambda logp, **kw: real(2.0 * logp, **kw))
    checks = run_law(models, "sd", N)
    for check in checks:
        assert not check.ok and check.p_value < 1e-20, f"the wrong variant was not detected: {check}"


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(CASES))
def test_first_two_tokens_follow_the_target_law_big(models, method: str) -> None:
    checks = run_law(models, method, N_SLOW, seed=2)
    for prompt, check in zip(PROMPTS, checks, strict=True):
        assert check.ok, f"{method} prompt {prompt}: {check}"


@pytest.mark.slow
@pytest.mark.parametrize(("method", "control"), SLOW_CONTROLS)
def test_more_wrong_verifiers_fail(models, method: str, control: str, monkeypatch) -> None:
    route_to_torch(monkeypatch, control)
    assert_caught(run_law(models, method, N_SLOW_CONTROL), f"{method} with {control}")


#: the methods with auto trees, one per draw rule (rrsw draws and verifies as rsd_c does)
AUTO_METHODS = ("rsd_c", "rrs", "spechub")


def auto_law(models, method: str, tmp_path, monkeypatch) -> tuple[list, AutoTreeBuilder]:
    """Law checks of ``method`` with branching="auto" on the main pair, and its tree builder. The
    target's cost curve is made flat (a pass costs the same at any size), so the rounds take wide trees whose
    siblings the verifier must handle, and the shape moves with the acceptance counted so far."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    target, draft = models
    decoder = specdec.SpeculativeDecoder(target, draft, method=method, branching="auto")
    decoder.builder.curve = CostCurve(target={1: 1.0, 10**6: 1.0}, draft={1: 0.01, 32: 0.01})
    # the node budget follows the machine's fast-path row limit (8 rows on AVX2, where the first round is then a
    # chain, which no sibling-handling control can fail): fixed here so that every machine drafts wide trees
    decoder.builder.max_nodes = 16
    ids, mask = left_pad([PROMPTS[i % 2] for i in range(2 * N)])
    out = decoder.generate(ids, mask, max_new_tokens=2, do_sample=True, temperature=TEMPERATURE, seed=3)
    return first_two_checks(target, out.new_tokens, SamplingConfig(temperature=TEMPERATURE), 0.08), decoder.builder


@pytest.mark.parametrize("method", AUTO_METHODS)
def test_auto_trees_follow_the_target_law(models, method: str, tmp_path, monkeypatch) -> None:
    """branching="auto": each round's shape comes from the rounds before (the acceptance counted so far), so every
    round is a fixed tree of the method's draw rule, verified exactly; the first two tokens follow the target's
    law."""
    checks, builder = auto_law(models, method, tmp_path, monkeypatch)
    shapes = builder.shapes_used
    assert any(s[0] >= 2 for s in shapes), shapes
    assert max(max(s, default=0) for s in shapes) <= builder.max_width, shapes
    for prompt, check in zip(PROMPTS, checks, strict=True):
        assert check.ok, f"{method} auto prompt {prompt}: {check}"


@pytest.mark.parametrize("method", AUTO_METHODS)
def test_auto_trees_with_a_wrong_verifier_fail(models, method: str, tmp_path, monkeypatch) -> None:
    """Power: the same run with the method's verifier made wrong is caught."""
    control = CONTROLS[specdec.methods.get(method).verifier]
    route_to_torch(monkeypatch, control)
    checks, _ = auto_law(models, method, tmp_path, monkeypatch)
    assert_caught(checks, f"{method} auto trees with {control}")
