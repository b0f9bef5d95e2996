"""The demo (``python -m specdec demo``) as a recorded benchmark: the same run, its rows appended to
``benchmarks/results/demo.csv`` with the run's settings (prompt set, temperature, threads, draft, batch size) and
where it ran (machine, CPU flags, extension variant, torch, commit, the 1-minute load average before the run).
``python benchmarks/report.py`` renders, per run, our AR, the fastest exact method against it and against
transformers' ``generate``, and the slowest method.

    python benchmarks/bench_demo.py --num-prompts 8 --temperature 0.7 [any other demo flag]
"""

from __future__ import annotations

import os
import sys
import time

from _timing import RESULTS, append_csv, run_meta
from specdec import cli
from specdec.demo import run_demo
from specdec.harness import draft_label

RUN = ["timestamp", "machine", "torch", "git_rev", "cpu_flags", "cpu_isa", "prompt_set", "num_prompts"]
RUN += ["max_new_tokens", "temperature", "threads", "batch_size", "draft", "dtype", "load_before"]
ROW = ["label", "new_tokens", "tokens_per_second", "speed_ratio", "block_efficiency", "acceptance_rate"]
ROW += ["target_calls", "same_as_ar"]
FIELDS = RUN + ROW


def main(argv: list[str]) -> None:
    args = cli.build_parser().parse_args(["demo", *argv])
    texts = args.check(args)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    load = os.getloadavg()[0]  # the 1-minute load average before the run (blank in rows recorded without it)
    rows = run_demo(args, texts)
    settings = {
        "prompt_set": os.path.basename(args.prompts) if args.prompts else "HumanEval",
        "num_prompts": len(texts),
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "threads": args.threads,
        "batch_size": args.batch_size,
        "draft": draft_label(args.draft, args.draft_int8),
        "dtype": args.dtype,
        "load_before": f"{load:.2f}",
    }
    out = [{"timestamp": stamp, **run_meta(), **settings, **{k: r.get(k, "") for k in ROW}} for r in rows]
    append_csv(os.path.join(RESULTS, "demo.csv"), FIELDS, out)
    print(f"appended {len(out)} rows to benchmarks/results/demo.csv")


if __name__ == "__main__":
    main(sys.argv[1:])
