"""The comparison with another engine on the same weights: llama.cpp's plain decoding beside ours
(llama_cpp.csv, benchmarks/bench_llama_cpp.py)."""

from __future__ import annotations

import os
from pathlib import Path

from .common import Rows, newest_runs, num, provenance, read_csv, table

#: a run is one bench_llama_cpp call's setting on one machine and CPU variant
RUN_KEY = ("machine", "cpu_isa", "model", "prompts", "skip", "temperature", "tokens")


def _runs(rows: Rows) -> list[Rows]:
    """The newest run of each setting, in the order the settings were first recorded."""
    return list(newest_runs(rows, RUN_KEY).values())


def _setting(r: dict[str, str]) -> str:
    prompts = "HumanEval" if r["prompts"] == "human-eval" else os.path.splitext(os.path.basename(r["prompts"]))[0]
    first = int(r.get("skip") or 0)
    prompts += f" {first + 1}-{first + int(r['n_prompts'])}"  # which prompts of the set
    temp = float(r["temperature"])
    sampling = "greedy" if temp == 0 else f"T = {temp:g}, top-k {r['top_k']}"
    model = "" if r["model"] == "SmolLM2-135M-Instruct" else f"{r['model']}, "
    return f"{model}{prompts}, {sampling}"


def _rate(r: dict[str, str] | None) -> str:
    return "-" if r is None else f"{num(r['tok_s'])} ({num(r['tok_s_decode'])})"


def _ratio(r: dict[str, str] | None) -> str:
    return "-" if r is None else f"{float(r['vs_llama_cpp']):.2f}x ({float(r['vs_llama_cpp_decode']):.2f}x)"


def block_llama_cpp(results: Path, *, brief: bool = False) -> str:
    runs = _runs(read_csv(results, "llama_cpp"))
    if not runs:
        return "No run recorded in `benchmarks/results/llama_cpp.csv`.\n"
    lines = []
    variants = len({run[0]["cpu_isa"] for run in runs}) > 1  # then each setting names its CPU variant
    for run in runs:
        for threads in sorted({int(r["threads"]) for r in run}):
            by = {r["engine"]: r for r in run if int(r["threads"]) == threads}
            best = next((r for e, r in by.items() if e not in ("llama.cpp", "llama.cpp eval", "ar")), None)
            setting = f"{_setting(run[0])} ({run[0]['cpu_isa']})" if variants else _setting(run[0])
            cells = [setting, str(threads), _rate(by.get("llama.cpp")), _rate(by.get("ar")),
                     _ratio(by.get("ar")), best["method"] if best else "-", _rate(best), _ratio(best)]  # fmt: skip
            if brief:
                cells = [cells[0], cells[1], cells[2], cells[4], cells[5], cells[7]]
            else:
                cells += [num(best["block_efficiency"]) if best and best["block_efficiency"] else "-",
                          best["same_as_ar"] or "-" if best else "-"]  # fmt: skip
            lines.append(cells)
    if brief:
        head = ["prompts, sampling", "threads", "llama.cpp tok/s", "our AR vs llama.cpp", "our best method",
                "vs llama.cpp"]  # fmt: skip
    else:
        head = ["prompts, sampling", "threads", "llama.cpp tok/s", "our AR tok/s", "AR vs llama.cpp", "our method",
                "tok/s", "vs llama.cpp", "block eff.", "greedy: same tokens as our AR"]  # fmt: skip
    rows = [r for run in runs for r in run]
    versions = ", ".join(dict.fromkeys(r["llama_cpp"] for r in rows))
    counts = ", ".join(dict.fromkeys(f"{r['n_prompts']} prompts x {r['tokens']} tokens x {r['rounds']} rounds"
                                     for r in rows))  # fmt: skip
    loads = [float(x) for r in rows for x in r["load"].split()]
    extra = (f"our CPU variant {', '.join(dict.fromkeys(r['cpu_isa'] for r in rows))} (llama.cpp: its own build for "
             f"this CPU); llama-cpp-python {versions} built "
             f"from source, the same bf16 weights; {counts}; tok/s over the whole call (prompt included), in brackets "
             f"over the decode alone; load {min(loads):.2f}-{max(loads):.2f}")  # fmt: skip
    return table(head, lines) + "\n\n" + provenance(rows, machine="machine", torch="torch", extra=extra) + "\n"


#: a vLLM run is one bench_vllm call's setting on one machine and CPU variant
VLLM_KEY = ("machine", "cpu_isa", "vllm", "prompts", "num_prompts", "max_new_tokens", "temperature", "threads")


def block_vllm(results: Path) -> str:
    """vLLM beside our driver on the same prompts (vllm.csv, benchmarks/bench_vllm.py)."""
    runs = list(newest_runs(read_csv(results, "vllm"), VLLM_KEY).values())
    if not runs:
        return "No run recorded in `benchmarks/results/vllm.csv`.\n"
    lines = []
    for run in runs:
        r0 = run[0]
        temp = float(r0["temperature"])
        setting = f"{r0['prompts']} 1-{r0['num_prompts']}, {'greedy' if temp == 0 else f'T = {temp:g}'}"
        for r in run:
            lines.append([setting, r0["threads"], r["engine"], r["config"], num(r["tokens_per_second"]),
                          f"{float(r['vs_our_ar']):.2f}x", num(r["accepted_per_round"]) if r["accepted_per_round"]
                          else "-"])  # fmt: skip
    head = ["prompts, sampling", "threads", "engine", "configuration", "tok/s", "vs our AR", "drafts accepted / round"]
    rows = [r for run in runs for r in run]
    loads = [float(r["load"]) for r in rows]
    versions = ", ".join(dict.fromkeys(f"vLLM {r['vllm']}, transformers {r['transformers']}" for r in rows))
    extra = (f"CPU variant {', '.join(dict.fromkeys(r['cpu_isa'] for r in rows))}; {versions} (vLLM's CPU build, "
             f"its own virtualenv); SmolLM2-135M-Instruct bf16, {rows[0]['max_new_tokens']} new tokens per prompt, "
             f"one prompt per call; load before each run {min(loads):.2f}-{max(loads):.2f}")  # fmt: skip
    return table(head, lines) + "\n\n" + provenance(rows, machine="machine", torch="torch", extra=extra) + "\n"
