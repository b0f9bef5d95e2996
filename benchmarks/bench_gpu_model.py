"""On a GPU: what a verification pass costs against a one-token step for a model of realistic size, and how many
kernels one speculative round launches.

* Pass cost: a Llama with random bf16 weights of about 1B parameters (width 2048, 16 layers, 32 query / 8 KV heads,
  MLP 8192, vocabulary 128256) through the decoders' adapter (``specdec.models.HFCausalLM.probe_chain``: one
  forward over a chain of n new tokens after a cached context of ``--context`` tokens, then the cache as it was), at
  n = 1 .. 64; CUDA events around each pass, median of ``--reps``. On a GPU a pass of many tokens costs little more
  than one while the weights' trip from memory dominates; where it stops doing so decides which trees pay.
* Launches per round: ``specdec.generate`` with method ``sd`` (the same random model as target and, with fewer
  layers, as draft) under the profiler: CUDA kernels and their time per round (target calls), beside the round's
  wall time. The kernel time is what a round would take if launching cost nothing, the floor a CUDA graph of the
  round approaches.

``--small`` (with ``--device cpu``): a tiny model, to check the script where no GPU is.
Output: rows appended to ``OUT/gpu_model.csv`` (``--out``, default benchmarks/results), with the device's name.
Run: python benchmarks/bench_gpu_model.py [--device cuda] [--out DIR] [--small]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
from typing import Any

import specdec
import specdec.models as models
import torch
from _timing import RESULTS, git_rev
from bench_gpu import save_rows, time_call

FIELDS = ["timestamp", "device", "torch", "cuda", "git_rev", "model", "params", "context", "case", "value", "unit"]
NEW = (1, 2, 4, 8, 16, 32, 64)


def llama(small: bool, layers: int | None = None) -> Any:
    """A Llama with random weights: about 1B parameters, or a tiny one (``small``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if small:
        cfg = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=128, vocab_size=512)  # fmt: skip
    else:
        cfg = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                   intermediate_size=8192, vocab_size=128256)  # fmt: skip
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    config = LlamaConfig(**cfg, max_position_embeddings=4096, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def timed(fn: Any, dev: torch.device, reps: int) -> float:
    """Median seconds of ``fn()`` (CUDA events on a GPU), after two warm-up calls."""
    return statistics.median(time_call(fn, [()], dev, 2, reps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="a tiny model (a dry run)")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--no-csv", action="store_true")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (use --device cpu --small for a dry run)")
    dtype = torch.bfloat16
    target = llama(args.small).to(dev, dtype)
    params = sum(p.numel() for p in target.parameters())
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta = {"timestamp": stamp, "device": name, "torch": torch.__version__, "cuda": torch.version.cuda or ""}
    meta |= {"git_rev": git_rev(), "model": "llama-random-small" if args.small else "llama-random-1b"}
    meta |= {"params": params, "context": args.context}
    rows: list[dict[str, Any]] = []
    lm = models.HFCausalLM(target, name="target")
    g = torch.Generator().manual_seed(0)
    vocab = int(target.config.vocab_size)
    state = lm.new_state(1)
    with torch.inference_mode():
        lm.forward_chain(state, [torch.randint(0, vocab, (args.context,), generator=g).tolist()], last_logits=False)
        one = None
        for n in NEW:
            chain = torch.randint(0, vocab, (1, n), generator=g).to(dev)
            sec = timed(lambda chain=chain: lm.probe_chain(state, chain), dev, args.reps)
            one = sec if n == 1 else one
            assert one is not None
            rows.append({**meta, "case": f"pass n={n}", "value": round(sec * 1e3, 4), "unit": "ms"})
            print(f"pass over {n:3d} new tokens: {sec * 1e3:8.3f} ms  ({sec / one:.2f}x a one-token step)", flush=True)

        draft = llama(args.small, layers=2 if not args.small else 1).to(dev, dtype)
        prompt = torch.randint(0, vocab, (1, 64), generator=g).to(dev)
        kw = dict(method="sd", max_new_tokens=32, do_sample=False, draft_length=4)
        specdec.generate(target, draft, prompt, **kw)  # warm-up
        activities = [torch.profiler.ProfilerActivity.CPU]
        if dev.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            out = specdec.generate(target, draft, prompt, **kw)
        rounds = max(1, int(out.stats.target_calls))
        device_events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        kernels = sum(e.count for e in device_events)
        # the GPU's own time: what a round would take if its launches cost nothing (a CUDA graph's floor)
        busy = sum(e.self_device_time_total for e in device_events) / 1e6
        rows.append({**meta, "case": "sd draft_length=4: CUDA kernels per round", "value": round(kernels / rounds, 1),
                     "unit": "kernels"})  # fmt: skip
        rows.append({**meta, "case": "sd draft_length=4: kernel time per round", "value": round(busy / rounds * 1e3, 3),
                     "unit": "ms"})  # fmt: skip
        sec = timed(lambda: specdec.generate(target, draft, prompt, **kw), dev, 3)
        per_round = sec / rounds
        rows.append({**meta, "case": "sd draft_length=4: time per round", "value": round(per_round * 1e3, 3),
                     "unit": "ms"})  # fmt: skip
        print(f"sd, draft_length 4: {kernels / rounds:.0f} CUDA kernels, {busy / rounds * 1e3:.2f} ms of kernel time "
              f"and {per_round * 1e3:.2f} ms per round ({rounds} rounds)")  # fmt: skip
    if not args.no_csv:
        save_rows(args.out, "gpu_model.csv", FIELDS, rows)


if __name__ == "__main__":
    main()
