"""Held-out evaluation set: target responses (T = 1) to Vicuna-bench questions, cached in the work directory.

Vicuna bench is never used for training; the same cached responses score every draft, so alpha and greedy
agreement of different drafts are compared on identical contexts. The questions are read from
``$SPECDEC_DATA_DIR/vicuna_bench_questions.jsonl`` (:func:`specdec.train.common.shared_data_dir`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .common import chat_ids, read_jsonl, save_atomic, shared_data_dir, sub_seed
from .data import sample_responses


def build_eval_set(
    model: Any,
    tok: Any,
    workdir: Path,
    *,
    n_prompts: int = 40,
    max_new_tokens: int = 48,
    seed: int = 0,
    batch_size: int = 40,
    file: str = "vicuna_bench_questions.jsonl",
) -> dict[str, Any]:
    """First ``n_prompts`` Vicuna questions (first turn) + target continuations with top-k labels (cached)."""
    path = workdir / f"evalset_vicuna_{n_prompts}x{max_new_tokens}_s{seed}.pt"
    if path.is_file():
        return torch.load(path, weights_only=False)
    rows = read_jsonl(shared_data_dir() / file)[:n_prompts]
    prompts = [chat_ids(tok, r["turns"][0]) for r in rows]
    g = torch.Generator().manual_seed(sub_seed(seed, "evalset"))
    recs = []
    for lo in range(0, len(prompts), batch_size):
        chunk = prompts[lo : lo + batch_size]
        res = sample_responses(model, chunk, max_new_tokens=max_new_tokens, eos_id=int(tok.eos_token_id), generator=g)
        for p, (toks, ids, lp) in zip(chunk, res, strict=True):
            recs.append(
                {"tokens": torch.tensor(p + toks, dtype=torch.int32), "start": len(p), "topk_ids": ids, "topk_logp": lp}
            )
    out = {"records": recs, "file": file, "n_prompts": n_prompts, "max_new_tokens": max_new_tokens, "seed": seed}
    save_atomic(out, path)
    return out
