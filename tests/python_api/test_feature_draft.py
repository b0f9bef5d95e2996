"""The feature draft (EAGLE-style, specdec.train.FeatureDraft driven by specdec.FeatureDrafter) on tiny models.

* wiring: every proposal the driver gets equals an offline teacher-forced recomputation (target hidden states of
  the committed prefix paired with the next tokens; deeper levels read the draft's own output for the parent), so
  the drafter reads the right features at the right positions (a wiring bug would stay exact but lose acceptance);
* law: the joint law of the first two generated tokens is the target's, chi-square p >= 1e-4
  (false-alarm rate 1e-4 per check, fixed seeds) and TV <= 0.08, for SD and RSD-C with a reduced head (p = 0 on
  two of eight tokens);
* greedy output equals target greedy for every drafting family, batch > 1 with a one-token prompt;
* bad inputs get clear errors.
"""

from __future__ import annotations

import pytest
import specdec
import torch
from specdec.drafters import FeatureDrafter
from specdec.models import cache_argument, layer_features
from specdec.train.feature_draft import FeatureDraft, FeatureDraftConfig
from test_train_specdec_pp import PROMPTS, TEMPERATURE, VOCAB, assert_first_two_law, random_head
from tiny_models import assert_target_greedy, left_pad, tiny_llama


def feature_draft(target, head_ids: list[int], seed: int, std: float = 0.5, extra: tuple = ()) -> FeatureDraft:
    torch.manual_seed(seed)
    cfg = FeatureDraftConfig(
        num_layers=1, intermediate_size=64, num_heads=2, num_kv_heads=1, head_vocab=len(head_ids), extra_layers=extra
    )
    draft = FeatureDraft(cfg, target.config, target.get_input_embeddings().weight, torch.tensor(head_ids))
    with torch.no_grad():
        draft.lm_head.reduced_weight.normal_(0, std)  # a non-flat draft law
        draft.decoder.pair.proj.weight.normal_(0, 0.2)
        if draft.decoder.pair.fuse is not None:
            draft.decoder.pair.fuse.weight.normal_(0, 0.2)
    return draft.eval()


class RecordingDrafter(FeatureDrafter):
    """Keeps (committed tokens, root logits, level logits of depth-1 nodes with their tokens) of every round."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.rounds: list[dict] = []

    def propose_root(self, committed):
        out = super().propose_root(committed)
        self.rounds.append(
            {"committed": [list(c) for c in committed], "root": out.dense(self.vocab_size)[:, 0].clone()}
        )
        return out

    def propose_level(self, tree, lo, hi):
        out = super().propose_level(tree, lo, hi)
        if lo == 1:
            self.rounds[-1]["level1"] = (
                tree.tokens[:, lo:hi].clone(),
                tree.valid[:, lo:hi].clone(),
                out.dense(self.vocab_size),
            )
        return out


@torch.no_grad()
def offline(target, draft, seq: list[int], children: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Root logits after ``seq`` and the logits after each depth-1 child, by full teacher-forced passes."""
    out = target.model(input_ids=torch.tensor([seq]), output_hidden_states=True)
    feats = out.last_hidden_state  # f_0 .. f_{n}
    if draft.feature_layers:  # [final ; inputs of the extra layers]
        feats = torch.cat([feats, layer_features(target.model, out.hidden_states, draft.feature_layers)], dim=-1)
    tokens = torch.tensor([seq[1:]])
    hidden, logits = draft(feats[:, : len(seq) - 1], tokens)
    root = logits[0, -1]
    kids = []
    for c in children:  # pair (draft output at the root pair, child token) after the committed pairs
        own = draft.decoder.pair.fused(feats[:, : len(seq) - 1])  # target pairs (fused), then the draft's output
        h2, lg2 = draft(torch.cat([own, hidden[:, -1:]], 1), torch.tensor([seq[1:] + [c]]))
        kids.append(lg2[0, -1])
    return root, torch.stack(kids) if kids else torch.zeros(0)


