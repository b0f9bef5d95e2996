"""One vLLM engine run for tests/in_vllm/test_vllm_plugin.py, in a process of its own (the plugin is read when vLLM
starts): the run's settings as JSON in argv[1], its tokens and speculative-decoding counters as JSON to argv[2]."""

from __future__ import annotations

import json
import sys


def main(config_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    cfg = json.loads(open(config_path).read())
    kw = dict(model=cfg["target"], dtype="float32", enforce_eager=True, skip_tokenizer_init=True, max_model_len=256,
              seed=0, tensor_parallel_size=cfg.get("tp", 1), disable_log_stats=False)  # fmt: skip
    spec = cfg.get("spec")
    if spec == "draft":
        kw["speculative_config"] = {"model": cfg["draft"], "num_speculative_tokens": cfg["k"],
                                    "draft_sample_method": cfg.get("draft_sample_method", "probabilistic")}  # fmt: skip
    elif spec == "ngram":
        kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": cfg["k"], "prompt_lookup_max": 3,
                                    "prompt_lookup_min": 1}  # fmt: skip
    llm = LLM(**kw)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in cfg["prompts"]]
    params = [
        SamplingParams(
            temperature=cfg["temperature"],
            max_tokens=cfg["max_tokens"],
            seed=cfg["seed"] + i,
            detokenize=False,
            ignore_eos=True,
        )  # fmt: skip
        for i in range(len(prompts))
    ]
    outs = llm.generate(prompts, params, use_tqdm=False)
    counters = {}
    for m in llm.get_metrics():
        if "spec_decode" in m.name and hasattr(m, "value"):
            counters[m.name] = counters.get(m.name, 0) + m.value
    result = {"tokens": [list(o.outputs[0].token_ids) for o in outs], "counters": counters}
    with open(out_path, "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
