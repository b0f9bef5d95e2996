"""cpu vs torch parity of decoder_layer. The cpu op calls the cpu kernels of skinny_linear(_int8), rms_norm,
rotary_embedding and decode_attention directly and ATen for the residual adds and the gated SiLU, so it must equal,
bit for bit, those public ops called one by one on the cpu backend (the path a model's layer takes op by op); the
torch backend is the same composition of the reference ops, bit for bit. Against the float64 truth the cpu layer's
error may be at most 2x the reference's own error on the same call plus two roundings of the dtype (the parts'
budgets, which differ only in the order of sums)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from backend_parity import requires_cpu_ext

import specdec_kernels as sk
from specdec_kernels import _registry
from tests.llama_layers import assert_same_bits, layer_case, run_layer

pytestmark = requires_cpu_ext

# (B, n, E, H, Hkv, D, intermediate, length, capacity): SmolLM2's layer (9 heads over 3, D = 64) at a decode step and
# a verification pass, a draft-sized layer, odd widths (tails of every kernel), a full cache, one head
SHAPES = [
    (1, 1, 576, 9, 3, 64, 1536, 40, 64),
    (1, 8, 576, 9, 3, 64, 1536, 40, 48),
    (2, 3, 192, 3, 3, 64, 576, 7, 16),
    (3, 2, 40, 4, 2, 10, 72, 5, 7),
    (1, 5, 48, 1, 1, 16, 24, 1, 6),
]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
ROUNDING = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def one_by_one(case: dict, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer from the public ops, each called on ``backend`` (what a model's layer does op by op)."""
    h, ws, scales, length = case["h"], case["weights"], case["scales"], case["length"]
    k_cache, v_cache = case["k_cache"].clone(), case["v_cache"].clone()
    b, n, _ = h.shape
    hkv, d = k_cache.shape[1], k_cache.shape[3]

    def linear(x: torch.Tensor, i: int) -> torch.Tensor:
        if scales:
            return sk.skinny_linear_int8(x, ws[i], scales[i], backend=backend)
        return sk.skinny_linear(x, ws[i], backend=backend)

    x = sk.rms_norm(h, case["ln1"], case["eps1"], backend=backend)
    if len(ws) == 7:
        q, k, v = linear(x, 0), linear(x, 1), linear(x, 2)
    else:
        q, k, v = linear(x, 0).split((ws[0].shape[0] - 2 * hkv * d, hkv * d, hkv * d), dim=-1)
    q, k = sk.rotary_embedding(
        q.view(b, n, -1, d).transpose(1, 2), k.view(b, n, hkv, d).transpose(1, 2), case["cos"], case["sin"],
        backend=backend,
    )  # fmt: skip
    end = length + n
    k_cache[:, :, length:end] = k
    v_cache[:, :, length:end] = v.view(b, n, hkv, d).transpose(1, 2)
    att = sk.decode_attention(q, k_cache[:, :, :end], v_cache[:, :, :end], case["mask"], case["scale"], backend=backend)
    h = h + linear(att.transpose(1, 2).reshape(b, n, -1), 3 if len(ws) == 7 else 1)
    x = sk.rms_norm(h, case["ln2"], case["eps2"], backend=backend)
    gate, up = (linear(x, 4), linear(x, 5)) if len(ws) == 7 else linear(x, 2).chunk(2, dim=-1)
    return h + linear(F.silu(gate) * up, len(ws) - 1), k_cache, v_cache


def truth(case: dict) -> torch.Tensor:
    """The layer in float64 (the reference's formula on float64 inputs; int8 weights dequantized exactly)."""
    c = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in case.items()}
    ws = case["weights"]
    if case["scales"]:
        ws = [q.double() * s.double()[:, None] for q, s in zip(ws, case["scales"], strict=True)]
    c["weights"], c["scales"] = [w.double() for w in ws], []
    return run_layer(c, "torch")[0]