@pytest.mark.parametrize(("method", "extra"), [("sd", ()), ("rsd_c", ()), ("rsd_c", (0, 1))])
def test_proposals_equal_teacher_forced_recomputation(method, extra):
    target = tiny_llama(0, vocab=32, hidden=32, std=0.3)
    draft = feature_draft(target, list(range(32)), seed=3, extra=extra)
    drafter = RecordingDrafter(draft)
    prompts = [[3, 1, 4, 1, 5], [2, 7], [9]]
    ids, mask = left_pad(prompts)
    kw = {"draft_length": 3} if method == "sd" else {"branching": (2, 2)}
    specdec.generate(target, drafter, ids, attention_mask=mask, method=method, max_new_tokens=12, seed=5, **kw)
    assert len(drafter.rounds) >= 3
    checked = 0
    for rnd in drafter.rounds:
        rows = [c for c in rnd["committed"]]
        for b, seq in enumerate(rows):
            if len(seq) < 2:
                continue  # nothing to pair yet: no proposal
            kids: list[int] = []
            if "level1" in rnd:
                tok, val, _ = rnd["level1"]
                kids = [int(t) for t, v in zip(tok[b], val[b], strict=True) if v]
            root, kid_logits = offline(target, draft, seq, kids)
            torch.testing.assert_close(rnd["root"][b], root, atol=1e-4, rtol=1e-4)
            if kids:
                tok, val, lg = rnd["level1"]
                torch.testing.assert_close(lg[b][val[b]], kid_logits, atol=1e-4, rtol=1e-4)
            checked += 1
    assert checked >= 6


@pytest.mark.parametrize(("method", "kw"), [("sd", {"draft_length": 3}), ("rsd_c", {"branching": (2, 2, 1)})])
def test_feature_draft_keeps_the_target_law(method, kw):
    target = tiny_llama(0, vocab=VOCAB, hidden=32, std=0.3)
    draft = feature_draft(target, [0, 1, 2, 4, 5, 7], seed=1)
    dec = specdec.SpeculativeDecoder(target, draft, method=method, **kw)
    assert isinstance(dec.drafter, FeatureDrafter)
    n = 3000
    ids, mask = left_pad([PROMPTS[i % 2] for i in range(2 * n)])
    out = dec.generate(ids, mask, max_new_tokens=4, do_sample=True, temperature=TEMPERATURE, seed=13)
    assert dec.last_stats is not None and dec.last_stats.block_efficiency > 1.0  # drafts were accepted
    assert_first_two_law(target, out.new_tokens)


@pytest.mark.parametrize(
    ("method", "kw"),
    [
        ("sd", {"draft_length": 4}),
        ("rsd_c", {"branching": (2, 2, 1)}),
        ("rsd_s", {"beam_width": 2, "draft_length": 3}),
        ("spechub", {"branching": (2, 1)}),
        ("spectr", {"num_chains": 2, "draft_length": 2}),
    ],
)
def test_feature_draft_greedy_equals_target_greedy(method, kw):
    target = tiny_llama(0, vocab=32, hidden=64)
    draft = feature_draft(target, list(range(0, 32, 2)) + [1, 3, 5], seed=4, extra=(1,) if method == "rsd_c" else ())
    g = torch.Generator().manual_seed(0)
    prompts = [[int(t) for t in torch.randint(0, 32, (int(n),), generator=g)] for n in (3, 1, 6, 4)]
    ids, mask = left_pad(prompts)
    out = specdec.generate(
        target, draft, ids, attention_mask=mask, method=method, max_new_tokens=20, do_sample=False, **kw
    )
    assert_target_greedy(target, prompts, out.new_tokens, 20)


@pytest.mark.parametrize(("method", "kw"), [("specdec_pp", {"draft_length": 4}), ("rsd_c", {"branching": (2, 2, 1)})])
def test_feature_draft_with_a_head_keeps_the_target_law(method, kw):
    target = tiny_llama(0, vocab=VOCAB, hidden=32, std=0.3)
    draft = feature_draft(target, [0, 1, 2, 4, 5, 7], seed=1)
    dec = specdec.SpeculativeDecoder(target, draft, method=method, head=random_head(32, 3), threshold=0.4, **kw)
    assert isinstance(dec.drafter, FeatureDrafter)
    n = 3000
    ids, mask = left_pad([PROMPTS[i % 2] for i in range(2 * n)])
    out = dec.generate(ids, mask, max_new_tokens=4, do_sample=True, temperature=TEMPERATURE, seed=17)
    lengths = [x for r in dec.builder.stop_rule.round_lengths for x in r]
    assert min(lengths) < max(lengths)  # the head did stop some rows earlier than others
    assert_first_two_law(target, out.new_tokens)


def test_feature_draft_with_a_head_greedy_equals_target_greedy():
    target = tiny_llama(0, vocab=32, hidden=64)
    draft = feature_draft(target, list(range(0, 32, 2)) + [1, 3, 5], seed=4)
    g = torch.Generator().manual_seed(0)
    prompts = [[int(t) for t in torch.randint(0, 32, (int(n),), generator=g)] for n in (3, 1, 6, 4)]
    ids, mask = left_pad(prompts)
    out = specdec.generate(
        target, draft, ids, attention_mask=mask, method="specdec_pp", head=random_head(64, 5), threshold=0.6,
        draft_length=5, max_new_tokens=20, do_sample=False,
    )  # fmt: skip
    assert_target_greedy(target, prompts, out.new_tokens, 20)


