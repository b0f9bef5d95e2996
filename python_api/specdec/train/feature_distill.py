"""Stages ``feature-distill`` and ``feature-eval``: train and score the feature draft (EAGLE-style).

Training pairs (records from ``feature-data``): input at draft position i is (f_i, x_{i+1}); the output h_i is
trained on the target's law of x_{i+2} (soft cross-entropy plus the TV term ``1 - sum min(p, q)`` that alpha
rewards) and on the next feature f_{i+1} (smooth L1, EAGLE's regression loss). The law is the stored top-k inside
the head (``labels="topk"``) or, with ``labels="head"``, the target's exact law over every head token, recomputed
from f_{i+1} (the final-norm state its lm_head reads), so the draft's tail is labelled too.

Two passes per batch (``unroll = 2``): pass 1 reads the target's features; pass 2 reads the draft's own pass-1
outputs in place of the features, attending to the pass-1 keys of earlier positions and to itself — exactly the
situation of a second-level draft token at inference (true features for the committed prefix, its own prediction
for the newest node), so depth-2 acceptance is trained, not hoped for.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .common import sub_seed, training_record, update_manifest
from .distill import (
    _split,
    batch_indices,
    embedding_and_head_ids,
    head_index_map,
    position_weighted_eval,
    resume,
    train_loop,
)
from .feature_data import label_with_features, load_feature_records
from .feature_draft import FeatureDraft, FeatureDraftConfig, init_from_target, trainable_state


@dataclass
class FeatureDistillConfig:
    seed: int = 0
    draft: FeatureDraftConfig = field(default_factory=FeatureDraftConfig)
    steps: int = 2600
    batch_size: int = 16
    max_len: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 40
    weight_decay: float = 0.01
    tv_weight: float = 1.0
    labels: str = "topk"  # "topk": stored top-k only; "head": exact law over the whole head (see module doc)
    reg_weight: float = 1.0
    feature_noise: float = 0.1  # uniform +-noise on input features (EAGLE's augmentation)
    unroll: int = 2
    freeze_head: bool = True  # the head stays the target's output embedding rows (EAGLE): fewer weights to overfit
    grad_clip: float = 1.0
    val_every_nth: int = 40
    eval_every: int = 400
    ckpt_every: int = 100
    autocast_bf16: bool = True


def collate(recs: list[dict[str, Any]], max_len: int, extra: bool = False) -> dict[str, torch.Tensor]:
    """Right-padded pairs. Shape: feats [B, L, E] (f_0..f_{L-1}; with ``extra``, [final ; xfeats] per position),
    ids [B, L], topk_* [B, L, k], n [B]."""
    lens = [min(len(r["tokens"]), max_len) for r in recs]
    L = max(lens)
    if extra and "xfeats" not in recs[0]:
        raise ValueError("the draft reads extra target layers but the data has no xfeats; rerun feature-data")
    E = recs[0]["feats"].shape[1] + (recs[0]["xfeats"].shape[1] if extra else 0)
    k = recs[0]["topk_ids"].shape[1]
    feats = torch.zeros((len(recs), L, E), dtype=torch.float32)
    ids = torch.zeros((len(recs), L), dtype=torch.long)
    tk_ids = torch.zeros((len(recs), L, k), dtype=torch.long)
    tk_lp = torch.full((len(recs), L, k), -float("inf"), dtype=torch.float32)
    for b, (r, n) in enumerate(zip(recs, lens, strict=True)):
        f = torch.cat([r["feats"][:n], r["xfeats"][:n]], dim=-1) if extra else r["feats"][:n]
        feats[b, :n] = f.float()
        ids[b, :n] = r["tokens"][:n].long()
        tk_ids[b, :n] = r["topk_ids"][:n].long()
        tk_lp[b, :n] = r["topk_logp"][:n].float()
    return {"feats": feats, "ids": ids, "topk_ids": tk_ids, "topk_logp": tk_lp, "n": torch.tensor(lens)}


def _pass_mask(n_pairs: int) -> torch.Tensor:
    """Boolean mask of pass 2 (True = attend): row i sees pass-1 keys j < i and its own new key.

    Shape: [1, 1, n, 2n]."""
    i = torch.arange(n_pairs)
    allowed = torch.cat([i[None, :] < i[:, None], i[None, :] == i[:, None]], dim=1)
    return allowed[None, None]


LABELS = ("topk", "head")


def topk_head_labels(tk_ids: torch.Tensor, tk_lp: torch.Tensor, hmap: torch.Tensor) -> torch.Tensor:
    """The stored top-k probabilities placed on the head's columns (0 elsewhere; top-k tokens outside the head are
    dropped). Shape: tk [N, k] -> [N, len(head)]."""
    idx = hmap[tk_ids]
    p = tk_lp.float().exp() * (idx >= 0)
    n_head = int((hmap >= 0).sum())
    return torch.zeros((p.shape[0], n_head), dtype=torch.float32).scatter_add_(1, idx.clamp_min(0), p)


def exact_head_labels(
    f_next: torch.Tensor, tk_ids: torch.Tensor, tk_lp: torch.Tensor, out_w: torch.Tensor, head_ids: torch.Tensor
) -> torch.Tensor:
    """The target's probabilities of every head token, recomputed from the final-norm state f_next that its lm_head
    reads (``out_w``: the output embedding [V, E]). The full-vocabulary normaliser is too costly per step, so it is
    read off the stored top-k: log Z = logsumexp(top-k logits) - log(stored top-k mass).
    Shape: f_next [N, E], tk [N, k] -> [N, len(head_ids)]."""
    with torch.autocast("cpu", enabled=False):
        f = f_next.float()
        logits = f @ out_w[head_ids].T
        tk_logits = torch.einsum("ne,nke->nk", f, out_w[tk_ids])
        log_z = torch.logsumexp(tk_logits, -1) - torch.logsumexp(tk_lp.float(), -1)
        return (logits - log_z[:, None]).exp()


def _head_terms(draft: FeatureDraft, h: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair soft CE and alpha against the target's head probabilities p. Shape: h [N, E], p [N, V_h] -> [N]."""
    logp = torch.log_softmax(draft.lm_head.reduced(h).float(), dim=-1)
    return -(p * logp).sum(-1), torch.minimum(logp.exp(), p).sum(-1)


