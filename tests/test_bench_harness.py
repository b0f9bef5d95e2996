"""The benchmark harness's CSV writer and run metadata (benchmarks/_timing.py): rows keep their values when a newer
harness adds columns, and every row names the machine, CPU flags and extension variant it was measured with."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _timing  # noqa: E402

import specdec_kernels as sk  # noqa: E402
from specdec_kernels.native import CUDA_OPS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    with path.open(newline="") as fh:
        header = next(csv.reader(fh))
    return header, rows


def test_append_creates_then_appends(tmp_path: Path) -> None:
    path = tmp_path / "op.csv"
    _timing.append_csv(path, ["a", "b"], [{"a": 1, "b": 2}])
    _timing.append_csv(path, ["a", "b"], [{"a": 3, "b": 4}])
    header, rows = read(path)
    assert header == ["a", "b"]
    assert rows == [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]


def test_new_columns_rewrite_the_file_keeping_old_rows(tmp_path: Path) -> None:
    path = tmp_path / "op.csv"
    _timing.append_csv(path, ["a", "b"], [{"a": 1, "b": 2}])
    _timing.append_csv(path, ["a", "cpu_flags", "b"], [{"a": 5, "cpu_flags": "avx2", "b": 6}])
    header, rows = read(path)
    assert header == ["a", "cpu_flags", "b"]
    assert rows == [{"a": "1", "cpu_flags": "", "b": "2"}, {"a": "5", "cpu_flags": "avx2", "b": "6"}]


def test_run_meta_names_the_variant_and_flags() -> None:
    meta = _timing.run_meta()
    assert set(meta) == {"machine", "torch", "git_rev", "cpu_flags", "cpu_isa"}
    assert meta["cpu_isa"].split()[0] == sk.cpu_isa()
    assert meta["cpu_flags"]


def test_interleaved_timing_takes_turns_in_a_rotated_order() -> None:
    calls: list[str] = []
    fns = {k: (lambda k=k: calls.append(k)) for k in ("a", "b", "c")}
    times = _timing.time_fns_interleaved(fns, budget=0.0, min_reps=4, max_reps=4)
    assert {k: len(t) for k, t in times.items()} == {"a": 4, "b": 4, "c": 4}
    assert calls[:3] == ["a", "b", "c"]  # one warm-up call each
    rounds = [calls[3 + 3 * r : 6 + 3 * r] for r in range(4)]
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert all(t >= 0 for ts in times.values() for t in ts)


def test_single_function_timing_runs_before_ahead_of_every_timed_call() -> None:
    calls: list[str] = []
    times = _timing.time_fn(lambda: calls.append("f"), 0.0, min_reps=3, max_reps=3, before=lambda: calls.append("b"))
    assert len(times) == 3
    assert calls == ["f", "b", "f", "b", "f", "b", "f"]  # the warm-up call, then before + call per repetition


def test_interleaved_cases_record_one_row_per_case_and_backend() -> None:
    import argparse

    rec = _timing.Recorder("op", argparse.Namespace(budget=0.0, clock="wall", no_csv=True))
    work = partial(time.sleep, 1e-4)  # a call takes time, so the medians and ratios are defined
    rec.cases_interleaved({"n 1": {"cpu": work, "torch": work}, "n 2": {"cpu": work}}, 64)
    assert [(r["case"], r["backend"]) for r in rec.rows] == [("n 1", "cpu"), ("n 1", "torch"), ("n 2", "cpu")]
    assert all(r["reps"] == 5 and r["copy_gbps"] > 0 and r["read_gbps"] > 0 for r in rec.rows)
    assert rec.rows[0]["speedup_vs_torch"] != "" and rec.rows[2]["speedup_vs_torch"] == ""


def test_samples_timed_elsewhere_are_recorded_as_a_case() -> None:
    import argparse

    rec = _timing.Recorder("op", argparse.Namespace(budget=0.0, clock="wall", no_csv=True))
    rec.samples("decoding draft first", {"cpu": [0.003, 0.001, 0.002]}, 64)
    (row,) = rec.rows
    assert row["case"] == "decoding draft first" and row["backend"] == "cpu" and row["reps"] == 3
    assert row["median_ms"] == 2.0 and row["p10_ms"] == 1.0 and row["p90_ms"] == 3.0


def _write(path: Path, fields: list[str], rows: list[dict]) -> None:
    _timing.append_csv(path, fields, rows)


def test_demo_runs_block_names_the_fastest_and_slowest_method(tmp_path: Path) -> None:
    import bench_demo
    import report

    meta = {"timestamp": "t1", "machine": "m", "torch": "2", "git_rev": "abc", "cpu_flags": "avx2", "cpu_isa": "avx2"}
    run = {**meta, "prompt_set": "chat.jsonl", "num_prompts": 8, "max_new_tokens": 64, "temperature": 0.7}
    run |= {"threads": 1, "batch_size": 1, "draft": "d", "dtype": "bf16", "load_before": "0.42"}
    rows = [
        {**run, "label": "ar", "tokens_per_second": 30, "speed_ratio": 1.0, "block_efficiency": 1.0},
        {**run, "label": "sd(L=2)", "tokens_per_second": 36, "speed_ratio": 1.2, "block_efficiency": 1.5},
        {**run, "label": "spechub(b=2,2)", "tokens_per_second": 48, "speed_ratio": 1.6, "block_efficiency": 2.0},
        # faster than its block efficiency allows: machine load, dropped
        {**run, "label": "rrs(b=2,2)", "tokens_per_second": 90, "speed_ratio": 3.0, "block_efficiency": 1.5},
        {**run, "label": "hf generate", "tokens_per_second": 16, "speed_ratio": 0.53, "block_efficiency": 1.0},
    ]
    _write(tmp_path / "demo.csv", bench_demo.FIELDS, rows)
    out = report.block_demo_runs(tmp_path)
    assert "| chat | T = 0.7 | 1 | avx2 | `d` | 30.0 | spechub(b=2,2) 1.60x | 3.00x | sd(L=2) 1.20x | 0.42 |" in out
    assert "rrs" not in out and "abc" not in out and "CPU flags avx2" in out  # the revision stays in the CSV
    # a run recorded before the load column existed: its rows are kept, the load shown as unknown
    old = [{k: v for k, v in r.items() if k != "load_before"} | {"timestamp": "t0", "prompt_set": "o"} for r in rows]
    (tmp_path / "demo.csv").unlink()
    _write(tmp_path / "demo.csv", [f for f in bench_demo.FIELDS if f != "load_before"], old)
    _write(tmp_path / "demo.csv", bench_demo.FIELDS, rows)
    out = report.block_demo_runs(tmp_path)
    assert "| o | T = 0.7 |" in out and "sd(L=2) 1.20x | - |" in out and "sd(L=2) 1.20x | 0.42 |" in out


def test_target_step_block_shows_the_draft_step_as_a_share_of_a_target_step(tmp_path: Path) -> None:
    import report

    meta = {"timestamp": "t1", "machine": "m", "torch": "2", "git_rev": "abc", "cpu_flags": "avx2", "cpu_isa": "avx2"}
    base = {**meta, "op": "target_step", "backend": "cpu", "threads": 1, "clock": "cpu", "bytes": 1000}
    base |= {"copy_gbps": 1.0}
    rows = [
        {**base, "case": "bf16 ctx 200 new 1", "median_ms": 40.0},
        {**base, "case": "bf16 ctx 200 new 2", "median_ms": 44.0},
        {**base, "case": "draft dr after a target step", "median_ms": 2.0, "bytes": 10},
        {**base, "case": "draft dr repeated", "median_ms": 1.0, "bytes": 10},
        {**base, "case": "bf16 linears new 1", "median_ms": 30.0},
        {**base, "case": "bf16 linears new 2", "median_ms": 33.0},
        {**base, "case": "bf16 linears in cache new 1", "median_ms": 6.0},
        {**base, "case": "bf16 linears in cache new 2", "median_ms": 9.5},
    ]
    fields = [*meta, "op", "case", "backend", "threads", "clock", "median_ms", "bytes", "copy_gbps"]
    _write(tmp_path / "target_step.csv", fields, rows)
    out = report.block_target_step(tmp_path)
    assert "draft step (dr), after a target step" in out
    assert "| avx2 | " in out and "| 40.0 ms | 1.10x | - | 5.0 % (2.00 ms) | 2.5 % (1.00 ms) |" in out
    # the compute floor sits on its own row, in ms, and stays out of the pass ratios and the floors; a run without
    # a read rate has no read floor, its copy floor is the bytes over the copy rate
    assert "| avx2 | - | 0.00100 ms | 40.0 ms | 1.10x |" in out
    assert "| avx2: linears alone | - | - | 30.0 ms | 1.10x | - | - | - |" in out
    assert "| avx2: linears in cache | - | - | 6.00 ms | 9.50 ms | - | - | - |" in out
    # the draft's steps as a decoding ran them: shares of that decoding's target passes, in three more columns
    rows += [
        {**base, "case": "decoding target pass", "median_ms": 16.0},
        {**base, "case": "decoding draft first", "median_ms": 0.8, "bytes": 10},
        {**base, "case": "decoding draft later", "median_ms": 0.4, "bytes": 10},
    ]
    (tmp_path / "target_step.csv").unlink()
    _write(tmp_path / "target_step.csv", fields, rows)
    out = report.block_target_step(tmp_path)
    assert "| target pass in decoding | draft step in decoding, first of a round | later in a round |" in out
    assert "| 2.5 % (1.00 ms) | 16.0 ms | 5.0 % (0.800 ms) | 2.5 % (0.400 ms) |" in out
    assert "| avx2: linears alone | - | - | 30.0 ms | 1.10x | - | - | - | - | - | - |" in out
    # with the read rate, the read floor and the one-token step and linears as multiples of it
    rows = [{**r, "read_gbps": 0.05} for r in rows]
    (tmp_path / "target_step.csv").unlink()
    _write(tmp_path / "target_step.csv", [*fields, "read_gbps"], rows)
    out = report.block_target_step(tmp_path)
    assert "| avx2 | 0.0200 ms | 0.00100 ms | 40.0 ms (2000.00x floor) | 1.10x |" in out
    assert "| avx2: linears alone | - | - | 30.0 ms (1500.00x floor) | 1.10x |" in out


def test_gpu_check_dry_run_times_every_cuda_op(tmp_path: Path) -> None:
    """scripts/gpu_check.sh --dry-run runs its steps on the CPU at small sizes and leaves the four files a GPU call
    brings back; its microbenchmark covers every op that has a CUDA kernel, each backend checked against the
    reference before it is timed, and the model benchmark records a pass at every chain length."""
    res = subprocess.run(
        ["bash", "scripts/gpu_check.sh", str(tmp_path), "--dry-run", "env", "build", "bench", "model"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    files = ["gpu_model.csv", "gpu_ops.csv", "logs.tar.gz", "summary.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == files
    assert all(f"{step} rc=0" in res.stdout for step in ("env", "build", "bench", "model"))
    _, rows = read(tmp_path / "gpu_ops.csv")
    assert {r["op"] for r in rows} == set(CUDA_OPS)
    assert {r["backend"] for r in rows} == {"torch", "cpu"}
    assert all(float(r["median_ms"]) > 0 and float(r["roofline_ms"]) > 0 for r in rows)
    _, model_rows = read(tmp_path / "gpu_model.csv")
    assert [r["case"] for r in model_rows[:7]] == [f"pass n={n}" for n in (1, 2, 4, 8, 16, 32, 64)]
    assert all(float(r["value"]) > 0 for r in model_rows if r["case"].startswith("pass "))
    assert {r["case"].split(": ")[-1] for r in model_rows[7:]} == {"CUDA kernels per round", "kernel time per round",
                                                                 "time per round"}  # fmt: skip
    # the docs' GPU blocks render from these CSVs: one line per (op, backend), one per model case
    import report

    ops_block = report.block_gpu_ops(tmp_path)
    assert ops_block.count("\n| `") == len(rows) and "Measured on cpu" in ops_block
    model_block = report.block_gpu_model(tmp_path)
    assert "| pass n=64 |" in model_block and "| pass n=1 | " in model_block and "1.00x" in model_block
    assert report.block_gpu_ops(tmp_path / "none").startswith("No GPU run recorded")


def test_the_read_rate_is_measured_once_per_thread_count() -> None:
    import argparse

    import torch

    rec = _timing.Recorder("op", argparse.Namespace(budget=0.0, clock="wall", no_csv=True))
    calls = []
    real = _timing.read_gbps
    try:
        _timing.read_gbps = lambda nbytes, budget: calls.append(nbytes) or 20.0  # type: ignore[assignment]
        assert rec.read_rate(64) == 20.0 and rec.read_rate(128) == 20.0 and len(calls) == 1
        threads = torch.get_num_threads()
        torch.set_num_threads(threads + 1)
        try:
            rec.read_rate(64)
        finally:
            torch.set_num_threads(threads)
        assert len(calls) == 2
    finally:
        _timing.read_gbps = real
    # the real measure reads a buffer past the caches, whatever the bytes asked for
    assert real(64, 0.0) > 0


def test_llama_cpp_block_states_each_engine_against_llama_cpp(tmp_path: Path) -> None:
    import report

    meta = {"timestamp": "t1", "machine": "m", "torch": "2", "git_rev": "abc", "cpu_flags": "avx2", "cpu_isa": "avx2"}
    base = {**meta, "load": "0.50 0.70", "llama_cpp": "0.3.36", "model": "SmolLM2-135M-Instruct", "dtype": "bf16",
            "prompts": "chat.jsonl", "skip": 40, "n_prompts": 8, "rounds": 2, "tokens": 64, "temperature": 0.0,
            "top_k": "", "threads": 1, "new_tokens": 1000, "block_efficiency": "", "same_as_ar": ""}  # fmt: skip
    rows = [
        {**base, "engine": "llama.cpp", "method": "plain", "tok_s": 50.0, "tok_s_decode": 60.0, "vs_llama_cpp": 1.0,
         "vs_llama_cpp_decode": 1.0, "same_as_ar": "3/16"},
        {**base, "engine": "llama.cpp eval", "method": "plain", "tok_s": 49.0, "tok_s_decode": 59.0,
         "vs_llama_cpp": 0.98, "vs_llama_cpp_decode": 0.98, "same_as_ar": "3/16"},
        {**base, "engine": "ar", "method": "ar", "tok_s": 40.0, "tok_s_decode": 45.0, "vs_llama_cpp": 0.8,
         "vs_llama_cpp_decode": 0.75},
        {**base, "engine": "rsd_c", "method": "rsd_c(auto)", "tok_s": 75.0, "tok_s_decode": 90.0, "vs_llama_cpp": 1.5,
         "vs_llama_cpp_decode": 1.5, "block_efficiency": 2.1, "same_as_ar": "16/16"},
    ]  # fmt: skip
    import bench_llama_cpp

    _write(tmp_path / "llama_cpp.csv", bench_llama_cpp.FIELDS, rows)
    out = report.block_llama_cpp(tmp_path)
    assert "| chat 41-48, greedy | 1 | 50.0 (60.0) | 40.0 (45.0) | 0.80x (0.75x) | rsd_c(auto) | 75.0 (90.0) | " in out
    assert "| 1.50x (1.50x) | 2.10 | 16/16 |" in out
    assert "llama-cpp-python 0.3.36" in out and "load 0.50-0.70" in out
    brief = report.block_llama_cpp(tmp_path, brief=True)
    assert "| chat 41-48, greedy | 1 | 50.0 (60.0) | 0.80x (0.75x) | rsd_c(auto) | 1.50x (1.50x) |" in brief
    # greedy: how often an engine's tokens equal our AR's
    outputs = {("ar", 0, 0): [1, 2], ("ar", 0, 1): [3], ("llama.cpp", 0, 0): [1, 2], ("llama.cpp", 0, 1): [4]}
    assert bench_llama_cpp.same_as_ar(outputs, "llama.cpp") == "1/2"
    assert bench_llama_cpp.same_as_ar(outputs, "llama.cpp eval") == "1/2"


def test_step_profile_block_shows_each_part_and_the_floor(tmp_path: Path) -> None:
    import bench_step_profile
    import report

    meta = {"timestamp": "t1", "machine": "m", "torch": "2", "git_rev": "abc", "cpu_flags": "avx2", "cpu_isa": "avx2"}
    base = {**meta, "load": "0.5", "model": "SmolLM2-135M-Instruct", "dtype": "bf16", "threads": 1, "prompts": "p",
            "tokens": 256, "step_ms": 20.0, "read_floor_ms": 10.0, "read_gbps": 27.0}  # fmt: skip
    parts = dict.fromkeys(bench_step_profile.PARTS, 1.0) | {"layers: linears": 12.0}
    rows = [{**base, "part": p, "ms_per_token": ms, "share": ms / 20.0} for p, ms in parts.items()]
    _write(tmp_path / "step_profile.csv", bench_step_profile.FIELDS, rows)
    out = report.block_step_profile(tmp_path)
    assert "| part of a step | SmolLM2-135M, avx2, 1 thread(s) |" in out
    assert "| layers: linears | 12.0 ms (60.0 %) |" in out and "| head | 1.00 ms (5.0 %) |" in out
    assert (
        "| step / read floor | 2.00x |" in out and "| read floor (weights / read rate) | 10.0 ms (27.0 GB/s) |" in out
    )


def test_llama_cpp_weights_check_catches_a_changed_matrix(tmp_path: Path) -> None:
    """The benchmark's check that llama.cpp's GGUF holds our bf16 weights: it passes on a faithful file (norms in
    fp32, q/k rows permuted as llama.cpp's converter permutes them) and fails on one changed value."""
    import bench_llama_cpp
    import gguf
    import numpy as np
    import pytest
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)  # fmt: skip
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    roles = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
             "ffn_norm": "post_attention_layernorm"}  # fmt: skip
    params = dict(model.named_parameters())

    def write(path: Path, change: bool) -> None:
        w = gguf.GGUFWriter(str(path), "llama")
        tensors = {"token_embd.weight": params["model.embed_tokens.weight"],
                   "output_norm.weight": params["model.norm.weight"]}  # fmt: skip
        tensors |= {f"blk.0.{r}.weight": params[f"model.layers.0.{n}.weight"] for r, n in roles.items()}
        for name, t in tensors.items():
            t = t.detach()
            if name.endswith(("attn_q.weight", "attn_k.weight")):
                t = t.flip(0)  # a row permutation
            if t.dim() == 1:
                w.add_tensor(name, t.float().numpy())
            else:
                bits = t.contiguous().view(torch.int16).numpy().copy()
                if change and name == "blk.0.ffn_up.weight":
                    bits[0, 0] ^= 1
                w.add_tensor(name, bits.view(np.uint8), raw_dtype=gguf.GGMLQuantizationType.BF16)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    write(tmp_path / "same.gguf", change=False)
    assert bench_llama_cpp.check_same_weights(tmp_path / "same.gguf", model) == 11
    write(tmp_path / "changed.gguf", change=True)
    with pytest.raises(SystemExit, match="ffn_up"):
        bench_llama_cpp.check_same_weights(tmp_path / "changed.gguf", model)


