"""specdec.int8_weights: a model's linears with int8 weights. The weights become their dequantized values in place,
the decode-step calls run skinny_linear_int8 on the int8 matrices (the feature draft's fused matrices included), a
weight edited afterwards is refused, and an int8 draft keeps the target's law and greedy tokens."""

from __future__ import annotations

import pytest
import specdec
import torch
from specdec import models
from specdec.drafters.networks.feature_draft import FeatureDraft, FeatureDraftConfig, _fused
from test_feature_draft import feature_draft
from test_train_specdec_pp import PROMPTS, TEMPERATURE, VOCAB, assert_first_two_law
from tiny_models import assert_target_greedy, left_pad, noisy_copy, tiny_llama

import specdec_kernels as sk


def test_weights_become_their_dequantized_values_and_decode_calls_run_int8():
    model = tiny_llama(0, vocab=32, hidden=32)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.dim() == 2}
    assert specdec.int8_weights(model) is model
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears
    for name, p in model.named_parameters():
        if name not in before:
            continue
        if not any(p is m.weight for m in linears):
            assert torch.equal(p, before[name])  # the embedding table is not a linear: untouched
            continue
        q, s = sk.quantize_int8(before[name])
        assert torch.equal(p, q.float() * s[:, None])
        assert float((p.detach() - before[name]).abs().max()) <= float(s.max()) / 2 * (1 + 1e-5)
    x = torch.randn(3, 32)
    w = model.lm_head.weight
    q, s, _ = getattr(w, models.INT8_ATTR)
    with torch.no_grad(), models.skinny_linears():
        got = models.decode_linear(x, w)
    assert torch.equal(got, sk.skinny_linear_int8(x, q, s))


def test_feature_draft_fused_matrices_carry_int8_and_the_lean_path_matches_the_module():
    target = tiny_llama(1, vocab=32, hidden=32, std=0.3)
    torch.manual_seed(0)
    cfg = FeatureDraftConfig(num_layers=1, intermediate_size=48, num_heads=4, num_kv_heads=2, head_vocab=32)
    draft = FeatureDraft(cfg, target.config, target.get_input_embeddings().weight, torch.arange(32)).eval()
    for p in draft.parameters():
        torch.nn.init.normal_(p, 0.0, 0.3)
    specdec.int8_weights(draft)
    layer = draft.decoder.llama.layers[0]
    qkv, gate_up = _fused(layer)
    attn = layer.self_attn
    q_parts = [getattr(m.weight, models.INT8_ATTR)[0] for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
    assert torch.equal(getattr(qkv, models.INT8_ATTR)[0], torch.cat(q_parts))
    assert getattr(gate_up, models.INT8_ATTR) is not None
    assert getattr(draft.lm_head.reduced_weight, models.INT8_ATTR) is not None
    # one draft step through the driver (lean path, int8 kernels) against the HF module on the dequantized weights
    from transformers import DynamicCache

    feats, ids = torch.randn(1, 4, 32), torch.randint(0, 32, (1, 4))
    mask = torch.zeros(1, 1, 4, 4)
    mask[..., torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)] = float("-inf")
    pos = torch.arange(4)[None]
    kw = {"attention_mask": mask, "position_ids": pos, "use_cache": True}
    with torch.no_grad(), models.skinny_linears():
        dec = draft.decoder
        lean = dec(ids, features=feats, cache=DynamicCache(config=draft.config), **kw).last_hidden_state
        hf = dec.llama(inputs_embeds=dec.pair(feats, ids), cache=DynamicCache(config=draft.config), **kw)
    torch.testing.assert_close(lean, hf.last_hidden_state, atol=1e-4, rtol=1e-4)


