"""Targets of the step benchmarks beside the real model: a Llama of realistic size with random weights, where the
weights dominate a step even more than in the 135M-parameter SmolLM2."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

#: the shape of Llama 3.2 1B (hidden 2048, 16 layers, 32 query and 8 key/value heads, MLP 8192, tied embeddings) on
#: SmolLM2's vocabulary of 49152, so that its tokenizer (which llama.cpp's converter needs) fits: 1.07B parameters
LLAMA_1B = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 8192, "tie_word_embeddings": True, "rope_theta": 500000.0,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-5}  # fmt: skip
MODELS = {"random-1b": LLAMA_1B}
#: where random checkpoints are written (once)
CACHE = Path(os.environ.get("SPECDEC_BENCH_MODELS", Path.home() / ".cache" / "specdec" / "bench_models"))


def random_llama_dir(name: str, cache: Path) -> Path:
    """An HF checkpoint (bf16 safetensors, SmolLM2's tokenizer) of the Llama shape ``name`` with random weights
    (seed 0, normal with std 0.02 as transformers initialises a Llama), written once under ``cache``."""
    from specdec import smollm2
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    target = cache / name
    if (target / "config.json").is_file():
        return target
    tokenizer = AutoTokenizer.from_pretrained(smollm2.converted_dir())
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, **MODELS[name])  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=name + ".", dir=cache))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, target)
    return target


def load_target(spec: str, cache: Path = CACHE) -> tuple[Any, Any, str, Path]:
    """(model in bf16, tokenizer, name, checkpoint directory) of ``spec``: ``smollm2`` (the real model) or a name of
    MODELS (random weights)."""
    from specdec import smollm2
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec == "smollm2":
        model, tokenizer = smollm2.load_smollm2("bf16")
        return model, tokenizer, "SmolLM2-135M-Instruct", smollm2.converted_dir()
    if spec not in MODELS:
        raise SystemExit(f"--model must be smollm2 or one of {sorted(MODELS)}, got {spec!r}")
    path = random_llama_dir(spec, cache)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    return model, AutoTokenizer.from_pretrained(path), f"Llama {spec} (random weights)", path