def test_tensor_parallel_block_states_each_layout_against_one_process_ar(tmp_path: Path) -> None:
    import bench_tensor_parallel
    import report

    meta = {"timestamp": "t1", "machine": "m", "torch": "2", "git_rev": "abc", "cpu_flags": "avx2", "cpu_isa": "avx2"}
    base = {**meta, "model": "random-1b", "prompts": "HumanEval", "num_prompts": 2, "max_new_tokens": 48,
            "temperature": 0.0, "draft": "ngram", "round": 0, "block_efficiency": "1.0"}  # fmt: skip
    one = {**base, "layout": "one process", "ranks": 1, "threads_per_rank": 2, "load": "1.00"}
    tp = {**base, "layout": "tensor parallel", "ranks": 2, "threads_per_rank": 1, "load": "1.50"}
    rows = [
        {**one, "label": "ar", "tokens_per_second": 10.0, "vs_one_process_ar": 1.0},
        {**tp, "label": "ar", "tokens_per_second": 8.0, "vs_one_process_ar": 0.8, "calls_per_round": 34,
         "bytes_per_round": 2048},
        {**tp, "label": "sd(L=2)", "tokens_per_second": 12.0, "vs_one_process_ar": 1.2, "block_efficiency": "1.9",
         "calls_per_round": 35, "bytes_per_round": 4096},
    ]  # fmt: skip
    _write(tmp_path / "tensor_parallel.csv", bench_tensor_parallel.FIELDS, rows)
    out = report.block_tensor_parallel(tmp_path)
    assert "**Llama random-1b (random weights)**, HumanEval (2 prompts), 48 new tokens, greedy, draft ngram" in out
    assert "| one process | 1 x 2 | ar | 10.0 | 1.00x | 1.00 | - | - |" in out
    assert "| tensor parallel | 2 x 1 | ar | 8.00 | 0.80x | 1.00 | 34.0 | 2.00 |" in out
    assert "| tensor parallel | 2 x 1 | sd(L=2) | 12.0 | 1.20x | 1.90 | 35.0 | 4.00 |" in out
    assert "load before each layout 1.00-1.50" in out


