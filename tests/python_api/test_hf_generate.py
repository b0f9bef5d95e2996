"""The transformers-native entry points against ``model.generate`` itself.

Greedy: for every supported generation setting, the tokens of ``specdec.generate``, of
``target.generate(custom_generate=specdec.custom_generate, assistant_model=draft)`` and of a built decoder's
``custom_generate`` equal ``target.generate``'s token for token (fp32 tiny Llamas: both run the same numerics; the
reference runs are checked for near-ties). Settings come from kwargs, from a passed GenerationConfig and from the
model's own ``generation_config``, resolved by transformers in its order.

Sampling: with a repetition penalty, a minimum new-token count on an EOS id, temperature, top-k, top-p and min-p all
active, the joint law of the first two tokens equals the law built by enumeration from transformers' own processor
classes (Pearson chi-square, false-alarm rate 1e-4 per check, 6 checks of a correct law); the same test fails for a
variant whose nodes forget the tokens on their tree path (the repetition penalty then reads the wrong context), so it
has power (with the target as its own draft, so that the second token comes from a drafted node's law).
"""

from __future__ import annotations

import copy
import string

import numpy as np
import pytest
import specdec
import torch
from specdec.sampling import RunContext
from test_law import CASES, PROMPTS, VOCAB, sharpened
from tiny_models import left_pad, noisy_copy, tiny_llama

from specdec_kernels.testing.stats import law_check

transformers = pytest.importorskip("transformers")

V = 64
N_NEW = 10
GREEDY_PROMPTS = [[5, 9, 13, 2, 40, 22], [7, 3, 51]]


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(3, vocab=V, std=0.3)
    return target, noisy_copy(target, 4, 0.2)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    return left_pad(GREEDY_PROMPTS, pad=0)


def reference(target, **kw) -> torch.Tensor:
    ids, mask = batch()
    out = target.generate(
        ids, attention_mask=mask, do_sample=False, output_scores=True, return_dict_in_generate=True, **kw
    )
    for step in out.scores:  # a near-tie could flip between two correct implementations
        top = torch.topk(step.float(), 2).values
        finite = torch.isfinite(top).all(dim=-1)
        gap = (top[:, 0] - top[:, 1])[finite]
        assert gap.numel() == 0 or float(gap.min()) > 1e-4, "reference greedy run has a near-tie: pick another seed"
    return out.sequences


def three_routes(target, draft, method: str, **kw) -> list[torch.Tensor]:
    ids, mask = batch()
    a = specdec.generate(target, draft, ids, method=method, attention_mask=mask, do_sample=False, **kw).sequences
    b = target.generate(
        ids,
        attention_mask=mask,
        custom_generate=specdec.custom_generate,
        assistant_model=draft,
        method=method,
        do_sample=False,
        **kw,
    )
    decoder = specdec.SpeculativeDecoder(target, draft, method=method)
    c = target.generate(ids, attention_mask=mask, custom_generate=decoder.custom_generate, do_sample=False, **kw)
    return [a, b, c]


def greedy_tokens(target, n: int = N_NEW) -> list[list[int]]:
    ids, mask = batch()
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n)
    return out[:, ids.shape[1] :].tolist()


def settings(target) -> dict[str, dict]:
    """One case per supported setting; EOS ids are tokens the plain greedy run emits early, so that the minimum
    lengths and the EOS lists change the output."""
    plain = greedy_tokens(target)
    e0, e1 = plain[0][2], plain[1][3]
    width = batch()[0].shape[1]
    return {
        "max_new_tokens": {"max_new_tokens": 9},
        "max_length": {"max_length": width + 7},
        "eos_token_id list + pad": {"max_new_tokens": N_NEW, "eos_token_id": [e0, e1], "pad_token_id": V - 1},
        "min_new_tokens": {"max_new_tokens": N_NEW, "min_new_tokens": 6, "eos_token_id": [e0, e1]},
        "min_length": {"max_new_tokens": N_NEW, "min_length": width + 5, "eos_token_id": e0},
        "repetition_penalty": {"max_new_tokens": N_NEW, "repetition_penalty": 1.8},
        "penalty below 1": {"max_new_tokens": N_NEW, "repetition_penalty": 0.7},
        "sampling knobs ignored when greedy": {"max_new_tokens": N_NEW, "temperature": 0.5, "top_k": 3, "min_p": 0.2},
        "top_p=0 when greedy": {"max_new_tokens": N_NEW, "top_p": 0.0},
        "numpy and tensor ids": {
            "max_new_tokens": N_NEW,
            "eos_token_id": [np.int64(e0), np.int64(e1)],
            "pad_token_id": torch.tensor(V - 1),
        },
        "model defaults (20 new tokens)": {},
    }


