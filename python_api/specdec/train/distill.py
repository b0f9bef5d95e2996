"""Stage ``distill``: train the draft on the target's top-k distributions (soft cross-entropy + TV term).

Loss per labelled position (q = target top-k probabilities inside the draft's head, p = draft softmax over the
head): ``-sum q log p`` (forward KL up to a constant) plus ``tv_weight * (1 - sum min(p, q))``; the second term
is exactly what the acceptance rate alpha = sum min(p, q) rewards. Step-based schedule (warmup + cosine), fixed
batch order from the seed, checkpoints every ``ckpt_every`` steps: a rerun with the same seed and data resumes or
reproduces the same weights (up to float non-determinism of the CPU kernels).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from .common import save_atomic, sub_seed, training_record, update_manifest
from .data import load_records
from .draft import DraftConfig, build_draft, init_from_target, select_head_ids, trainable_state


@dataclass
class DistillConfig:
    seed: int = 0
    draft: DraftConfig = field(default_factory=DraftConfig)
    steps: int = 600
    batch_size: int = 16
    max_len: int = 320
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 30
    weight_decay: float = 0.05
    tv_weight: float = 1.0
    grad_clip: float = 1.0
    val_every_nth: int = 20  # every 20th sequence is held out from training (validation loss / alpha)
    eval_every: int = 200
    ckpt_every: int = 100
    autocast_bf16: bool = True


def lr_at(step: int, cfg: DistillConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def head_index_map(head_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Full-vocabulary id -> position in the head, -1 outside."""
    m = torch.full((vocab,), -1, dtype=torch.long)
    m[head_ids] = torch.arange(head_ids.numel())
    return m


def collate(recs: list[dict[str, Any]], max_len: int) -> dict[str, torch.Tensor]:
    """Right-padded batch; labelled positions (the hidden state that predicts each response token) flattened."""
    lens = [min(len(r["tokens"]), max_len) for r in recs]
    L = max(lens)
    ids = torch.zeros((len(recs), L), dtype=torch.long)
    mask = torch.zeros((len(recs), L), dtype=torch.long)
    rows, cols, tk_ids, tk_lp = [], [], [], []
    for b, (r, n) in enumerate(zip(recs, lens, strict=True)):
        ids[b, :n] = r["tokens"][:n].long()
        mask[b, :n] = 1
        start = int(r["start"])
        m = n - start  # labelled response tokens that fit
        if m <= 0:
            continue
        rows.append(torch.full((m,), b))
        cols.append(torch.arange(start - 1, start - 1 + m))
        tk_ids.append(r["topk_ids"][:m].long())
        tk_lp.append(r["topk_logp"][:m].float())
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "rows": torch.cat(rows),
        "cols": torch.cat(cols),
        "topk_ids": torch.cat(tk_ids),
        "topk_logp": torch.cat(tk_lp),
    }


def distill_loss(
    draft: Any, batch: dict[str, torch.Tensor], hmap: torch.Tensor, tv_weight: float
) -> tuple[torch.Tensor, dict[str, float]]:
    hidden = draft.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    h = hidden[batch["rows"], batch["cols"]]
    logp = torch.log_softmax(draft.lm_head.reduced(h).float(), dim=-1)  # [N, Vr]
    idx = hmap[batch["topk_ids"]]  # [N, K], -1 outside the head
    inside = idx >= 0
    q = batch["topk_logp"].exp() * inside
    lp = logp.gather(1, idx.clamp_min(0))
    ce = -(q * lp).sum(-1).mean()
    alpha_topk = (torch.minimum(lp.exp(), q) * inside).sum(-1).mean()
    loss = ce + tv_weight * (1 - alpha_topk)
    return loss, {"ce": ce.item(), "alpha_topk": alpha_topk.item(), "positions": int(h.shape[0])}


