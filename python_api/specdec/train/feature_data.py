"""Stage ``feature-data``: training data for the feature draft (EAGLE-style, reads the target's hidden states).

Every record is a token sequence with, at every position t, the target's final hidden state ``feats[t]`` (the
final-norm output after token t, what the target's lm_head reads) and its top-k next-token log-probs
``topk_*[t]`` (the law of token t + 1), both from one teacher-forced target pass (bf16, as at inference).

Two sources, written as resumable shards ``<workdir>/feature/data/<source>_<i>.pt``:

* ``magpie``: the target writes an instruction itself (chat template cut at the user turn), then answers it at
  T = 1; in-domain for chat prompts.
* ``gsm8k``: GSM8K *train* question + reference solution (teacher-forced only).

Each shard has its own seed derived from (seed, source, shard), so an interrupted run resumes to the same data.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..models import layer_features
from .common import chat_ids, clean_gsm8k_answer, save_atomic, sub_seed, tensors_sha256, update_manifest
from .data import DataConfig, _magpie_prompts, gsm8k_splits, sample_responses


@dataclass
class FeatureDataConfig:
    """How much data to build (the defaults are the shipped draft's data, see docs/drafts.md)."""

    seed: int = 0
    n_magpie: int = 6144  # instruction attempts; ~70 % end within max_instruction_tokens and are kept
    n_gsm8k: int = 256
    max_instruction_tokens: int = 64
    # sampling temperature of the instructions only (answers are always T = 1). 0.8 gives coherent, human-like
    # questions and keeps ~90 % of attempts, but a full retrain on such data (4800 attempts, same volume, ~17 min
    # less data time) scored the same held-out alpha (0.436 vs 0.433), so the shipped draft's 1.0 stays
    instruction_temperature: float = 1.0
    max_new_tokens: int = 128
    batch_size: int = 64
    label_batch_size: int = 16
    top_k: int = 32
    shard_size: int = 64
    # also store these decoder layers' inputs, for drafts with FeatureDraftConfig.extra_layers (default: none; the
    # fusion of layers 10 and 20 gained +0.01 alpha for +0.75 % step cost in a probe, so it is off)
    feature_layers: tuple[int, ...] = ()


@torch.no_grad()
def label_with_features(
    model: Any, seqs: list[list[int]], *, top_k: int, batch_size: int, layers: tuple[int, ...] = ()
) -> list[dict[str, Any]]:
    """Teacher-forced target pass: per sequence, feats [T, H] bf16 and top-k log-probs [T, k] of every position;
    with ``layers``, also xfeats [T, len(layers) H] bf16 (:func:`layer_features`)."""
    out: list[dict[str, Any]] = [{} for _ in seqs]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # less padding
    for lo in range(0, len(order), batch_size):
        idx = order[lo : lo + batch_size]
        L = max(len(seqs[i]) for i in idx)
        ids = torch.zeros((len(idx), L), dtype=torch.long)
        mask = torch.zeros((len(idx), L), dtype=torch.long)
        for b, i in enumerate(idx):
            ids[b, : len(seqs[i])] = torch.tensor(seqs[i])
            mask[b, : len(seqs[i])] = 1
        out_b = model.model(input_ids=ids, attention_mask=mask, output_hidden_states=bool(layers))
        hidden = out_b.last_hidden_state
        extra = layer_features(model.model, out_b.hidden_states, layers) if layers else None
        for b, i in enumerate(idx):
            h = hidden[b, : len(seqs[i])]
            logp = torch.log_softmax(model.lm_head(h).float(), dim=-1)
            lp, ix = logp.topk(top_k, dim=-1)
            out[i] = {
                "tokens": torch.tensor(seqs[i], dtype=torch.int32),
                "feats": h.to(torch.bfloat16).clone(),
                "topk_ids": ix.to(torch.int32),
                "topk_logp": lp.to(torch.float16),
            }
            if extra is not None:
                out[i]["xfeats"] = extra[b, : len(seqs[i])].to(torch.bfloat16).clone()
    return out


def _shard_path(workdir: Path, source: str, i: int) -> Path:
    return workdir / "feature" / "data" / f"{source}_{i:04d}.pt"


def _magpie_sequences(model: Any, tok: Any, n: int, cfg: FeatureDataConfig, seed: int) -> tuple[list, list]:
    dcfg = DataConfig(
        max_instruction_tokens=cfg.max_instruction_tokens,
        instruction_temperature=cfg.instruction_temperature,
        batch_size=cfg.batch_size,
    )
    prompts = _magpie_prompts(model, tok, n, dcfg, seed)
    g = torch.Generator().manual_seed(sub_seed(seed, "response"))
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    seqs, starts = [], []
    for lo in range(0, len(order), cfg.batch_size):
        chunk = [prompts[i] for i in order[lo : lo + cfg.batch_size]]
        res = sample_responses(
            model, chunk, max_new_tokens=cfg.max_new_tokens, eos_id=int(tok.eos_token_id), generator=g, top_k=1
        )
        for p, (toks, _, _) in zip(chunk, res, strict=True):
            seqs.append(p + toks)
            starts.append(len(p))
    return seqs, starts


def build_feature_data(
    model: Any, tok: Any, workdir: Path, cfg: FeatureDataConfig, *, progress: bool = True
) -> dict[str, Any]:
    """Run (or resume) the feature-data stage; returns the manifest record (counts, hash, seconds)."""
    t0 = time.time()
    _, gsm = gsm8k_splits(DataConfig(seed=cfg.seed, n_gsm8k_sample=0, n_gsm8k_label=cfg.n_gsm8k))
    per_source = []
    for source, n in (("magpie", cfg.n_magpie), ("gsm8k", len(gsm))):
        starts = range(0, n, cfg.shard_size)
        per_source.append([(source, i, min(cfg.shard_size, n - lo)) for i, lo in enumerate(starts)])
    jobs = [job for group in zip_longest(*per_source) for job in group if job is not None]
    bar = tqdm(jobs, desc="feature-data shards", disable=not progress)
    for source, i, n in bar:
        path = _shard_path(workdir, source, i)
        if path.is_file():
            if cfg.feature_layers:
                _add_layer_features(model, path, cfg)
            continue
        seed = sub_seed(cfg.seed, "feature", source, i)
        if source == "magpie":
            seqs, starts = _magpie_sequences(model, tok, n, cfg, seed)
        else:
            rows = gsm[i * cfg.shard_size : i * cfg.shard_size + n]
            seqs = [chat_ids(tok, r["question"], clean_gsm8k_answer(r["answer"])) for r in rows]
            starts = [len(chat_ids(tok, r["question"])) for r in rows]
        recs = label_with_features(
            model, seqs, top_k=cfg.top_k, batch_size=cfg.label_batch_size, layers=cfg.feature_layers
        )
        for r, s in zip(recs, starts, strict=True):
            r["start"] = s
        save_atomic({"records": recs, "source": source, "feature_layers": list(cfg.feature_layers)}, path)
        bar.set_postfix(positions=sum(len(s) for s in seqs))
    shards = sorted(_shard_path(workdir, source, i).name for source, i, _ in jobs)
    records = load_feature_records(workdir, shards)
    info = {
        "config": asdict(cfg),
        "shards": shards,
        "sequences": len(records),
        "positions": int(sum(len(r["tokens"]) for r in records)),
        "response_positions": int(sum(len(r["tokens"]) - r["start"] for r in records)),
        "data_sha256": tensors_sha256(t for r in records for t in (r["tokens"], r["topk_ids"])),
        "seconds_this_run": round(time.time() - t0, 1),
    }
    update_manifest(workdir / "feature", "data", info)
    return info


def _add_layer_features(model: Any, path: Path, cfg: FeatureDataConfig) -> None:
    """Resume with other ``feature_layers``: relabel an existing shard's sequences (one teacher-forced pass; the
    sampled tokens, hence the data hash, stay the same)."""
    shard = torch.load(path, weights_only=False)
    if list(shard.get("feature_layers", [])) == list(cfg.feature_layers):
        return
    seqs = [r["tokens"].tolist() for r in shard["records"]]
    new = label_with_features(model, seqs, top_k=cfg.top_k, batch_size=cfg.label_batch_size, layers=cfg.feature_layers)
    for r, n in zip(shard["records"], new, strict=True):
        r["xfeats"] = n["xfeats"]
    shard["feature_layers"] = list(cfg.feature_layers)
    save_atomic(shard, path)


def load_feature_records(workdir: Path, shards: list[str] | None = None) -> list[dict[str, Any]]:
    """The data stage's shards' records in a fixed order (sorted file names).

    ``shards``: file names; by default the list the data stage recorded in the manifest, so shards left in the
    folder by another configuration (a larger ``n_magpie`` before) are not read; every shard in the folder when
    the manifest has no list."""
    folder = workdir / "feature" / "data"
    if shards is None:
        manifest = workdir / "feature" / "manifest.json"
        if manifest.is_file():
            shards = json.loads(manifest.read_text()).get("data", {}).get("shards")
    names = sorted(shards) if shards is not None else sorted(p.name for p in folder.glob("*.pt"))
    recs: list[dict[str, Any]] = []
    for name in names:
        recs += torch.load(folder / name, weights_only=False)["records"]
    return recs
