"""Shared harness of the kernel microbenchmarks (benchmarks/bench_<op>.py; docs/benchmarks.md, Methodology).

Each benchmark checks the backend against the reference first, then times both in the same process: median and
10/90 % quantiles over repeated calls, GB/s from the bytes the op must move, the GB/s of a plain memory copy of the
same number of bytes, and the machine's streaming read rate (the roofline of an op that reads its bytes once). Rows
are appended to benchmarks/results/<op>.csv with the machine, its vector-instruction flags, the torch version and the
git revision.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import torch

import specdec_kernels
from specdec_kernels.testing.oracles_tree import open_uniform  # noqa: F401  (re-exported)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
CLOCK = time.perf_counter
FIELDS = [
    "timestamp",
    "machine",
    "torch",
    "git_rev",
    "cpu_flags",
    "cpu_isa",
    "op",
    "case",
    "backend",
    "threads",
    "clock",
    "median_ms",
    "p10_ms",
    "p90_ms",
    "reps",
    "bytes",
    "bytes_kind",
    "gbps",
    "copy_gbps",
    "speedup_vs_torch",
    "read_gbps",
]


def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """Common options (threads, budget, backends, clock, CSV); ``extra`` adds a benchmark's own options."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=min(2, torch.get_num_threads()), help="torch/OpenMP threads")
    ap.add_argument("--budget", type=float, default=0.4, help="seconds of timing per (case, backend)")
    ap.add_argument("--backends", default="cpu,torch", help="comma-separated backends to time (torch = reference)")
    ap.add_argument("--no-csv", action="store_true", help="print only, do not append to benchmarks/results")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: perf_counter; cpu: process CPU time (use with --threads 1 on a shared, oversubscribed machine, "
        "where wall time mostly measures waiting for a core)",
    )
    if extra is not None:
        extra(ap)
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    args.backends = [b for b in args.backends.split(",") if b]
    return args


def machine() -> str:
    import specdec_kernels

    return f"{platform.machine()} {specdec_kernels.cpu_model() or 'cpu'} ({os.cpu_count()} cores)"


#: the CPU flags that decide which kernel variant runs (specdec_kernels.native loads the best one the CPU allows)
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16", "amx_bf16")


def cpu_flags() -> str:
    """The vector-instruction flags of this CPU among ISA_FLAGS, space-separated ("unknown" where unreadable)."""
    from specdec_kernels.native import cpu_flags as read_flags

    flags = read_flags()
    if flags is None:
        return "unknown"
    return " ".join(f for f in ISA_FLAGS if f in flags) or "none"


def cpu_isa() -> str:
    """The CPU extension variant this process loaded, and skinny_linear's bf16 path where it differs (the amx variant
    runs the avx512bf16 path when the OS refuses the tile state; the avx512 variant runs the avx2 tiles)."""
    variant, path = specdec_kernels.cpu_isa(), specdec_kernels.skinny_linear_isa()
    return variant if path in (variant, "none") else f"{variant} (skinny_linear {path})"


def git_rev() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "csrc", "specdec_kernels"], cwd=ROOT).returncode
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_meta() -> dict[str, str]:
    """Where a row was measured: machine, torch version, commit, CPU flags and the extension variant loaded."""
    return {"machine": machine(), "torch": torch.__version__, "git_rev": git_rev(), "cpu_flags": cpu_flags(),
            "cpu_isa": cpu_isa()}  # fmt: skip