def test_rollout_labels_are_the_acceptance_probabilities_of_the_drafted_nodes():
    """specdec.train.feature_head: each first drafted node's label is min(1, q/p) of its token, with q the target's
    and p the draft's law after the committed prefix, recomputed here by full teacher-forced passes; its feature is
    the draft's hidden state of that node."""
    from specdec.train.feature_head import _LabellingDecoder

    target = tiny_llama(0, vocab=32, hidden=32, std=0.3)
    draft = feature_draft(target, list(range(0, 32, 2)) + [1, 3, 5], seed=3)
    drafter = RecordingDrafter(draft)
    dec = _LabellingDecoder(target, drafter, method="sd", draft_length=3)
    chunks = []

    def labelled(tree, *args):  # the label chunks of this round, level by level
        n = len(dec.labels)
        levels = list(dec.recorder.hidden)
        out = _LabellingDecoder._verify_tree(dec, tree, *args)
        chunks.append((levels, dec.features[n:], dec.labels[n:]))
        return out

    dec._verify_tree = labelled
    dec.generate(torch.tensor([[3, 1, 4, 1, 5]]), max_new_tokens=16, do_sample=True, temperature=1.0, top_k=0, seed=2)
    checked = 0
    for rnd, (levels, feats, labels) in zip(drafter.rounds, chunks, strict=True):
        if "level1" not in rnd:
            continue
        assert levels[0] == 1 and labels[0].shape == (1,) and feats[0].shape == (1, 32)
        seq, y = rnd["committed"][0], int(rnd["level1"][0][0, 0])
        with torch.no_grad():
            q = torch.softmax(target(torch.tensor([seq])).logits[0, -1].float(), -1)[y]
        p = torch.softmax(rnd["root"][0].float(), -1)[y]
        assert 0.0 <= float(labels[0]) <= 1.0
        torch.testing.assert_close(labels[0], (q / p).clamp(max=1.0)[None], atol=1e-4, rtol=1e-4)
        checked += 1
    assert checked >= 3
    assert len(dec.features) == len(dec.labels) and sum(len(x) for x in dec.labels) >= 2 * checked


def test_feature_draft_bad_inputs():
    target = tiny_llama(0, vocab=32, hidden=32)
    draft = feature_draft(target, list(range(32)), seed=2)
    with pytest.raises(ValueError, match="head= reads hidden states of width 16, but the draft's are 32"):
        specdec.SpeculativeDecoder(target, draft, method="specdec_pp", head=random_head(16, 1))
    with pytest.raises(ValueError, match="needs features="):
        draft.decoder(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="features must have shape"):
        draft.decoder(torch.tensor([[1, 2]]), features=torch.zeros(1, 3, 32))
    with pytest.raises(TypeError, match="not a feature draft"):
        FeatureDrafter(tiny_llama(1, vocab=32, hidden=32))
    other = tiny_llama(0, vocab=48, hidden=32)
    with pytest.raises(ValueError, match="vocabulary"):
        specdec.SpeculativeDecoder(other, draft, method="sd")
    wider = tiny_llama(0, vocab=32, hidden=64)
    with pytest.raises(ValueError, match="hidden states of width 32, but the target's hidden size is 64"):
        specdec.SpeculativeDecoder(wider, draft, method="sd")


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_lean_forward_equals_the_hf_stack(dtype, tol):
    """The driver's calls (additive 4-D mask, positions, cache) take FeatureDecoder's lean path; it must compute
    what HF's LlamaModel computes on the same inputs, cache contents included (2 layers, a tree-shaped mask)."""
    from transformers import DynamicCache

    target = tiny_llama(1, vocab=32, hidden=32, std=0.3)
    torch.manual_seed(0)
    cfg = FeatureDraftConfig(num_layers=2, intermediate_size=48, num_heads=4, num_kv_heads=2, head_vocab=32)
    draft = FeatureDraft(cfg, target.config, target.get_input_embeddings().weight, torch.arange(32)).to(dtype).eval()
    for p in draft.parameters():  # HF init leaves norms at 1 and projections small: perturb everything
        torch.nn.init.normal_(p, 0.0, 0.3)
    b, past, n = 2, 5, 3
    feats = torch.randn(b, past + n, 32, dtype=dtype)
    ids = torch.randint(0, 32, (b, past + n))
    # nodes: 0 <- past, 1 <- 0, 2 <- 0 (siblings); row 1 also masks its first past slot
    mask = torch.zeros(b, 1, n, past + n, dtype=dtype)
    mask[:, :, 0, past + 1 :] = float("-inf")
    mask[:, :, 1, past + 2] = float("-inf")
    mask[:, :, 2, past + 1] = float("-inf")
    mask[1, :, :, 0] = float("-inf")
    pos = torch.tensor([[5, 6, 6], [4, 5, 5]])
    outs = []
    with torch.no_grad():
        for lean in (True, False):
            cache = DynamicCache(config=draft.config)
            dec = draft.decoder
            dec(ids[:, :past], features=feats[:, :past], cache=cache, use_cache=True)  # causal prefill
            kw = {"attention_mask": mask, "position_ids": pos, "use_cache": True}
            if lean:
                h = dec(ids[:, past:], features=feats[:, past:], cache=cache, **kw).last_hidden_state
            else:  # the stack under the cache keyword of the installed transformers
                embeds = dec.pair(feats[:, past:], ids[:, past:])
                h = dec.llama(inputs_embeds=embeds, **kw, **{cache_argument(dec.llama): cache}).last_hidden_state
            outs.append((h.float(), [t.float() for t in (cache.layers[1].keys, cache.layers[1].values)]))
    (h_lean, kv_lean), (h_hf, kv_hf) = outs
    assert torch.isfinite(h_lean).all() and h_lean.abs().max() > 0.1
    torch.testing.assert_close(h_lean, h_hf, atol=tol, rtol=tol)
    for a, c in zip(kv_lean, kv_hf, strict=True):
        torch.testing.assert_close(a, c, atol=tol, rtol=tol)