@pytest.mark.parametrize("method", ["sd", "rsd_c", "spechub"])
def test_greedy_equals_model_generate_for_every_setting(pair, method: str) -> None:
    target, draft = pair
    for name, kw in settings(target).items():
        ref = reference(target, **kw)
        for route, got in zip(("specdec.generate", "custom_generate", "decoder.custom_generate"),
                              three_routes(target, draft, method, **kw), strict=True):  # fmt: skip
            assert torch.equal(got, ref), f"{method}, {name}, {route}:\n{got}\n!=\n{ref}"


def test_settings_resolve_in_transformers_order(pair) -> None:
    """The model's generation_config, then a passed GenerationConfig, then kwargs: a copy of the target whose
    generation_config sets a penalty and EOS, overridden in part by a passed config and a kwarg."""
    target, draft = pair
    model = copy.deepcopy(target)
    e0 = greedy_tokens(target)[0][4]
    model.generation_config.repetition_penalty = 1.5
    model.generation_config.eos_token_id = e0
    model.generation_config.max_new_tokens = 8
    gc = transformers.GenerationConfig(repetition_penalty=1.2, min_new_tokens=3)
    ids, mask = batch()
    ref = model.generate(ids, attention_mask=mask, generation_config=gc, max_new_tokens=N_NEW)
    ours = specdec.generate(model, draft, ids, method="sd", attention_mask=mask, generation_config=gc,
                            max_new_tokens=N_NEW)  # fmt: skip
    assert torch.equal(ours.sequences, ref)
    assert ref.shape[1] <= ids.shape[1] + N_NEW


class StopOn(transformers.StoppingCriteria):
    """Stops a row once its last token is ``token``."""

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        if isinstance(scores, torch.Tensor):  # transformers hands a tuple when it records scores
            assert scores.shape == (input_ids.shape[0], V)
        return input_ids[:, -1] == self.token


def test_stopping_criteria_cut_inside_a_round(pair) -> None:
    """A criterion that fires in the middle of an accepted block cuts the row after that token, as transformers'
    one-token steps do."""
    target, draft = pair
    plain = greedy_tokens(target)
    for method in ("sd", "rsd_c"):
        crit = [StopOn(plain[0][3])]
        ref = reference(target, max_new_tokens=N_NEW, stopping_criteria=crit, pad_token_id=V - 1)
        for got in three_routes(target, draft, method, max_new_tokens=N_NEW, stopping_criteria=crit,
                                pad_token_id=V - 1):  # fmt: skip
            assert torch.equal(got, ref)


def char_tokenizer():
    """One token per character, 64 of them (letters, digits, space, full stop): token strings concatenate."""
    tokenizers = pytest.importorskip("tokenizers")
    chars = string.ascii_lowercase + string.ascii_uppercase + string.digits + " ."
    assert len(chars) == V
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token="."))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), "isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=".", pad_token=".")


