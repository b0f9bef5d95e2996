"""vLLM on this CPU beside our own driver, on the same prompts and settings (SmolLM2-135M-Instruct, bf16, one
prompt per call): vLLM's plain decoding, its n-gram speculation and its draft-model speculation with the target as
its own draft (every draft is then due to be accepted), each verified by its own sampler and by specdec's
(``SPECDEC_VLLM=1``, :mod:`specdec.integrations.vllm`), and our driver's AR, SD with the same n-gram proposer and the
default ``rsd_c``. tokens/s, each run's ratio to our AR, and the drafts accepted per verification round. Rows go to
``benchmarks/results/vllm.csv``. Runs in the virtualenv of scripts/install_vllm.sh (vLLM pins its own
transformers); each vLLM engine runs in a process of its own.

    ~/.cache/specdec/vllm-venv/bin/python benchmarks/bench_vllm.py --num-prompts 4 --max-new-tokens 64 --temperature 0.7
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from _timing import RESULTS, append_csv, run_meta

FIELDS = ["timestamp", "machine", "torch", "git_rev", "cpu_flags", "cpu_isa", "vllm", "transformers", "prompts",
          "num_prompts", "max_new_tokens", "temperature", "threads", "engine", "config", "new_tokens", "seconds",
          "tokens_per_second", "vs_our_ar", "accepted_per_round", "load"]  # fmt: skip
K = 3  # drafts per round for every n-gram configuration


def vllm_run(settings: dict, *, spec: str | None, ours: bool) -> dict:
    """One vLLM engine in a process of its own (this file with --engine); its tokens, time and counters."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg, out = os.path.join(tmp, "cfg.json"), os.path.join(tmp, "out.json")
        with open(cfg, "w") as fh:
            json.dump({**settings, "spec": spec}, fh)
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if settings["threads"] == 1 else f"0-{settings['threads'] - 1}"
        env.pop("SPECDEC_VLLM", None)
        if ours:
            env["SPECDEC_VLLM"] = "1"
        done = subprocess.run([sys.executable, __file__, "--engine", cfg, out], env=env, capture_output=True,
                              text=True)  # fmt: skip
        if done.returncode:
            raise SystemExit(f"vLLM run failed:\n{done.stderr[-4000:]}")
        with open(out) as fh:
            return json.load(fh)


def engine_main(cfg_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(cfg_path) as fh:
        cfg = json.load(fh)
    kw: dict = dict(model=cfg["model"], dtype="bfloat16", enforce_eager=True, max_model_len=2048, seed=0,
                    disable_log_stats=False)  # fmt: skip
    if cfg["spec"] == "ngram":
        kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3,
                                    "prompt_lookup_min": 1}  # fmt: skip
    elif cfg["spec"] == "self":  # the target as vLLM's draft model: every draft is due to be accepted
        kw["speculative_config"] = {"model": cfg["model"], "num_speculative_tokens": K,
                                    "draft_sample_method": "probabilistic"}  # fmt: skip
    llm = LLM(**kw)
    params = SamplingParams(temperature=cfg["temperature"], max_tokens=cfg["max_new_tokens"], seed=0,
                            top_k=cfg["top_k"] or 0)  # fmt: skip
    llm.generate([TokensPrompt(prompt_token_ids=cfg["prompts"][0][:16])], params, use_tqdm=False)  # warm-up
    before = _counters(llm)
    t0 = time.perf_counter()
    new = 0
    for p in cfg["prompts"]:  # one prompt per call, as our driver runs them
        out = llm.generate([TokensPrompt(prompt_token_ids=p)], params, use_tqdm=False)
        new += len(out[0].outputs[0].token_ids)
    seconds = time.perf_counter() - t0
    after = _counters(llm)
    rounds = after.get("num_drafts", 0) - before.get("num_drafts", 0)
    accepted = after.get("num_accepted_tokens", 0) - before.get("num_accepted_tokens", 0)
    with open(out_path, "w") as fh:
        json.dump({"new_tokens": new, "seconds": seconds, "acceptance": accepted / rounds if rounds else None}, fh)


def _counters(llm) -> dict:
    out: dict = {}
    for m in llm.get_metrics():
        if "spec_decode" in m.name and hasattr(m, "value") and isinstance(m.value, (int, float)):
            key = m.name.rsplit(":", 1)[-1].removeprefix("spec_decode_")
            out[key] = out.get(key, 0) + m.value
    return out


