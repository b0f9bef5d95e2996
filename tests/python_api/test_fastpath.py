"""The adapter's CPU fast path (specdec.models.fastpath): decode-sized linears, attention, fused layers and the
whole stack give the bits of the model's own modules where they are taken, only inside the adapter's forwards, and
``fast_path=False`` leaves every module alone."""

from __future__ import annotations

import pytest
import torch
from specdec.models import HFCausalLM
from tiny_models import noisy_copy, tiny_llama


def count_calls(monkeypatch, op: str, record) -> list:
    """Every call of ``op``'s implementation that the adapter makes (it calls implementations, resolved through
    ``specdec_kernels.implementation`` one by one or ``specdec_kernels.implementations`` as a table) appends
    ``record(*args)`` to the returned list."""
    import specdec_kernels as sk

    calls: list = []
    resolve, resolve_all = sk.implementation, sk.implementations

    def counted_fn(fn):
        def counted(*args):
            calls.append(record(*args))
            return fn(*args)

        return counted

    def implementation(name, backend="auto", device="cpu"):
        fn = resolve(name, backend, device)
        return counted_fn(fn) if name == op else fn

    def implementations(names, device="cpu"):
        table = dict(resolve_all(names, device))
        if op in table:
            table[op] = counted_fn(table[op])
        return table

    monkeypatch.setattr(sk, "implementation", implementation)
    monkeypatch.setattr(sk, "implementations", implementations)
    return calls


