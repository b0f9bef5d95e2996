"""cpu vs torch parity of decoder_stack. Both backends run decoder_layer's computation for each layer in turn, so a
stack call must equal, bit for bit, one decoder_layer call per layer on the same backend (output and every cache
written); the cpu backend's layers are themselves checked against the ops one by one in test_parity_decoder_layer."""

from __future__ import annotations

import pytest
import torch
from backend_parity import requires_cpu_ext

from specdec_kernels import _registry
from tests.llama_layers import assert_same_bits, run_layers_in_turn, run_stack, stack_case

pytestmark = requires_cpu_ext

# (B, n, E, H, Hkv, D, intermediate, length, capacity): SmolLM2's layer at a decode step, a verification pass of a
# draft-sized layer, odd widths
SHAPES = [
    (1, 1, 576, 9, 3, 64, 1536, 40, 48),
    (2, 3, 192, 3, 3, 64, 576, 7, 16),
    (3, 2, 40, 4, 2, 10, 72, 5, 7),
]


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
@pytest.mark.parametrize("fused", [False, True], ids=["seven", "stacked"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_stack_is_decoder_layer_in_turn(
    shape: tuple[int, ...], dtype: torch.dtype, fused: bool, int8: bool, backend: str
) -> None:
    case = stack_case(shape, dtype, fused, int8, layers=3, seed=5)
    out, ks, vs = run_stack(case, backend)
    want, want_ks, want_vs = run_layers_in_turn(case, backend)
    assert_same_bits(out, want)
    for got, exp in zip([*ks, *vs], [*want_ks, *want_vs], strict=True):
        assert_same_bits(got, exp)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_mask_shared_by_the_batch_rows_is_their_own_mask(dtype: torch.dtype, backend: str) -> None:
    # the stack converts the mask to fp32 once for all its layers: a [1, 1, n, S] mask must give what that mask
    # expanded to every batch row gives
    case = stack_case((2, 3, 40, 4, 2, 10, 72, 5, 9), dtype, True, False, layers=2, seed=4)
    shared = case["mask"][:1].clone()
    want = run_stack({**case, "mask": shared.expand_as(case["mask"]).contiguous()}, backend)
    got = run_stack({**case, "mask": shared}, backend)
    for g, w in zip([got[0], *got[1], *got[2]], [want[0], *want[1], *want[2]], strict=True):
        assert_same_bits(g, w)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_unvalidated_call_is_the_same_op(backend: str) -> None:
    case = stack_case((2, 3, 40, 4, 2, 10, 72, 5, 9), torch.bfloat16, True, True, layers=2, seed=2)
    want = run_stack(case, backend)
    got = run_stack(case, backend, validate=False)
    assert torch.equal(got[0], want[0])
    for a, b in zip([*got[1], *got[2]], [*want[1], *want[2]], strict=True):
        assert torch.equal(a, b)


def test_opcheck() -> None:
    for dtype, int8 in ((torch.bfloat16, False), (torch.float32, True)):
        c = stack_case((1, 2, 40, 4, 2, 10, 72, 5, 7), dtype, True, int8, layers=2, seed=1)
        args = (c["h"], [w for g in c["weights"] for w in g], [s for g in c["scales"] for s in g], c["ln1"],
                c["ln2"], c["cos"], c["sin"], c["k_caches"], c["v_caches"], c["length"], c["mask"], c["eps1"],
                c["eps2"], c["scale"])  # fmt: skip
        torch.library.opcheck(torch.ops.specdec.decoder_stack, args)


def test_auto_uses_cpu_on_cpu() -> None:
    cpu = torch.device("cpu")
    assert _registry.resolve("decoder_stack", "auto", cpu) is _registry.resolve("decoder_stack", "cpu", cpu)
