"""Microbenchmark of decoder_stack: cpu (one call for the whole stack) vs torch (the reference ops composed), and
the same cpu layers called one decoder_layer call per layer from Python (the case suffixed "layer by layer").

Checks first: each backend against the reference on one layer, and the cpu stack bitwise against its layers.
Cases: SmolLM2-135M's stack (30 layers of E = 576, 9 query heads over 3 KV heads of 64, MLP 1536, ~210 MB of bf16
weights, so they come from memory as in a step), each layer with its own 200-slot cache, at n = 1 (a one-token
step) and n = 8 (a verification pass). The gap between the one-call and the layer-by-layer rows is the Python-level
cost of the 30 calls that the op removes. bytes = the stack's weights read once.
Run: python benchmarks/bench_decoder_stack.py [--threads 1] [--clock cpu] [--no-csv]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from _timing import Recorder, impl, parse_args
from bench_decoder_layer import CONTEXT, D, layer_weights, step_inputs

OP = "decoder_stack"
LAYERS = 30


def stack_call(fn: Callable[..., Any], layers: list[tuple], x: dict[str, Any]) -> Callable[[], Any]:
    weights = [w for ws, _ in layers for w in ws]
    ln = [x["ln"]] * len(layers)
    ks, vs = [x["k_cache"].clone() for _ in layers], [x["v_cache"].clone() for _ in layers]

    def call() -> Any:
        return fn(x["h"], weights, [], ln, ln, x["cos"], x["sin"], ks, vs, CONTEXT, x["mask"], 1e-5, 1e-5, D**-0.5)

    return call


def layer_by_layer(layers: list[tuple], x: dict[str, Any]) -> Callable[[], Any]:
    """One cpu decoder_layer call per layer, each layer's output into the next."""
    layer = impl("decoder_layer", "cpu")
    ks, vs = [x["k_cache"].clone() for _ in layers], [x["v_cache"].clone() for _ in layers]

    def call() -> Any:
        h = x["h"]
        for (ws, scales), k, v in zip(layers, ks, vs, strict=True):
            h = layer(h, ws, scales, x["ln"], x["ln"], x["cos"], x["sin"], k, v, CONTEXT, x["mask"], 1e-5, 1e-5,
                      D**-0.5)  # fmt: skip
        return h

    return call


def main() -> None:
    args = parse_args(__doc__)
    rec = Recorder(OP, args)
    g = torch.Generator().manual_seed(0)
    layers = [layer_weights(g, stacked=False, int8=False) for _ in range(LAYERS)]
    nbytes = sum(w.numel() * w.element_size() for ws, _ in layers for w in ws)
    for n in (1, 8):
        x = step_inputs(n, g)
        fns = {b: stack_call(impl(OP, b), layers, x) for b in args.backends}
        # bf16 roundings compound over 30 random layers: each backend is checked against the reference on the first
        # layer alone, and the cpu stack against the cpu layers called one by one, bitwise
        ref = stack_call(impl(OP, "torch"), layers[:1], x)()
        for b in fns:
            if not torch.allclose(stack_call(impl(OP, b), layers[:1], x)().float(), ref.float(), rtol=5e-2, atol=5e-2):
                raise SystemExit(f"{b} disagrees with the reference on n={n}")
        if "cpu" in fns and not torch.equal(fns["cpu"](), layer_by_layer(layers, x)()):
            raise SystemExit(f"the cpu stack differs from its layers called one by one on n={n}")
        name = f"target bf16 {LAYERS} layers n={n} ctx {CONTEXT}"
        rec.case(name, fns, nbytes=nbytes)
        if "cpu" in args.backends:
            rec.case(f"{name}, layer by layer", {"cpu": layer_by_layer(layers, x)}, nbytes=nbytes)
    rec.save()


if __name__ == "__main__":
    main()