def test_adapter_runs_the_feature_draft_without_its_module_call():
    """The adapter's forwards of a feature draft call FeatureDecoder.lean_call directly: the logits of a chain and a
    level are bitwise those of the module call, and a hook on the draft's decoder makes the adapter call the
    module (the hook fires)."""
    from specdec.models import HFCausalLM

    target = tiny_llama(1, vocab=32, hidden=32, std=0.3)
    torch.manual_seed(0)
    cfg = FeatureDraftConfig(num_layers=1, intermediate_size=48, num_heads=4, num_kv_heads=2, head_vocab=16)
    draft = FeatureDraft(cfg, target.config, target.get_input_embeddings().weight, torch.arange(0, 32, 2)).eval()
    for p in draft.parameters():
        torch.nn.init.normal_(p, 0.0, 0.3)
    calls: list[str] = []
    cls = type(draft.decoder)
    real_call, real_forward = cls.lean_call, cls.lean_forward

    def counted_call(self, *args):
        calls.append("call")
        return real_call(self, *args)

    def counted_forward(self, *args):
        calls.append("forward")
        return real_forward(self, *args)

    feats = torch.randn(1, 6, 32)
    tokens, parent = torch.tensor([[3, 5, 7]]), torch.tensor([[-1, 0, 0]])
    valid, depth = torch.ones((1, 3), dtype=torch.bool), torch.tensor([[0, 1, 1]])

    def run(lm: HFCausalLM) -> list[torch.Tensor]:
        with torch.no_grad():
            st = lm.new_state(1)
            out = [lm.forward_chain(st, [[4, 9, 2, 6]], last_logits=True, features=feats[:, :4], reduced=True)]
            base = st.length
            out.append(lm.forward_level(st, tokens, parent, valid, depth, 1, 3, base, features=feats[:, 4:6]))
        return out

    import unittest.mock as mock

    with mock.patch.object(cls, "lean_call", counted_call), mock.patch.object(cls, "lean_forward", counted_forward):
        lm = HFCausalLM(draft, name="draft")
        assert lm._lean_features
        direct = run(lm)
        assert calls == ["call", "forward"] * 2
        lm._lean_features = False
        called = run(lm)
        assert calls[4:] == ["forward"] * 2  # the module call takes its own lean path inside
        seen: list[int] = []
        handle = draft.decoder.register_forward_pre_hook(lambda *a: seen.append(1))
        lm._lean_features = True
        hooked = run(lm)
        handle.remove()
        head_seen: list[int] = []  # a hook on the (reduced) head: the adapter calls the head module
        handle = lm.head.register_forward_hook(lambda *a: head_seen.append(1))
        head_hooked = run(lm)
        handle.remove()
    assert seen == [1, 1] and head_seen == [1, 1]
    for a, b, c, d in zip(direct, called, hooked, head_hooked, strict=True):
        assert torch.isfinite(a[a > float("-inf")]).all()
        assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d)