def feature_loss(
    draft: FeatureDraft,
    batch: dict[str, torch.Tensor],
    hmap: torch.Tensor,
    cfg: FeatureDistillConfig,
    train: bool,
    out_w: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``out_w``: the target's output embedding, needed with ``cfg.labels == "head"``."""
    from transformers import DynamicCache

    feats, ids, n = batch["feats"], batch["ids"], batch["n"]
    B, L, _ = feats.shape
    final = feats[..., : draft.decoder.pair.width]  # regression targets: the final hidden states
    P = L - 1  # pairs (f_i, x_{i+1}), i = 0 .. L-2
    f_in = feats[:, :P]
    if train and cfg.feature_noise > 0:
        f_in = f_in + (torch.rand_like(f_in) * 2 - 1) * cfg.feature_noise
    pos = torch.arange(P)[None].expand(B, P)
    cache = DynamicCache(config=draft.config)
    out = draft.decoder(ids[:, 1:], features=f_in, position_ids=pos, past_key_values=cache, use_cache=True)
    h1 = out.last_hidden_state
    valid = torch.arange(P)[None] < (n - 1)[:, None]  # pair i has a label at position i + 1
    tk_ids, tk_lp = batch["topk_ids"][:, 1:][valid], batch["topk_logp"][:, 1:][valid]
    if cfg.labels == "head":
        if out_w is None:
            raise ValueError('labels="head" needs out_w, the target\'s output embedding')
        p1 = exact_head_labels(final[:, 1:][valid], tk_ids, tk_lp, out_w, draft.lm_head.head_ids)
    else:
        p1 = topk_head_labels(tk_ids, tk_lp, hmap)
    ce1, a1 = _head_terms(draft, h1[valid], p1)
    reg1 = torch.nn.functional.smooth_l1_loss(h1[valid].float(), final[:, 1:][valid], reduction="none").mean(-1)
    loss = (ce1 + cfg.tv_weight * (1 - a1) + cfg.reg_weight * reg1).mean()
    m = {
        "ce": ce1.mean().item(),
        f"alpha_{cfg.labels}": a1.mean().item(),
        "reg": reg1.mean().item(),
        "positions": int(a1.numel()),
    }
    if cfg.unroll >= 2 and P >= 2:
        # pair i (i >= 1) reads h1[i-1] (the pass-1 prediction of f_i) instead of f_i
        f2 = torch.cat([draft.decoder.pair.fused(feats[:, :1]), h1[:, :-1]], dim=1)
        mask = _pass_mask(P).expand(B, 1, P, 2 * P)
        h2 = draft.decoder(ids[:, 1:], features=f2, position_ids=pos, past_key_values=cache, attention_mask=mask)
        h2 = h2.last_hidden_state
        v2 = valid & (torch.arange(P)[None] >= 1)
        ce2, a2 = _head_terms(draft, h2[v2], p1[v2[valid]])
        reg2 = torch.nn.functional.smooth_l1_loss(h2[v2].float(), final[:, 1:][v2], reduction="none").mean(-1)
        loss = loss + (ce2 + cfg.tv_weight * (1 - a2) + cfg.reg_weight * reg2).mean()
        m[f"alpha2_{cfg.labels}"] = a2.mean().item()
    return loss, m


def validate(
    draft: FeatureDraft,
    val: list[dict[str, Any]],
    hmap: torch.Tensor,
    cfg: FeatureDistillConfig,
    out_w: torch.Tensor | None = None,
) -> dict:
    def metrics(recs: list[dict[str, Any]]) -> dict[str, float]:
        batch = collate(recs, cfg.max_len, bool(cfg.draft.extra_layers))
        return feature_loss(draft, batch, hmap, cfg, train=False, out_w=out_w)[1]

    return position_weighted_eval(draft, val, cfg.batch_size, cfg.autocast_bf16, metrics)


def run_feature_distill(
    workdir: Path,
    cfg: FeatureDistillConfig,
    *,
    target: Any = None,
    records: list[dict[str, Any]] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train (or resume) the feature draft; writes ``<workdir>/feature/{ckpt.pt,final.pt}`` and the manifest."""
    t0 = time.time()
    if cfg.labels not in LABELS:
        raise ValueError(f"labels must be one of {LABELS}, got {cfg.labels!r}")
    torch.manual_seed(cfg.seed)
    if target is None:
        from ..smollm2 import load_smollm2

        target, _ = load_smollm2("bf16")
    records = load_feature_records(workdir) if records is None else records
    if not records:
        raise ValueError(f"no training data under {workdir}/feature/data; run the feature-data stage first")
    train, val = _split(records, cfg.val_every_nth)
    vocab = int(target.config.vocab_size)
    table, head_ids = embedding_and_head_ids(target, train, cfg.draft.head_vocab)
    draft = FeatureDraft(cfg.draft, target.config, table, head_ids)
    init_from_target(draft, target)
    if cfg.freeze_head:
        draft.lm_head.reduced_weight.requires_grad_(False)
    hmap = head_index_map(head_ids, vocab)
    out_w = target.get_output_embeddings().weight.detach().float() if cfg.labels == "head" else None
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    out_dir = workdir / "feature"
    ckpt_path = out_dir / "ckpt.pt"
    step, history = resume(ckpt_path, cfg, draft, opt)

    def batch_at(step: int) -> dict[str, torch.Tensor]:
        idx = batch_indices(step, len(train), cfg.batch_size, sub_seed(cfg.seed, "feature"))
        return collate([train[i] for i in idx], cfg.max_len, bool(cfg.draft.extra_layers))

    step = train_loop(
        draft,
        params,
        opt,
        cfg,
        step=step,
        history=history,
        ckpt_path=ckpt_path,
        batch_at=batch_at,
        loss_of=lambda batch: feature_loss(draft, batch, hmap, cfg, train=True, out_w=out_w),
        validate=lambda: validate(draft, val, hmap, cfg, out_w),
        state_of=trainable_state,
        desc="feature-distill",
        log_every=20,
        progress=progress,
    )
    info = training_record(
        cfg, trainable_state(draft), head_ids, history, out_dir,
        step=step, sequences=(len(train), len(val)), positions=int(sum(len(r["tokens"]) for r in train)), t0=t0,
    )  # fmt: skip
    update_manifest(out_dir, "distill", info)
    return info


def feature_draft_from_checkpoint(path: Path, target: Any) -> FeatureDraft:
    """The draft from a ``feature-distill`` checkpoint (``final.pt``), fp32, sharing the target's embedding values."""
    ck = torch.load(path, weights_only=False)
    cfg = FeatureDraftConfig(**ck["config"]["draft"])
    table = target.get_input_embeddings().weight.detach().to(torch.bfloat16).float()
    draft = FeatureDraft(cfg, target.config, table, ck["head_ids"])
    draft.load_state_dict(ck["state"], strict=False)
    return draft.eval()


@torch.no_grad()
def feature_acceptance(draft: FeatureDraft, target: Any, recs: list[dict[str, Any]]) -> dict[str, float]:
    """alpha = E[sum min(p, q)] (full distributions, T = 1) at the records' response positions, for the first
    draft token (pairs read true target features) and the second (the newest pair reads the draft's own output).

    Token t (t >= start) is drafted by pair t - 2 = (f_{t-2}, x_{t-1}) at depth 1; q_t = softmax(lm_head(f_{t-1})).
    """
    from transformers import DynamicCache

    recs = [r for r in recs if len(r["tokens"]) > int(r["start"]) >= 2]
    layers = tuple(draft.feature_layers)
    seqs = [r["tokens"].tolist() for r in recs]
    labelled = label_with_features(target, seqs, top_k=1, batch_size=8, layers=layers)
    dtype = next(draft.parameters()).dtype
    a1, a2, g1, cover = [], [], [], []
    head = draft.lm_head.head_ids
    for r, lab in zip(recs, labelled, strict=True):
        tokens, feats = lab["tokens"].long(), lab["feats"]
        tin = torch.cat([feats, lab["xfeats"]], dim=-1) if layers else feats  # what the draft reads
        T, start = len(tokens), int(r["start"])
        tdtype = next(target.parameters()).dtype
        q = torch.softmax(target.lm_head(feats[start - 1 : T - 1].to(tdtype)).float(), dim=-1)  # laws of start..T-1
        P = T - 1
        pos = torch.arange(P)[None]
        cache = DynamicCache(config=draft.config)
        h1 = draft.decoder(
            tokens[None, 1:],
            features=tin[None, :P].to(dtype),
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
        f2 = torch.cat([draft.decoder.pair.fused(tin[None, :1]), h1[:, :-1]], dim=1)
        h2 = draft.decoder(
            tokens[None, 1:], features=f2, position_ids=pos, past_key_values=cache, attention_mask=_pass_mask(P)
        ).last_hidden_state
        rows = slice(start - 2, T - 2)
        p1 = torch.softmax(draft.lm_head(h1[0, rows]).float(), dim=-1)
        p2 = torch.softmax(draft.lm_head(h2[0, rows]).float(), dim=-1)
        a1.append(torch.minimum(p1, q).sum(-1))
        a2.append(torch.minimum(p2, q).sum(-1))
        g1.append((p1.argmax(-1) == q.argmax(-1)).float())
        cover.append(q[:, head].sum(-1))
    return {
        "alpha": torch.cat(a1).mean().item(),
        "alpha_depth2": torch.cat(a2).mean().item(),
        "greedy_agreement": torch.cat(g1).mean().item(),
        "head_coverage": torch.cat(cover).mean().item(),
        "positions": int(torch.cat(a1).numel()),
    }


@torch.no_grad()
def feature_step_cost(draft: FeatureDraft, target: Any, *, context: int = 200, reps: int = 30) -> dict[str, float]:
    """Median seconds of a 1-token cached step of the draft (one pair + head) and of the target, interleaved."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 1000, (1, context), generator=g)
    x = torch.randint(3, 1000, (1, 1), generator=g)
    dtype = next(draft.parameters()).dtype
    tcache, dcache = DynamicCache(config=target.config), DynamicCache(config=draft.config)
    from ..models import cache_argument, layer_features

    key = cache_argument(target)
    out = target.model(input_ids=ids, use_cache=True, output_hidden_states=True, **{key: tcache})
    feats = out.last_hidden_state
    if draft.feature_layers:
        feats = torch.cat([feats, layer_features(target.model, out.hidden_states, draft.feature_layers)], dim=-1)
    draft(feats.to(dtype), ids, past_key_values=dcache, use_cache=True)
    f1 = feats[:, -1:].to(dtype)
    times: dict[str, list[float]] = {"draft": [], "target": []}
    pos = torch.tensor([[context]])
    # both called as the driver calls them: an explicit additive mask over the cache (the draft's lean path)
    tmask = torch.zeros((1, 1, 1, context + 1), dtype=next(target.parameters()).dtype)
    dmask = tmask.to(dtype)
    for _ in range(reps):
        t = time.perf_counter()
        target(input_ids=x, attention_mask=tmask, position_ids=pos, use_cache=True, **{key: tcache})
        times["target"].append(time.perf_counter() - t)
        tcache.crop(-1)
        t = time.perf_counter()
        draft(f1, x, attention_mask=dmask, position_ids=pos, past_key_values=dcache, use_cache=True)
        times["draft"].append(time.perf_counter() - t)
        dcache.crop(-1)
    d, t = statistics.median(times["draft"]), statistics.median(times["target"])
    return {"draft_step_s": d, "target_step_s": t, "cost_ratio": d / t}


@torch.no_grad()
def feature_check_set(draft: FeatureDraft, target: Any, tokenizer: Any, *, new_tokens: int = 24) -> dict[str, float]:
    """alpha on the tiny fixed check set of :func:`specdec.train.evaluate.check_set_alpha` (4 chat prompts + the
    target's greedy continuation): the tests confirm that a shipped feature draft loads with its recorded quality."""
    from .evaluate import check_set_records

    recs = check_set_records(target, tokenizer, new_tokens=new_tokens)
    return feature_acceptance(draft, target, recs)


def run_feature_eval(
    workdir: Path, *, seed: int = 0, draft: Any = None, target: Any = None, record: bool = True
) -> dict[str, Any]:
    """Score the feature draft (``<workdir>/feature/final.pt`` unless given: a module, or the name/path of a
    saved one such as ``"smollm2-eagle"``), both models in bf16, on the cached held-out Vicuna eval set (the one
    the plain draft is scored on). ``record``: write the result into the workdir's manifest."""
    from ..smollm2 import load_smollm2
    from .evalset import build_eval_set
    from .evaluate import expected_speedup

    t0 = time.time()
    tok = None
    if target is None:
        target, tok = load_smollm2("bf16")
    if draft is None:
        draft = feature_draft_from_checkpoint(workdir / "feature" / "final.pt", target).to(torch.bfloat16)
    elif isinstance(draft, str | Path):
        from .feature_draft import load_feature_draft

        draft = load_feature_draft(draft, target, dtype=torch.bfloat16)
    draft.eval()
    ev = build_eval_set(target, tok, workdir, seed=seed)
    metrics = feature_acceptance(draft, target, ev["records"])
    metrics.update(feature_step_cost(draft, target))
    metrics.update(expected_speedup(metrics["alpha"], metrics["cost_ratio"]))
    info = {
        "eval_set": {k: ev[k] for k in ("file", "n_prompts", "max_new_tokens", "seed")},
        "dtype": "bf16",
        "metrics": metrics,
        "seconds_this_run": round(time.time() - t0, 1),
    }
    if record:
        update_manifest(workdir / "feature", "eval", info)
    return info


def ship_feature_draft(workdir: Path, name: str, *, assets_dir: Path | None = None) -> dict[str, Any]:
    """Write the trained feature draft (bf16 safetensors) and its manifest (with the check-set alpha) to assets."""
    import json

    from ..drafters.store import ASSETS_DIR
    from ..smollm2 import load_smollm2
    from .common import file_sha256, write_json_atomic
    from .feature_draft import load_feature_draft, save_feature_draft

    out = assets_dir or ASSETS_DIR
    target, tok = load_smollm2("bf16")
    ck = torch.load(workdir / "feature" / "final.pt", weights_only=False)
    draft = feature_draft_from_checkpoint(workdir / "feature" / "final.pt", target)
    path = save_feature_draft(draft, out / f"{name}.safetensors")
    wm = workdir / "feature" / "manifest.json"
    manifest = json.loads(wm.read_text()) if wm.is_file() else {}
    manifest["files"] = {"draft": {"file": path.name, "bytes": path.stat().st_size, "sha256": file_sha256(path)}}
    shipped = load_feature_draft(path, target)
    manifest["check_set"] = {"dtype": "bf16", **feature_check_set(shipped, target, tok)}
    manifest["retrain"] = f"python -m specdec.train feature-all --seed {ck['config']['seed']} --name {name}"
    write_json_atomic(out / f"{name}.json", manifest)
    return {"files": {"draft": str(path)}, "bytes": {"draft": path.stat().st_size}}
