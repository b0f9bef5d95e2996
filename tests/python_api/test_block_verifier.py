"""``verifier="block"`` and ``verifier="traversal"``: who takes them, what they change, and that every entry point
passes them on.

The law of block verification end to end is tested in test_law.py (with its negative control), its kernels in
tests/ops/test_verify_block.py. Here: the option's validation and label, greedy output equal to the target's greedy
decoding (block verification of one-hot rows is SD's greedy walk), the same sampled tokens through
``specdec.generate``, ``custom_generate`` and a built decoder for one seed (and other tokens than with the token
verifier), and the demo flag.
"""

from __future__ import annotations

import argparse

import pytest
import specdec
from specdec.cli import build_parser
from specdec.demo import method_kwargs
from specdec.methods import make_method
from tiny_models import assert_target_greedy, left_pad, noisy_copy, tiny_llama

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6]]


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(0, vocab=48, hidden=32, std=0.2)
    return target, noisy_copy(target, 1, 0.6)


def test_block_is_offered_for_chain_methods_only() -> None:
    config = make_method("sd", draft_length=3, verifier="block")
    assert config.verifier == "block" and config.verification == "block"
    assert config.describe() == "sd(L=3)+block"
    assert make_method("sd").verifier == "sd" and make_method("sd", verifier="token").describe() == "sd(L=4)"
    with pytest.raises(
        ValueError, match=r"method 'rsd_c' takes verifier=\['token', 'traversal'\] only.*sd, specdec_pp"
    ):
        make_method("rsd_c", verifier="block")
    with pytest.raises(ValueError, match=r"method 'sd' takes verifier=\['block', 'token'\] only.*rrs, rrsw, rsd_c"):
        make_method("sd", verifier="traversal")
    with pytest.raises(ValueError, match="method 'spechub' takes verifier"):
        make_method("spechub", verifier="traversal")
    with pytest.raises(ValueError, match="verifier must be one of"):
        make_method("sd", verifier="blocks")


def test_traversal_is_offered_for_fixed_shape_trees() -> None:
    assert make_method("rsd_c", branching=(2, 1), verifier="traversal").verifier == "traversalw"
    assert make_method("rrsw", branching=(2, 1), verifier="traversal").verifier == "traversalw"
    assert make_method("rrs", branching=(2, 1), verifier="traversal").verifier == "traversal"
    assert make_method("rsd_c", branching=(2, 1), verifier="traversal").describe() == "rsd_c(b=2,1)+traversal"


def test_traversal_refuses_a_head(pair) -> None:
    target, draft = pair
    with pytest.raises(ValueError, match="verifier='traversal' needs a tree whose shape is fixed"):
        specdec.SpeculativeDecoder(
            target, draft, method="rsd_c", branching=(2, 1), verifier="traversal", head=lambda h: h[..., 0]
        )


@pytest.mark.parametrize(("method", "verifier"), [("rsd_c", "traversal"), ("rrs", "traversal")])
def test_greedy_traversal_is_the_target_greedy_output(pair, method: str, verifier: str) -> None:
    target, draft = pair
    ids, mask = left_pad(PROMPTS)
    dec = specdec.SpeculativeDecoder(target, draft, method=method, branching=(2, 2), verifier=verifier)
    out = dec.generate(ids, mask, max_new_tokens=12, do_sample=False)
    assert_target_greedy(target, PROMPTS, out.new_tokens, 12)


@pytest.mark.parametrize("method", ["sd", "csd"])
def test_greedy_block_is_the_target_greedy_output(pair, method: str) -> None:
    target, draft = pair
    ids, mask = left_pad(PROMPTS)
    drafter = draft if method == "sd" else specdec.CascadeDrafter([draft], bigram=list(range(1, 48)) + [0])
    dec = specdec.SpeculativeDecoder(target, drafter, method=method, verifier="block")
    out = dec.generate(ids, mask, max_new_tokens=12, do_sample=False)
    assert_target_greedy(target, PROMPTS, out.new_tokens, 12)


def test_every_entry_point_passes_the_verifier_on(pair) -> None:
    target, draft = pair
    ids, mask = left_pad(PROMPTS)
    kw = dict(do_sample=True, temperature=1.0, top_k=0, max_new_tokens=10, seed=7)
    a = specdec.generate(target, draft, ids, method="sd", attention_mask=mask, verifier="block", **kw).sequences
    b = target.generate(
        ids,
        attention_mask=mask,
        custom_generate=specdec.custom_generate,
        assistant_model=draft,
        method="sd",
        verifier="block",
        **kw,
    )
    dec = specdec.SpeculativeDecoder(target, draft, method="sd", verifier="block")
    c = target.generate(ids, attention_mask=mask, custom_generate=dec.custom_generate, **kw)
    assert a.tolist() == b.tolist() == c.tolist()
    assert dec.last_stats.method == "sd(L=4)+block"
    token = specdec.generate(target, draft, ids, method="sd", attention_mask=mask, **kw)
    assert token.stats.method == "sd(L=4)" and token.sequences.tolist() != a.tolist()  # the option changed the run


def test_demo_flag_reaches_the_methods_that_take_it() -> None:
    args = build_parser().parse_args(["demo", "--verifier", "block"])
    assert method_kwargs("sd", args)["verifier"] == "block"
    assert "verifier" not in method_kwargs("rsd_c", args)
    plain = build_parser().parse_args(["demo"])
    assert "verifier" not in method_kwargs("sd", plain)
    assert isinstance(args, argparse.Namespace)