@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
@pytest.mark.parametrize("fused", [False, True], ids=["seven", "stacked"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cpu_is_the_ops_one_by_one(shape: tuple[int, ...], dtype: torch.dtype, fused: bool, int8: bool) -> None:
    case = layer_case(shape, dtype, fused, int8, seed=shape[2] + shape[1])
    for backend in ("cpu", "torch"):
        got, want = run_layer(case, backend), one_by_one(case, backend)
        for a, b in zip(got, want, strict=True):
            assert_same_bits(a, b)
    out, k_cache, _ = run_layer(case, "cpu")
    length, n = case["length"], shape[1]
    # the slots outside [length, length + n) are untouched, the new ones written
    assert_same_bits(k_cache[:, :, :length], case["k_cache"][:, :, :length])
    assert_same_bits(k_cache[:, :, length + n :], case["k_cache"][:, :, length + n :])
    assert not torch.equal(k_cache[:, :, length : length + n], case["k_cache"][:, :, length : length + n])
    assert out.dtype == dtype and out.shape == case["h"].shape


@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES[:3], ids=str)
def test_within_budget_of_float64(shape: tuple[int, ...], dtype: torch.dtype, int8: bool) -> None:
    case = layer_case(shape, dtype, False, int8, seed=7 * shape[1])
    exact = truth(case)
    err_cpu = (run_layer(case, "cpu")[0].double() - exact).abs().max().item()
    err_ref = (run_layer(case, "torch")[0].double() - exact).abs().max().item()
    assert err_ref > 0 or dtype == torch.float32
    assert err_cpu <= 2 * err_ref + 2 * ROUNDING[dtype] * exact.abs().max().item()


def test_row_alone_is_bitwise_the_same() -> None:
    """A token's output does not depend on the rows beside it: with the cache of a one-token step, row r of an
    n-token call (its mask restricted to the slots it sees) equals the call on row r alone."""
    case = layer_case((1, 4, 96, 4, 2, 16, 64, 6, 16), torch.bfloat16, False, False, seed=3)
    full = run_layer(case, "cpu")[0]
    for r in range(4):
        mask = case["mask"][:, :, r : r + 1, : case["length"] + r + 1]
        one = {**case, "h": case["h"][:, r : r + 1], "cos": case["cos"][:, r : r + 1], "sin": case["sin"][:, r : r + 1]}
        k, v = case["k_cache"].clone(), case["v_cache"].clone()
        # the keys of the rows before r, as the n-token call wrote them
        _, k_full, v_full = run_layer(case, "cpu")
        k[:, :, : case["length"] + r], v[:, :, : case["length"] + r] = (
            k_full[:, :, : case["length"] + r],
            v_full[:, :, : case["length"] + r],
        )
        out = sk.decoder_layer(
            one["h"], case["weights"], case["ln1"], case["ln2"], one["cos"], one["sin"], k, v, case["length"] + r,
            mask, scale=case["scale"], eps1=case["eps1"], eps2=case["eps2"], backend="cpu",
        )  # fmt: skip
        assert_same_bits(out, full[:, r : r + 1])


def test_opcheck() -> None:
    for dtype, int8 in ((torch.bfloat16, False), (torch.float32, True)):
        c = layer_case((1, 2, 40, 4, 2, 10, 72, 5, 7), dtype, True, int8, seed=1)
        args = (c["h"], c["weights"], c["scales"], c["ln1"], c["ln2"], c["cos"], c["sin"], c["k_cache"],
                c["v_cache"], c["length"], c["mask"], c["eps1"], c["eps2"], c["scale"])  # fmt: skip
        torch.library.opcheck(torch.ops.specdec.decoder_layer, args)


def test_auto_uses_cpu_on_cpu() -> None:
    cpu = torch.device("cpu")
    assert _registry.resolve("decoder_layer", "auto", cpu) is _registry.resolve("decoder_layer", "cpu", cpu)
