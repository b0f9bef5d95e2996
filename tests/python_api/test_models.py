"""HF adapter: tree forwards equal path-by-path forwards, KV filtering equals a from-scratch run."""

from __future__ import annotations

import pytest
import torch
from specdec.models import HFCausalLM, cache_argument
from specdec.tree import DraftTree
from tiny_models import tiny_llama

# Two rows with different prompt lengths and different trees laid out level by level as the decoders do
# (docs/kernels.md): each level is a block of columns, row 1 has fewer nodes and padding at the end of each block.
PROMPTS = [[3, 17, 5, 9, 21], [11, 2, 30]]
LEVEL_PARENTS = [
    [[0, 0, 0], [1, 1, 2, 3, 3], [4, 5, 6, 7], [9, 9]],
    [[0, 0], [1, 1, 2], [4, 5, 6], [9, 10]],
]


def _trees(seed: int = 0) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    tree = DraftTree.from_roots(torch.tensor([p[-1] for p in PROMPTS]))
    for level in range(len(LEVEL_PARENTS[0])):
        width = max(len(rows[level]) for rows in LEVEL_PARENTS)
        parent = torch.zeros((2, width), dtype=torch.long)
        valid = torch.zeros((2, width), dtype=torch.bool)
        for b, rows in enumerate(LEVEL_PARENTS):
            parent[b, : len(rows[level])] = torch.tensor(rows[level])
            valid[b, : len(rows[level])] = True
        tree.append_level(torch.randint(0, 32, (2, width), generator=g), parent, valid)
    return tree


@torch.no_grad()
def _path_logits(model, seq: list[int]) -> torch.Tensor:
    return model(torch.tensor([seq])).logits[0, -1].float()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_forward_equals_path_forwards(attn: str) -> None:
    model = tiny_llama(0, attn=attn)
    lm = HFCausalLM(model)
    tree = _trees()
    with torch.inference_mode():
        state = lm.new_state(2)
        lm.forward_chain(state, [p[:-1] for p in PROMPTS], last_logits=False)
        logits = lm.forward_tree(state, tree.tokens, tree.parent, tree.valid, tree.depth)
    worst = 0.0
    for b in range(2):
        for n in tree.valid[b].nonzero().squeeze(1).tolist():
            ref = _path_logits(model, PROMPTS[b] + tree.path_tokens(b, n))
            worst = max(worst, float((logits[b, n] - ref).abs().max()))
    assert worst <= 1e-4, f"tree forward differs from path forwards by {worst:.2e} ({attn})"


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_level_forwards_equal_path_forwards(attn: str) -> None:
    """Draft-style drafting: root cached first, then one forward per level."""
    model = tiny_llama(1, attn=attn)
    lm = HFCausalLM(model)
    tree = _trees(1)
    with torch.inference_mode():
        state = lm.new_state(2)
        lm.forward_chain(state, PROMPTS, last_logits=True)
        base = state.length
        got = torch.zeros((2, tree.size, 32))
        for lo, hi in tree.levels[1:]:
            got[:, lo:hi] = lm.forward_level(state, tree.tokens, tree.parent, tree.valid, tree.depth, lo, hi, base)
    worst = 0.0
    for b in range(2):
        for n in tree.valid[b].nonzero().squeeze(1).tolist()[1:]:
            ref = _path_logits(model, PROMPTS[b] + tree.path_tokens(b, n))
            worst = max(worst, float((got[b, n] - ref).abs().max()))
    assert worst <= 1e-4, f"level forwards differ from path forwards by {worst:.2e} ({attn})"