def test_routed_linears_take_skinny_linear_only_inside_the_adapter(monkeypatch) -> None:
    import specdec.models as models

    import specdec_kernels as sk
    from specdec_kernels import native

    model = tiny_llama(0, vocab=32, hidden=16)
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        before = model(torch.tensor([[3, 4, 5]])).logits
    real = sk.skinny_linear
    calls = count_calls(monkeypatch, "skinny_linear", lambda a, w: a.numel() // a.shape[-1])
    lm = HFCausalLM(model)
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert len(lm.routing.linears) == n_linear > 0  # every bias-free linear, routed only inside the adapter
    proj = model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        # outside the adapter's forwards: F.linear, the model as it was
        assert torch.equal(model(torch.tensor([[3, 4, 5]])).logits, before) and not calls
        with lm.routing.active():
            assert torch.equal(proj(x), real(x, proj.weight))  # 5 rows: skinny_linear
            assert calls == [5]
            big = torch.randn(models.DECODE_ROWS + 1, 16)
            assert torch.equal(proj(big), torch.nn.functional.linear(big, proj.weight)) and calls == [5]
        state = lm.new_state(1)
        lm.forward_chain(state, [[3, 4, 5]], last_logits=True)
        assert calls[1:] == [3] * (n_linear - 1) + [1]  # every projection on 3 rows, then the head on the last
    # bf16 beyond DECODE_ROWS: skinny_linear only where it runs its AVX2 tiles (no bf16 dot products in the CPU)
    n = len(calls)
    with torch.no_grad():
        models.decode_linear(torch.randn(models.DECODE_ROWS + 1, 16).bfloat16(), proj.weight.bfloat16())
    assert (len(calls) > n) == (native.skinny_linear_isa() == "avx2")
    n = len(calls)
    with torch.no_grad(), lm.routing.active(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert proj(x).dtype == torch.bfloat16 and len(calls) == n  # autocast keeps F.linear (and its dtype)
    with lm.routing.active():  # training (autograd) keeps F.linear
        n = len(calls)
        proj(x).sum().backward()
        assert len(calls) == n and proj.weight.grad is not None


def _tree_vs_steps(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of a 5-node tree with siblings (root; a, b under it; c under a, d under b) in one verification pass,
    and of the same tokens fed one at a time along each root-to-leaf path from the same cached context."""
    lm = HFCausalLM(model)
    context = [[5, 9, 2, 7, 11, 3, 8, 1, 6, 12, 4, 10, 13]]
    tokens = torch.tensor([[14, 15, 16, 17, 18]])
    parent = torch.tensor([[-1, 0, 0, 1, 2]])
    depth = torch.tensor([[0, 1, 1, 2, 2]])
    with torch.no_grad():
        state = lm.new_state(1)
        lm.forward_chain(state, context, last_logits=False)
        tree = lm.forward_tree(state, tokens, parent, torch.ones_like(tokens, dtype=torch.bool), depth)
        steps = torch.zeros_like(tree)
        for path in ([0, 1, 3], [0, 2, 4]):
            state = lm.new_state(1)
            lm.forward_chain(state, context, last_logits=False)
            for node in path:
                steps[0, node] = lm.forward_chain(state, [[int(tokens[0, node])]], last_logits=True)[0]
    return tree, steps


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_verification_pass_gives_the_bits_of_one_token_steps(dtype: torch.dtype) -> None:
    """With the routed linears and attention (row-independent kernels, blocked slots adding exact zeros), every node
    of a tree with siblings gets bitwise the logits the same token gets in one-token steps: greedy speculative
    decoding then equals AR token for token in bf16 too. Power: HF's own sdpa attention fails it (below)."""
    from specdec_kernels import native

    if native.skinny_linear_isa() == "none":
        pytest.skip("needs the cpu extension")
    tree, steps = _tree_vs_steps(tiny_llama(3, vocab=32, hidden=64, heads=4, kv_heads=2, std=0.3, dtype=dtype))
    assert torch.equal(tree, steps)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_pass_of_decode_rows_nodes_gives_the_bits_of_one_token_steps(dtype: torch.dtype) -> None:
    """The same at the widest pass the kernels take: a chain of DECODE_ROWS nodes in bf16 (16 where the CPU's bf16
    path is AMX or AVX-512-BF16 without AMX in PyTorch), FP32_ROWS in fp32, against as many one-token steps."""
    import specdec.models as models

    from specdec_kernels import native

    if native.skinny_linear_isa() == "none":
        pytest.skip("needs the cpu extension")
    lm = HFCausalLM(tiny_llama(3, vocab=40, hidden=64, heads=4, kv_heads=2, std=0.3, dtype=dtype))
    n = models.decode_row_limit(dtype)
    context = [[5, 9, 2, 7, 11, 3, 8, 1, 6, 12, 4, 10, 13]]
    tokens = torch.arange(14, 14 + n).unsqueeze(0)
    with torch.no_grad():
        state = lm.new_state(1)
        lm.forward_chain(state, context, last_logits=False)
        live = torch.ones_like(tokens, dtype=torch.bool)
        tree = lm.forward_tree(state, tokens, torch.arange(-1, n - 1).unsqueeze(0), live, torch.arange(n).unsqueeze(0))
        state = lm.new_state(1)
        lm.forward_chain(state, context, last_logits=False)
        steps = torch.stack([lm.forward_chain(state, [[t]], last_logits=True)[0] for t in tokens[0].tolist()])
    assert tree.shape == (1, n, 40) and torch.equal(tree[0], steps)


def test_decode_rows_follow_the_cpu() -> None:
    """16 rows where our bf16 tiles beat PyTorch's linear up to there (AMX, or AVX-512-BF16 on a CPU without AMX,
    where PyTorch has no fast small-batch bf16 path), 8 elsewhere; the cost curves of the auto trees are keyed by it."""
    import specdec.autotree as autotree
    import specdec.models as models

    from specdec_kernels import native

    assert models.decode_rows("amx", True) == 16
    assert models.decode_rows("avx512bf16", False) == 16
    assert models.decode_rows("avx512bf16", True) == 8  # our variant forced below AMX: PyTorch's AMX linear wins
    assert {models.decode_rows(isa, amx) for isa in ("baseline", "avx2", "avx512") for amx in (False, True)} == {8}
    assert models.DECODE_ROWS == models.decode_rows(native.skinny_linear_isa(), torch.cpu._is_amx_tile_supported())
    model = tiny_llama(0, vocab=32, hidden=32)
    assert autotree.curve_key(model, 1, 8) != autotree.curve_key(model, 1, 16)


def test_hf_attention_rounds_a_verification_pass_differently(monkeypatch) -> None:
    """The power check of the test above, kept as a test: with HF's own sdpa attention instead of the routed one,
    the bf16 tree pass and the one-token steps round differently, so the equality above is the routing's doing."""

    from specdec.models.fastpath import attention

    monkeypatch.setattr(attention, "NATIVE_ATTENTION", False)
    tree, steps = _tree_vs_steps(tiny_llama(3, vocab=32, hidden=64, heads=4, kv_heads=2, std=0.3, dtype=torch.bfloat16))
    assert not torch.equal(tree, steps)


def test_routed_attention_only_inside_the_adapter_and_only_for_sdpa(monkeypatch) -> None:
    import specdec.models as models

    model = tiny_llama(1, vocab=32, hidden=64, heads=4, kv_heads=2, dtype=torch.bfloat16)
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        before = model(ids).logits
    calls = count_calls(monkeypatch, "decode_attention", lambda q, *rest: tuple(q.shape))
    lm = HFCausalLM(model)
    assert lm.routing.config is model.config and model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before) and not calls  # the model outside the adapter: untouched
        state = lm.new_state(1)
        lm.forward_chain(state, [[3, 4, 5]], last_logits=True)
        assert calls == [(1, 4, 3, 16)] * 2  # both layers, 3 query rows
        lm.forward_chain(state, [list(range(models.DECODE_ROWS + 1))], last_logits=True)
        assert len(calls) == 2  # more rows than DECODE_ROWS (a prefill): HF's sdpa
    assert HFCausalLM(tiny_llama(1, vocab=32, hidden=64, attn="eager")).routing.config is None


def _chain_and_tree_logits(lm: HFCausalLM) -> list[torch.Tensor]:
    """Logits of a ragged two-row prompt, a one-token step and a tree pass with siblings."""
    with torch.no_grad():
        state = lm.new_state(2)
        out = [lm.forward_chain(state, [[5, 9, 2, 7, 11], [3, 8, 1]], last_logits=True)]
        out.append(lm.forward_chain(state, [[6], [12]], last_logits=True))
        tokens = torch.tensor([[14, 15, 16], [4, 10, 13]])
        parent = torch.tensor([[-1, 0, 0], [-1, 0, 1]])
        depth = torch.tensor([[0, 1, 1], [0, 1, 2]])
        out.append(lm.forward_tree(state, tokens, parent, torch.ones_like(tokens, dtype=torch.bool), depth))
    return out


@pytest.mark.parametrize("family", ["llama", "mistral"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_fused_layers_compute_the_modules_bits_with_reference_ops(monkeypatch, family: str, dtype) -> None:
    """Inside the adapter a stock Llama/Mistral decoder layer runs as a few fused op calls (fused_decoder_layer).
    With every op on its torch reference (rms_norm and rotary_embedding are HF's formulas) the logits are bitwise
    those of the layer modules' own forwards; with the cpu kernels they differ only by rms_norm's summation order."""
    import transformers

    from specdec_kernels import native

    model = tiny_llama(4, vocab=40, hidden=64, heads=4, kv_heads=2, std=0.3, dtype=dtype)
    if family == "mistral":
        cfg = transformers.MistralConfig(**{**model.config.to_dict(), "model_type": "mistral", "sliding_window": None})
        torch.manual_seed(4)
        model = transformers.MistralForCausalLM(cfg).to(dtype).eval()
    layers = model.model.layers
    for backend in ("torch", "auto"):
        monkeypatch.setenv("SPECDEC_BACKEND", backend)
        fused = HFCausalLM(model)
        assert fused.routing.layers == list(layers)
        plain = HFCausalLM(model)
        plain.routing.layers, plain.routing.layer_forwards = [], []
        got, want = _chain_and_tree_logits(fused), _chain_and_tree_logits(plain)
        for a, b in zip(got, want, strict=True):
            if backend == "torch" or native.skinny_linear_isa() == "none":
                assert torch.equal(a, b)
            else:
                tol = 5e-2 if dtype == torch.bfloat16 else 1e-5
                torch.testing.assert_close(a, b, atol=tol, rtol=tol)
    assert not any("forward" in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_layer_in_one_native_call_gives_the_op_by_op_bits(monkeypatch, dtype, int8: bool) -> None:
    """Once the caches hold keys, a decode-sized call of a stock stack runs as one decoder_stack call; with that path
    off, each layer as one decoder_layer call; with both off, op by op. The logits (prompt, one-token step, tree
    pass) are bitwise the same all three ways, and each path is taken (every layer of the step and the tree pass)."""
    import specdec.models as models

    from specdec_kernels import native

    if not native.HAVE_CPU:
        pytest.skip("the cpu extension is not built")
    model = tiny_llama(4, vocab=40, hidden=64, heads=4, kv_heads=2, std=0.3, dtype=dtype, layers=3)
    if int8:
        models.int8_weights(model)

    from specdec.models.fastpath import layers as layer_path
    from specdec.models.fastpath import stack as stack_path

    def counting(module, name: str, calls: list[bool]) -> None:
        real = getattr(module, name)

        def counted(*args, **kwargs):
            out = real(*args, **kwargs)
            calls.append(out is not None)
            return out

        monkeypatch.setattr(module, name, counted)

    stacks: list[bool] = []
    counting(stack_path, "native_stack", stacks)
    got = _chain_and_tree_logits(HFCausalLM(model))
    assert stacks[-2:] == [True, True] and not any(stacks[:-2])  # the prompt fills the caches: not taken
    monkeypatch.setattr(stack_path, "native_stack", lambda *args, **kwargs: None)
    layers: list[bool] = []
    counting(layer_path, "native_call", layers)
    by_layer = _chain_and_tree_logits(HFCausalLM(model))
    assert layers[-6:] == [True] * 6 and not any(layers[:-6])  # the step and the tree pass: 3 layers each
    monkeypatch.setattr(layer_path, "native_call", lambda *args, **kwargs: None)
    by_ops = _chain_and_tree_logits(HFCausalLM(model))
    for a, b, c in zip(got, by_layer, by_ops, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_stack_call_is_left_to_the_layers_where_they_differ(monkeypatch) -> None:
    """The stack runs in one call only where every layer would take its one-call path alike: a hook on one layer,
    one layer with int8 weights among float ones, or one layer with another epsilon leave it to the layers (same
    logits as with the stack path off). The layers' part of the call is read once per cache, so a change to the
    model between generate calls is seen at the next one."""
    import specdec.models as models

    from specdec_kernels import native

    if not native.HAVE_CPU:
        pytest.skip("the cpu extension is not built")
    from specdec.models.fastpath import stack as stack_path

    taken: list[bool] = []
    real = stack_path.native_stack

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(stack_path, "native_stack", counted)
    for case in ("hook", "int8", "eps"):
        model = tiny_llama(4, vocab=40, hidden=64, heads=4, kv_heads=2, std=0.3, layers=3)
        layer = model.model.layers[1]
        if case == "hook":
            layer.register_forward_pre_hook(lambda *a: None)
        elif case == "int8":
            models.int8_weights(layer)
        else:
            layer.post_attention_layernorm.variance_epsilon *= 2
        taken.clear()
        lm = HFCausalLM(model)
        got = _chain_and_tree_logits(lm)
        assert not any(taken), case
        # a hook is looked for on every forward; mixed weight kinds or epsilons leave no stack plan to try
        assert bool(taken) if case == "hook" else lm._plan == (None,), case
        monkeypatch.setattr(stack_path, "native_stack", lambda *args, **kwargs: None)
        want = _chain_and_tree_logits(HFCausalLM(model))
        monkeypatch.setattr(stack_path, "native_stack", counted)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b), case


def test_stack_plan_is_read_again_for_each_cache() -> None:
    """The stack path's layer arguments are read from the model once per cache: weights made int8 between two
    generate calls are used from the next cache on (the logits of a fresh adapter), and differ from the float ones."""
    import specdec.models as models

    from specdec_kernels import native

    if not native.HAVE_CPU:
        pytest.skip("the cpu extension is not built")
    model = tiny_llama(4, vocab=40, hidden=64, heads=4, kv_heads=2, std=0.3, layers=3)
    lm = HFCausalLM(model)
    before = _chain_and_tree_logits(lm)
    assert lm._plan is not None and lm._plan[0] is not None and lm._plan[0].dtype == torch.float32
    models.int8_weights(model)
    after = _chain_and_tree_logits(lm)
    assert lm._plan[0] is not None and lm._plan[0].dtype is None  # int8
    for b, c in zip(after, _chain_and_tree_logits(HFCausalLM(model)), strict=True):
        assert torch.equal(b, c)
    assert not torch.equal(before[1], after[1])


def test_output_head_runs_its_module_call_only_where_it_must() -> None:
    """The output head of a stock forward runs as its routed linear without the module call, the same bits as the
    call; a hook on the head makes the adapter call the module (the hook fires on every forward)."""
    model = tiny_llama(4, vocab=40, hidden=64, heads=4, kv_heads=2, std=0.3, layers=2)
    lm = HFCausalLM(model)
    assert lm._head_routed
    direct = _chain_and_tree_logits(lm)
    seen: list[int] = []
    handle = model.lm_head.register_forward_hook(lambda *a: seen.append(1))
    called = _chain_and_tree_logits(lm)
    handle.remove()
    assert seen == [1, 1, 1]
    for a, b in zip(direct, called, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_base_model_run_part_by_part_gives_its_forwards_bits(dtype) -> None:
    """A stock stack of fused layers is run part by part (embedding, rotary table, layers, norm) instead of through
    the base model's forward: the same logits bitwise; a hook on the base model keeps its forward (and fires)."""
    model = tiny_llama(6, vocab=40, hidden=64, heads=4, kv_heads=2, std=0.3, dtype=dtype)
    lean, stock = HFCausalLM(model), HFCausalLM(model)
    assert lean._lean and lean.routing.layers == list(model.model.layers)
    stock._lean = False
    for a, b in zip(_chain_and_tree_logits(lean), _chain_and_tree_logits(stock), strict=True):
        assert torch.equal(a, b)
    seen: list[int] = []
    handle = model.model.register_forward_pre_hook(lambda *a: seen.append(1))
    assert not lean._lean_now(torch.zeros(1, 1, dtype=torch.long))
    _chain_and_tree_logits(lean)
    handle.remove()
    assert seen == [1, 1, 1]
    # a hook on one layer: that layer is called as a module (the hook fires on every forward), the others not
    layer_seen: list[int] = []
    handle = model.model.layers[1].register_forward_hook(lambda *a: layer_seen.append(1))
    for a, b in zip(_chain_and_tree_logits(lean), _chain_and_tree_logits(stock), strict=True):
        assert torch.equal(a, b)
    handle.remove()
    assert layer_seen == [1, 1, 1] * 2
    assert not HFCausalLM(tiny_llama(5, vocab=32, hidden=32, attn="eager"))._lean  # no fused layers


def test_layers_with_hooks_or_other_parts_keep_their_own_forward() -> None:
    """A layer is fused only when the fused call computes what its modules would: a hook on any part, a biased
    projection, another activation or eager attention keep the module forwards (and still the routed linears)."""
    model = tiny_llama(5, vocab=32, hidden=32, layers=4)
    layers = model.model.layers
    layers[0].self_attn.k_proj.register_forward_hook(lambda *a: None)
    layers[1].mlp.act_fn = torch.nn.GELU()
    layers[2].self_attn.q_proj.bias = torch.nn.Parameter(torch.zeros(32))
    seen: list[int] = []
    layers[3].register_forward_pre_hook(lambda *a: seen.append(1))  # a hook on the layer itself still fires
    lm = HFCausalLM(model)
    assert lm.routing.layers == [layers[3]]
    with torch.no_grad():
        lm.forward_chain(lm.new_state(1), [[3, 4]], last_logits=True)
    assert seen == [1]
    assert HFCausalLM(tiny_llama(5, vocab=32, hidden=32, attn="eager")).routing.layers == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_fast_path_off_runs_the_models_own_modules(monkeypatch, dtype) -> None:
    """``fast_path=False``: no decode op of the fast path runs (linears, attention, fused layers, stack), no module
    of the model gets another forward, and the logits are those of the model's own modules with the adapter's mask;
    greedy speculation through it still equals the model's own greedy decoding. With the default the same calls do
    run the fast path (the power of the count)."""
    import specdec

    model = tiny_llama(5, vocab=48, hidden=64, heads=4, kv_heads=2, std=0.3, dtype=dtype, layers=2)
    draft = noisy_copy(model, 1, 0.3)
    ops = ("skinny_linear", "decode_attention", "decoder_layer", "decoder_stack")
    calls = {op: count_calls(monkeypatch, op, lambda *a: 1) for op in ops}
    seen: list[bool] = []
    for m in model.modules():
        m.register_forward_pre_hook(lambda mod, args: seen.append("forward" in mod.__dict__))
    lm = HFCausalLM(model, fast_path=False)
    assert not lm.routing.linears and not lm.routing.layers and lm.routing.config is None
    ids = [[3, 4, 5, 6, 7]]
    with torch.no_grad():
        state = lm.new_state(1)
        got = lm.forward_chain(state, ids, last_logits=True)
        step = lm.forward_chain(state, [[8]], last_logits=True)
        want = model(torch.tensor([ids[0] + [8]])).logits
    assert not any(sum(c) for c in calls.values()) and seen and not any(seen)
    torch.testing.assert_close(got, want[:, 4], rtol=0, atol=1e-5 if dtype == torch.float32 else 2e-2)
    torch.testing.assert_close(step, want[:, 5], rtol=0, atol=1e-5 if dtype == torch.float32 else 2e-2)
    out = specdec.generate(
        model, draft, torch.tensor(ids), method="sd", draft_length=3, max_new_tokens=8,
        do_sample=False, fast_path=False,
    )  # fmt: skip
    ref = model.generate(torch.tensor(ids), max_new_tokens=8, do_sample=False)
    assert torch.equal(out.sequences, ref) and not any(sum(c) for c in calls.values())
    with torch.no_grad():
        state = HFCausalLM(model).new_state(1)
        HFCausalLM(model).forward_chain(state, ids, last_logits=True)
    assert sum(calls["skinny_linear"]) + sum(calls["decoder_stack"]) + sum(calls["decoder_layer"]) > 0


@pytest.mark.parametrize("bad", [True, "on", None, 1, "Auto"])
def test_fast_path_refuses_other_values(bad) -> None:
    with pytest.raises(ValueError, match="fast_path"):
        HFCausalLM(tiny_llama(0, vocab=16, hidden=32), fast_path=bad)
