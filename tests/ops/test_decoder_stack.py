"""decoder_stack's arguments: every bad input is a clear error naming the argument (and the layer), before any
kernel runs; the per-layer checks are decoder_layer's."""

from __future__ import annotations

import pytest
import torch

import specdec_kernels as sk
from tests.llama_layers import stack_case

SHAPE = (2, 3, 40, 4, 2, 10, 72, 5, 9)


def _call(int8: bool = False, **change: object) -> None:
    """decoder_stack on a valid 3-layer case (layer i's capacity 9 + i) with some arguments replaced."""
    case = stack_case(SHAPE, torch.float32, False, int8, layers=3, seed=4)
    case.update(change)
    sk.decoder_stack(
        case["h"], case["weights"], case["ln1"], case["ln2"], case["cos"], case["sin"], case["k_caches"],
        case["v_caches"], case["length"], case["mask"], scale=case["scale"], eps1=case["eps1"], eps2=case["eps2"],
        scales=case["scales"],
    )  # fmt: skip


def _case(int8: bool = False) -> dict:
    return stack_case(SHAPE, torch.float32, False, int8, layers=3, seed=4)


def _replace(key: str, i: int, value: object, int8: bool = False) -> list:
    items = list(_case(int8)[key])
    items[i] = value
    return items


def _replace_weight(layer: int, i: int, w: torch.Tensor) -> list:
    groups = [list(g) for g in _case()["weights"]]
    groups[layer][i] = w
    return groups


BAD = [
    ({"h": torch.randn(2, 40)}, ValueError, r"h must have 3 dimensions"),
    ({"h": torch.randn(2, 0, 40)}, ValueError, r"h must hold at least one token"),
    ({"k_caches": []}, ValueError, r"k_caches must be a non-empty list, one cache per layer"),
    ({"k_caches": None}, ValueError, r"k_caches must be a non-empty list"),
    ({"v_caches": _case()["v_caches"][:2]}, ValueError, r"v_caches must be a list of one entry per layer \(3"),
    ({"ln1": _case()["ln1"][:2]}, ValueError, r"ln1 must be a list of one entry per layer \(3"),
    ({"weights": _case()["weights"][:1]}, ValueError, r"weights must be a list of one entry per layer \(3"),
    ({"scales": [[]]}, ValueError, r"scales must be empty \(floating weights\) or a list of one entry per layer"),
    ({"ln2": _replace("ln2", 1, torch.ones(41))}, ValueError, r"ln2\[1\] must be \[E=40\]"),
    ({"k_caches": _replace("k_caches", 2, torch.randn(2, 2, 9))}, ValueError, r"k_caches\[2\] must have 4 dim"),
    (
        {"v_caches": _replace("v_caches", 1, torch.randn(2, 2, 9, 10))},
        ValueError,
        r"k_caches\[1\] and v_caches\[1\] must be one \[B=2, Hkv, capacity, D\] shape",
    ),
    (
        {
            "k_caches": _replace("k_caches", 0, torch.randn(2, 2, 7, 10)),
            "v_caches": _replace("v_caches", 0, torch.randn(2, 2, 7, 10)),
        },
        ValueError,
        r"length must be an int in \[0, capacity - n = 4\], got 5",
    ),  # fmt: skip
    (
        {
            "k_caches": _replace("k_caches", 1, torch.randn(2, 2, 10, 12)),
            "v_caches": _replace("v_caches", 1, torch.randn(2, 2, 10, 12)),
        },
        ValueError,
        r"the query projection \(weights\[1\]\[q\]\) must have a multiple of D=12",
    ),  # fmt: skip
    (
        {"weights": [_case()["weights"][0], _case()["weights"][1][:4], _case()["weights"][2]]},
        ValueError,
        r"weights\[1\] must be a list of 7 matrices, as weights\[0\]",
    ),  # fmt: skip
    ({"weights": _replace_weight(2, 3, torch.randn(40, 41))}, ValueError, r"weights\[2\]\[o\] must be \[40, 40\]"),
    ({"weights": _replace_weight(1, 6, torch.randn(40, 72).double())}, TypeError, r"weights\[1\]\[down\] must have h"),
    ({"cos": torch.randn(2, 3, 12)}, ValueError, r"cos must be \[B=2 or 1, n=3, D=10\]"),
    ({"mask": torch.zeros(2, 1, 3, 9)}, ValueError, r"mask must broadcast to \[B, 1, n, length \+ n\]"),
    ({"eps2": float("nan")}, ValueError, r"eps2 must be a finite number >= 0"),
    ({"scale": float("inf")}, ValueError, r"scale must be a finite number"),
    ({"h": torch.randn(2, 3, 40, device="meta")}, ValueError, r"all tensors must be on one device"),
]


@pytest.mark.parametrize(("change", "exc", "match"), BAD, ids=[m for _, _, m in BAD])
def test_bad_inputs(change: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        _call(**change)


def test_int8_scales_per_layer() -> None:
    case = _case(int8=True)
    with pytest.raises(ValueError, match=r"scales\[1\] must be empty \(floating weights\) or hold one per weight"):
        _call(int8=True, scales=[case["scales"][0], case["scales"][1][:3], case["scales"][2]])
    # one float layer among int8 ones: valid alone, but the layers must agree
    weights = [case["weights"][0], _case()["weights"][1], case["weights"][2]]
    with pytest.raises(ValueError, match=r"scales\[1\] must hold one scale per matrix of weights\[1\] \(7\)"):
        _call(int8=True, weights=weights, scales=[case["scales"][0], [], case["scales"][2]])
    scales = [list(g) for g in case["scales"]]
    scales[2][4] = torch.ones(71)
    with pytest.raises(ValueError, match=r"scales\[2\]\[gate\] must be \[out=72\]"):
        _call(int8=True, scales=scales)


def test_caches_untouched_on_bad_input() -> None:
    """Validation runs before any layer: a bad last layer leaves the first layers' caches as they were."""
    case = _case()
    before = [t.clone() for t in case["k_caches"]]
    case["ln1"] = _replace("ln1", 2, torch.ones(41))
    with pytest.raises(ValueError, match=r"ln1\[2\]"):
        sk.decoder_stack(
            case["h"], case["weights"], case["ln1"], case["ln2"], case["cos"], case["sin"], case["k_caches"],
            case["v_caches"], case["length"], case["mask"], scale=case["scale"], eps1=case["eps1"], eps2=case["eps2"],
        )  # fmt: skip
    for a, b in zip(case["k_caches"], before, strict=True):
        assert torch.equal(a, b)


def test_exported() -> None:
    assert "decoder_stack" in sk.__all__ and sk.decoder_stack is sk.ops.decoder_stack


def test_one_head_dim_for_every_layer() -> None:
    """Layers may differ in cache heads and capacity, not in the head dim D that cos and sin share."""
    from tests.llama_layers import layer_case

    other = layer_case((2, 3, 40, 4, 2, 12, 72, 5, 10), torch.float32, False, False, seed=9)  # D = 12
    case = _case()
    with pytest.raises(ValueError, match=r"every layer's cache must have one head dim D .* got \[10, 12\]"):
        _call(
            weights=[case["weights"][0], other["weights"], case["weights"][2]],
            k_caches=_replace("k_caches", 1, other["k_cache"]),
            v_caches=_replace("v_caches", 1, other["v_cache"]),
        )
