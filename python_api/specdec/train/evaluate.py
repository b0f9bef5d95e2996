"""Stage ``eval``: acceptance rate, greedy agreement and cost of a draft against the target, both in bf16.

* ``alpha`` = mean over held-out response positions of ``sum_v min(p(v), q(v))`` at T = 1 with the full
  distributions of both models (the expected per-token acceptance of standard speculative sampling).
* ``greedy_agreement`` = fraction of the same positions where ``argmax p == argmax q``.
* ``head_coverage`` = mean target mass inside the draft's head (an upper bound on alpha).
* ``cost_ratio`` = median time of one draft decoding step / one target decoding step (batch 1, 1 new token,
  KV cache of ``context`` tokens), measured interleaved in the same process so machine load affects both alike.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from ..models import cache_argument
from .common import update_manifest


@torch.no_grad()
def _response_probs(model: Any, recs: list[dict[str, Any]], batch_size: int = 8) -> list[torch.Tensor]:
    """fp32 next-token distributions [n, V] at every response position of each record (teacher forcing)."""
    out = []
    for lo in range(0, len(recs), batch_size):
        chunk = recs[lo : lo + batch_size]
        L = max(len(r["tokens"]) for r in chunk)
        ids = torch.zeros((len(chunk), L), dtype=torch.long)
        mask = torch.zeros((len(chunk), L), dtype=torch.long)
        for b, r in enumerate(chunk):
            ids[b, : len(r["tokens"])] = r["tokens"].long()
            mask[b, : len(r["tokens"])] = 1
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        for b, r in enumerate(chunk):
            h = hidden[b, int(r["start"]) - 1 : len(r["tokens"]) - 1]
            out.append(torch.softmax(model.lm_head(h).float(), dim=-1))
    return out


@torch.no_grad()
def acceptance_metrics(draft: Any, target: Any, recs: list[dict[str, Any]]) -> dict[str, float]:
    """alpha, greedy agreement and head coverage of ``draft`` vs ``target`` on the records' response positions."""
    recs = [r for r in recs if len(r["tokens"]) > int(r["start"])]
    qs = _response_probs(target, recs)
    ps = _response_probs(draft, recs)
    q, p = torch.cat(qs), torch.cat(ps)
    head = getattr(draft.lm_head, "head_ids", None)
    cover = q[:, head].sum(-1).mean().item() if head is not None else 1.0
    return {
        "alpha": torch.minimum(p, q).sum(-1).mean().item(),
        "greedy_agreement": (p.argmax(-1) == q.argmax(-1)).float().mean().item(),
        "head_coverage": cover,
        "positions": int(q.shape[0]),
    }


@torch.no_grad()
def step_cost_ratio(draft: Any, target: Any, *, context: int = 200, reps: int = 30) -> dict[str, float]:
    """Median seconds of a 1-token cached decoding step of each model, measured interleaved."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 1000, (1, context), generator=g)
    x = torch.randint(3, 1000, (1, 1), generator=g)
    caches = {}
    for name, m in (("draft", draft), ("target", target)):
        c = DynamicCache(config=m.config)
        m(input_ids=ids, use_cache=True, **{cache_argument(m): c})
        caches[name] = c
    times: dict[str, list[float]] = {"draft": [], "target": []}
    pos = torch.tensor([[context]])
    for _ in range(reps):
        for name, m in (("draft", draft), ("target", target)):
            t = time.perf_counter()
            m(input_ids=x, position_ids=pos, use_cache=True, **{cache_argument(m): caches[name]})
            times[name].append(time.perf_counter() - t)
            caches[name].crop(-1)
    d, t = statistics.median(times["draft"]), statistics.median(times["target"])
    return {"draft_step_s": d, "target_step_s": t, "cost_ratio": d / t}


def expected_speedup(alpha: float, cost: float, max_len: int = 8) -> dict[str, float]:
    """Leviathan et al.: best chain length k and (1 - a^(k+1)) / ((1 - a)(c k + 1)) (i.i.d. acceptance model)."""
    best_k, best = 0, 1.0
    for k in range(1, max_len + 1):
        s = (1 - alpha ** (k + 1)) / ((1 - alpha) * (cost * k + 1)) if alpha < 1 else (k + 1) / (cost * k + 1)
        if s > best:
            best_k, best = k, s
    return {"best_k": best_k, "expected_speedup": best}


CHECK_PROMPTS = (
    "Write a short note to a friend about a trip to the mountains.",
    "What are three tips for learning a new language?",
    "Explain why the sky is blue in simple words.",
    "Give me a recipe idea for a quick dinner.",
)


@torch.no_grad()
def check_set_records(target: Any, tokenizer: Any, *, new_tokens: int = 24) -> list[dict[str, Any]]:
    """The tiny fixed check set: 4 fixed chat prompts + the target's greedy continuation (deterministic)."""
    from .common import chat_ids

    recs = []
    for text in CHECK_PROMPTS:
        ids = chat_ids(tokenizer, text)
        seq = list(ids)
        for _ in range(new_tokens):
            nxt = int(target(input_ids=torch.tensor([seq])).logits[0, -1].float().argmax())
            seq.append(nxt)
        recs.append({"tokens": torch.tensor(seq), "start": len(ids)})
    return recs


def check_set_alpha(draft: Any, target: Any, tokenizer: Any, *, new_tokens: int = 24) -> dict[str, float]:
    """alpha / greedy agreement on the check set (:func:`check_set_records`), used by the tests to confirm that a
    shipped draft loads with its recorded quality."""
    return acceptance_metrics(draft, target, check_set_records(target, tokenizer, new_tokens=new_tokens))


def run_eval(workdir: Path, *, seed: int = 0, draft: Any = None, target: Any = None) -> dict[str, Any]:
    """Score the distilled draft (``<workdir>/distill/final.pt`` unless given) on the cached Vicuna eval set."""
    from ..smollm2 import load_smollm2
    from .draft import draft_from_checkpoint
    from .evalset import build_eval_set

    t0 = time.time()
    if target is None:
        target, tok = load_smollm2("bf16")
    else:
        tok = None
    if draft is None:
        draft = draft_from_checkpoint(workdir / "distill" / "final.pt", target).to(torch.bfloat16)
    draft.eval()
    ev = build_eval_set(target, tok, workdir, seed=seed)
    metrics = acceptance_metrics(draft, target, ev["records"])
    metrics.update(step_cost_ratio(draft, target))
    metrics.update(expected_speedup(metrics["alpha"], metrics["cost_ratio"]))
    info = {
        "eval_set": {k: ev[k] for k in ("file", "n_prompts", "max_new_tokens", "seed")},
        "dtype": "bf16",
        "metrics": metrics,
        "seconds_this_run": round(time.time() - t0, 1),
    }
    update_manifest(workdir, "eval", info)
    return info
