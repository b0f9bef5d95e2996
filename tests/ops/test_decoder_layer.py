"""decoder_layer: one Llama decoder layer of a decode step in one op. The reference is HF's LlamaDecoderLayer over a
cache (float32, to the rounding of the attention's sum order); the cpu backend against the ops one by one and the
float64 truth is in tests/backends/test_parity_decoder_layer.py; bad inputs (public API)."""

from __future__ import annotations

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import native
from tests.llama_layers import layer_case, run_layer

BACKENDS = ["torch", "cpu"] if native.HAVE_CPU else ["torch"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_reference_is_hf_llama_decoder_layer(backend: str) -> None:
    """A tiny random Llama layer runs 5 tokens into an HF cache, then 3 more as a chain; the op, given the cached
    keys and values in a buffer with room, gives HF's output and writes HF's new keys and values."""
    transformers = pytest.importorskip("transformers")
    from transformers import DynamicCache

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    layer, rotary = model.model.layers[0], model.model.rotary_emb
    past, n, cap = 5, 3, 12
    g = torch.Generator().manual_seed(1)
    h_past, h = torch.randn(1, past, 48, generator=g), torch.randn(1, n, 48, generator=g)
    cache = DynamicCache()
    with torch.no_grad():
        causal = torch.triu(torch.full((past, past), float("-inf")), diagonal=1)[None, None]
        layer(h_past, attention_mask=causal, cache=cache, use_cache=True,
              position_embeddings=rotary(h_past, torch.arange(past)[None]))  # fmt: skip
        k_cache, v_cache = torch.zeros(1, 2, cap, 12), torch.zeros(1, 2, cap, 12)
        k_cache[:, :, :past], v_cache[:, :, :past] = cache.layers[0].keys, cache.layers[0].values
        mask = torch.zeros(1, 1, n, past + n)
        mask[..., past:] = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
        cos, sin = rotary(h, torch.arange(past, past + n)[None])
        want = layer(h, attention_mask=mask, cache=cache, use_cache=True, position_embeddings=(cos, sin))
        attn, mlp = layer.self_attn, layer.mlp
        weights = [m.weight for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)]
        weights += [m.weight for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
        out = sk.decoder_layer(
            h, weights, layer.input_layernorm.weight, layer.post_attention_layernorm.weight, cos, sin, k_cache,
            v_cache, past, mask, scale=attn.scaling, eps1=1e-5, eps2=1e-5, backend=backend,
        )  # fmt: skip
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_cache[:, :, : past + n], cache.layers[0].keys, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v_cache[:, :, : past + n], cache.layers[0].values, rtol=1e-5, atol=1e-5)
    assert torch.equal(k_cache[:, :, past + n :], torch.zeros(1, 2, cap - past - n, 12))


@pytest.mark.parametrize("backend", BACKENDS)
def test_unvalidated_call_is_the_same_op(backend: str) -> None:
    case = layer_case((2, 3, 40, 4, 2, 10, 72, 5, 9), torch.bfloat16, True, True, seed=2)
    want = run_layer(case, backend)
    k, v = case["k_cache"].clone(), case["v_cache"].clone()
    got = sk.decoder_layer(
        case["h"], case["weights"], case["ln1"], case["ln2"], case["cos"], case["sin"], k, v, case["length"],
        case["mask"], scale=case["scale"], eps1=case["eps1"], eps2=case["eps2"], scales=case["scales"],
        backend=backend, validate=False,
    )  # fmt: skip
    assert torch.equal(got, want[0]) and torch.equal(k, want[1]) and torch.equal(v, want[2])


def _call(**change: object) -> None:
    """decoder_layer on a valid small case with some arguments replaced."""
    case = layer_case((2, 3, 40, 4, 2, 10, 72, 5, 9), torch.float32, False, False, seed=4)
    case.update(change)
    sk.decoder_layer(
        case["h"], case["weights"], case["ln1"], case["ln2"], case["cos"], case["sin"], case["k_cache"],
        case["v_cache"], case["length"], case["mask"], scale=case["scale"], eps1=case["eps1"], eps2=case["eps2"],
        scales=case["scales"],
    )  # fmt: skip


def _weights(i: int, w: torch.Tensor) -> list[torch.Tensor]:
    ws = layer_case((2, 3, 40, 4, 2, 10, 72, 5, 9), torch.float32, False, False, seed=4)["weights"]
    ws[i] = w
    return ws


