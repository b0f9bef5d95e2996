"""GPU microbenchmark of the sampling, tree and verification ops: the ``cuda`` and ``triton`` backends against the
torch reference on the same device, with identical injected noise.

Cases, one per op at the sizes that matter on a GPU: verify_tree at 8 rows x 32 nodes x 49152 tokens and at
64 x 64 x 128256; gumbel_topk, sbs_step, process_logits, sample_categorical, spechub_sample, emission_law and
kseq_gamma at 64 x 128256; verify_chain 64 rows x 8 drafts x 128256; verify_node 64 x 128256; tree_mask, tree_positions
and filter_kv at a batch of 64 trees. Before anything is timed, every backend's output is compared with the
reference's on the same inputs (integer outputs equal, float outputs within 1e-4 relative or 1e-5 absolute); a
backend that disagrees (or raises) is not timed, and the run ends with an error naming it.

Timing: each call between two CUDA events (the host waits for the second), after ``--warmup`` calls, over
``--copies`` copies of its inputs taken in turn (so that inputs that fit in L2 are not read from it); median and
10th / 90th percentiles of ``--reps`` calls. Roofline: the bytes a call must move (inputs read once and outputs
written once, counted per case, a lower bound) over the device-to-device copy rate measured in the same run (bytes
read plus bytes written); ``x roofline`` is the median over that time. Goals at the large shapes: within 2x of the
roofline, and at least 10x the torch reference.

``--device cpu --small`` runs the same cases at small sizes on the CPU (backends torch and cpu, wall clock), which
checks the script where no GPU is.

Output: rows appended to ``OUT/gpu_ops.csv`` (``--out``, default benchmarks/results), with the device's name.
Run: python benchmarks/bench_gpu.py [--device cuda] [--backends torch,cuda,triton] [--out DIR] [--small]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from _timing import RESULTS, append_csv, git_rev, quantile
from bench_verify_tree import depth_of, tree

import specdec_kernels as sk
from specdec_kernels.trees import branching_parents, parents_tensor

FIELDS = [
    "timestamp", "device", "torch", "cuda", "git_rev", "op", "case", "backend", "median_ms", "p10_ms", "p90_ms",
    "reps", "bytes", "copy_gbps", "roofline_ms", "x_roofline", "speedup_vs_torch",
]  # fmt: skip


@dataclass
class Case:
    op: str
    name: str
    args: tuple  # the implementation's positional arguments (specdec_kernels.implementation)
    nbytes: int  # bytes a call must move
    outputs: Callable[[Any], list[torch.Tensor]]  # the outputs compared with the reference's


def _noise(shape: tuple[int, ...], g: torch.Generator, dev: torch.device) -> torch.Tensor:
    """Uniform noise in (0, 1) in float64, as the ops take it (never exactly 0)."""
    return torch.rand(shape, dtype=torch.float64, generator=g, device=dev).clamp_min(2.0**-60)


def _logits(shape: tuple[int, ...], g: torch.Generator, dev: torch.device) -> torch.Tensor:
    """A peaked, realistic spread of logits: N(0, 2.5^2) plus a few leading tokens."""
    z = 2.5 * torch.randn(shape, generator=g, device=dev)
    z[..., :8] += torch.linspace(14, 6, 8, device=dev)
    return z


def _first(n: int) -> Callable[[Any], list[torch.Tensor]]:
    return lambda out: list(out[:n]) if isinstance(out, tuple) else [out]


def cases(dev: torch.device, small: bool) -> list[Case]:
    """Every op's case on ``dev`` (``small``: sizes for a CPU dry run)."""
    g = torch.Generator(device=dev).manual_seed(0)
    rows, vocab = (4, 1000) if small else (64, 128256)
    out: list[Case] = []

    logp = torch.log_softmax(_logits((rows, vocab), g, dev), -1)
    u = _noise((rows, vocab), g, dev)
    out.append(Case("gumbel_topk", f"{rows}x{vocab} k=4", (logp, 4, u), rows * vocab * 12 + rows * 4 * 16, _first(2)))
    out.append(Case("sample_categorical", f"{rows}x{vocab}", (logp, u), rows * vocab * 12, _first(1)))
    out.append(Case("spechub_sample", f"{rows}x{vocab}", (logp, u), rows * vocab * 12, _first(3)))
    x = _logits((rows, vocab), g, dev)
    out.append(
        Case("process_logits", f"{rows}x{vocab} T=0.8 k=50 p=0.9", (x, 0.8, 50, 0.9), rows * vocab * 8, _first(1))
    )

    batch, w = (2, 2) if small else (8, 8)
    sigma = torch.log_softmax(torch.randn((batch, w), generator=g, device=dev), -1)
    gamma = sigma.clone()
    beam_valid = torch.ones((batch, w), dtype=torch.bool, device=dev)
    logp_b = torch.log_softmax(_logits((batch, w, vocab), g, dev), -1)
    u_b = _noise((batch, w, vocab), g, dev)
    out.append(
        Case(
            "sbs_step",
            f"{batch * w}x{vocab} B={batch} W={w}",
            (logp_b, sigma, gamma, beam_valid, w, u_b),
            batch * w * vocab * 12,
            _first(2),
        )
    )

    z = _logits((rows, vocab), g, dev)
    p = torch.softmax(z, -1)
    q = torch.softmax(z + 0.5 * torch.randn(z.shape, generator=g, device=dev), -1)
    out.append(Case("emission_law", f"{rows}x{vocab} l=2", (p, q, 2.0), rows * vocab * 12, _first(1)))
    kk = torch.full((rows,), 3, device=dev)
    out.append(Case("kseq_gamma", f"{rows}x{vocab} K=3", (p, q, kk), rows * vocab * 8, _first(1)))
    cand = torch.multinomial(p, 3, replacement=True, generator=g)
    call = ("rrs", cand, torch.ones_like(cand, dtype=torch.bool), p, q, _noise((rows, 3), g, dev), u, None, False)
    out.append(Case("verify_node", f"rrs {rows}x{vocab} K=3", call, rows * vocab * 16, _first(2)))

    length = 3 if small else 8
    zc = _logits((rows, length + 1, vocab), g, dev)
    pc = torch.softmax(zc[:, :length], -1)
    qc = torch.softmax(zc + 0.5 * torch.randn(zc.shape, generator=g, device=dev), -1)
    draft = torch.multinomial(pc.reshape(-1, vocab), 1, generator=g).reshape(rows, length)
    lengths = torch.full((rows,), length, dtype=torch.long, device=dev)
    call = (draft, pc, qc, lengths, _noise((rows, length), g, dev), u, False, None, 0, 1.0)
    out.append(Case("verify_chain", f"{rows}x{length}x{vocab} sampling", call, rows * vocab * 16, _first(2)))
    del zc, pc, qc

    for b, n, v in [(2, 8, 500), (2, 16, 1000)] if small else [(8, 32, 49152), (64, 64, 128256)]:
        out.append(tree_case(b, n, v, g, dev))

    trees = 4 if small else 64
    parent = parents_tensor(branching_parents([2] * 5), batch=trees).to(dev)
    tvalid = torch.ones_like(parent, dtype=torch.bool)
    past = 64 if small else 2048
    pvalid = torch.ones((trees, past), dtype=torch.bool, device=dev)
    mask_bytes = trees * parent.shape[1] * (past + parent.shape[1]) * 2
    name = f"binary6 B={trees} P={past} bf16"
    out.append(Case("tree_mask", name, (parent, tvalid, pvalid, torch.bfloat16), mask_bytes, _first(1)))
    depth = torch.randint(0, 8, (trees, 64), generator=g, device=dev)
    prefix = torch.randint(1, 4096, (trees,), generator=g, device=dev)
    out.append(Case("tree_positions", f"B={trees} N=64", (depth, prefix), depth.numel() * 16, _first(1)))
    layers, slots, m = (4, 100, 3) if small else (60, 1100, 6)
    kv = [torch.randn((trees, 3, slots, 64), generator=g, device=dev).bfloat16() for _ in range(layers)]
    kv_prefix = torch.full((trees,), slots - 40, dtype=torch.long, device=dev)
    nodes = (torch.arange(1, m + 1, device=dev) * 3).expand(trees, m).contiguous()
    n_acc = torch.full((trees,), m, dtype=torch.long, device=dev)
    moved = layers * trees * 3 * m * 64 * 2 * 2
    name = f"{layers}x[{trees},3,{slots},64] bf16 m={m}"
    out.append(Case("filter_kv", name, (kv, kv_prefix, nodes, n_acc), moved, _first(1)))
    return out