def _split(records: list[dict[str, Any]], nth: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    train = [r for i, r in enumerate(records) if i % nth != nth - 1]
    val = [r for i, r in enumerate(records) if i % nth == nth - 1]
    return train, val


def batch_indices(step: int, n: int, bs: int, seed: int) -> list[int]:
    """Indices of the batch at ``step``: epoch-wise permutations from the seed (resumable, reproducible)."""
    out: list[int] = []
    pos = step * bs
    while len(out) < bs:
        epoch, off = divmod(pos, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(sub_seed(seed, "epoch", epoch)))
        take = min(bs - len(out), n - off)
        out += perm[off : off + take].tolist()
        pos += take
    return out


@torch.no_grad()
def position_weighted_eval(
    model: Any, val: list[dict[str, Any]], batch_size: int, autocast: bool, batch_metrics: Any
) -> dict[str, float]:
    """Validation metrics averaged over labelled positions: ``batch_metrics(records)`` returns a dict with
    ``positions`` and per-position means; the model is in eval mode meanwhile. Keys come back as ``val_<name>``."""
    model.eval()
    tot: dict[str, float] = {}
    n = 0
    for lo in range(0, len(val), batch_size):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            m = batch_metrics(val[lo : lo + batch_size])
        for k, v in m.items():
            if k != "positions":
                tot[k] = tot.get(k, 0.0) + v * m["positions"]
        n += m["positions"]
    model.train()
    return {f"val_{k}": v / max(1, n) for k, v in tot.items()}


def validate(draft: Any, val: list[dict[str, Any]], hmap: torch.Tensor, cfg: DistillConfig) -> dict[str, float]:
    def metrics(recs: list[dict[str, Any]]) -> dict[str, float]:
        return distill_loss(draft, collate(recs, cfg.max_len), hmap, cfg.tv_weight)[1]

    return position_weighted_eval(draft, val, cfg.batch_size, cfg.autocast_bf16, metrics)


def embedding_and_head_ids(
    target: Any, train: list[dict[str, Any]], head_vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's input embedding as a draft reads it at inference (bf16 values, fp32 for training) and the
    ``head_vocab`` tokens with the most target mass in ``train`` (EOS always kept)."""
    vocab = int(target.config.vocab_size)
    table = target.get_input_embeddings().weight.detach().to(torch.bfloat16).float()
    eos = target.config.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, list | tuple) else ((int(eos),) if eos is not None else ())
    return table, select_head_ids(train, vocab, min(head_vocab, vocab), always=eos_ids)


def resume(ckpt_path: Path, cfg: Any, model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[int, list]:
    """Load the training checkpoint at ``ckpt_path`` into ``model`` and ``opt`` if there is one (it must have been
    written with the same configuration); returns (step, history), (0, []) for a fresh start."""
    if not ckpt_path.is_file():
        return 0, []
    ck = torch.load(ckpt_path, weights_only=False)
    if ck["config"] != asdict(cfg):
        raise ValueError(f"{ckpt_path} was written with a different configuration; use another --workdir")
    model.load_state_dict(ck["state"], strict=False)
    opt.load_state_dict(ck["opt"])
    if "rng" in ck:
        torch.set_rng_state(ck["rng"])
    return ck["step"], ck["history"]


def train_loop(
    model: torch.nn.Module,
    params: list[torch.nn.Parameter],
    opt: torch.optim.Optimizer,
    cfg: Any,
    *,
    step: int,
    history: list[dict[str, Any]],
    ckpt_path: Path,
    batch_at: Callable[[int], Any],
    loss_of: Callable[[Any], tuple[torch.Tensor, dict[str, float]]],
    validate: Callable[[], dict[str, float]],
    state_of: Callable[[torch.nn.Module], dict[str, torch.Tensor]],
    desc: str,
    log_every: int,
    progress: bool,
) -> int:
    """The training loop of both drafts, from ``step`` to ``cfg.steps``: learning-rate schedule (:func:`lr_at`),
    bf16 autocast when ``cfg.autocast_bf16``, gradient clipping, running means of the loss and of the metrics
    ``loss_of`` returns (``positions`` excepted) every ``log_every`` steps, ``validate()`` every ``cfg.eval_every``
    steps, and a resumable checkpoint (model state, optimiser, step, history, RNG) every ``cfg.ckpt_every`` steps and
    at the end. Appends to ``history``; returns the last step."""
    model.train()
    bar = tqdm(total=cfg.steps, initial=step, desc=desc, disable=not progress)
    run: dict[str, float] = {}
    while step < cfg.steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        batch = batch_at(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.autocast_bf16):
            loss, m = loss_of(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        step += 1
        m["loss"] = loss.item()
        for k, v in m.items():
            run[k] = run.get(k, 0.0) + v
        run["_n"] = run.get("_n", 0.0) + 1
        bar.update(1)
        if step % log_every == 0:
            avg = {k: v / run["_n"] for k, v in run.items() if k not in ("_n", "positions")}
            bar.set_postfix({k: f"{v:.3f}" for k, v in avg.items() if k == "loss" or k.startswith("alpha")})
            history.append({"step": step, **avg})
            run = {}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            history.append({"step": step, **validate()})
            tqdm.write(f"step {step}: {history[-1]}")
        if step % cfg.ckpt_every == 0 or step == cfg.steps:
            ck = {"config": asdict(cfg), "state": state_of(model), "opt": opt.state_dict(), "step": step}
            save_atomic({**ck, "history": history, "rng": torch.get_rng_state()}, ckpt_path)
    bar.close()
    return step


def run_distill(
    workdir: Path,
    cfg: DistillConfig,
    *,
    target: Any = None,
    records: list[dict[str, Any]] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train (or resume) the draft; writes ``<workdir>/distill/{ckpt.pt,final.pt}`` and the manifest record."""
    t0 = time.time()
    torch.manual_seed(cfg.seed)
    if target is None:
        from ..smollm2 import load_smollm2

        target, _ = load_smollm2("bf16")
    records = load_records(workdir) if records is None else records
    if not records:
        raise ValueError(f"no training data under {workdir}/data; run the data stage first")
    train, val = _split(records, cfg.val_every_nth)
    vocab = int(target.config.vocab_size)
    table, head_ids = embedding_and_head_ids(target, train, cfg.draft.head_vocab)
    draft = build_draft(cfg.draft, target.config, table, head_ids)
    init_from_target(draft, table, target)
    hmap = head_index_map(head_ids, vocab)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    out_dir = workdir / "distill"
    ckpt_path = out_dir / "ckpt.pt"
    step, history = resume(ckpt_path, cfg, draft, opt)

    def batch_at(step: int) -> dict[str, torch.Tensor]:
        return collate([train[i] for i in batch_indices(step, len(train), cfg.batch_size, cfg.seed)], cfg.max_len)

    step = train_loop(
        draft,
        params,
        opt,
        cfg,
        step=step,
        history=history,
        ckpt_path=ckpt_path,
        batch_at=batch_at,
        loss_of=lambda batch: distill_loss(draft, batch, hmap, cfg.tv_weight),
        validate=lambda: validate(draft, val, hmap, cfg),
        state_of=trainable_state,
        desc="distill",
        log_every=10,
        progress=progress,
    )
    positions = int(sum(r["topk_ids"].shape[0] for r in train))
    info = training_record(
        cfg, trainable_state(draft), head_ids, history, out_dir,
        step=step, sequences=(len(train), len(val)), positions=positions, t0=t0,
    )  # fmt: skip
    update_manifest(workdir, "distill", info)
    return info