BAD = [
    ({"h": torch.randn(2, 40)}, ValueError, r"h must have 3 dimensions"),
    ({"h": torch.ones(2, 3, 40, dtype=torch.long)}, TypeError, r"h must be a floating-point tensor"),
    ({"h": torch.randn(2, 0, 40)}, ValueError, r"h must hold at least one token"),
    ({"ln1": torch.ones(41)}, ValueError, r"ln1 must be \[E=40\]"),
    ({"ln2": torch.ones(40, dtype=torch.float64)}, ValueError, r"ln2 must be \[E=40\] in h's dtype"),
    ({"k_cache": torch.randn(2, 2, 9)}, ValueError, r"k_cache must have 4 dimensions"),
    ({"v_cache": torch.randn(2, 2, 8, 10)}, ValueError, r"k_cache and v_cache must be one \[B=2, Hkv, capacity"),
    ({"k_cache": torch.randn(1, 2, 9, 10), "v_cache": torch.randn(1, 2, 9, 10)}, ValueError, r"B=2"),
    ({"k_cache": torch.randn(2, 2, 9, 10).double()}, TypeError, r"k_cache and v_cache must have h's dtype"),
    ({"length": 7}, ValueError, r"length must be an int in \[0, capacity - n = 6\], got 7"),
    ({"length": -1}, ValueError, r"length must be an int in \[0, capacity - n = 6\]"),
    ({"length": 2.0}, ValueError, r"length must be an int"),
    ({"length": "x"}, ValueError, r"length must be an int"),
    ({"scales": None}, ValueError, r"scales must be empty \(floating weights\) or hold one per weight"),
    ({"weights": [torch.randn(40, 40)] * 5}, ValueError, r"weights must be a list of 7 matrices"),
    ({"weights": _weights(0, torch.randn(40))}, ValueError, r"weights\[q\] must have 2 dimensions"),
    ({"weights": _weights(1, torch.randn(20, 41))}, ValueError, r"weights\[k\] must be \[20, 40\]"),
    ({"weights": _weights(3, torch.randn(40, 41))}, ValueError, r"weights\[o\] must be \[40, 40\]"),
    ({"weights": _weights(6, torch.randn(40, 71))}, ValueError, r"weights\[down\] must be \[40, 72\]"),
    ({"weights": _weights(0, torch.randn(30, 40))}, ValueError, r"a multiple of the cache's Hkv=2 heads, got 30"),
    ({"weights": _weights(2, torch.randn(20, 40).double())}, TypeError, r"weights\[v\] must have h's dtype"),
    ({"scales": [torch.ones(40)]}, ValueError, r"scales must be empty \(floating weights\) or hold one per weight"),
    ({"scales": [torch.ones(40)] * 7}, TypeError, r"with scales, weights\[q\] must be int8"),
    ({"cos": torch.randn(2, 3, 12)}, ValueError, r"cos must be \[B=2 or 1, n=3, D=10\]"),
    ({"sin": torch.randn(2, 3)}, ValueError, r"sin must have 3 dimensions"),
    (
        {"mask": torch.zeros(2, 1, 3, 9)},
        ValueError,
        r"mask must broadcast to \[B, 1, n, length \+ n\] = \(2, 1, 3, 8\)",
    ),
    ({"mask": torch.zeros(2, 1, 3, 8, dtype=torch.bool)}, TypeError, r"mask must be a floating-point tensor"),
    ({"eps1": -1.0}, ValueError, r"eps1 must be a finite number >= 0"),
    ({"eps2": float("nan")}, ValueError, r"eps2 must be a finite number >= 0"),
    ({"scale": float("inf")}, ValueError, r"scale must be a finite number"),
    ({"h": torch.randn(2, 3, 40, device="meta")}, ValueError, r"all tensors must be on one device"),
]


@pytest.mark.parametrize(("change", "exc", "match"), BAD, ids=[m for _, _, m in BAD])
def test_bad_inputs(change: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        _call(**change)


def test_int8_weights_need_int8() -> None:
    case = layer_case((2, 3, 40, 4, 2, 10, 72, 5, 9), torch.float32, False, True, seed=4)
    scales = list(case["scales"])
    scales[4] = torch.ones(71)
    with pytest.raises(ValueError, match=r"scales\[gate\] must be \[out=72\]"):
        _call(weights=case["weights"], scales=scales)


def test_exported() -> None:
    assert "decoder_layer" in sk.__all__ and sk.decoder_layer is sk.ops.decoder_layer