def test_vllm_block_states_each_configuration_against_our_ar(tmp_path: Path) -> None:
    import bench_vllm
    import report

    meta = {"timestamp": "t1", "machine": "m", "torch": "2", "git_rev": "abc", "cpu_flags": "avx2", "cpu_isa": "avx2"}
    base = {**meta, "vllm": "0.32.0", "transformers": "5.19.0", "prompts": "HumanEval", "num_prompts": 4,
            "max_new_tokens": 64, "temperature": 0.7, "threads": 1, "new_tokens": 256, "seconds": 10.0,
            "load": "0.90"}  # fmt: skip
    rows = [
        {**base, "engine": "vLLM", "config": "plain", "tokens_per_second": 12.0, "vs_our_ar": 0.5,
         "accepted_per_round": ""},
        {**base, "engine": "vLLM", "config": "ngram K=3, specdec's verifier", "tokens_per_second": 15.0,
         "vs_our_ar": 0.625, "accepted_per_round": 1.2},
        {**base, "engine": "specdec", "config": "ar", "tokens_per_second": 24.0, "vs_our_ar": 1.0,
         "accepted_per_round": ""},
    ]  # fmt: skip
    _write(tmp_path / "vllm.csv", bench_vllm.FIELDS, rows)
    out = report.block_vllm(tmp_path)
    assert "| HumanEval 1-4, T = 0.7 | 1 | vLLM | plain | 12.0 | 0.50x | - |" in out
    assert "| HumanEval 1-4, T = 0.7 | 1 | vLLM | ngram K=3, specdec's verifier | 15.0 | 0.62x | 1.20 |" in out
    assert "| HumanEval 1-4, T = 0.7 | 1 | specdec | ar | 24.0 | 1.00x | - |" in out
    assert "vLLM 0.32.0, transformers 5.19.0" in out and "load before each run 0.90-0.90" in out
