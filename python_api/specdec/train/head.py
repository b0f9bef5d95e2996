"""SpecDec++ acceptance-prediction head and its training (docs/drafts.md). Stage ``head``.

Head: ``D`` residual blocks ``x <- x + SiLU(W_d x + b_d)`` then ``Linear(H, 2)`` on the draft's final hidden state
(after the final norm, fp32); ``Phat = softmax(logits)[1]`` = predicted probability that the token whose hidden state
it sees is accepted. Blocks have independent weights by default; ``tie_blocks=True`` reuses one block D times (the
reference code's quirk, needed to load its released checkpoints).

Data: on target responses X, the draft samples Y_i ~ p(.|prompt, X_<i) (teacher forcing, raw T = 1
softmax); label P_i = min(1, q(Y_i) / p(Y_i)); token mixing builds Z with Z_i = X_i w.p. r (0.15) else Y_i; the
head sees e_i(prompt, Z_<i, Y_i) at positions with Z_i = Y_i. q(Y_i) comes from the stored top-k target
log-probs; a Y_i outside the target's top-k gets q = 0 (its true q is below the k-th largest probability; with
k = 32 this tail is small). Loss: weighted soft-label BCE with weights (w_acc = 1, w_rej), normalised by
``sum(w_rej (1 - P) + P)``; monitored by the binary KL.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..drafters.networks.head import (  # noqa: F401 (names of the module before the networks moved)
    AcceptanceHead,
    ResBlock,
    load_head,
)
from .common import save_atomic, sub_seed, tensors_sha256, update_manifest


def weighted_bce(logits: torch.Tensor, target: torch.Tensor, w_rej: float, w_acc: float = 1.0) -> torch.Tensor:
    """Soft-label weighted BCE (2-class form, normalised by the total weight)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    num = -(w_acc * target * logp[..., 1] + w_rej * (1 - target) * logp[..., 0]).sum()
    return num / (w_rej * (1 - target) + w_acc * target).sum().clamp_min(1e-8)


def binary_kl(p: torch.Tensor, phat: torch.Tensor) -> torch.Tensor:
    eps = 1e-6
    p, phat = p.clamp(eps, 1 - eps), phat.clamp(eps, 1 - eps)
    return (p * (p / phat).log() + (1 - p) * ((1 - p) / (1 - phat)).log()).mean()


@dataclass
class HeadConfig:
    seed: int = 0
    depth: int = 3
    tie_blocks: bool = False
    w_rej: float = 6.0
    threshold: float = 0.7  # default h for decoding (robust pair w_rej = 6, h = 0.7)
    mix_ratio: float = 0.15
    steps: int = 600
    batch_size: int = 256
    lr: float = 1e-3
    val_fraction: float = 0.05
    feature_batch: int = 16


@torch.no_grad()
def head_features(
    draft: Any, records: list[dict[str, Any]], cfg: HeadConfig, *, progress: bool = True
) -> dict[str, torch.Tensor]:
    """Hidden states e_i and labels P_i for the head, from the draft in its own dtype."""
    head_ids = draft.lm_head.head_ids
    g = torch.Generator().manual_seed(sub_seed(cfg.seed, "head_features"))
    feats, labels = [], []
    bs = cfg.feature_batch
    for lo in tqdm(range(0, len(records), bs), desc="head features", disable=not progress):
        chunk = [r for r in records[lo : lo + bs] if len(r["tokens"]) > int(r["start"])]
        if not chunk:
            continue
        L = max(len(r["tokens"]) for r in chunk)
        x = torch.zeros((len(chunk), L), dtype=torch.long)
        mask = torch.zeros_like(x)
        for b, r in enumerate(chunk):
            x[b, : len(r["tokens"])] = r["tokens"].long()
            mask[b, : len(r["tokens"])] = 1
        hid = draft.model(input_ids=x, attention_mask=mask).last_hidden_state
        z = x.clone()
        for b, r in enumerate(chunk):
            s, n = int(r["start"]), len(r["tokens"])
            p = torch.softmax(draft.lm_head.reduced(hid[b, s - 1 : n - 1]).float(), dim=-1)  # p(.|prompt, X_<i)
            j = torch.multinomial(p, 1, generator=g).squeeze(1)
            y = head_ids[j]
            log_p = p.gather(1, j[:, None]).squeeze(1).log()
            hit = r["topk_ids"].long() == y[:, None]
            log_q = torch.where(hit, r["topk_logp"].float(), torch.full_like(r["topk_logp"].float(), -math.inf))
            label = (log_q.max(-1).values - log_p).exp().clamp(max=1.0)
            keep_x = torch.rand(n - s, generator=g) < cfg.mix_ratio
            z[b, s:n] = torch.where(keep_x, x[b, s:n], y)
            r["_y"], r["_label"] = y, label
        hz = draft.model(input_ids=z, attention_mask=mask).last_hidden_state
        for b, r in enumerate(chunk):
            s, n = int(r["start"]), len(r["tokens"])
            use = z[b, s:n] == r["_y"]  # positions whose input token is the draft's own sample
            feats.append(hz[b, s:n][use].to(torch.bfloat16))
            labels.append(r.pop("_label")[use])
            r.pop("_y")
    return {"features": torch.cat(feats), "labels": torch.cat(labels).float()}


