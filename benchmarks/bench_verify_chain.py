"""Microbenchmark of verify_chain: cpu vs torch reference, same accept_u and final noise.

Bytes read per call (what the op must read): sampling: per row one full vocabulary row for the final sample
(p and q rows in fp32 for a correction, q for a bonus, plus float64 noise), counted as B * V * (4 + 4 + 8);
greedy: the L + 1 q rows it may take an argmax of, B * (L + 1) * V * 4. The lenient case (CS Drafting's inner
review, leniency 2) reads like a sampling one.
Run: python benchmarks/bench_verify_chain.py [--threads 2] [--no-csv]
"""

from __future__ import annotations

from functools import partial

import torch
from _timing import Recorder, impl, open_uniform, parse_args

OP = "verify_chain"


def main() -> None:
    args = parse_args(__doc__)
    rec = Recorder(OP, args)
    cases = [
        (8, 5, 49152, False, 1.0),
        (32, 4, 32000, False, 1.0),
        (8, 5, 49152, True, 1.0),
        (8, 10, 49152, False, 2.0),
    ]
    for batch, length, vocab, greedy, leniency in cases:
        g = torch.Generator().manual_seed(vocab)
        z = 2.5 * torch.randn((batch, length + 1, vocab), generator=g)
        z[..., :8] += torch.linspace(14, 6, 8)
        p = torch.softmax(z[:, :length], -1)
        q = torch.softmax(z + 0.5 * torch.randn(z.shape, generator=g), -1)
        draft = torch.multinomial(p.reshape(-1, vocab), 1, generator=g).reshape(batch, length)
        lengths = torch.full((batch,), length, dtype=torch.long)
        u = torch.rand((batch, length), dtype=torch.float64, generator=g)
        fin = open_uniform((batch, vocab), seed=1)
        pp = None if greedy else p
        ref = impl(OP, "torch")(draft, pp, q, lengths, u, fin, greedy, None, 0, leniency)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            out = fn(draft, pp, q, lengths, u, fin, greedy, None, 0, leniency)
            if not (torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])):
                raise SystemExit(f"{backend} disagrees with the reference on B={batch} V={vocab}")
            fns[backend] = partial(fn, draft, pp, q, lengths, u, fin, greedy, None, 0, leniency)
        mode = "greedy" if greedy else ("sampling" if leniency == 1.0 else f"lenient l={leniency:g}")
        # greedy reads at most the L + 1 q rows (argmax); sampling one p/q row pair and the final noise
        nbytes = batch * (length + 1) * vocab * 4 if greedy else batch * vocab * (4 + 4 + 8)
        rec.case(f"B={batch} L={length} V={vocab} {mode}", fns, nbytes=nbytes)
    rec.save()


if __name__ == "__main__":
    main()