def test_stop_strings_with_a_tokenizer(pair) -> None:
    target, draft = pair
    tok = char_tokenizer()
    plain = greedy_tokens(target)
    stop = tok.decode(plain[1][3:5])  # two tokens: the match spans a draft block
    ids, mask = batch()
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=N_NEW, stop_strings=[stop],
                          tokenizer=tok, pad_token_id=V - 1)  # fmt: skip
    assert ref.shape[1] < ids.shape[1] + N_NEW or ref[1, -1] != V - 1  # the stop string cut row 1
    ours = specdec.generate(target, draft, ids, method="rsd_c", attention_mask=mask, do_sample=False,
                            max_new_tokens=N_NEW, stop_strings=[stop], tokenizer=tok, pad_token_id=V - 1)  # fmt: skip
    assert torch.equal(ours.sequences, ref)
    with pytest.raises(ValueError, match="stop_strings needs tokenizer="):
        specdec.generate(target, draft, ids, method="sd", attention_mask=mask, stop_strings=[stop])
    # from the model's own generation_config (left as it was after the call)
    model = copy.deepcopy(target)
    model.generation_config.stop_strings = [stop]
    ours = specdec.generate(model, draft, ids, method="rsd_c", attention_mask=mask, do_sample=False,
                            max_new_tokens=N_NEW, tokenizer=tok, pad_token_id=V - 1)  # fmt: skip
    assert torch.equal(ours.sequences, ref) and model.generation_config.stop_strings == [stop]
    # the hook: transformers drops tokenizer= for a custom_generate callable, the criterion goes in as such
    crit = transformers.StoppingCriteriaList([transformers.StopStringCriteria(tokenizer=tok, stop_strings=[stop])])
    hooked = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=N_NEW, stopping_criteria=crit,
                             pad_token_id=V - 1, custom_generate=specdec.custom_generate, assistant_model=draft,
                             method="sd")  # fmt: skip
    assert torch.equal(hooked, ref)


class Collect(transformers.generation.streamers.BaseStreamer):
    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.flatten().tolist())

    def end(self) -> None:
        self.ended = True


def test_streamers_get_the_prompt_then_every_new_token(pair) -> None:
    target, draft = pair
    prompt = torch.tensor([GREEDY_PROMPTS[0]])
    ref = target.generate(prompt, do_sample=False, max_new_tokens=N_NEW)
    new = ref[0, prompt.shape[1] :].tolist()
    direct, hooked = Collect(), Collect()
    out = specdec.generate(target, draft, prompt, method="sd", do_sample=False, max_new_tokens=N_NEW,
                           streamer=direct)  # fmt: skip
    seq = target.generate(prompt, do_sample=False, max_new_tokens=N_NEW, custom_generate=specdec.custom_generate,
                          assistant_model=draft, method="sd", streamer=hooked)  # fmt: skip
    assert torch.equal(out.sequences, ref) and torch.equal(seq, ref)
    for s in (direct, hooked):
        assert s.puts[0] == GREEDY_PROMPTS[0] and sum(s.puts[1:], []) == new and s.ended
    assert len(direct.puts) - 1 < len(new), "a round streams its whole block at once"
    tok = char_tokenizer()
    text = transformers.TextIteratorStreamer(tok, skip_prompt=True)
    specdec.generate(target, draft, prompt, method="sd", do_sample=False, max_new_tokens=N_NEW, streamer=text)
    assert "".join(text) == tok.decode(new)
    with pytest.raises(ValueError, match="streamer= needs batch size 1"):
        ids, mask = batch()
        specdec.generate(target, draft, ids, method="sd", attention_mask=mask, streamer=Collect())


def test_the_hook_finds_assistant_model_and_streamer_or_fails_loudly(pair, monkeypatch) -> None:
    """transformers hands a custom_generate callable neither argument; the hook reads both from its generate call.
    Run in CI with the oldest and the newest supported transformers: a release that renames them fails here."""
    import specdec.edge as edge

    target, draft = pair
    prompt = torch.tensor([GREEDY_PROMPTS[0]])
    seen = {}

    def spy(model, input_ids, *args, **kwargs):
        seen.update(edge.generate_call())
        return input_ids

    target.generate(prompt, max_new_tokens=2, custom_generate=spy, assistant_model=draft, streamer=Collect())
    assert seen["assistant_model"] is draft and isinstance(seen["streamer"], Collect)
    assert edge.generate_call() == {}  # not inside transformers' generate
    monkeypatch.setattr(edge, "GENERATE_LOCALS", ("assistant_model", "a_renamed_streamer"))
    with pytest.raises(RuntimeError, match="cannot find assistant_model and a_renamed_streamer in transformers"):
        target.generate(prompt, max_new_tokens=2, custom_generate=specdec.custom_generate, assistant_model=draft)


