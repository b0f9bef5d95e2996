"""Shared helpers of the rms_norm, rotary_embedding and decoder_layer tests: bit-level comparisons, inputs as a Llama
layer makes them, HF's RMSNorm formula in the cpu kernel's summation order, and whole decoder-layer calls."""

from __future__ import annotations

import torch

import specdec_kernels as sk

_INT = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}


def assert_same_bits(out: torch.Tensor, want: torch.Tensor) -> None:
    """Equal bit patterns (so -0.0 != +0.0), NaN at the same places (their payloads are not compared)."""
    assert out.shape == want.shape and out.dtype == want.dtype
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(out), nan)
    assert torch.equal(out[~nan].view(_INT[out.dtype]), want[~nan].view(_INT[want.dtype]))


def assert_rotary_cpu_is_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """rotary_embedding's cpu results carry the reference's bits and come out contiguous."""
    out, ref = sk.rotary_embedding(q, k, cos, sin, backend="cpu"), sk.rotary_embedding(q, k, cos, sin, backend="torch")
    for o, r in zip(out, ref, strict=True):
        assert o.is_contiguous()
        assert_same_bits(o, r)


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in units in the last place between two tensors of one float dtype (finite values)."""
    top = torch.iinfo(_INT[a.dtype]).max

    def line(t: torch.Tensor) -> torch.Tensor:  # sign-magnitude bit patterns onto a monotone integer line
        i = t.contiguous().view(_INT[t.dtype]).long()
        return torch.where(i < 0, -(i & top), i)

    return (line(a) - line(b)).abs()


def norm_case(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states x [..., D] and an RMSNorm weight [D] near 1, as a trained model has them."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    w = (1 + 0.5 * torch.randn(shape[-1], generator=g)).to(dtype)
    return x, w


def rms_norm_in_kernel_order(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's formula with the cpu kernel's summation order: lane l sums the squares of elements 16 i + l in order,
    the 16 lanes are summed in the tree (l, l + 8), (l, l + 4), (0 + 2) + (1 + 3), the last D % 16 squares follow."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.to(acc)
    sq = h * h
    d = x.shape[-1]
    full = d // 16 * 16
    lanes = torch.zeros((*x.shape[:-1], 16), dtype=acc)
    for i in range(0, full, 16):
        lanes = lanes + sq[..., i : i + 16]
    t = lanes[..., :8] + lanes[..., 8:]
    t = t[..., :4] + t[..., 4:]
    total = (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])
    for i in range(full, d):
        total = total + sq[..., i]
    scale = torch.rsqrt(total / d + eps)  # IEEE 1 / sqrt on CPU (torch.sqrt is MKL's, not always correctly rounded)
    return weight * (h * scale[..., None]).to(x.dtype)


def projected(b: int, h: int, n: int, d: int, dtype: torch.dtype, g: torch.Generator, scale: float = 1.0):
    """q or k as a model makes it: a linear's output [B, n, H * D] viewed as [B, n, H, D], transposed (strided)."""
    return (torch.randn(b, n, h * d, generator=g) * scale).to(dtype).view(b, n, h, d).transpose(1, 2)


