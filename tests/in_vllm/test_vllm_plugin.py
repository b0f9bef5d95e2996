"""specdec's verifier inside vLLM (specdec.integrations.vllm), with vLLM's CPU build: ``bash scripts/test_vllm.sh``.

A tiny random Llama target (vocabulary 8, 4 heads) and a noisy copy as vLLM's draft model, saved to a temporary
folder; every engine run is vLLM's offline ``LLM`` with ``enforce_eager=True`` in a process of its own
(tests/in_vllm/run_llm.py). Checked:

* the law of the first two tokens of 4000 seeded requests at T = 0.8 (the second comes from verification: vLLM
  drafts from the first) against the target's processed law q(y1) q(y2 | y1) from transformers, Pearson chi-square
  p >= 1e-4 (false alarm 1e-4) and TV <= 0.06 (noise ~0.03), with SPECDEC_VLLM=1;
* the same test catches vLLM's own verification (plugin off): its per-token temperatures are uninitialised memory on
  this build, which is the test's proof of power inside vLLM;
* greedy: tokens equal to vLLM without speculation, with the draft model and with the ngram proposer;
* tensor_parallel_size=2 gives the tokens of 1, greedy;
* acceptance counters as vLLM reports them: with the target as its own draft, our verifier accepts every draft.

Tokens and counters are asserted, never speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "python_api"))

from tiny_models import noisy_copy, tiny_llama  # noqa: E402

from specdec_kernels.testing.stats import law_check  # noqa: E402

VOCAB = 8
TEMPERATURE = 0.8
PROMPT = [1, 5, 2, 7, 3]
N_LAW = 4000


def run(models: dict, tmp: Path, name: str, *, plugin: bool, **cfg) -> dict:
    """One engine run (run_llm.py) with the plugin on or off; its tokens and counters."""
    cfg = {"target": str(models["target"]), "draft": str(models["draft"]), "k": 2, "seed": 0, **cfg}
    (tmp / f"{name}.json").write_text(json.dumps(cfg))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1" if cfg.get("tp", 1) == 2 else "0-1"
    env.pop("SPECDEC_VLLM", None)
    if plugin:
        env["SPECDEC_VLLM"] = "1"
    out = tmp / f"{name}.out.json"
    done = subprocess.run([sys.executable, str(HERE / "run_llm.py"), str(tmp / f"{name}.json"), str(out)], env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(out.read_text())
    # the plugin's line when its sampler verifies (only with speculation and the plugin on)
    result["ours"] = "specdec: verifying a first batch" in done.stderr + done.stdout
    return result


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("vllm_models")
    target = tiny_llama(0, vocab=VOCAB, hidden=256, heads=4, kv_heads=2, std=0.04)  # head_dim 64: vLLM-CPU attention
    draft = noisy_copy(target, 1, 0.5)
    paths = {"target": root / "target", "draft": root / "draft", "self": root / "target"}
    for name, model in (("target", target), ("draft", draft)):
        model.generation_config.eos_token_id = None
        model.save_pretrained(paths[name])
    return {**paths, "target_model": target}


def exact_first_two(target, temperature: float) -> np.ndarray:
    """q(y1) q(y2 | y1) of the target at ``temperature`` (no top-k/top-p), [V, V]."""
    with torch.no_grad():
        first = torch.softmax(target(torch.tensor([PROMPT])).logits[0, -1].double() / temperature, -1)
        ids = torch.tensor([PROMPT + [y] for y in range(VOCAB)])
        second = torch.softmax(target(ids).logits[:, -1].double() / temperature, -1)
    law = first[:, None] * second
    return (law / law.sum()).numpy()


def first_two_check(models: dict, result: dict):
    pairs = np.array([t[:2] for t in result["tokens"]])
    counts = np.zeros((VOCAB, VOCAB))
    np.add.at(counts, (pairs[:, 0], pairs[:, 1]), 1)
    return law_check(counts, exact_first_two(models["target_model"], TEMPERATURE), max_tv=0.06)


def test_our_verifier_gives_the_target_law_and_vllms_own_does_not(models: dict, tmp_path: Path) -> None:
    cfg = dict(spec="draft", prompts=[PROMPT] * N_LAW, temperature=TEMPERATURE, max_tokens=2)
    result = run(models, tmp_path, "ours", plugin=True, **cfg)
    assert result["ours"]
    ours = first_two_check(models, result)
    assert ours.ok, str(ours)
    result = run(models, tmp_path, "theirs", plugin=False, **cfg)
    assert not result["ours"]
    theirs = first_two_check(models, result)
    assert theirs.p_value < 1e-4, str(theirs)
    print(f"\nspecdec's verifier: {ours}\nvLLM's own verifier: {theirs}")


def test_greedy_tokens_equal_vllm_without_speculation(models: dict, tmp_path: Path) -> None:
    prompts = [[1 + (i * 3 + j) % (VOCAB - 1) for j in range(4 + i)] for i in range(6)]
    cfg = dict(prompts=prompts, temperature=0.0, max_tokens=24)
    plain = run(models, tmp_path, "plain", plugin=False, spec=None, **cfg)["tokens"]
    for name, extra in (("draft", {}), ("ngram", {}), ("draft_tp2", {"tp": 2})):
        result = run(models, tmp_path, f"greedy_{name}", plugin=True, spec=name.split("_")[0], **cfg, **extra)
        assert result["ours"], name
        assert result["tokens"] == plain, name


def test_a_target_drafting_for_itself_has_every_draft_accepted(models: dict, tmp_path: Path) -> None:
    cfg = dict(spec="draft", prompts=[PROMPT] * 64, temperature=0.7, max_tokens=12)
    result = run(models, tmp_path, "self", plugin=True, **{**cfg, "draft": str(models["target"])})
    assert result["ours"]
    c = result["counters"]
    drafts = next(v for k, v in c.items() if k.endswith("num_draft_tokens"))
    accepted = next(v for k, v in c.items() if k.endswith("num_accepted_tokens"))
    assert drafts > 100 and accepted == drafts, c
    print(f"\ntarget drafting for itself at T = 0.7: {accepted} of {drafts} drafts accepted")