def test_return_dict_in_generate_carries_the_speculative_stats(pair) -> None:
    target, draft = pair
    ids, mask = batch()
    plain = target.generate(ids, attention_mask=mask, custom_generate=specdec.custom_generate, assistant_model=draft,
                            method="sd", max_new_tokens=N_NEW)  # fmt: skip
    out = target.generate(ids, attention_mask=mask, custom_generate=specdec.custom_generate, assistant_model=draft,
                          method="sd", max_new_tokens=N_NEW, return_dict_in_generate=True)  # fmt: skip
    assert isinstance(plain, torch.Tensor) and isinstance(out, specdec.GenerationOutput)
    assert torch.equal(out.sequences, plain)
    assert out.stats.new_tokens == sum(len(t) for t in out.new_tokens) and out.stats.block_efficiency >= 1.0
    # read as transformers' own output of return_dict_in_generate=True is read
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=N_NEW, return_dict_in_generate=True)
    assert isinstance(ref, transformers.generation.utils.GenerateDecoderOnlyOutput)
    assert torch.equal(out["sequences"], ref["sequences"]) and torch.equal(out[0], ref[0])
    assert torch.equal(out.to_tuple()[0], ref.to_tuple()[0]) and "sequences" in out and "scores" not in out
    assert out.scores is None and out.logits is None and out.attentions is None and out.hidden_states is None
    assert list(out.keys()) == ["sequences", "new_tokens", "stats"] and out["stats"] is out.stats
    with pytest.raises(KeyError):
        out["scores"]
    assert [k for k in ref.keys() if k != "past_key_values" and k != "cache"] == ["sequences"]


def test_values_transformers_runs_as_plain_decoding_are_accepted(pair) -> None:
    target, draft = pair
    ids, mask = batch()
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=N_NEW, do_sample=False)
    noop = {"suppress_tokens": [], "begin_suppress_tokens": [], "guidance_scale": 1.0, "penalty_alpha": 0.0}
    for key, value in noop.items():
        out = target.generate(ids, attention_mask=mask, custom_generate=specdec.custom_generate, assistant_model=draft,
                              method="sd", max_new_tokens=N_NEW, do_sample=False, **{key: value})  # fmt: skip
        assert torch.equal(out, ref), key
        out = specdec.generate(target, draft, ids, attention_mask=mask, method="sd", max_new_tokens=N_NEW,
                               do_sample=False, **{key: value})  # fmt: skip
        assert torch.equal(out.sequences, ref), key
    # the same settings with an effect stay refused
    for key, value in {"suppress_tokens": [3], "guidance_scale": 1.5, "penalty_alpha": 0.6}.items():
        with pytest.raises(specdec.errors.UnsupportedSettingError, match=key):
            specdec.generate(target, draft, ids, attention_mask=mask, method="sd", **{key: value})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"no_repeat_ngram_size": 2}, "no_repeat_ngram_size=2 is not supported"),
        ({"bad_words_ids": [[3]]}, "bad_words_ids=.* is not supported"),
        ({"typical_p": 0.5, "do_sample": True}, "typical_p=0.5 is not supported"),
        ({"output_logits": True}, "output_logits=True is not supported"),
        ({"prefix_allowed_tokens_fn": lambda b, ids: [1, 2]}, "PrefixConstrainedLogitsProcessor is not supported"),
        ({"logits_processor": [transformers.SuppressTokensLogitsProcessor([3])]}, "SuppressTokensLogitsProcessor"),
        # a user's processor of a class transformers builds takes the place of transformers' own
        (
            {"logits_processor": [transformers.RepetitionPenaltyLogitsProcessor(3.0)]},
            "RepetitionPenaltyLogitsProcessor",
        ),
        ({"do_sample": True, "logits_processor": [transformers.TopKLogitsWarper(1)]}, "TopKLogitsWarper"),
        ({"eos_token_id": 5, "logits_processor": [transformers.MinLengthLogitsProcessor(12, 5)]}, "MinLength"),
        ({"stopping_criteria": [transformers.EosTokenCriteria(5)]}, "EosTokenCriteria.*eos_token_id="),
        ({"max_new_tokens": 8, "stopping_criteria": [transformers.MaxLengthCriteria(9)]}, "MaxLengthCriteria.*max_len"),
    ],
)
def test_unimplemented_settings_are_refused_by_name(pair, kwargs, match) -> None:
    target, draft = pair
    ids, mask = batch()
    with pytest.raises(specdec.errors.UnsupportedSettingError, match=match):
        specdec.generate(target, draft, ids, method="sd", attention_mask=mask, **kwargs)
    with pytest.raises(ValueError, match=match):
        target.generate(ids, attention_mask=mask, custom_generate=specdec.custom_generate, assistant_model=draft,
                        method="sd", **kwargs)  # fmt: skip


