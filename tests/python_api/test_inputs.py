"""Bad inputs give clear errors that name the argument; reproducibility with seeds and generators."""

from __future__ import annotations

import pytest
import specdec
import torch
from tiny_models import tiny_llama


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(0, vocab=16, hidden=32), tiny_llama(1, vocab=16, hidden=32)


PROMPT = torch.tensor([[1, 2, 3]])


def test_mismatched_vocabularies(pair) -> None:
    """A draft model of another output size is fitted to the target (test_drafting.py); a drafter of another
    vocabulary that cannot be is refused."""
    from specdec.drafters import NGramDrafter

    target, _ = pair
    with pytest.raises(ValueError, match="draft vocabulary size 24 differs from the target's 16"):
        specdec.generate(target, NGramDrafter(24), PROMPT, method="sd")


def test_missing_draft(pair) -> None:
    with pytest.raises(ValueError, match="draft is required for method 'rsd_c'"):
        specdec.generate(pair[0], None, PROMPT, method="rsd_c")


def test_unknown_draft_string(pair) -> None:
    with pytest.raises(ValueError, match="draft must be a model, a Drafter or the string 'ngram'"):
        specdec.generate(pair[0], "bigram", PROMPT, method="sd")


@pytest.mark.parametrize(
    ("ids", "mask", "match"),
    [
        (torch.zeros((1, 0), dtype=torch.long), None, "input_ids must hold at least one prompt token per row"),
        (torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 1], [0, 0]]), "attention_mask row 1 selects no token"),
        (torch.tensor([[1, 2]]), torch.tensor([[1, 1, 1]]), "attention_mask must have the shape of input_ids"),
        (torch.tensor([[1, 2]]), torch.tensor([[1, 2]]), "attention_mask must hold only 0"),
        (torch.tensor([[1, 99]]), None, r"input_ids must hold token ids in \[0, 16\)"),
        (torch.tensor([[1.0, 2.0]]), None, "input_ids must be an integer tensor"),
    ],
)
def test_bad_prompts(pair, ids, mask, match) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        specdec.generate(pair[0], pair[1], ids, method="sd", attention_mask=mask)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens` must be greater than 0"),  # transformers' own check
        ({"do_sample": True, "temperature": -1.0}, "temperature` .* has to be a strictly positive float"),
        ({"no_repeat_ngram_size": 2}, "no_repeat_ngram_size=2 is not supported"),
        ({"num_beams": 2}, "num_beams=2 is not supported"),
        ({"output_scores": True}, "output_scores=True is not supported"),
        ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": -2}, "top_k must be an int >= 0"),
        ({"eos_token_id": 16}, r"eos_token_id must be a token id or a list of token ids in \[0, 16\)"),
        ({"eos_token_id": [3, True]}, r"eos_token_id must be a token id or a list of token ids in \[0, 16\)"),
        ({"seed": 1, "generator": torch.Generator()}, "pass either seed= or generator="),
        ({"seed": -5}, r"seed must be an int in \[0, 2\*\*63\), got -5"),
        ({"seed": 2**63}, r"seed must be an int in \[0, 2\*\*63\), got 9223372036854775808"),
        ({"seed": 1.5}, r"seed must be an int in \[0, 2\*\*63\), got 1.5"),
        ({"seed": "7"}, r"seed must be an int in \[0, 2\*\*63\), got '7'"),
        ({"seed": True}, r"seed must be an int in \[0, 2\*\*63\), got True"),
        ({"pad_token_id": 16}, r"pad_token_id must be a token id in \[0, 16\) .*got 16"),
        ({"pad_token_id": -1}, r"pad_token_id must be a token id in \[0, 16\) .*got -1"),
        ({"pad_token_id": 2.0}, r"pad_token_id must be a token id in \[0, 16\) .*got 2.0"),
        ({"max_new_tokens": 3.5}, "max_new_tokens must be an int, got 3.5"),
        ({"max_new_tokens": 4, "min_new_tokens": 1.5}, "min_new_tokens must be an int, got 1.5"),
        ({"do_sample": True, "repetition_penalty": 1e-40}, r"produced \+inf logits"),
    ],
)
def test_bad_generation_arguments(pair, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        specdec.generate(pair[0], pair[1], PROMPT, method="sd", **kwargs)


def test_pad_token_id_from_generation_config_is_checked(pair) -> None:
    transformers = pytest.importorskip("transformers")
    gc = transformers.GenerationConfig(pad_token_id=40)
    with pytest.raises(ValueError, match=r"pad_token_id must be a token id in \[0, 16\) .*got 40"):
        specdec.generate(pair[0], pair[1], PROMPT, method="sd", generation_config=gc)


def test_seed_zero_and_an_in_range_pad_token_are_accepted(pair) -> None:
    out = specdec.generate(
        pair[0], pair[1], torch.tensor([[1, 2, 3], [4, 5, 6]]), method="sd", max_new_tokens=3, seed=0, pad_token_id=15
    )
    assert [len(t) for t in out.new_tokens] == [3, 3] and out.sequences.shape == (2, 6)


@pytest.mark.parametrize(
    ("method", "kwargs", "match"),
    [
        ("beam", {}, "method must be one of"),
        ("sd", {"draft_length": 0}, "draft_length must be an int >= 1, got 0"),
        ("rsd_c", {"branching": (2, 0)}, "branching must be a non-empty sequence of ints >= 1"),
        ("rsd_c", {"branching": ()}, "branching must be a non-empty sequence of ints >= 1"),
        ("rrsw", {"parents": (0, 0)}, r"parents is not a valid level-order tree: parents\[0\] must be -1"),
        ("rrs", {"parents": (-1, 0, 2)}, "parents is not a valid level-order tree"),
        ("rrs", {"parents": (-1,)}, "parents must describe at least one draft node"),
        ("rrs", {"branching": (2,), "parents": (-1, 0)}, "pass branching or parents, not both"),
        ("spechub", {"branching": (3,)}, "branching for method 'spechub' must hold 1s and 2s"),
        ("spechub", {"parents": (-1, 0, 0, 0)}, "parents for method 'spechub' must give every node at most 2"),
        ("rsd_s", {"beam_width": 0}, "beam_width must be an int >= 1"),
        ("spectr", {"num_chains": -1}, "num_chains must be an int >= 1"),
        ("rsd_c", {"draft_length": 3}, "method 'rsd_c' does not take draft_length"),
        ("ar", {"branching": (2,)}, "method 'ar' does not take branching"),
    ],
)
def test_invalid_method_and_tree_specs(pair, method, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        specdec.SpeculativeDecoder(pair[0], pair[1], method=method, **kwargs)


def _nan_model(seed: int):
    model = tiny_llama(seed, vocab=16, hidden=32)
    with torch.no_grad():
        model.lm_head.weight[3] = float("nan")
    return model


def test_nan_target_logits(pair) -> None:
    with pytest.raises(ValueError, match="target produced NaN logits"):
        specdec.generate(_nan_model(5), pair[1], PROMPT, method="sd", seed=0)


def test_nan_draft_logits(pair) -> None:
    with pytest.raises(ValueError, match="draft produced NaN logits"):
        specdec.generate(pair[0], _nan_model(6), PROMPT, method="rsd_c", seed=0)


def test_ngram_drafter_arguments() -> None:
    with pytest.raises(ValueError, match="vocab_size must be an int >= 1"):
        specdec.NGramDrafter(0)
    with pytest.raises(ValueError, match="max_tokens must be an int >= 1"):
        specdec.NGramDrafter(16, max_tokens=0)
    with pytest.raises(ValueError, match="bigram must be a length-16 table"):
        specdec.NGramDrafter(16, bigram=[0, 1])


def test_seed_reproducibility(pair) -> None:
    target, draft = pair
    ids = PROMPT.expand(4, -1)
    runs = [
        specdec.generate(target, draft, ids, method="rsd_s", max_new_tokens=12, do_sample=True, seed=s).new_tokens
        for s in (7, 7, 8)
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    # a fixed tree: with branching="auto" the shapes follow the round timings, so only the law repeats
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    kw = dict(method="spechub", branching=(2, 1), max_new_tokens=12, do_sample=True)
    a = specdec.generate(target, draft, ids, generator=g1, **kw).new_tokens
    b = specdec.generate(target, draft, ids, generator=g2, **kw).new_tokens
    assert a == b


def test_reseeding_one_generator_reproduces_the_run(pair) -> None:
    """Op seeds are drawn from the run's generator in blocks that live only as long as one generate call, so
    reseeding the same generator (or the default one) and generating again gives the same tokens. A fixed tree:
    branching="auto" picks shapes from the round timings, so its draws need not repeat (its law does)."""
    target, draft = pair
    ids = PROMPT.expand(3, -1)
    g = torch.Generator().manual_seed(5)
    first = specdec.generate(
        target, draft, ids, method="rsd_c", branching=(2, 2), max_new_tokens=12, do_sample=True, generator=g
    ).new_tokens
    second = specdec.generate(
        target, draft, ids, method="rsd_c", branching=(2, 2), max_new_tokens=12, do_sample=True, generator=g
    ).new_tokens
    g.manual_seed(5)
    again = specdec.generate(
        target, draft, ids, method="rsd_c", branching=(2, 2), max_new_tokens=12, do_sample=True, generator=g
    ).new_tokens
    assert again == first and second != first
    torch.manual_seed(9)
    a = specdec.generate(target, draft, ids, method="sd", max_new_tokens=12, do_sample=True).new_tokens
    torch.manual_seed(9)
    b = specdec.generate(target, draft, ids, method="sd", max_new_tokens=12, do_sample=True).new_tokens
    assert a == b
