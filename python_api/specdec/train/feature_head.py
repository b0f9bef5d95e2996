"""SpecDec++ acceptance head for a feature draft (EAGLE-style), trained on the draft's own decoding rounds. Stage
``feature-head``.

The head (:class:`~specdec.train.head.AcceptanceHead`) reads the hidden state the feature draft computes for a
drafted node (its prediction of the target's feature there, after the final norm) and predicts the probability that
the node is accepted given that its parent was. A feature draft's hidden states depend on the target features of the
committed prefix and on the draft's own outputs along the drafted path, so the training positions come from real
SD rounds rather than teacher forcing: the driver drafts chains of ``draft_length`` tokens with the draft on prompts
the target wrote itself (Magpie-style) and on GSM8K-train questions, at T = 1 without truncation, and every drafted
node whose own children were drafted gives one example

    feature = the draft's hidden state of node k,   label = min(1, q(y_k) / p(y_k)),

with q and p the target's and the draft's laws at node k's parent, read from the round's verification pass. The
label is the probability that SD accepts y_k once its parent is accepted, whatever happened earlier in the chain, so
every such node counts, not only those up to the first rejection. Loss, optimiser and file format are the plain
draft's head's (weighted soft-label BCE, ``head.train_head``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..decoder import SpeculativeDecoder
from ..tree import DraftTree
from .common import chat_ids, sub_seed
from .head import HeadConfig, head_record, save_head, train_head


@dataclass
class RolloutConfig:
    seed: int = 0
    n_magpie: int = 160  # instructions the target writes itself
    n_gsm8k: int = 32  # GSM8K-train questions
    max_new_tokens: int = 96
    draft_length: int = 6  # chain length of the rounds: nodes 1 .. L-1 are labelled
    batch_size: int = 8
    temperature: float = 1.0
    # h = 0.8: the fastest of 0.3 .. 0.9 for specdec_pp at T = 0.7 on HumanEval problems 100-103 and Vicuna-bench
    # questions 61-64 (greedy: 0.7 .. 0.9 within 1 %)
    head: HeadConfig = field(default_factory=lambda: HeadConfig(threshold=0.8))


class _NodeRecorder:
    """A stop rule that never stops: keeps the draft's hidden state of every node whose children get drafted
    (:meth:`TreeBuilder.build` hands them to ``live`` right after the draft's forward over them)."""

    def __init__(self) -> None:
        self.hidden: dict[int, torch.Tensor] = {}  # first node of a level -> [B, w, H]

    def start(self, tree: DraftTree, drafter: Any) -> None:
        self.hidden = {}

    def live(self, level: int, tree: DraftTree, lo: int, hi: int, live: torch.Tensor, drafter: Any) -> torch.Tensor:
        if level >= 1:
            self.hidden[lo] = drafter.last_hidden.float().clone()
        return live

    def keep_drafting(self, valid: torch.Tensor) -> bool:
        return True

    def finish(self) -> None:
        pass


class _LabellingDecoder(SpeculativeDecoder):
    """SD that also records (hidden state, min(1, q/p)) of every drafted node whose children were drafted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert self.builder is not None
        self.recorder = _NodeRecorder()
        self.builder.stop_rule = self.recorder
        self.features: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []

    def _verify_tree(self, tree, q_logits, q_probs, eos, generator):  # noqa: ANN001, ANN202
        p_rows = tree.p_rows(q_logits.shape[-1])
        for lo, hidden in self.recorder.hidden.items():
            nodes = torch.arange(lo, lo + hidden.shape[1], device=tree.device)
            par = tree.parent[:, nodes].clamp_min(0)
            tok = tree.tokens[:, nodes].clamp_min(0)
            rows = torch.arange(tree.batch, device=tree.device)[:, None]
            q = q_probs[rows, par, tok].float()
            p = p_rows[rows, par, tok]
            ok = tree.valid[:, nodes] & (p > 0)
            self.features.append(hidden[ok].to(torch.bfloat16))
            self.labels.append((q[ok] / p[ok]).clamp(max=1.0))
        return super()._verify_tree(tree, q_logits, q_probs, eos, generator)


def rollout_prompts(model: Any, tok: Any, cfg: RolloutConfig) -> list[list[int]]:
    """Self-written instructions (their own seed, apart from the drafts' training data) and GSM8K-train questions."""
    from .data import DataConfig, _magpie_prompts, gsm8k_splits

    dcfg = DataConfig(seed=sub_seed(cfg.seed, "feature_head"))
    prompts = _magpie_prompts(model, tok, cfg.n_magpie, dcfg, sub_seed(cfg.seed, "feature_head_magpie"))
    dcfg.n_gsm8k_sample, dcfg.n_gsm8k_label = cfg.n_gsm8k, 0
    questions, _ = gsm8k_splits(dcfg)
    return prompts + [chat_ids(tok, r["question"]) for r in questions]


@torch.no_grad()
def rollout_features(
    target: Any, draft: Any, prompts: list[list[int]], cfg: RolloutConfig, *, progress: bool = True
) -> dict[str, torch.Tensor]:
    """(features [N, H] bf16, labels [N] fp32) from SD rounds of ``draft`` (a feature draft) on ``prompts``."""
    dec = _LabellingDecoder(target, draft, method="sd", draft_length=cfg.draft_length)
    bs = cfg.batch_size
    for i, lo in enumerate(tqdm(range(0, len(prompts), bs), desc="rollouts", disable=not progress)):
        rows = prompts[lo : lo + bs]
        width = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, r in enumerate(rows):  # left padding, as generate takes it
            ids[b, width - len(r) :] = torch.tensor(r)
            mask[b, width - len(r) :] = 1
        dec.generate(
            ids,
            mask,
            max_new_tokens=cfg.max_new_tokens,
            do_sample=True,
            temperature=cfg.temperature,
            top_k=0,
            seed=sub_seed(cfg.seed, "feature_head_rollout", i),
        )
    if not dec.labels:
        raise RuntimeError("the rollouts drafted no labelled node (draft_length must be >= 2)")
    return {"features": torch.cat(dec.features), "labels": torch.cat(dec.labels).float()}


def run_feature_head(
    workdir: Path, cfg: RolloutConfig, name: str, *, assets_dir: Path | None = None, progress: bool = True
) -> dict[str, Any]:
    """Stage ``feature-head``: rollouts of the feature draft asset ``name``, the head trained on them, shipped as
    ``<name>-head.safetensors`` beside the draft, with a ``head`` section in the draft's manifest."""
    import json

    from ..drafters.store import ASSETS_DIR, resolve_asset
    from ..smollm2 import load_smollm2
    from .common import file_sha256, save_atomic, write_json_atomic
    from .feature_draft import load_feature_draft

    t0 = time.time()
    target, tok = load_smollm2("bf16")
    draft = load_feature_draft(name, target)
    feats_path = workdir / "feature_head" / f"rollouts_{name}_s{cfg.seed}.pt"
    if feats_path.is_file():
        data = torch.load(feats_path, weights_only=False)
    else:
        data = rollout_features(target, draft, rollout_prompts(target, tok, cfg), cfg, progress=progress)
        save_atomic(data, feats_path)
    head, history = train_head(data, int(draft.config.hidden_size), cfg.head, progress=progress)
    out = assets_dir or ASSETS_DIR
    path = save_head(head, out / f"{name}-head.safetensors", cfg.head)
    manifest_path = resolve_asset(name).with_suffix(".json")
    if assets_dir is not None:
        manifest_path = out / f"{name}.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    manifest.setdefault("files", {})["head"] = {
        "file": path.name,
        "bytes": path.stat().st_size,
        "sha256": file_sha256(path),
    }
    manifest["head"] = head_record(cfg, data, history, t0)
    manifest["head"]["retrain"] = f"python -m specdec.train feature-head --seed {cfg.seed} --name {name}"
    write_json_atomic(manifest_path, manifest)
    return {"files": {"head": str(path)}, **{k: manifest["head"][k] for k in ("positions", "mean_label", "metrics")}}