def tree_case(batch: int, n: int, vocab: int, g: torch.Generator, dev: torch.device) -> Case:
    """verify_tree, method rrs, on the tree of ``bench_verify_tree`` (4 children at the root, then 2 per node, level
    by level); each node's token drawn from its parent's draft row. Bytes: the p and q rows of one root-to-leaf path
    plus the final noise (a walk reads no more)."""
    parents = tree("rrs", n)
    depth = depth_of(parents)
    z = _logits((batch, n, vocab), g, dev)
    p_rows = torch.softmax(z, -1)
    z.add_(0.5 * torch.randn(z.shape, generator=g, device=dev))
    q_rows = torch.softmax(z, -1)
    del z
    parent = torch.tensor(parents, device=dev).expand(batch, n).contiguous()
    tokens = torch.zeros((batch, n), dtype=torch.long, device=dev)
    idx = torch.tensor(parents[1:], device=dev)
    drawn = torch.multinomial(p_rows[:, idx].reshape(-1, vocab), 1, generator=g).reshape(batch, n - 1)
    tokens[:, 1:] = drawn
    valid = torch.ones((batch, n), dtype=torch.bool, device=dev)
    u = _noise((batch, n, 4), g, dev)
    fin = _noise((batch, vocab), g, dev)
    call = (tokens, parent, valid, p_rows, q_rows, "rrs", None, u, fin, False, None, depth)
    nbytes = batch * (depth + 1) * vocab * 8 + batch * vocab * 8
    return Case("verify_tree", f"rrs {batch}x{n}x{vocab}", call, nbytes, _first(2))