def test_plain_draft_input_projection_runs_the_decode_kernels_and_keeps_autograd():
    from specdec.train.draft import ProjectedEmbedding

    torch.manual_seed(0)
    table = torch.randn(32, 24)
    emb = ProjectedEmbedding(table, 16)
    ids = torch.tensor([[3, 5, 31]])
    ref = table[ids] @ emb.proj.weight.T
    # training: the projection's gradient flows as through nn.Linear
    emb(ids).sum().backward()
    assert emb.proj.weight.grad is not None
    torch.testing.assert_close(emb.proj.weight.grad, table[ids].sum((0, 1))[None, :].expand(16, -1))
    specdec.int8_weights(emb)
    q, s, _ = getattr(emb.proj.weight, models.INT8_ATTR)
    with torch.no_grad(), models.skinny_linears():
        got = emb(ids)
    # a decode step's few rows: the int8 kernel on the packed matrix, as the head's rows
    assert torch.equal(got, sk.skinny_linear_int8(table[ids], q, s))
    torch.testing.assert_close(got, ref, atol=float(s.max()) * table.abs().sum(-1).max().item(), rtol=0)


def test_a_tensor_shared_with_another_model_keeps_its_values():
    """A weight the model shares (here: its head tied to another model's head) gets a new quantized Parameter; the
    shared tensor, and so the other model, stays as it was."""
    other = tiny_llama(0, vocab=32, hidden=32)
    model = tiny_llama(1, vocab=32, hidden=32)
    model.lm_head.weight = other.lm_head.weight
    before = other.lm_head.weight.detach().clone()
    specdec.int8_weights(model)
    assert torch.equal(other.lm_head.weight, before)
    assert getattr(other.lm_head.weight, models.INT8_ATTR, None) is None
    assert model.lm_head.weight is not other.lm_head.weight
    q, s = sk.quantize_int8(before)
    assert torch.equal(model.lm_head.weight, q.float() * s[:, None])


def test_a_weight_edited_after_quantization_is_refused():
    model = tiny_llama(0, vocab=32, hidden=32)
    specdec.int8_weights(model)
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    with torch.no_grad(), models.skinny_linears(), pytest.raises(RuntimeError, match="changed or moved"):
        models.decode_linear(torch.randn(1, 32), model.lm_head.weight)
    specdec.int8_weights(model)  # quantized again: accepted
    with torch.no_grad(), models.skinny_linears():
        assert models.decode_linear(torch.randn(1, 32), model.lm_head.weight).shape == (1, 32)


@pytest.mark.parametrize(("method", "kw"), [("sd", {"draft_length": 3}), ("rsd_c", {"branching": (2, 2, 1)})])
def test_int8_draft_keeps_the_target_law(method, kw):
    target = tiny_llama(0, vocab=VOCAB, hidden=32, std=0.3)
    draft = specdec.int8_weights(feature_draft(target, [0, 1, 2, 4, 5, 7], seed=1))
    dec = specdec.SpeculativeDecoder(target, draft, method=method, **kw)
    n = 3000
    ids, mask = left_pad([PROMPTS[i % 2] for i in range(2 * n)])
    out = dec.generate(ids, mask, max_new_tokens=4, do_sample=True, temperature=TEMPERATURE, seed=13)
    assert dec.last_stats is not None and dec.last_stats.block_efficiency > 1.0  # drafts were accepted
    assert_first_two_law(target, out.new_tokens)


# fixed shapes: branching="auto" may rightly find that no tree pays for a model this small on a given machine
@pytest.mark.parametrize(
    ("method", "kw"), [("sd", {}), ("rsd_c", {"branching": (2, 2, 1)}), ("spechub", {"branching": (2, 1)})]
)
def test_int8_plain_draft_greedy_equals_target_greedy(method, kw):
    target = tiny_llama(0, vocab=32, hidden=64)
    draft = specdec.int8_weights(noisy_copy(target, seed=1, scale=0.3))
    g = torch.Generator().manual_seed(0)
    prompts = [[int(t) for t in torch.randint(0, 32, (int(n),), generator=g)] for n in (3, 1, 6, 4)]
    ids, mask = left_pad(prompts)
    out = specdec.generate(target, draft, ids, attention_mask=mask, method=method, max_new_tokens=10, seed=0, **kw)
    assert out.stats is not None and out.stats.block_efficiency > 1.0
    assert_target_greedy(target, prompts, out.new_tokens, 10)