def ours(settings: dict) -> list[tuple[str, dict]]:
    """Our driver on the same prompts: AR, SD with the n-gram proposer (K drafts), the default rsd_c."""
    import specdec
    import torch
    from specdec.harness import DEFAULT_DRAFT, make_draft
    from specdec.smollm2 import load_smollm2

    torch.set_num_threads(settings["threads"])
    target, tok = load_smollm2("bf16")
    gen = {"max_new_tokens": settings["max_new_tokens"], "eos_token_id": tok.eos_token_id}
    if settings["temperature"] > 0:
        gen.update(do_sample=True, temperature=settings["temperature"], top_k=settings["top_k"] or 0)
    decoders = [("ar", specdec.SpeculativeDecoder(target, None, method="ar")),
                (f"sd(L={K}), ngram", specdec.SpeculativeDecoder(target, "ngram", method="sd", draft_length=K)),
                (f"rsd_c(auto), {DEFAULT_DRAFT}",
                 specdec.SpeculativeDecoder(target, make_draft(DEFAULT_DRAFT, target, torch.bfloat16)))]  # fmt: skip
    rows = []
    for label, dec in decoders:
        dec.generate(torch.tensor([settings["prompts"][0][:16]]), **{**gen, "max_new_tokens": 2}, seed=0)
        new, seconds, emitted, rounds = 0, 0.0, 0, 0
        for i, p in enumerate(settings["prompts"]):
            out = dec.generate(torch.tensor([p]), **gen, seed=i)
            new += out.stats.new_tokens
            seconds += out.stats.wall_time
            emitted, rounds = emitted + out.stats.emitted, rounds + out.stats.row_rounds
        # each round emits its accepted drafts and one token of the target's
        rate = (emitted - rounds) / rounds if rounds and label != "ar" else None
        rows.append((label, {"new_tokens": new, "seconds": seconds, "acceptance": rate}))
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", help="JSONL prompt file (default: HumanEval)")
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import transformers
    import vllm
    from specdec.harness import load_prompts
    from specdec.smollm2 import chat_prompt, converted_dir, load_smollm2

    _, tok = load_smollm2("bf16")
    texts = load_prompts(args.prompts, args.num_prompts)
    settings = {"model": str(converted_dir()), "prompts": [chat_prompt(tok, t) for t in texts],
                "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k,
                "threads": args.threads}  # fmt: skip
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    runs = []
    for label, spec, plugin in (("plain", None, False), (f"ngram K={K}, vLLM's verifier", "ngram", False),
                                (f"ngram K={K}, specdec's verifier", "ngram", True),
                                (f"itself as draft K={K}, vLLM's verifier", "self", False),
                                (f"itself as draft K={K}, specdec's verifier", "self", True)):  # fmt: skip
        load = os.getloadavg()[0]
        runs.append(("vLLM", label, vllm_run(settings, spec=spec, ours=plugin), load))
    load = os.getloadavg()[0]
    runs += [("specdec", label, r, load) for label, r in ours(settings)]
    ar = next(r for e, label, r, _ in runs if e == "specdec" and label == "ar")
    ar_rate = ar["new_tokens"] / ar["seconds"]
    rows = []
    for engine, label, r, load in runs:
        rate = r["new_tokens"] / r["seconds"]
        row = {"timestamp": stamp, **run_meta(), "vllm": vllm.__version__, "transformers": transformers.__version__}
        row.update(prompts=os.path.basename(args.prompts) if args.prompts else "HumanEval", num_prompts=len(texts),
                   max_new_tokens=args.max_new_tokens, temperature=args.temperature, threads=args.threads,
                   engine=engine, config=label, new_tokens=r["new_tokens"], seconds=f"{r['seconds']:.3f}",
                   tokens_per_second=f"{rate:.3f}", vs_our_ar=f"{rate / ar_rate:.3f}", load=f"{load:.2f}",
                   accepted_per_round="" if r["acceptance"] is None else f"{r['acceptance']:.3f}")  # fmt: skip
        rows.append(row)
        print(f"{engine:8s} {label:40s} {rate:7.2f} tok/s  {rate / ar_rate:.2f}x our AR  {r['acceptance']}")
    append_csv(os.path.join(RESULTS, "vllm.csv"), FIELDS, rows)
    print(f"appended {len(rows)} rows to benchmarks/results/vllm.csv")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--engine":
        engine_main(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1:])