def rope_tables(b: int, n: int, d: int, dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B, n, D] of random positions, with equal halves as HF's rotary embedding builds them."""
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    pos = torch.randint(0, 4096, (b, n), generator=g).double()
    ang = torch.cat([pos[..., None] * inv] * 2, dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def layer_case(shape: tuple[int, ...], dtype: torch.dtype, fused: bool, int8: bool, seed: int) -> dict:
    """Inputs of one call: weights scaled so the activations stay O(1), a mask with blocked slots."""
    b, n, e, h, hkv, d, inter, length, cap = shape
    g = torch.Generator().manual_seed(seed)

    def mat(o: int, i: int) -> torch.Tensor:
        return torch.randn((o, i), generator=g) / i**0.5

    ws = [mat(h * d, e), mat(hkv * d, e), mat(hkv * d, e), mat(e, h * d), mat(inter, e), mat(inter, e), mat(e, inter)]
    if fused:
        ws = [torch.cat(ws[:3]), ws[3], torch.cat(ws[4:6]), ws[6]]
    scales: list[torch.Tensor] = []
    if int8:
        pairs = [sk.quantize_int8(w) for w in ws]
        ws, scales = [p[0] for p in pairs], [p[1] for p in pairs]
    else:
        ws = [w.to(dtype) for w in ws]
    angle = torch.rand((b, n, d), generator=g) * 6.3
    mask = torch.zeros((b, 1, n, length + n))
    mask[..., :length][torch.rand((b, 1, n, length), generator=g) < 0.2] = float("-inf")
    mask[..., length:] = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)  # a chain: causal new slots
    return {
        "h": torch.randn((b, n, e), generator=g).to(dtype),
        "weights": ws,
        "ln1": (1 + 0.1 * torch.randn(e, generator=g)).to(dtype),
        "ln2": (1 + 0.1 * torch.randn(e, generator=g)).to(dtype),
        "cos": angle.cos().to(dtype),
        "sin": angle.sin().to(dtype),
        "k_cache": torch.randn((b, hkv, cap, d), generator=g).to(dtype),
        "v_cache": torch.randn((b, hkv, cap, d), generator=g).to(dtype),
        "length": length,
        "mask": mask.to(dtype),
        "scale": d**-0.5,
        "eps1": 1e-5,
        "eps2": 1e-6,
        "scales": scales,
    }


def run_layer(case: dict, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, k_cache, v_cache) of decoder_layer on copies of the case's caches."""
    c = {**case, "k_cache": case["k_cache"].clone(), "v_cache": case["v_cache"].clone()}
    out = sk.decoder_layer(
        c["h"], c["weights"], c["ln1"], c["ln2"], c["cos"], c["sin"], c["k_cache"], c["v_cache"], c["length"],
        c["mask"], scale=c["scale"], eps1=c["eps1"], eps2=c["eps2"], scales=c["scales"], backend=backend,
    )  # fmt: skip
    return out, c["k_cache"], c["v_cache"]


def stack_case(shape: tuple[int, ...], dtype: torch.dtype, fused: bool, int8: bool, layers: int, seed: int) -> dict:
    """Inputs of one decoder_stack call: ``layers`` layers (weights, norms, caches of their own; layer i's cache
    capacity ``capacity + i``) sharing h, cos/sin, mask, length, epsilons and scale."""
    cases = [layer_case(shape, dtype, fused, int8, seed + i) for i in range(layers)]
    first = cases[0]
    b, _, _, _, hkv, d, _, _, cap = shape
    g = torch.Generator().manual_seed(seed)
    caches = [torch.randn((2, b, hkv, cap + i, d), generator=g).to(dtype) for i in range(layers)]
    return {
        **{k: first[k] for k in ("h", "cos", "sin", "length", "mask", "scale", "eps1", "eps2")},
        "weights": [c["weights"] for c in cases],
        "scales": [c["scales"] for c in cases] if int8 else [],
        "ln1": [c["ln1"] for c in cases],
        "ln2": [c["ln2"] for c in cases],
        "k_caches": [c[0] for c in caches],
        "v_caches": [c[1] for c in caches],
    }


def run_stack(case: dict, backend: str, **kw: object) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """(output, k_caches, v_caches) of decoder_stack on copies of the case's caches."""
    ks, vs = [t.clone() for t in case["k_caches"]], [t.clone() for t in case["v_caches"]]
    out = sk.decoder_stack(
        case["h"], case["weights"], case["ln1"], case["ln2"], case["cos"], case["sin"], ks, vs, case["length"],
        case["mask"], scale=case["scale"], eps1=case["eps1"], eps2=case["eps2"], scales=case["scales"],
        backend=backend, **kw,
    )  # fmt: skip
    return out, ks, vs


def run_layers_in_turn(case: dict, backend: str) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """What decoder_stack computes, as one decoder_layer call per layer."""
    ks, vs = [t.clone() for t in case["k_caches"]], [t.clone() for t in case["v_caches"]]
    h = case["h"]
    for i, (k, v) in enumerate(zip(ks, vs, strict=True)):
        h = sk.decoder_layer(
            h, case["weights"][i], case["ln1"][i], case["ln2"][i], case["cos"], case["sin"], k, v, case["length"],
            case["mask"], scale=case["scale"], eps1=case["eps1"], eps2=case["eps2"],
            scales=case["scales"][i] if case["scales"] else (), backend=backend,
        )  # fmt: skip
    return h, ks, vs