def _copy(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return a.clone()
    return [_copy(x) for x in a] if isinstance(a, list) else a


def _agree(out: list[torch.Tensor], ref: list[torch.Tensor]) -> bool:
    for a, b in zip(out, ref, strict=True):
        if a.dtype.is_floating_point:
            ok = torch.equal(torch.isfinite(a), torch.isfinite(b))
            fin = torch.isfinite(a)
            if not ok or not torch.allclose(a[fin].double(), b[fin].double(), rtol=1e-4, atol=1e-5):
                return False
        elif not torch.equal(a, b):
            return False
    return True


def time_call(fn: Callable[..., Any], copies: list[tuple], dev: torch.device, warmup: int, reps: int) -> list[float]:
    """Seconds per call, each between two events (CUDA) or two clock reads (CPU), cycling through ``copies``."""
    cuda = dev.type == "cuda"
    for i in range(warmup):
        fn(*copies[i % len(copies)])
    if cuda:
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(reps):
        args = copies[i % len(copies)]
        if cuda:
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - t0)
    return times


def save_rows(out: str, name: str, fields: list[str], rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` to ``out/name`` (a CSV with ``fields``)."""
    if rows:
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, name)
        append_csv(path, fields, rows)
        print(f"appended {len(rows)} rows to {path}")


def copy_rate(dev: torch.device, nbytes: int) -> float:
    """Device-to-device copy rate in bytes per second, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    med = statistics.median(time_call(lambda: dst.copy_(src), [()], dev, 3, 20))
    return 2 * nbytes / med


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda or cpu")
    ap.add_argument("--backends", default=None, help="default: torch,cuda,triton on a GPU, torch,cpu on the CPU")
    ap.add_argument("--small", action="store_true", help="small sizes (a dry run)")
    ap.add_argument("--ops", default="", help="comma-separated ops to run (default: all)")
    ap.add_argument("--copies", type=int, default=3, help="copies of each case's inputs, taken in turn")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=str(RESULTS), help="folder of gpu_ops.csv")
    ap.add_argument("--no-csv", action="store_true")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (use --device cpu --small for a dry run)")
    args.device = dev
    default = "torch,cuda,triton" if dev.type == "cuda" else "torch,cpu"
    args.backends = [b for b in (args.backends or default).split(",") if b]
    args.ops = {o for o in args.ops.split(",") if o}
    return args


def main() -> None:
    args = parse_args()
    dev = args.device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    rate = copy_rate(dev, (1 << 24) if args.small else (1 << 31))
    print(f"{name}: device-to-device copy {rate / 1e9:.0f} GB/s (read + written)")
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta = {"timestamp": stamp, "device": name, "torch": torch.__version__, "cuda": torch.version.cuda or ""}
    meta["git_rev"] = git_rev()
    rows: list[dict[str, Any]] = []
    disagree: list[str] = []
    with torch.inference_mode():
        for case in cases(dev, args.small):
            if args.ops and case.op not in args.ops:
                continue
            have = [b for b in args.backends if b in sk.available_backends()]
            fns = {b: sk.implementation(case.op, b, dev) for b in have}
            ref = case.outputs(fns["torch"](*_copy(case.args)))
            for b in list(fns):
                try:
                    same = _agree(case.outputs(fns[b](*_copy(case.args))), ref)
                except Exception as err:  # a backend that raises is reported like one that disagrees
                    print(f"{case.op} {case.name}: backend {b} raised {type(err).__name__}: {err}")
                    same = False
                if not same:
                    print(f"{case.op} {case.name}: backend {b} DISAGREES with the torch reference; not timed")
                    disagree.append(f"{case.op}/{b}")
                    del fns[b]
            copies = [case.args] + [tuple(_copy(a) for a in case.args) for _ in range(args.copies - 1)]
            roof = case.nbytes / rate
            medians = {}
            for b, fn in fns.items():
                times = time_call(fn, copies, dev, args.warmup, args.reps)
                medians[b] = statistics.median(times)
                rows.append({
                    **meta, "op": case.op, "case": case.name, "backend": b,
                    "median_ms": round(medians[b] * 1e3, 5), "p10_ms": round(quantile(times, 0.1) * 1e3, 5),
                    "p90_ms": round(quantile(times, 0.9) * 1e3, 5), "reps": len(times), "bytes": case.nbytes,
                    "copy_gbps": round(rate / 1e9, 1), "roofline_ms": round(roof * 1e3, 5),
                    "x_roofline": round(medians[b] / roof, 2), "speedup_vs_torch": "",
                })  # fmt: skip
            for r in rows[-len(fns) :]:
                r["speedup_vs_torch"] = round(medians["torch"] / medians[r["backend"]], 2)
                print(f"{case.op:18s} {case.name:32s} {r['backend']:6s} {r['median_ms']:10.4f} ms  "
                      f"x{r['x_roofline']:<7} roofline  x{r['speedup_vs_torch']:<7} vs torch", flush=True)  # fmt: skip
            del copies
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    if not args.no_csv:
        save_rows(args.out, "gpu_ops.csv", FIELDS, rows)
    if disagree:
        raise SystemExit(f"backends that disagree with the torch reference: {', '.join(disagree)}")


if __name__ == "__main__":
    main()