def train_head(
    data: dict[str, torch.Tensor], hidden_size: int, cfg: HeadConfig, *, progress: bool = True
) -> tuple[AcceptanceHead, list[dict[str, float]]]:
    """Adam + cosine schedule on the (features, labels) set; returns the head and its history."""
    torch.manual_seed(sub_seed(cfg.seed, "head_init"))
    x, y = data["features"].float(), data["labels"]
    n = x.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(sub_seed(cfg.seed, "head_split")))
    n_val = max(1, int(n * cfg.val_fraction))
    val, tr = perm[:n_val], perm[n_val:]
    head = AcceptanceHead(hidden_size, cfg.depth, tie_blocks=cfg.tie_blocks)
    opt = torch.optim.Adam(head.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(sub_seed(cfg.seed, "head_batches"))
    history = []
    for step in tqdm(range(cfg.steps), desc="head", disable=not progress):
        for group in opt.param_groups:
            group["lr"] = cfg.lr * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        idx = tr[torch.randint(len(tr), (cfg.batch_size,), generator=g)]
        loss = weighted_bce(head(x[idx]), y[idx], cfg.w_rej)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % 100 == 0 or step + 1 == cfg.steps:
            with torch.no_grad():
                pv = head.prob(x[val])
                history.append(
                    {
                        "step": step + 1,
                        "train_loss": loss.item(),
                        "val_loss": weighted_bce(head(x[val]), y[val], cfg.w_rej).item(),
                        "val_binary_kl": binary_kl(y[val], pv).item(),
                        "val_mean_label": y[val].mean().item(),
                        "val_mean_phat": pv.mean().item(),
                    }
                )
    return head, history


def save_head(head: AcceptanceHead, path: Path, cfg: HeadConfig) -> Path:
    from safetensors.torch import save_file

    meta = {
        "hidden_size": head.hidden_size,
        "depth": head.depth,
        "tie_blocks": head.tie_blocks,
        "threshold": cfg.threshold,
        "w_rej": cfg.w_rej,
    }
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"head_config": json.dumps(meta)})
    return path


def run_head(
    workdir: Path,
    cfg: HeadConfig,
    *,
    draft: Any = None,
    records: list[dict[str, Any]] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Stage ``head``: features from the distilled draft (bf16) on the training data, then train the head."""
    from .data import load_records
    from .draft import draft_from_checkpoint

    t0 = time.time()
    if draft is None:
        from ..smollm2 import load_smollm2

        target, _ = load_smollm2("bf16")
        draft = draft_from_checkpoint(workdir / "distill" / "final.pt", target).to(torch.bfloat16)
    feats_path = workdir / "head" / f"features_s{cfg.seed}_r{cfg.mix_ratio}.pt"
    if feats_path.is_file():
        data = torch.load(feats_path, weights_only=False)
    else:
        data = head_features(draft, load_records(workdir) if records is None else records, cfg, progress=progress)
        save_atomic(data, feats_path)
    head, history = train_head(data, int(draft.config.hidden_size), cfg, progress=progress)
    save_head(head, workdir / "head" / "head.safetensors", cfg)
    info = head_record(cfg, data, history, t0)
    update_manifest(workdir, "head", info)
    return info


def head_record(cfg: Any, data: dict[str, torch.Tensor], history: list[dict[str, float]], t0: float) -> dict[str, Any]:
    """The manifest section of a trained head: configuration, data size and hash, final metrics, time."""
    return {
        "config": asdict(cfg),
        "positions": int(data["labels"].numel()),
        "mean_label": data["labels"].mean().item(),
        "features_sha256": tensors_sha256([data["labels"]]),
        "metrics": history[-1],
        "seconds_this_run": round(time.time() - t0, 1),
    }
