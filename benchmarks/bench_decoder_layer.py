"""Microbenchmark of decoder_layer: cpu (one call) vs torch (the reference ops composed), and the same cpu kernels
called one by one from Python (the case suffixed "ops one by one"), on SmolLM2-135M's layer shape.

Cases: a target layer (E = 576, 9 query heads over 3 KV heads of 64, MLP 1536) in bf16 over a 200-slot cache at
n = 1 (a one-token step) and n = 8 (a verification pass), each call on the next of 30 such layers (a model's worth
of weights, ~210 MB, so the weights come from memory as in a step); and a draft layer (the same shape, stacked
[q; k; v] and [gate; up] matrices, int8 weights) at n = 1 on one layer that stays in cache, as a draft's repeated
steps run it. The gap between the one-call and the one-by-one rows is the Python-level cost of a layer that the
op removes. bytes = the layer's weights read once.
Run: python benchmarks/bench_decoder_layer.py [--threads 1] [--clock cpu] [--no-csv]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from _timing import Recorder, impl, parse_args

from specdec_kernels import quantize_int8
from specdec_kernels.reference.decode import layer_from_ops

OP = "decoder_layer"
E, H, HKV, D, INTER, CONTEXT = 576, 9, 3, 64, 1536, 200
PARTS = ("skinny_linear", "skinny_linear_int8", "rms_norm", "rotary_embedding", "decode_attention")


def layer_weights(g: torch.Generator, stacked: bool, int8: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    def mat(o: int, i: int) -> torch.Tensor:
        return torch.randn((o, i), generator=g) / i**0.5

    ws = [mat(H * D, E), mat(HKV * D, E), mat(HKV * D, E), mat(E, H * D), mat(INTER, E), mat(INTER, E), mat(E, INTER)]
    if stacked:
        ws = [torch.cat(ws[:3]), ws[3], torch.cat(ws[4:6]), ws[6]]
    if not int8:
        return [w.bfloat16() for w in ws], []
    pairs = [quantize_int8(w) for w in ws]
    return [q for q, _ in pairs], [s for _, s in pairs]


def step_inputs(n: int, g: torch.Generator) -> dict[str, Any]:
    """The arguments of a call besides the weights: n new tokens after CONTEXT cached ones (a chain)."""
    angle = torch.rand((1, n, D), generator=g) * 6.3
    mask = torch.zeros((1, 1, n, CONTEXT + n))
    mask[..., CONTEXT:] = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
    return {
        "h": torch.randn((1, n, E), generator=g).bfloat16(),
        "ln": (1 + 0.1 * torch.randn(E, generator=g)).bfloat16(),
        "cos": angle.cos().bfloat16(),
        "sin": angle.sin().bfloat16(),
        "k_cache": torch.randn((1, HKV, CONTEXT + 16, D), generator=g).bfloat16(),
        "v_cache": torch.randn((1, HKV, CONTEXT + 16, D), generator=g).bfloat16(),
        "mask": mask.bfloat16(),
    }


def caller(fn: Callable[..., Any], layers: list[tuple], x: dict[str, Any]) -> Callable[[], Any]:
    """A call of ``fn`` on the inputs ``x``, on the next layer of ``layers`` per invocation."""
    cycle = itertools.cycle(layers)

    def call() -> Any:
        ws, scales = next(cycle)
        return fn(x["h"], ws, scales, x["ln"], x["ln"], x["cos"], x["sin"], x["k_cache"], x["v_cache"], CONTEXT,
                  x["mask"], 1e-5, 1e-5, D**-0.5)  # fmt: skip

    return call


def main() -> None:
    args = parse_args(__doc__)
    rec = Recorder(OP, args)
    g = torch.Generator().manual_seed(0)
    one_by_one = {op: impl(op, "cpu") for op in PARTS} if "cpu" in args.backends else None
    target = [layer_weights(g, stacked=False, int8=False) for _ in range(30)]
    draft = [layer_weights(g, stacked=True, int8=True)]
    cases = [("target bf16", target, 1), ("target bf16", target, 8), ("draft int8 stacked", draft, 1)]
    for label, layers, n in cases:
        nbytes = sum(w.numel() * w.element_size() for w in layers[0][0])
        x = step_inputs(n, g)
        fns = {b: caller(impl(OP, b), layers, x) for b in args.backends}
        ref = caller(impl(OP, "torch"), layers, x)()  # the first layer, as each function's first call
        for b, fn in fns.items():
            if not torch.allclose(fn().float(), ref.float(), rtol=5e-2, atol=5e-2):
                raise SystemExit(f"{b} disagrees with the reference on {label} n={n}")
        name = f"{label} n={n} ctx {CONTEXT}"
        rec.case(name, fns, nbytes=nbytes)
        if one_by_one is not None:
            ops = caller(lambda *a: layer_from_ops(one_by_one, *a), layers, x)
            rec.case(f"{name}, ops one by one", {"cpu": ops}, nbytes=nbytes)
    rec.save()


if __name__ == "__main__":
    main()