def test_lean_fused_weights_follow_weight_edits():
    """The lean path's cached [q; k; v] and [gate; up] matrices are rebuilt after an in-place edit or a dtype move."""
    from specdec.drafters.networks.feature_draft import _fused

    target = tiny_llama(1, vocab=32, hidden=32, std=0.3)
    cfg = FeatureDraftConfig(num_layers=1, intermediate_size=48, num_heads=4, num_kv_heads=2, head_vocab=32)
    draft = FeatureDraft(cfg, target.config, target.get_input_embeddings().weight, torch.arange(32)).eval()
    layer = draft.decoder.llama.layers[0]
    qkv, _ = _fused(layer)
    with torch.no_grad():
        layer.self_attn.k_proj.weight.add_(1.0)
        layer.mlp.up_proj.weight.mul_(2.0)
    qkv2, gu2 = _fused(layer)
    nq, nkv = layer.self_attn.q_proj.weight.shape[0], layer.self_attn.k_proj.weight.shape[0]
    assert not torch.equal(qkv, qkv2)
    torch.testing.assert_close(qkv2[nq : nq + nkv], layer.self_attn.k_proj.weight, rtol=0, atol=0)
    torch.testing.assert_close(gu2[48:], layer.mlp.up_proj.weight, rtol=0, atol=0)
    draft.to(torch.bfloat16)
    assert _fused(layer)[0].dtype == torch.bfloat16


def test_rotary_rows_of_a_module_built_in_inference_mode():
    """A model built under torch.inference_mode has inference buffers (no version counter): the rotary rows are
    still gathered from the table, with the module's bits."""
    from specdec.models.fastpath.layers import _ROTARY_TABLES, rotary_rows

    with torch.inference_mode():
        target = tiny_llama(1, vocab=32, hidden=32, std=0.3)
    rotary = target.model.rotary_emb
    assert rotary.inv_freq.is_inference()
    h = torch.zeros(1, 3, 32)
    pos = torch.tensor([[4, 5, 900]])
    with torch.no_grad():
        got, want = rotary_rows(rotary, pos, h), rotary(h, pos)
    assert rotary in _ROTARY_TABLES and "_specdec_table" not in vars(rotary)  # cached beside the module
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_feature_draft_built_in_inference_mode_drafts():
    """A feature draft (and target) built under torch.inference_mode has inference weights without a version
    counter: the lean path's fused matrices are still made and cached, and a greedy generate runs and equals the
    target's greedy tokens."""
    from specdec.drafters.networks.feature_draft import _fused

    with torch.inference_mode():
        target = tiny_llama(0, vocab=32, hidden=64)
        draft = feature_draft(target, list(range(0, 32, 2)) + [1, 3, 5], seed=4)
    layer = draft.decoder.llama.layers[0]
    assert layer.self_attn.q_proj.weight.is_inference()
    assert _fused(layer)[0] is _fused(layer)[0]  # cached
    prompts = [[3, 5, 7, 1], [9, 2]]
    ids, mask = left_pad(prompts)
    out = specdec.generate(target, draft, ids, attention_mask=mask, method="sd", max_new_tokens=12, do_sample=False)
    assert_target_greedy(target, prompts, out.new_tokens, 12)


def test_lean_rope_table_has_the_modules_bits():
    """The lean path gathers cos/sin from a cached table; every row has the bits HF's rotary module computes for
    that position (the table grows past its first 1024 rows and follows a dtype change)."""
    from specdec.models import rotary_rows as _rope
    from specdec.models.fastpath.layers import _ROTARY_TABLES

    target = tiny_llama(1, vocab=32, hidden=32, std=0.3)
    cfg = FeatureDraftConfig(num_layers=1, intermediate_size=48, num_heads=4, num_kv_heads=2, head_vocab=32)
    rotary = FeatureDraft(cfg, target.config, target.get_input_embeddings().weight, torch.arange(32)).decoder.llama
    rotary = rotary.rotary_emb
    for dtype, pos in [
        (torch.float32, torch.tensor([[0, 5, 5], [7, 1023, 3]])),
        (torch.float32, torch.tensor([[2000, 4097, 1]])),
        (torch.bfloat16, torch.tensor([[9, 3000]])),
    ]:
        h = torch.zeros(1, dtype=dtype)
        got, want = _rope(rotary, pos, h), rotary(h, pos)
        for a, c in zip(got, want, strict=True):
            assert a.dtype == dtype and torch.equal(a, c)
    assert _ROTARY_TABLES[rotary][1].shape[0] == 4096  # rebuilt for bf16: the power of two above 3000