def test_processors_built_with_the_settings_values_pass(pair) -> None:
    """With the hook, a processor of a known class built with the settings' values takes the place of transformers'
    own: accepted, and the output is model.generate's with that processor. The repetition penalty follows the
    processor's prompt_ignore_length (none: the padding is penalized too; per row: it is not)."""
    target, draft = pair
    ids, mask = batch()
    padding = (mask != 0).int().argmax(dim=1)
    kw = dict(do_sample=False, max_new_tokens=N_NEW, repetition_penalty=1.8)
    variants = [[transformers.RepetitionPenaltyLogitsProcessor(1.8)]]
    try:  # newer transformers take one count per row
        variants.append([transformers.RepetitionPenaltyLogitsProcessor(1.8, prompt_ignore_length=padding)])
    except ValueError:
        pass
    outputs = []
    for procs in variants:
        ref = target.generate(ids, attention_mask=mask, logits_processor=procs, **kw)
        got = target.generate(ids, attention_mask=mask, logits_processor=procs, custom_generate=specdec.custom_generate,
                              assistant_model=draft, method="sd", **kw)  # fmt: skip
        assert torch.equal(got, ref)
        outputs.append(ref)
    assert torch.equal(target.generate(ids, attention_mask=mask, **kw), target.generate(
        ids, attention_mask=mask, custom_generate=specdec.custom_generate, assistant_model=draft, method="sd", **kw
    ))  # fmt: skip
    if len(outputs) == 2:  # the padding changes the padded row's law: the test would see a driver that ignored it
        assert not torch.equal(outputs[0], outputs[1])


def test_top_p_zero_samples_the_most_probable_token(pair) -> None:
    """top_p=0 keeps the most probable token alone, as transformers' top-p warper does: sampling equals greedy."""
    target, draft = pair
    ids, mask = batch()
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=N_NEW)
    for seed in range(3):
        out = specdec.generate(target, draft, ids, method="rsd_c", attention_mask=mask, do_sample=True, top_p=0.0,
                               max_new_tokens=N_NEW, seed=seed)  # fmt: skip
        assert torch.equal(out.sequences, ref)


def test_integer_inputs_give_int64_sequences(pair) -> None:
    target, draft = pair
    ids, mask = batch()
    ref = target.generate(ids.int(), attention_mask=mask, do_sample=False, max_new_tokens=N_NEW)
    for got in (
        specdec.generate(target, draft, ids.int(), method="sd", attention_mask=mask, max_new_tokens=N_NEW).sequences,
        target.generate(
            ids.int(),
            attention_mask=mask,
            max_new_tokens=N_NEW,
            custom_generate=specdec.custom_generate,
            assistant_model=draft,
            method="sd",
        ),  # fmt: skip
    ):
        assert got.dtype == torch.int64 == ref.dtype and torch.equal(got, ref)