def append_csv(path: str | os.PathLike[str], fields: list[str], rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` to the CSV at ``path`` with columns ``fields``. A file written with other columns (an older
    harness) is first rewritten with ``fields``, the columns it lacks left blank, so every row keeps its values."""
    new = not os.path.exists(path)
    if not new:
        with open(path, newline="") as fh:
            header = next(csv.reader(fh), [])
        if header != fields:
            with open(path, newline="") as fh:
                old = list(csv.DictReader(fh))
            with open(path, "w", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=fields, restval="", extrasaction="ignore")
                writer.writeheader()
                writer.writerows(old)
    with open(path, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, restval="")
        if new:
            writer.writeheader()
        writer.writerows(rows)


def impl(op: str, backend: str) -> Callable[..., Any]:
    """The registered implementation (bypasses validation: the benchmark times the kernel, not the checks)."""
    return specdec_kernels.implementation(op, backend, "cpu")


def time_fn(
    fn: Callable[[], Any],
    budget: float,
    min_reps: int = 5,
    max_reps: int = 200,
    before: Callable[[], Any] | None = None,
) -> list[float]:
    """Seconds per call: one warm-up, then calls until ``budget`` seconds are spent (min/max repetitions);
    ``before`` runs untimed ahead of every call (e.g. what evicts the call's data from the caches)."""
    return time_fns_interleaved({0: fn}, budget, min_reps, max_reps, before)[0]


def time_fns_interleaved(
    fns: dict[Any, Callable[[], Any]],
    budget: float,
    min_reps: int = 5,
    max_reps: int = 200,
    before: Callable[[], Any] | None = None,
) -> dict[Any, list[float]]:
    """Seconds per call of each function, taking turns: one warm-up each, then rounds that call every function once,
    in an order rotated per round, until ``budget`` seconds per function are spent (min/max repetitions); ``before``
    runs untimed ahead of every call. A load or a memory speed that drifts during the run then hits every function
    alike, so their ratios hold where medians taken one after another would not."""
    keys = list(fns)
    for k in keys:
        fns[k]()
    times: dict[Any, list[float]] = {k: [] for k in keys}
    start, total, rnd = time.perf_counter(), budget * len(keys), 0
    while rnd < max_reps and (rnd < min_reps or time.perf_counter() - start < total):
        for i in range(len(keys)):
            k = keys[(i + rnd) % len(keys)]
            if before is not None:
                before()
            t0 = CLOCK()
            fns[k]()
            times[k].append(CLOCK() - t0)
        rnd += 1
    return times


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def copy_gbps(nbytes: int, budget: float) -> float:
    """GB/s of a plain copy of ``nbytes`` bytes (torch's memcpy path): it reads and writes them, so an op that only
    reads its bytes can outrun it (:func:`read_gbps` is that roofline)."""
    src = torch.empty(max(1, nbytes), dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    times = time_fn(lambda: dst.copy_(src), budget / 2)
    return nbytes / statistics.median(times) / 1e9


#: a read-rate buffer is at least this large: well past any last-level cache of these machines
READ_BYTES_MIN = 256 * 2**20


def read_gbps(nbytes: int, budget: float) -> float:
    """GB/s of a streaming read: a sum over an fp32 buffer of ``nbytes`` bytes (at least READ_BYTES_MIN, so that it
    comes from memory), on torch's threads. A weight stream is bound by this rate; a copy also writes, so
    :func:`copy_gbps` reports far less (about half on these machines)."""
    n = max(nbytes, READ_BYTES_MIN) // 4
    buf = torch.ones(n, dtype=torch.float32)
    times = time_fn(buf.sum, budget / 2)
    return n * 4 / statistics.median(times) / 1e9


class Recorder:
    """Collects timings of one op; prints a table and appends CSV rows."""

    def __init__(self, op: str, args: argparse.Namespace) -> None:
        self.op, self.args = op, args
        self.rows: list[dict[str, Any]] = []
        self.stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.meta = run_meta()
        self._read: dict[int, float] = {}  # read rate per thread count, measured once per run

    def read_rate(self, nbytes: int) -> float:
        """The streaming read rate (:func:`read_gbps`) at torch's current thread count, measured once per run."""
        threads = torch.get_num_threads()
        if threads not in self._read:
            self._read[threads] = read_gbps(nbytes, self.args.budget)
        return self._read[threads]

    def case(
        self,
        name: str,
        fns: dict[str, Callable[[], Any]],
        nbytes: int,
        bytes_kind: str = "read",
        before: Callable[[], Any] | None = None,
    ) -> None:
        roof = copy_gbps(nbytes, self.args.budget)
        self._record(name, {b: time_fn(fn, self.args.budget, before=before) for b, fn in fns.items()}, nbytes,
                     bytes_kind, roof)  # fmt: skip

    def cases_interleaved(
        self, cases: dict[str, dict[str, Callable[[], Any]]], nbytes: int, bytes_kind: str = "read"
    ) -> None:
        """Several cases (name -> backend -> function) timed taking turns (time_fns_interleaved), so that their
        ratios are not skewed by a machine that drifts during the run; one copy rate measured before them all."""
        roof = copy_gbps(nbytes, self.args.budget)
        fns = {(name, b): fn for name, per in cases.items() for b, fn in per.items()}
        times = time_fns_interleaved(fns, self.args.budget)
        for name, per in cases.items():
            self._record(name, {b: times[(name, b)] for b in per}, nbytes, bytes_kind, roof)

    def samples(self, name: str, timed: dict[str, list[float]], nbytes: int) -> None:
        """Timings taken elsewhere (seconds per call, per backend; e.g. inside a decoding run), recorded as a case."""
        self._record(name, timed, nbytes, "read", copy_gbps(nbytes, self.args.budget))

    def _record(self, name: str, timed: dict[str, list[float]], nbytes: int, bytes_kind: str, roof: float) -> None:
        medians = {backend: statistics.median(times) for backend, times in timed.items()}
        for backend, times in timed.items():
            med = medians[backend]
            row = {
                "timestamp": self.stamp,
                **self.meta,
                "op": self.op,
                "case": name,
                "backend": backend,
                "threads": torch.get_num_threads(),
                "clock": self.args.clock,
                "median_ms": round(med * 1e3, 4),
                "p10_ms": round(quantile(times, 0.1) * 1e3, 4),
                "p90_ms": round(quantile(times, 0.9) * 1e3, 4),
                "reps": len(times),
                "bytes": nbytes,
                "bytes_kind": bytes_kind,
                "gbps": round(nbytes / med / 1e9, 3),
                "copy_gbps": round(roof, 3),
                "speedup_vs_torch": round(medians["torch"] / med, 2) if "torch" in medians else "",
                "read_gbps": round(self.read_rate(nbytes), 3),
            }
            self.rows.append(row)
            print(
                f"{self.op:18s} {name:34s} {backend:6s} median {row['median_ms']:9.3f} ms "
                f"[p10 {row['p10_ms']:.3f}, p90 {row['p90_ms']:.3f}]  {row['gbps']:7.2f} GB/s "
                f"(copy {roof:6.2f}, read {row['read_gbps']:6.2f})  x{row['speedup_vs_torch']} vs torch",
                flush=True,
            )

    def save(self) -> None:
        if self.args.no_csv or not self.rows:
            return
        os.makedirs(RESULTS, exist_ok=True)
        path = os.path.join(RESULTS, f"{self.op}.csv")
        append_csv(path, FIELDS, self.rows)
        print(f"appended {len(self.rows)} rows to {os.path.relpath(path, ROOT)}")
