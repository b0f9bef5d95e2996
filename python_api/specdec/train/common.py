"""Shared plumbing of the training pipeline: work directory, manifests, seeds, prompt sources, chat formatting."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

SHARED_DATA_ENV = "SPECDEC_DATA_DIR"
# The external data files the folder named by $SPECDEC_DATA_DIR must hold: GSM8K *train* (training only) and the
# Vicuna-bench questions (evaluation only). Everything else the pipeline reads is written by the target itself.
SHARED_DATA_FILES = ("gsm8k_train.jsonl", "vicuna_bench_questions.jsonl")
MAGPIE_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def default_workdir() -> Path:
    """``$SPECDEC_TRAIN_DIR`` or ``<specdec cache>/train`` (the cache the SmolLM2 loader uses)."""
    if os.environ.get("SPECDEC_TRAIN_DIR"):
        return Path(os.environ["SPECDEC_TRAIN_DIR"])
    from ..smollm2 import cache_dir

    return cache_dir() / "train"


def shared_data_dir() -> Path:
    """The folder named by ``$SPECDEC_DATA_DIR``, which holds ``gsm8k_train.jsonl`` (GSM8K train questions and
    solutions, one JSON object per line with ``question`` and ``answer``) and ``vicuna_bench_questions.jsonl``
    (Vicuna-bench questions, one JSON object per line with ``turns``).

    Raises ``FileNotFoundError`` naming the variable when it is unset or does not name a folder."""
    value = os.environ.get(SHARED_DATA_ENV, "")
    files = " and ".join(SHARED_DATA_FILES)
    if not value:
        raise FileNotFoundError(f"${SHARED_DATA_ENV} is not set: set it to a folder holding {files}")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"${SHARED_DATA_ENV}={value!r} is not a folder: it must name a folder holding {files}")
    return path


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def file_sha256(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tensors_sha256(tensors: Iterable[torch.Tensor]) -> str:
    """Hash of tensor bytes (data fingerprints in manifests; same seed -> same hash)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().contiguous().cpu()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        h.update(str(t.dtype).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def sub_seed(seed: int, *parts: Any) -> int:
    """Deterministic child seed: every shard/stage gets its own stream, so resuming reproduces the same data."""
    key = ":".join([str(seed), *map(str, parts)]).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & ((1 << 63) - 1)


def write_json_atomic(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def save_atomic(obj: Any, path: Path) -> None:
    """torch.save through a temp file + rename: an interrupted run never leaves a half-written checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    os.close(fd)
    torch.save(obj, tmp)
    os.replace(tmp, path)


def update_manifest(workdir: Path, stage: str, info: dict[str, Any]) -> dict[str, Any]:
    """Merge one stage's record (config, hashes, metrics, timing) into ``<workdir>/manifest.json``."""
    path = workdir / "manifest.json"
    manifest = json.loads(path.read_text()) if path.is_file() else {}
    info = dict(info)
    info["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    manifest[stage] = info
    write_json_atomic(path, manifest)
    return manifest


def clean_gsm8k_answer(answer: str) -> str:
    """GSM8K solutions without calculator annotations, final line phrased as a sentence."""
    text = re.sub(r"<<[^>]*>>", "", answer)
    return re.sub(r"\n?#### *(.*)$", r"\nThe answer is \1.", text.strip())


def chat_ids(tokenizer: Any, user: str, assistant: str | None = None) -> list[int]:
    """Token ids of a chat prompt (generation prompt appended), or of prompt + assistant turn when given."""
    messages = [{"role": "user", "content": user}]
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    ids = [int(t) for t in (out.tolist() if isinstance(out, torch.Tensor) else out)]
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    if assistant is not None:
        ids = ids + tokenizer.encode(assistant, add_special_tokens=False) + [int(tokenizer.eos_token_id)]
    return ids


def magpie_prefix(tokenizer: Any) -> list[int]:
    """Chat template up to the start of the user turn: the target then writes an instruction itself (Magpie)."""
    text = f"<|im_start|>system\n{MAGPIE_SYSTEM}<|im_end|>\n<|im_start|>user\n"
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


def set_threads(n: int | None = None) -> None:
    torch.set_num_threads(n or int(os.environ.get("SPECDEC_TRAIN_THREADS", "2")))


def training_record(
    cfg: Any,
    state: dict[str, torch.Tensor],
    head_ids: torch.Tensor,
    history: list[dict[str, float]],
    out_dir: Path,
    *,
    step: int,
    sequences: tuple[int, int],
    positions: int,
    t0: float,
) -> dict[str, Any]:
    """Save a finished distillation (``<out_dir>/final.pt``: configuration, trained ``state``, head ids, history)
    and return its manifest record: configuration, steps, data sizes (``sequences`` = train, validation), hashes of
    the head ids and weights, first and last loss, the last validation metrics and the time of this run."""
    from dataclasses import asdict

    save_atomic({"config": asdict(cfg), "state": state, "head_ids": head_ids, "history": history}, out_dir / "final.pt")
    vals = [h for h in history if "val_ce" in h]
    losses = [h["loss"] for h in history if "loss" in h]
    return {
        "config": asdict(cfg),
        "steps": step,
        "train_sequences": sequences[0],
        "val_sequences": sequences[1],
        "train_positions": positions,
        "head_ids_sha256": tensors_sha256([head_ids]),
        "weights_sha256": tensors_sha256(state.values()),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "metrics": vals[-1] if vals else {},
        "seconds_this_run": round(time.time() - t0, 1),
    }
