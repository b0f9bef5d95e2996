"""The method registry (specdec.methods): every method is one spec in one module, and everything else reads it.

* the ten built-in methods, in their order, each with a label, a description and its reference;
* lookups and registrations fail with errors that name the method or the parameter;
* every registered drafting method's toy loop (its sibling draw and verifier, from the registry) keeps the target
  law and the target's greedy output (specdec_kernels.testing.toy);
* adding a method is one spec: a method registered here (and removed afterwards) is configured, labelled, drafted,
  verified and offered by the demo CLI with no other change.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest
import specdec
import torch
from specdec import cli, methods
from specdec.cli import build_parser, method_kwargs
from specdec.methods import MethodConfig, MethodSpec, make_method, tree_label
from specdec.methods.builders import SWORTreeBuilder
from tiny_models import left_pad, noisy_copy, reference_greedy, tiny_llama

from specdec_kernels.testing import toy, toy_grown
from specdec_kernels.testing.stats import LawCheck

BUILT_IN = ("ar", "sd", "rrs", "rrsw", "rsd_c", "rsd_s", "spectr", "spechub", "gds", "specdec_pp", "csd")
REFERENCE = re.compile(r"(19|20)\d\d.*arXiv:\d{4}\.\d{4,5}")


def test_available_lists_the_built_in_methods_in_order() -> None:
    assert methods.available() == BUILT_IN
    assert specdec.METHODS == BUILT_IN


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_spec_has_a_description_with_its_reference_and_a_label(name: str) -> None:
    spec = methods.get(name)
    assert spec.name == name
    assert len(spec.description) > 100 and REFERENCE.search(spec.description), spec.description
    config = make_method(name)
    assert config.spec is spec and config.verifier == spec.verifier
    assert config.describe() == spec.label(config) and config.describe().startswith(name)
    assert set(spec.defaults) <= spec.allowed <= methods.PARAMETERS
    assert spec.drafts == (spec.verifier is not None)


def test_the_methods_table_of_the_docs_lists_every_method_with_its_verifier() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "methods.md").read_text(encoding="utf-8")
    rows = {m: v or "none" for m, v in re.findall(r"^\| `(\w+)` \| (?:`(\w+)`|none) \|", text, flags=re.MULTILINE)}
    assert rows == {m: methods.get(m).verifier or "none" for m in methods.available()}


def test_labels() -> None:
    labels = {
        ("ar", ()): "ar",
        ("sd", ()): "sd(L=4)",
        ("rsd_c", (("branching", (2, 1)),)): "rsd_c(b=2,1)",
        ("rrs", (("parents", (-1, 0, 0, 1)),)): "rrs(N=4)",
        ("rsd_s", ()): "rsd_s(W=2,L=3)",
        ("spectr", (("num_chains", 3),)): "spectr(K=3,L=3)",
        ("spechub", ()): "spechub(auto)",
        ("spechub", (("branching", (2, 1)),)): "spechub(b=2,1)",
        ("specdec_pp", ()): "specdec_pp(cap=20)",
        ("csd", ()): "csd(L<=24)",
    }
    for (name, kw), label in labels.items():
        assert make_method(name, **dict(kw)).describe() == label


def test_get_names_the_unknown_method_and_lists_the_available_ones() -> None:
    with pytest.raises(ValueError, match=r"method must be one of \('ar', 'sd', .*'csd'\), got 'nope'"):
        methods.get("nope")
    with pytest.raises(ValueError, match="got 'nope'"):
        make_method("nope")
    with pytest.raises(ValueError, match="got 'nope'"):
        methods.unregister("nope")


@pytest.mark.parametrize("name", BUILT_IN)
def test_a_parameter_a_method_does_not_take_is_named(name: str) -> None:
    values = {"draft_length": 2, "branching": (2,), "parents": (-1, 0), "beam_width": 2, "num_chains": 2}
    for param in sorted(methods.PARAMETERS - methods.get(name).allowed):
        with pytest.raises(ValueError, match=f"method '{name}' does not take {param}"):
            make_method(name, **{param: values[param]})


def test_bad_specs_are_refused() -> None:
    common = {"description": "x", "label": tree_label}
    with pytest.raises(ValueError, match="already registered"):
        methods.register(MethodSpec(name="sd", verifier="sd", builder=SWORTreeBuilder, **common))
    with pytest.raises(ValueError, match="both or neither"):
        MethodSpec(name="half", verifier="sd", builder=None, **common)
    with pytest.raises(ValueError, match=r"unknown parameters \['depth'\]"):
        MethodSpec(name="odd", verifier=None, builder=None, allowed=frozenset({"depth"}), **common)
    with pytest.raises(ValueError, match="defaults .* must be allowed"):
        MethodSpec(name="odd", verifier=None, builder=None, defaults={"draft_length": 2}, **common)
    with pytest.raises(ValueError, match="must be an identifier"):
        MethodSpec(name="two words", verifier=None, builder=None, **common)


# ---------------------------------------------------------------------------------------------------------------
# The toy loop of a registered method: the registry's sibling draw and verifier, run on toy bigram models


def toy_decoder(config: MethodConfig, *, greedy: bool = False) -> toy.Decoder:
    spec = config.spec
    draw = getattr(spec.builder, "draw", None)
    assert spec.verifier is not None and draw is not None, f"{config.method}: no toy loop for builder {spec.builder}"
    if draw == "beam":
        assert config.beam_width is not None and config.draft_length is not None
        return toy_grown.beam(config.beam_width, config.draft_length, verifier=spec.verifier, greedy=greedy)
    if draw == "cascade":  # the target reviews a chain: the block of a draft reviewing a proposer (leniency 2)
        assert spec.verifier == "sd"
        return toy_grown.cascade(2, 2, 2.0, greedy=greedy)
    assert draw in toy.DRAWS and config.parents is not None
    return toy.tree(config.parents, draw=draw, verifier=spec.verifier, greedy=greedy)


def drafting_methods() -> list[str]:
    return [m for m in methods.available() if methods.get(m).drafts]


# small trees keep the toy runs short, and toy loops take fixed trees (the auto default of rsd_c, rrsw, rrs and
# spechub, trees chosen per round for the machine, has its law and greedy tests with the real decoder); every other
# method runs with its defaults
TOY_PARAMS = {"specdec_pp": {"draft_length": 3}} | {
    m: {"branching": (2, 2)} for m in methods.available() if methods.get(m).auto_builder is not None
}
N_TOY = 20_000


def toy_law(config: MethodConfig, model: toy.ToyModel) -> LawCheck:
    max_tv = max(0.015, math.sqrt(model.vocab**2 / N_TOY))
    return toy.check_first_tokens(model, toy_decoder(config), N_TOY, seed=11, max_tv=max_tv)


def toy_law_ok(config: MethodConfig) -> None:
    # PEAKED_TOY: i.i.d. drafts repeat often, which gives a wrong verifier pairing power (see the control below)
    for model in (toy.SPEC_TOY, toy.PEAKED_TOY):
        res = toy_law(config, model)
        assert res.ok, f"{config.describe()}: {res}"


def toy_greedy_ok(config: MethodConfig) -> None:
    model = toy.random_toy(12, seed=112)
    start = torch.arange(12).repeat(2)
    run = toy.generate(model, toy_decoder(config, greedy=True), len(start), seed=0, n_tokens=20, start=start)
    assert (run.tokens == toy.target_greedy(model, start, 20)).all(), config.describe()


@pytest.mark.parametrize("name", drafting_methods())
def test_every_method_keeps_the_target_law_in_its_toy_loop(name: str) -> None:
    toy_law_ok(make_method(name, **TOY_PARAMS.get(name, {})))


@pytest.mark.parametrize("name", drafting_methods())
def test_every_method_returns_target_greedy_in_its_toy_loop(name: str) -> None:
    toy_greedy_ok(make_method(name, **TOY_PARAMS.get(name, {})))


# ---------------------------------------------------------------------------------------------------------------
# Adding a method: this spec is all a new module of specdec.methods would hold.

TRIPLE = MethodSpec(
    name="triple",
    description=(
        "Three children per node drawn without replacement and verified by recursive rejection sampling without "
        "replacement (a test method). W. Jeon et al., Recursive Speculative Decoding: Accelerating LLM Inference "
        "via Sampling Without Replacement, 2024, arXiv:2402.14160."
    ),
    verifier="rrsw",
    builder=SWORTreeBuilder,
    label=tree_label,
    defaults={"branching": (3, 1)},
    allowed=frozenset({"branching"}),
)


@pytest.fixture
def triple():
    methods.register(TRIPLE)
    try:
        yield TRIPLE
    finally:
        methods.unregister(TRIPLE.name)


def test_a_registered_method_is_configured_labelled_and_offered(triple, capsys) -> None:
    assert methods.available()[-1] == "triple" and "triple" in specdec.METHODS
    config = make_method("triple")
    assert config.parents == (-1, 0, 0, 0, 1, 2, 3) and config.depth == 2 and config.verifier == "rrsw"
    assert config.describe() == "triple(b=3,1)"
    with pytest.raises(ValueError, match="method 'triple' does not take draft_length"):
        make_method("triple", draft_length=3)
    with pytest.raises(ValueError, match="branching must be a non-empty sequence of ints >= 1"):
        make_method("triple", branching=(3, 0))
    args = build_parser().parse_args(["demo", "--methods", "triple", "--branching", "2,2"])
    assert method_kwargs("triple", args) == {"branching": (2, 2)}
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    assert "specdec_pp, csd, triple" in " ".join(capsys.readouterr().out.split())


def test_a_registered_method_decodes_exactly(triple) -> None:
    toy_law_ok(make_method("triple"))
    toy_greedy_ok(make_method("triple"))
    target = tiny_llama(3, vocab=64, std=0.2)
    draft = noisy_copy(target, 5, 0.1)
    prompts = [[5, 9, 2], [7, 1, 1, 4, 30]]
    refs = []
    for p in prompts:
        toks, gap = reference_greedy(target, p, 12)
        assert gap > 1e-3, "near-tie in the reference greedy decoding"
        refs.append(toks)
    ids, mask = left_pad(prompts)
    out = specdec.generate(target, draft, ids, method="triple", attention_mask=mask, max_new_tokens=12, do_sample=False)
    assert out.new_tokens == refs and out.stats.method == "triple(b=3,1)"
    assert out.stats.block_efficiency > 1.0


def test_a_spec_pairing_a_draw_with_the_wrong_verifier_fails_its_toy_law() -> None:
    """Negative control: children drawn without replacement but verified as i.i.d. ones ('rrs')."""
    methods.register(dataclasses.replace(TRIPLE, name="triple_rrs", verifier="rrs"))
    try:
        res = toy_law(make_method("triple_rrs", branching=(2, 2)), toy.PEAKED_TOY)
    finally:
        methods.unregister("triple_rrs")
    assert not res.ok and res.p_value < 1e-12, res


def test_an_unregistered_method_is_gone() -> None:
    methods.register(TRIPLE)
    methods.unregister("triple")
    assert "triple" not in methods.available()
    with pytest.raises(ValueError, match="got 'triple'"):
        make_method("triple")