def test_right_padding_is_refused(pair) -> None:
    target, draft = pair
    ids = torch.tensor([[5, 9, 13], [7, 3, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    with pytest.raises(ValueError, match="attention_mask row 1 ends with padding"):
        specdec.generate(target, draft, ids, method="sd", attention_mask=mask, max_new_tokens=4)
    with pytest.raises(ValueError, match="attention_mask row 1 ends with padding"):
        target.generate(ids, attention_mask=mask, max_new_tokens=4, custom_generate=specdec.custom_generate,
                        assistant_model=draft, method="sd")  # fmt: skip


def test_draft_is_given_once(pair) -> None:
    target, draft = pair
    ids, mask = batch()
    with pytest.raises(ValueError, match="assistant_model= or draft=, not both"):
        target.generate(ids, custom_generate=specdec.custom_generate, assistant_model=draft, draft=draft, method="sd")
    decoder = specdec.SpeculativeDecoder(target, draft, method="sd")
    with pytest.raises(ValueError, match="assistant_model= is not read"):
        target.generate(ids, custom_generate=decoder.custom_generate, assistant_model=draft)
    other = tiny_llama(9, vocab=V)
    with pytest.raises(ValueError, match="not this decoder's target"):
        other.generate(ids, custom_generate=decoder.custom_generate)


# ---------------------------------------------------------------------------------------------------------------
# Sampling law with every context-dependent control on

N_LAW = 5000
EOS = 6
LAW_KW = dict(temperature=0.9, top_k=6, top_p=0.95, min_p=0.05, repetition_penalty=5.0, min_new_tokens=1)


@pytest.fixture(scope="module")
def law_pair():
    target = tiny_llama(0, vocab=VOCAB, hidden=32, std=0.3)
    return target, sharpened(tiny_llama(1, vocab=VOCAB, hidden=32, std=0.3), 2.0)


def penalty_start(target, ids: torch.Tensor, mask: torch.Tensor) -> list[int]:
    """Where the installed transformers' repetition penalty starts reading each row of this batch: the
    ``prompt_ignore_length`` of the processor its generate builds (per row: the leading padding; None: 0, older
    releases penalize the padding too)."""
    got = {}

    def spy(model, input_ids, logits_processor=None, **kwargs):
        proc = next(p for p in logits_processor if isinstance(p, transformers.RepetitionPenaltyLogitsProcessor))
        got["skip"] = proc.prompt_ignore_length
        return input_ids

    target.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=1, custom_generate=spy, **LAW_KW)
    skip = got["skip"]
    if skip is None:
        return [0] * ids.shape[0]
    return skip.tolist() if isinstance(skip, torch.Tensor) else [int(skip)] * ids.shape[0]


@torch.no_grad()
def hf_law(target, prompt: list[int], lead: list[int] = ()) -> np.ndarray:
    """[V, V] float64: the first two tokens' law under transformers' own processor classes, by enumeration;
    ``lead``: padding before the prompt that the repetition penalty reads (see penalty_start)."""
    P = transformers.generation.logits_process
    penalty = P.RepetitionPenaltyLogitsProcessor(LAW_KW["repetition_penalty"])
    procs = transformers.LogitsProcessorList(
        [
            P.MinNewTokensLengthLogitsProcessor(len(prompt), LAW_KW["min_new_tokens"], EOS),
            P.TemperatureLogitsWarper(LAW_KW["temperature"]),
            P.TopKLogitsWarper(LAW_KW["top_k"]),
            P.TopPLogitsWarper(LAW_KW["top_p"]),
            P.MinPLogitsWarper(LAW_KW["min_p"]),
        ]
    )

    def law(rows: list[list[int]]) -> torch.Tensor:
        ids = torch.tensor(rows)
        scores = penalty(torch.tensor([list(lead) + r for r in rows]), target(ids).logits[:, -1].float())
        return torch.softmax(procs(ids, scores).double(), dim=-1)

    first = law([prompt])[0]
    second = law([prompt + [y] for y in range(VOCAB)])
    joint = first[:, None] * second
    return (joint / joint.sum()).numpy()


def law_checks(models, method: str, seed: int) -> list:
    target, draft = models
    decoder = specdec.SpeculativeDecoder(target, draft, method=method, **CASES.get(method, {}))
    ids, mask = left_pad([PROMPTS[i % 2] for i in range(2 * N_LAW)])
    out = decoder.generate(ids, mask, max_new_tokens=max(decoder.config.depth + 1, 2), do_sample=True,
                           eos_token_id=EOS, seed=seed, **LAW_KW)  # fmt: skip
    first_two = np.array([t[:2] for t in out.new_tokens])
    start = penalty_start(target, ids[:2], mask[:2])
    checks = []
    for i, prompt in enumerate(PROMPTS):
        counts = np.zeros((VOCAB, VOCAB))
        np.add.at(counts, (first_two[i::2, 0], first_two[i::2, 1]), 1)
        lead = ids[i, start[i] : ids.shape[1] - len(prompt)].tolist()
        checks.append(law_check(counts, hf_law(target, prompt, lead), max_tv=0.08))
    return checks


def test_law_cases_reach_the_second_token_through_a_path(law_pair) -> None:
    """The settings make the controls matter: the penalty moves the second token's law and EOS is masked first."""
    law = hf_law(law_pair[0], PROMPTS[0])
    assert law[EOS].sum() == 0.0  # min_new_tokens: no EOS as the first token
    assert all(law[y, y] < law[y].sum() * 0.5 for y in range(VOCAB) if law[y].sum() > 0.05)


@pytest.mark.parametrize("method", ["sd", "rsd_c", "spechub"])
def test_sampled_law_equals_the_processed_target_law(law_pair, method: str) -> None:
    for prompt, check in zip(PROMPTS, law_checks(law_pair, method, seed=2), strict=True):
        assert check.ok, f"{method} prompt {prompt}: {check}"


def test_forgetting_the_tree_path_fails_the_law(law_pair, monkeypatch) -> None:
    """Negative control: nodes read only their row's tokens, not the drafted tokens above them. The draft is the
    target itself, so nearly every first token is accepted and the second comes from a node's (wrong) law."""
    real = RunContext.node_seen

    def row_only(self, tree, lo, hi):
        seen = real(self, tree, lo, hi)
        return self.seen[:, None, : self.vocab].expand_as(seen)

    monkeypatch.setattr(RunContext, "node_seen", row_only)
    checks = law_checks((law_pair[0], law_pair[0]), "sd", seed=2)
    assert any(not c.ok and c.p_value < 1e-4 for c in checks), [str(c) for c in checks]


def test_cascade_greedy_equals_model_generate_for_every_setting(pair) -> None:
    """csd drafts with a cascade (a neural drafter above Max-Gram); the context-dependent settings still give
    ``model.generate``'s tokens."""
    from specdec.drafters import bigram_table

    target, draft = pair
    cascade = specdec.CascadeDrafter([draft], bigram=bigram_table([greedy_tokens(target, 30)[0]], V),
                                     steps=[[3, 0], [0, 1]])  # fmt: skip
    ids, mask = batch()
    for name, kw in settings(target).items():
        ref = reference(target, **kw)
        ours = specdec.generate(target, cascade, ids, method="csd", attention_mask=mask, do_sample=False, **kw)
        hooked = target.generate(ids, attention_mask=mask, custom_generate=specdec.custom_generate, draft=cascade,
                                 method="csd", do_sample=False, **kw)  # fmt: skip
        assert torch.equal(ours.sequences, ref), name
        assert torch.equal(hooked, ref), name
