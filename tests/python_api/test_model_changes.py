"""A decoder built once and reused sees the models as they are at each call: a hook added, a module replaced, a cast
or another attention after it was built changes what runs, as it changes ``model.generate``. What would make the
target's logits differ from its own forward (training-mode dropout, int8 copies of its weights) is refused."""

from __future__ import annotations

import pytest
import specdec
import torch
from specdec.decoder import SpeculativeDecoder
from specdec.models import HFCausalLM, rotary_rows
from tiny_models import left_pad, noisy_copy, tiny_llama

VOCAB = 48
PROMPTS = [[3, 17, 5, 9, 21], [11, 2, 30]]
N_NEW = 10


def _models() -> tuple[torch.nn.Module, torch.nn.Module]:
    target = tiny_llama(1, vocab=VOCAB, std=0.2)
    return target, noisy_copy(target, 2, 0.1)


def _same_as_generate(dec: SpeculativeDecoder, target: torch.nn.Module) -> bool:
    ids, mask = left_pad(PROMPTS)
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=N_NEW)
    out = dec.generate(ids, mask, do_sample=False, max_new_tokens=N_NEW)
    return torch.equal(out.sequences, ref)


def _decoder(target: torch.nn.Module, draft: torch.nn.Module) -> SpeculativeDecoder:
    dec = SpeculativeDecoder(target, draft, method="rsd_c", branching=(2, 2))
    assert _same_as_generate(dec, target)  # a first call before the model changes
    return dec


def test_a_hook_added_after_the_decoder_was_built_runs() -> None:
    target, draft = _models()
    dec = _decoder(target, draft)
    calls = []

    def scale(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return out * 3.0

    target.model.layers[0].mlp.register_forward_hook(scale)
    assert _same_as_generate(dec, target)
    assert calls  # it ran inside the decoder's forwards too (and changed their output like generate's)


class _Lora(torch.nn.Module):
    """An adapter library's wrapper around a linear: the base layer plus a low-rank update."""

    def __init__(self, base: torch.nn.Linear) -> None:
        super().__init__()
        self.base = base
        g = torch.Generator().manual_seed(7)
        self.a = torch.nn.Parameter(torch.randn(4, base.in_features, generator=g) * 0.5)
        self.b = torch.nn.Parameter(torch.randn(base.out_features, 4, generator=g) * 0.5)

    @property
    def weight(self) -> torch.Tensor:  # what such wrappers expose: the base weight, without the update
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.T) @ self.b.T


def test_a_module_replaced_after_the_decoder_was_built_runs() -> None:
    target, draft = _models()
    dec = _decoder(target, draft)
    mlp = target.model.layers[1].mlp
    mlp.down_proj = _Lora(mlp.down_proj)
    assert _same_as_generate(dec, target)


def test_another_attention_after_the_decoder_was_built_is_kept() -> None:
    target, draft = _models()
    dec = _decoder(target, draft)
    target.set_attn_implementation("eager")
    assert _same_as_generate(dec, target)
    assert target.config._attn_implementation == "eager"


def test_a_cast_after_the_decoder_was_built_is_seen() -> None:
    target, draft = _models()
    dec = _decoder(target, draft)
    target.to(torch.float64)
    assert _same_as_generate(dec, target)
    assert dec.target.dtype == torch.float64


def test_a_users_own_sdpa_is_not_replaced() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    target, draft = _models()
    dec = _decoder(target, draft)
    calls = []

    def mine(module, query, key, value, mask, **kwargs):  # noqa: ANN001, ANN003, ANN202
        calls.append(1)
        out, w = sdpa_attention_forward(module, query, key, value, mask, **kwargs)
        return out * 1.5, w

    AttentionInterface.register("sdpa", mine)
    try:
        assert _same_as_generate(dec, target)
        n_generate = len(calls)
        calls.clear()
        dec.generate(torch.tensor([PROMPTS[0]]), do_sample=False, max_new_tokens=N_NEW)
        assert calls and n_generate
    finally:
        AttentionInterface.register("sdpa", sdpa_attention_forward)


def test_training_mode_dropout_is_refused() -> None:
    target, draft = _models()
    dec = _decoder(target, draft)
    ids = torch.tensor([PROMPTS[0]])
    target.train()  # no dropout configured: the logits are the eval-mode ones
    assert _same_as_generate(dec, target)
    target.config.attention_dropout = 0.1
    with pytest.raises(ValueError, match="training mode with dropout.*model.eval"):
        dec.generate(ids, do_sample=False, max_new_tokens=2)
    target.eval()
    assert _same_as_generate(dec, target)


def test_a_target_with_int8_weights_is_refused() -> None:
    target, draft = _models()
    draft.lm_head = target.lm_head  # a draft sharing the target's head, as EAGLE-style drafts do
    specdec.int8_weights(draft)
    with pytest.raises(ValueError, match="target: 1 linear.*int8 weights"):
        specdec.generate(target, draft, torch.tensor([PROMPTS[0]]), method="sd", do_sample=False, max_new_tokens=2)


def test_an_acceptance_heads_round_lengths_are_the_latest_calls() -> None:
    target, draft = _models()
    dec = SpeculativeDecoder(target, draft, method="specdec_pp", head=lambda h: torch.full(h.shape[:-1], 0.9))
    ids = torch.tensor([PROMPTS[0]])
    dec.generate(ids, do_sample=False, max_new_tokens=N_NEW)
    first = list(dec.builder.stop_rule.round_lengths)
    dec.generate(ids, do_sample=False, max_new_tokens=N_NEW)
    assert dec.builder.stop_rule.round_lengths == first and 0 < len(first) <= dec.last_stats.target_calls


def test_the_rotary_table_follows_the_modules_scaling() -> None:
    target, _ = _models()
    rotary = target.model.rotary_emb
    h = torch.zeros((1, 3, 64))
    pos = torch.arange(3)[None]
    before = rotary_rows(rotary, pos, h)[0]
    rotary.attention_scaling = 0.5
    after = rotary_rows(rotary, pos, h)[0]
    assert torch.equal(after, rotary(h, pos)[0]) and not torch.equal(after, before)


def test_refresh_builds_again_only_after_a_change() -> None:
    target, _ = _models()
    lm = HFCausalLM(target, name="target")
    assert not lm.refresh()
    target.model.layers[0].register_forward_pre_hook(lambda m, a: None)
    assert lm.refresh() and not lm.refresh()
