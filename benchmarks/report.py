"""Render every measured figure of the documentation from the recorded data.

The figures in README.md and docs/*.md are never typed by hand: each sits in a generated block

    <!-- report:begin NAME -->
    ...
    <!-- report:end -->

that this script rewrites from benchmarks/results/*.csv (and, for the shipped drafts, the manifests in
python_api/specdec/assets/*.json). Every table names the machine, CPU flags and torch version of the rows it
shows, or says which of those columns the CSV does not record. It also renders the PNGs next to the CSVs
(benchmarks/plot.py).

Run:  python benchmarks/report.py            # rewrite the blocks and the PNGs
      python benchmarks/report.py --no-png   # the blocks only
      python benchmarks/report.py --check    # exit 1 if a committed block differs from its rendering

tests/test_docs_rendered.py runs the check in memory, so a figure edited by hand, or a CSV changed without
re-rendering, fails the test suite.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

# the render package beside this file, also when a test loads this file by its path
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from render.common import (  # noqa: F401
    ASSETS,
    PLAUSIBLE_SLACK,
    RESULTS,
    ROOT,
    Rows,
    _variant_cell,
    implausible,
    newest_run,
    num,
    provenance,
    read_csv,
    table,
)
from render.csd import CSD_SETS, _csd_run, _csd_setting, block_csd, plot_csd  # noqa: F401
from render.drafts import (  # noqa: F401
    SET_NAMES,
    _shipped,
    block_draft_alpha,
    block_draft_e2e,
    block_shipped_drafts,
    block_specdec_pp,
)
from render.end_to_end import (  # noqa: F401
    HEADLINE_DRAFT,
    block_demo_runs,
    block_end_to_end,
    block_end_to_end_headline,
    plot_end_to_end,
)
from render.engines import block_llama_cpp, block_vllm  # noqa: F401
from render.gpu import _gpu_provenance, block_gpu_model, block_gpu_ops  # noqa: F401
from render.kernels import (  # noqa: F401
    HEADLINE_OPS,
    KERNEL_OPS,
    block_kernel_headline,
    block_kernel_tables,
    kernel_provenance,
    kernel_rows,
)
from render.parallel import block_tensor_parallel  # noqa: F401
from render.steps import (  # noqa: F401
    _new_cells,
    _runs_by_isa,
    _share_cell,
    block_step_overhead,
    block_step_profile,
    block_target_step,
    block_target_step_ops,
)
from render.verifiers import block_block_verification, block_optimum  # noqa: F401

#: the files that hold generated blocks
DOCS = (
    "README.md",
    "docs/benchmarks.md",
    "docs/drafts.md",
    "docs/distributed.md",
    "docs/methods.md",
    "benchmarks/results/csd.md",
)


BLOCK = re.compile(r"(<!-- report:begin ([a-z0-9_-]+) -->\n)(.*?)(<!-- report:end -->)", re.S)


BLOCKS: dict[str, Callable[[Path], str]] = {
    "kernel-headline": block_kernel_headline,
    "kernel-tables": block_kernel_tables,
    "step-overhead-headline": lambda results: block_step_overhead(results, brief=True),
    "step-overhead": block_step_overhead,
    "draft-alpha": block_draft_alpha,
    "draft-alpha-headline": lambda results: block_draft_alpha(results),
    "shipped-drafts": block_shipped_drafts,
    "end-to-end": block_end_to_end,
    "demo-runs": block_demo_runs,
    "end-to-end-headline": block_end_to_end_headline,
    "specdec-pp": block_specdec_pp,
    "draft-e2e": block_draft_e2e,
    "target-step": block_target_step,
    "target-step-ops": block_target_step_ops,
    "step-profile": block_step_profile,
    "llama-cpp": block_llama_cpp,
    "llama-cpp-headline": lambda results: block_llama_cpp(results, brief=True),
    "tensor-parallel": block_tensor_parallel,
    "block-verification": block_block_verification,
    "optimum": block_optimum,
    "vllm": block_vllm,
    "csd": block_csd,
    "gpu-ops": block_gpu_ops,
    "gpu-model": block_gpu_model,
}


def render_text(text: str, results: Path = RESULTS) -> str:
    """``text`` with every generated block replaced by its rendering (unknown block names raise KeyError)."""
    cache: dict[str, str] = {}

    def sub(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in BLOCKS:
            raise KeyError(f"unknown report block {name!r}; known: {', '.join(BLOCKS)}")
        if name not in cache:
            cache[name] = BLOCKS[name](results)
        return m.group(1) + cache[name] + m.group(4)

    return BLOCK.sub(sub, text)


def render_all(root: Path = ROOT, results: Path = RESULTS) -> dict[str, tuple[str, str]]:
    """{doc path: (committed text, rendered text)} for every file in DOCS."""
    out = {}
    for rel in DOCS:
        text = (root / rel).read_text(encoding="utf-8")
        out[rel] = (text, render_text(text, results))
    return out


def render_pngs(results: Path) -> list[str]:
    """The PNGs of benchmarks/plot.py (kernel microbenchmarks, summary, step overhead), from the same CSVs."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import plot

    written = []
    all_rows = {}
    for op in KERNEL_OPS:
        rows = read_csv(results, op)
        if rows:
            all_rows[op] = plot.newest_run(rows)
            written.append(plot.plot_op(op, all_rows[op], str(results)))
    summary = plot.plot_summary(all_rows, str(results))
    if summary:
        written.append(summary)
    overhead = read_csv(results, "step_overhead")
    if overhead:
        written.append(plot.plot_step_overhead(overhead, str(results)))
    for extra in (plot_end_to_end(results), plot_csd(results)):
        if extra:
            written.append(extra)
    pp = [r for r in newest_run(read_csv(results, "specdec_pp"), ("machine", "torch", "git_rev", "prompts"))]
    if pp:
        import bench_specdec_pp

        floats = ("param", "discard_rate", "verification_rate")
        pts = [{**r, **{k: float(r[k]) if r.get(k) else 0.0 for k in floats}} for r in pp]
        written.append(str(bench_specdec_pp.plot(pts)))
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 when a committed block is stale")
    ap.add_argument("--no-png", action="store_true", help="do not render the PNGs")
    args = ap.parse_args()
    stale = []
    for rel, (old, new) in render_all().items():
        if old == new:
            continue
        stale.append(rel)
        if not args.check:
            (ROOT / rel).write_text(new, encoding="utf-8")
            print("rewrote", rel)
    if args.check:
        for rel in stale:
            print(f"{rel}: generated blocks differ from benchmarks/results; run python benchmarks/report.py")
        return 1 if stale else 0
    if not args.no_png:
        for path in render_pngs(RESULTS):
            print("wrote", os.path.relpath(path, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
