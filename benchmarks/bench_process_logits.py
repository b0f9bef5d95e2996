"""Microbenchmark of process_logits: cpu vs torch reference.

Bytes read per call: the logits (their dtype) once; the fp32 output is written once more (not counted).
Cases marked ``law`` call it with log=False (the probabilities the verifiers read, as the driver does for the
target's rows): the cpu kernel writes them in the same pass, the reference takes a softmax of its log-probs.
Run: python benchmarks/bench_process_logits.py [--threads 2] [--no-csv]
"""

from __future__ import annotations

from functools import partial

import torch
from _timing import Recorder, impl, parse_args

OP = "process_logits"


def check_logp(out: torch.Tensor, ref: torch.Tensor, x32: torch.Tensor | None) -> None:
    """Same kept set; error vs the float64 truth within 2x the reference's error + 4 fp32 ulps (see
    tests/backends/backend_parity.py for why the budget is relative to the reference)."""
    masked = torch.isneginf(ref)
    if not torch.equal(torch.isneginf(out), masked):
        raise SystemExit("the backend keeps other tokens than the reference")
    if x32 is None:
        if not torch.equal(out, ref):
            raise SystemExit("greedy rows differ")
        return
    truth = torch.log_softmax(x32.double().masked_fill(masked, float("-inf")), -1)[~masked]
    ref_err = (ref[~masked].double() - truth).abs().max()
    budget = 2 * ref_err + 4 * torch.finfo(torch.float32).eps * truth.abs().clamp_min(1.0)
    if not bool(((out[~masked].double() - truth).abs() <= budget).all()):
        raise SystemExit("log-probs outside the error budget")


def main() -> None:
    args = parse_args(__doc__)
    rec = Recorder(OP, args)
    cases = [
        (64, 32000, torch.float32, (0.8, 0, 1.0)),
        (64, 32000, torch.float32, (0.8, 50, 1.0)),
        (64, 32000, torch.float32, (0.8, 0, 0.9)),
        (64, 32000, torch.bfloat16, (0.8, 40, 0.95)),
        (8, 128256, torch.float32, (1.0, 0, 0.95)),
        (8, 128256, torch.float32, (0.0, 0, 1.0)),
        (8, 49152, torch.bfloat16, (0.7, 0, 1.0, False)),
        (64, 32000, torch.float32, (0.8, 0, 0.9, False)),
    ]
    for rows, vocab, dtype, setting in cases:
        g = torch.Generator().manual_seed(vocab)
        x = 2.5 * torch.randn((rows, vocab), generator=g)
        x[:, :8] += torch.linspace(14, 6, 8)
        x = x.to(dtype)
        ref = impl(OP, "torch")(x, *setting)
        fns = {}
        for backend in args.backends:
            fn = impl(OP, backend)
            out = fn(x, *setting)
            law = len(setting) > 3 and not setting[3]
            if law:  # compare the log of the law: same kept set, same budget
                out, ref_l = out.log(), ref.log()
            else:
                ref_l = ref
            if not torch.equal(torch.isneginf(out), torch.isneginf(ref_l)):
                raise SystemExit(f"{backend} keeps other tokens than the reference ({rows}x{vocab} {setting})")
            check_logp(out, ref_l, None if setting[0] < 1e-5 else x.float() / setting[0])
            fns[backend] = partial(fn, x, *setting)
        t, k, p = setting[:3]
        name = f"{rows}x{vocab} {str(dtype)[6:]} T={t} k={k} p={p}" + (" law" if len(setting) > 3 else "")
        rec.case(name, fns, nbytes=rows * vocab * x.element_size())
    rec.save()


if __name__ == "__main__":
    main()
