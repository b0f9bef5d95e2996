"""Training helpers of the distilled draft (the network itself: :mod:`specdec.drafters.networks.draft`): building it
from a ``distill`` checkpoint, initialising it from the target, choosing its head's tokens, the weights that are
trained. The network's names are importable from here too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..drafters.networks.draft import (  # noqa: F401 (names of the module before the networks moved)
    PROBE_ROWS,
    DraftConfig,
    ProjectedEmbedding,
    ReducedHead,
    build_draft,
    check_compatible,
    check_fingerprint,
    target_embedding,
    target_fingerprint,
)


def draft_from_checkpoint(path: Path, target: Any) -> Any:
    """The draft from a ``distill`` checkpoint (``final.pt``), in fp32, sharing the target's embedding values."""
    ck = torch.load(path, weights_only=False)
    cfg = DraftConfig(**ck["config"]["draft"])
    table = target_embedding(target).to(torch.bfloat16).float()
    draft = build_draft(cfg, target.config, table, ck["head_ids"])
    draft.load_state_dict(ck["state"], strict=False)
    return draft.eval()


@torch.no_grad()
def init_from_target(draft: Any, embed_table: torch.Tensor, target: Any = None) -> None:
    """Initialise the draft from the target.

    A fresh narrow body (no ``target_layers``): project onto the top-H principal directions of the target
    embedding; the head starts as the target's tied output embedding seen through the same projection (a head that
    starts close to the target's helps the first steps of training). With ``target_layers`` (``target`` needed):
    the body is a copy of those layers and of the final norm, the projection the identity, and the head the
    target's output rows of ``head_ids``: the draft starts as the target with the other layers skipped."""
    cfg = DraftConfig(**draft.config.specdec_draft)
    if cfg.target_layers:
        _init_from_target_layers(draft, cfg, target)
        return
    table = embed_table.float()
    _, _, vt = torch.linalg.svd(
        table[torch.randperm(table.shape[0], generator=torch.Generator().manual_seed(0))[:8192]], full_matrices=False
    )
    h = draft.config.hidden_size
    basis = vt[:h]  # [H, E]
    draft.model.embed_tokens.proj.weight.copy_(basis)
    head = draft.lm_head
    head.reduced_weight.copy_(table[head.head_ids] @ basis.T)


def _init_from_target_layers(draft: Any, cfg: DraftConfig, target: Any) -> None:
    if target is None:
        raise ValueError("a draft with target_layers is initialised from the target model: pass target")
    want = DraftConfig.from_target_layers(target.config, cfg.target_layers, cfg.head_vocab)
    if want != cfg:
        raise ValueError(f"draft config {cfg} does not have the target's layer shape {want}")
    src = target.model
    for dst, i in zip(draft.model.layers, cfg.target_layers, strict=True):
        dst.load_state_dict({k: v.float() for k, v in src.layers[i].state_dict().items()})
    draft.model.norm.weight.copy_(src.norm.weight.float())
    draft.model.embed_tokens.proj.weight.copy_(torch.eye(cfg.hidden_size))
    out = target.get_output_embeddings().weight.detach()
    draft.lm_head.reduced_weight.copy_(out[draft.lm_head.head_ids].float())


def select_head_ids(
    records: list[dict[str, Any]], vocab_size: int, k: int, always: tuple[int, ...] = ()
) -> torch.Tensor:
    """The k tokens with the largest target probability mass over the training positions (sorted ids).

    ``always`` (e.g. EOS) are forced in. Ties break to the lower token id.
    """
    if k > vocab_size:
        raise ValueError(f"head_vocab={k} exceeds the vocabulary size {vocab_size}")
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for r in records:
        mass.index_add_(0, r["topk_ids"].reshape(-1).long(), r["topk_logp"].reshape(-1).double().exp())
    for t in always:
        mass[t] = float("inf")
    order = torch.argsort(-mass, stable=True)[:k]
    return torch.sort(order).values


def trainable_state(draft: Any) -> dict[str, torch.Tensor]:
    """Everything that is shipped: every parameter plus head_ids (the frozen embedding table is excluded)."""
    return {k: v for k, v in draft.state_dict().items() if not k.endswith("embed_tokens.table")}