@pytest.mark.parametrize("split", [False, True])
def test_keep_path_equals_from_scratch_run(split: bool) -> None:
    """KVState.keep after a tree forward; ``split``: an earlier round committed 2 / 0 tokens, so this round's chain
    moves to the rows' own ends (row 1, with nothing cached, into slot 0) before the path does."""
    model = tiny_llama(2)
    lm = HFCausalLM(model)
    tree = _trees(2)
    tokens = tree.tokens
    # Row 0 keeps the path 0 -> 1 -> 4 -> 9 -> 13, row 1 keeps 0 -> 2 -> 6 (ids in the padded layout).
    accepted = torch.tensor([[1, 4, 9, 13], [2, 6, -1, -1]])
    n_acc = torch.tensor([4, 2])
    nxt = [7, 19]
    zeros = torch.zeros(2, dtype=torch.long)
    with torch.inference_mode():
        state = lm.new_state(2)
        chains = [p[:-1] for p in PROMPTS]
        if split:
            first = [chains[0][:2], []]
            lm.forward_chain(state, first, last_logits=False)
            state.keep(zeros, torch.tensor([len(c) for c in first]), torch.zeros((2, 0), dtype=torch.long), zeros)
            assert state.length == 2 and state.n_cached.tolist() == [2, 0]
            chains = [chains[0][2:], chains[1]]
        chain_at = state.length
        lm.forward_chain(state, chains, last_logits=False)
        lm.forward_tree(state, tokens, tree.parent, tree.valid, tree.depth)
        root_slot = state.length - tokens.shape[1]
        path = root_slot + torch.nn.functional.pad(accepted, (1, 0))  # slots of [root, accepted nodes]
        state.keep(zeros + chain_at, torch.tensor([len(c) for c in chains]), path, 1 + n_acc)
        # each row is left-packed: slots [0, n_cached) and nothing past the longest row
        want = [len(p) + int(m) for p, m in zip(PROMPTS, n_acc, strict=True)]
        assert state.n_cached.tolist() == want and state.length == max(want)
        assert torch.equal(state.valid, torch.arange(max(want))[None, :] < torch.tensor(want)[:, None])
        after = lm.forward_chain(state, [[t] for t in nxt], last_logits=True)
        # The same sequences from scratch, one row at a time, with a plain HF cache.
        for b in range(2):
            seq = PROMPTS[b] + [int(tokens[b, n]) for n in accepted[b, : n_acc[b]]]
            out = model(torch.tensor([seq]), use_cache=True)
            past = getattr(out, "cache", None) or out.past_key_values  # renamed in newer transformers
            ref = model(torch.tensor([[nxt[b]]]), **{cache_argument(model): past}).logits[0, -1]
            assert float((after[b] - ref).abs().max()) <= 1e-4
            # Filtered cache: the row's valid slots hold exactly the sequential cache (both now end with nxt).
            slots = state.valid[b].nonzero().squeeze(1)
            for layer, ref_layer in zip(state.cache.layers, out.past_key_values.layers, strict=True):
                k = layer.keys[b][:, slots]
                v = layer.values[b][:, slots]
                assert float((k - ref_layer.keys[0]).abs().max()) <= 1e-5
                assert float((v - ref_layer.values[0]).abs().max()) <= 1e-5


def test_unsupported_architecture_is_rejected() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=32, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        HFCausalLM(transformers.GPT2LMHeadModel(cfg))


def test_attention_without_custom_masks_is_rejected() -> None:
    model = tiny_llama(0)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation 'flash_attention_2' cannot take a custom tree mask"):
        HFCausalLM(model, name="target")


