"""Microbenchmark of sbs_step: cpu vs torch reference, same noise.

Cases: the goal shape 64 beam rows x 49152 vocab (B = 8 rows of Win = 8 entries, Wout = 8) and a sweep: vocab
32000 / 49152 / 128256, beam rows 1 / 8 / 64 (B x Win), widths 2 / 4 / 8 (``--quick``: the goal shape only).
Beam states are those of a real expansion: sigma/gamma come from a previous sbs_step on the same draft rows.
Bytes read per call: logp (4 B fp32) + float64 noise (8 B) per element.
Run: python benchmarks/bench_sbs_step.py [--threads 1 --clock cpu] [--quick] [--no-csv]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
from _timing import Recorder, impl, open_uniform, parse_args

OP = "sbs_step"
GOAL = [(8, 8, 49152, 8)]
SWEEP = [(8, 8, 32000, 8), (8, 8, 128256, 8), (1, 1, 49152, 8), (4, 2, 49152, 2), (16, 4, 49152, 4)]


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="only the goal shape 64 x 49152")


def beam_state(batch: int, w_in: int, vocab: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """sigma/gamma/valid [B, Win] of a real beam: one root expansion to Win entries."""
    x = 2.5 * torch.randn((batch, 1, vocab), generator=g)
    x[..., :8] += torch.linspace(14, 6, 8)
    zeros = torch.zeros((batch, 1), dtype=torch.float64)
    ones = torch.ones((batch, 1), dtype=torch.bool)
    root = impl(OP, "cpu")(torch.log_softmax(x, -1), zeros, zeros, ones, w_in, open_uniform((batch, 1, vocab), 1))
    return root[2], root[3], root[4]


def main() -> None:
    args = parse_args(__doc__, options)
    rec = Recorder(OP, args)
    for batch, w_in, vocab, w_out in GOAL + ([] if args.quick else SWEEP):
        g = torch.Generator().manual_seed(vocab + w_in)
        sigma, gamma, valid = beam_state(batch, w_in, vocab, g)
        x = 2.5 * torch.randn((batch, w_in, vocab), generator=g)
        x[..., :8] += torch.linspace(14, 6, 8)
        logp = torch.log_softmax(x, -1)
        u = open_uniform((batch, w_in, vocab), seed=w_out)
        call = (logp, sigma, gamma, valid, w_out, u)
        ref = impl(OP, "torch")(*call)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            out = fn(*call)
            if not all(torch.equal(out[i], ref[i]) for i in (0, 1, 4)):
                raise SystemExit(f"{backend} disagrees with the reference on {batch}x{w_in}x{vocab} w_out={w_out}")
            fns[backend] = partial(fn, *call)
        rows = batch * w_in
        rec.case(f"{rows}x{vocab} B={batch} Win={w_in} Wout={w_out} fp32", fns, nbytes=rows * vocab * (4 + 8))
    rec.save()


if __name__ == "__main__":
    main()
