"""Tensor parallelism against one process on the same machine: the demo (``python -m specdec demo``) run once in
one process with ``--ranks`` torch threads (at most the machine's cores), once under ``torchrun --nproc_per_node
<ranks>`` with one thread per rank (the target sharded with ``tp_plan="auto"``), on the same prompts and settings,
the two runs taking turns ``--rounds`` times. Rows go to ``benchmarks/results/tensor_parallel.csv``: tokens/s of
each method, its ratio to the one-process AR of the same round, and (sharded runs) the collectives and bytes each
rank sends per round.

    python benchmarks/bench_tensor_parallel.py --model random-1b --ranks 2 -- --methods ar,sd,rsd_c --draft ngram
    python benchmarks/bench_tensor_parallel.py --model smollm2 --ranks 3 -- --methods ar,rsd_c,sd

SmolLM2 has 9 attention heads and 3 key/value heads: 3 ranks, never 2. The flags after ``--`` go to the demo.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _models import CACHE, MODELS, random_llama_dir
from _timing import RESULTS, append_csv, run_meta

FIELDS = ["timestamp", "machine", "torch", "git_rev", "cpu_flags", "cpu_isa", "model", "prompts", "num_prompts",
          "max_new_tokens", "temperature", "draft", "round", "layout", "ranks", "threads_per_rank", "label",
          "new_tokens", "tokens_per_second", "vs_one_process_ar", "block_efficiency", "calls_per_round",
          "bytes_per_round", "load"]  # fmt: skip


def demo_json(cmd: list[str]) -> dict:
    """Run one demo command line; its JSON document (the last stdout line)."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random-1b", help=f"smollm2 or one of {sorted(MODELS)}")
    parser.add_argument(
        "--ranks", type=int, default=2, help="tensor-parallel ranks (and the one process's threads, at most the cores)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="times the two layouts take turns")
    parser.add_argument("demo", nargs="*", help="demo flags (after --)")
    args = parser.parse_args(argv)
    if os.environ.get("OMP_NUM_THREADS"):
        raise SystemExit("unset OMP_NUM_THREADS: the layouts set their own thread counts")
    if args.model != "smollm2" and args.model not in MODELS:
        raise SystemExit(f"--model must be smollm2 or one of {sorted(MODELS)}, got {args.model!r}")
    model = [] if args.model == "smollm2" else ["--model", str(random_llama_dir(args.model, CACHE))]
    demo = ["demo", "--json", "--no-numerics", *model, *args.demo]
    threads = min(args.ranks, os.cpu_count() or 1)  # more threads than cores would only slow the one process
    one = [sys.executable, "-m", "specdec", *demo, "--threads", str(threads)]
    tp = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.ranks),
          "-m", "specdec", *demo, "--threads", "1"]  # fmt: skip
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    out = []
    for rnd in range(args.rounds):
        order = [("one process", one), ("tensor parallel", tp)]
        for layout, cmd in order if rnd % 2 == 0 else order[::-1]:
            load = os.getloadavg()[0]
            doc = demo_json(cmd)
            s = doc["settings"]
            for r in doc["rows"]:
                out.append({
                    "timestamp": stamp, **run_meta(), "model": args.model,
                    "prompts": os.path.basename(s["prompts"]) if s.get("prompts") else "HumanEval",
                    "num_prompts": s["num_prompts"], "max_new_tokens": s["max_new_tokens"],
                    "temperature": s["temperature"], "draft": s["draft"], "round": rnd, "layout": layout,
                    "ranks": args.ranks if layout == "tensor parallel" else 1,
                    "threads_per_rank": 1 if layout == "tensor parallel" else threads, "label": r["label"],
                    "new_tokens": r["new_tokens"], "tokens_per_second": r["tokens_per_second"],
                    "block_efficiency": r["block_efficiency"], "calls_per_round": r.get("calls_per_round", ""),
                    "bytes_per_round": r.get("bytes_per_round", ""), "load": f"{load:.2f}",
                })  # fmt: skip
    for rnd in range(args.rounds):
        base = [o for o in out if o["round"] == rnd and o["layout"] == "one process" and o["label"] == "ar"]
        for o in out:
            if base and o["round"] == rnd:
                o["vs_one_process_ar"] = f"{float(o['tokens_per_second']) / float(base[0]['tokens_per_second']):.3f}"
    append_csv(os.path.join(RESULTS, "tensor_parallel.csv"), FIELDS, out)
    for o in out:
        print(f"{o['round']} {o['layout']:16s} {o['label']:24s} {float(o['tokens_per_second']):7.2f} tok/s  "
              f"{o.get('vs_one_process_ar', '-')}x one-process AR  {o['bytes_per_round'] or ''}")  # fmt: skip
    print(f"appended {len(out)} rows to benchmarks/results/tensor_parallel.csv")


if __name__ == "__main__":
    main(sys.argv[1:])