def test_not_a_model_is_rejected() -> None:
    with pytest.raises(TypeError, match="target must be a HuggingFace causal LM"):
        HFCausalLM(object(), name="target")


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_chain_mask_follows_the_definition(monkeypatch, backend: str):
    """chain_mask: token j of a row sees the row's valid past and its chain tokens 0..j; a padding token (past the
    row's chain) sees only itself. Also with the torch reference of tree_mask."""
    from specdec.models import chain_mask

    monkeypatch.setenv("SPECDEC_BACKEND", backend)
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        low = torch.finfo(dtype).min
        for _ in range(100):
            b, s, n = (int(torch.randint(lo, hi, (), generator=g)) for lo, hi in ((1, 4), (0, 6), (1, 5)))
            past = torch.rand(b, s, generator=g) < 0.7
            lens = torch.randint(0, n + 1, (b,), generator=g)
            lens[0] = n
            block = torch.arange(n)[None] < lens[:, None]
            want = torch.full((b, 1, n, s + n), low, dtype=dtype)
            for r in range(b):
                for j in range(n):
                    if j < int(lens[r]):
                        want[r, 0, j, :s][past[r]] = 0
                        want[r, 0, j, s : s + j + 1] = 0
                    else:
                        want[r, 0, j, s + j] = 0
            assert torch.equal(chain_mask(past, block, dtype), want)


def test_crop_cache_matches_dynamic_cache_crop():
    """crop_cache (one in-place kernel call for plain CPU layers) leaves every layer exactly as DynamicCache.crop
    does, keeps working for the next forward's append, and falls back to crop() when the kernel cannot be used."""
    from specdec.models import crop_cache
    from transformers import DynamicCache

    model = tiny_llama(seed=0)
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    caches = [DynamicCache(config=cfg), DynamicCache(config=cfg)]
    with torch.no_grad():
        for c in caches:
            model(input_ids=ids, use_cache=True, **{cache_argument(model): c})
        crop_cache(caches[0], 4)
        caches[1].crop(-4)
        for a, b in zip(caches[0].layers, caches[1].layers, strict=True):
            assert a.keys.shape == b.keys.shape == (2, cfg.num_key_value_heads, 5, a.keys.shape[-1])
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        assert caches[0].get_seq_length() == 5
        crop_cache(caches[0], 0)  # nothing to drop
        assert caches[0].get_seq_length() == 5
        more = ids[:, :3]
        pos = torch.arange(5, 8)[None].expand(2, -1)
        outs = [
            model(input_ids=more, position_ids=pos, use_cache=True, **{cache_argument(model): c}).logits for c in caches
        ]
        assert torch.equal(outs[0], outs[1])
    # the fallback: a cache whose layers are not all initialised is cropped by DynamicCache.crop
    empty = DynamicCache(config=cfg)
    crop_cache(empty, 3)
    assert empty.get_seq_length() == 0


def test_crop_slots_rejects_bad_lengths():
    from specdec_kernels.native import HAVE_CPU, crop_slots

    if not HAVE_CPU:
        pytest.skip("C++ extension not built")
    kv = [torch.zeros(1, 2, 6, 4)]
    with pytest.raises(ValueError, match="length must be in"):
        crop_slots(kv, 7)
    with pytest.raises(ValueError, match="length must be in"):
        crop_slots(kv, -1)
    for bad in (2.9, True, "2"):
        with pytest.raises(ValueError, match="length must be an int"):
            crop_slots(kv, bad)
    with pytest.raises(ValueError, match=r"must be \[B, H, S, D\]"):
        crop_slots([torch.zeros(6, 4)], 2)
    assert kv[0].shape == (1, 2, 6, 4)
    # no kernel for other devices: nothing changes and the caller falls back to slicing
    meta = [torch.zeros(1, 2, 6, 4), torch.zeros(1, 2, 6, 4, device="meta")]
    assert crop_slots(meta, 3) is False
    assert [t.shape[2] for t in meta] == [6, 6]
    assert crop_slots(kv, 2) is True and kv[0].shape == (1, 2, 2, 4)


def test_generate_leaves_the_users_model_untouched() -> None:
    """After the adapter's forwards (target and draft), the user's models carry no instance forward, name their own
    attention, HF's attention registry holds the same "sdpa" function, and their outputs are bitwise those of a
    fresh copy."""
    import copy

    import specdec
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    target = tiny_llama(1, vocab=32, hidden=64, heads=4, kv_heads=2, dtype=torch.bfloat16)
    draft = tiny_llama(2, vocab=32, hidden=64, heads=4, kv_heads=2, dtype=torch.bfloat16)
    fresh = copy.deepcopy(target)
    ids = torch.tensor([[3, 4, 5, 6]])
    specdec.generate(target, draft, ids, method="sd", draft_length=3, max_new_tokens=12, do_sample=False)
    for model in (target, draft):
        assert not any("forward" in m.__dict__ for m in model.modules())
        assert model.config._attn_implementation == "sdpa"
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa
    longer = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 1, 2]])
    with torch.no_grad():
        for x in (ids, longer):
            assert torch.equal(target(x).logits, fresh(x).logits)
        assert torch.equal(
            target.generate(longer, max_new_tokens=6, do_sample=False),
            fresh.generate(longer, max_new_tokens=6, do_sample=False),
        )


def test_a_model_split_by_device_map_is_refused_up_front() -> None:
    model = tiny_llama(1, vocab=32)
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers": 1, "lm_head": "cpu"}
    with pytest.raises(ValueError, match=r"split over devices by device_map \(0, 1, cpu\)"):
        HFCausalLM(model, name="target")
    model.hf_device_map = {"": "cpu"}  # one device: accepted
    HFCausalLM(model, name="target")


def test_slot_cache_layers_hold_what_dynamic_layers_hold() -> None:
    """The adapter's cache layers (views of buffers with room to grow) hold bitwise what DynamicCache's concatenating
    layers hold through appends that outgrow the buffer, crops (kernel and slicing), row selection and slot moves."""
    from specdec.models import crop_cache, new_cache
    from transformers import DynamicCache

    from specdec_kernels import filter_kv

    g = torch.Generator().manual_seed(3)
    caches = [new_cache(), DynamicCache()]

    def append(n: int, batch: int = 2) -> None:
        k, v = torch.randn(2, batch, 3, n, 8, generator=g)
        for c in caches:
            out = c.update(k, v, 0)
            assert out[0].shape == (batch, 3, c.get_seq_length(), 8)

    def same() -> None:
        a, b = caches[0].layers[0], caches[1].layers[0]
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)

    append(100)
    slot = caches[0].layers[0]
    assert type(slot).__name__ == "SlotLayer" and slot.buffers[0].shape[2] > 100 and not slot.keys.is_contiguous()
    for n in (1, 5, 200, 3):  # 200 outgrows the first buffer: one copy into a larger one
        append(n)
        same()
    for c in caches:
        crop_cache(c, 7)
    same()
    caches[0].crop(-2), caches[1].crop(-2)
    append(4)
    same()
    for c in caches:  # move slots 300, 302 right after a prefix of 290, in place, on every layer tensor
        kv = [c.layers[0].keys, c.layers[0].values]
        filter_kv(kv, torch.tensor([290, 290]), torch.tensor([[11, 13], [12, -1]]), torch.tensor([2, 1]))
    same()
    for c in caches:
        c.batch_select_indices(torch.tensor([1]))
    append(6, batch=1)
    same()


def test_a_double_models_steps_give_its_own_forwards_logits() -> None:
    """HF's norms compute a float64 model in fp32: its decode steps keep the module's norms (the rms_norm op would
    compute them in fp64 and part from the model's own logits by ~1e-6)."""
    model = tiny_llama(1, vocab=48, std=0.2, dtype=torch.float64)
    lm = HFCausalLM(model, name="target")
    seq = [3, 17, 5, 9, 21, 4, 8]
    with torch.inference_mode():
        state = lm.new_state(1)
        lm.forward_chain(state, [seq[:4]], last_logits=False)
        for i in range(4, len(seq)):
            step = lm.forward_chain(state, [[seq[i]]], last_logits=True)[0]
            full = model(torch.tensor([seq[: i + 1]])).logits[0, -1]
            torch.testing.assert_close(step, full, rtol=0, atol=1e-12)
