"""The distilled draft: a narrow Llama that reuses the target's frozen embedding and has a reduced-vocabulary head.

* Input: ``embed_proj(E_target[token])`` — the target's (frozen, shared) input embedding followed by a learned
  Linear(E, H). Only the projection is shipped; the table comes from the target at load time (it is always there).
* Body: ``num_layers`` standard HF Llama decoder layers of width H (a real ``LlamaForCausalLM``, so the driver's
  HF adapter, KV cache, tree masks and position ids all work unchanged).
* Output: :class:`ReducedHead` scores only ``head_ids`` (the tokens that carry most of the target's mass) and
  returns full-vocabulary logits with ``-inf`` elsewhere, so p = softmax(logits) is a proper distribution over the
  full vocabulary with exact zeros outside the head. Speculative decoding stays exact for any p (a drafted token
  always has p > 0; tokens with p = 0 are simply never proposed).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from ...distributed import is_dtensor
from ...errors import DraftMismatchError
from ...models import (
    decode_linear,
)

PROBE_ROWS = (0, 1, 2, 100, 1000, 10000, 30000, 49151)  # embedding rows stored to recognise the target


@dataclass
class DraftConfig:
    """Shape of the draft. Defaults: ~2.6M trained body parameters + 2.1M head (see docs/drafts.md)."""

    hidden_size: int = 256
    num_layers: int = 2
    intermediate_size: int = 768
    num_heads: int = 4
    num_kv_heads: int = 2
    head_vocab: int = 8192
    #: the target's decoder layers the body starts from (copied in this order, then trained; the shape fields must
    #: then be the target's); empty: a fresh narrow body initialised from the embedding's principal directions
    target_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.target_layers = tuple(int(i) for i in self.target_layers)  # JSON gives a list

    @classmethod
    def from_target_layers(cls, target_config: Any, layers: tuple[int, ...], head_vocab: int) -> DraftConfig:
        """The shape of a draft whose body starts as the target's decoder ``layers`` (ValueError when an index is
        out of range, repeats or none is given)."""
        n = int(target_config.num_hidden_layers)
        if not layers:
            raise ValueError("target_layers must name at least one of the target's decoder layers")
        if any(not 0 <= i < n for i in layers) or len(set(layers)) != len(layers):
            raise ValueError(f"target_layers must be distinct indices in [0, {n}), got {list(layers)}")
        return cls(
            hidden_size=int(target_config.hidden_size),
            num_layers=len(layers),
            intermediate_size=int(target_config.intermediate_size),
            num_heads=int(target_config.num_attention_heads),
            num_kv_heads=int(getattr(target_config, "num_key_value_heads", target_config.num_attention_heads)),
            head_vocab=head_vocab,
            target_layers=tuple(layers),
        )


class ProjectedEmbedding(nn.Module):
    """Frozen target embedding table (not a parameter, not saved) followed by a trained Linear(E, H)."""

    def __init__(self, table: torch.Tensor, hidden_size: int) -> None:
        super().__init__()
        self.register_buffer("table", table.detach(), persistent=False)
        self.proj = nn.Linear(table.shape[1], hidden_size, bias=False)

    @property
    def weight(self) -> torch.Tensor:  # HF helpers read embed_tokens.weight for dtype/device
        return self.proj.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # a decode step's few rows go to the skinny kernels (int8 where int8_weights packed the projection), as
        # the head's do: PyTorch's small-batch linear costs several times more here
        return decode_linear(self.table[input_ids].to(self.proj.weight.dtype), self.proj.weight)


class ReducedHead(nn.Module):
    """Linear head over ``head_ids`` only; full-vocabulary output with ``-inf`` outside the head.

    Shape: hidden [..., H] -> logits [..., vocab_size]; ``full=False`` (or :meth:`reduced`) gives the
    [..., len(head_ids)] scores, in ``head_ids`` order (sorted ids), which the driver samples from directly.
    """

    #: the module can return the scores of ``head_ids`` only (specdec.models.HFCausalLM reads this)
    reduced_output = True

    def __init__(self, hidden_size: int, head_ids: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        ids = torch.as_tensor(head_ids, dtype=torch.long)
        if ids.ndim != 1 or ids.numel() == 0:
            raise ValueError(f"head_ids must be a non-empty 1-D tensor, got shape {tuple(ids.shape)}")
        if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise ValueError(f"head_ids must lie in [0, {vocab_size}), got range [{int(ids.min())}, {int(ids.max())}]")
        if torch.unique(ids).numel() != ids.numel():
            raise ValueError("head_ids must not repeat a token")
        self.vocab_size = int(vocab_size)
        self.register_buffer("head_ids", ids)
        self.reduced_weight = nn.Parameter(torch.empty(ids.numel(), hidden_size))
        nn.init.normal_(self.reduced_weight, std=0.02)

    @property
    def weight(self) -> torch.Tensor:
        """A zero-cost [vocab_size, H] stand-in for code that reads ``lm_head.weight.shape`` to learn the vocabulary
        (HF adapters do). It holds no weights: call the module for logits."""
        w = self.reduced_weight
        return w.new_zeros(()).expand(self.vocab_size, w.shape[1])

    def reduced(self, hidden: torch.Tensor) -> torch.Tensor:
        return decode_linear(hidden, self.reduced_weight)

    def forward(self, hidden: torch.Tensor, *, full: bool = True) -> torch.Tensor:
        z = self.reduced(hidden)
        if not full:
            return z
        out = z.new_full((*z.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.head_ids, z)


def build_draft(cfg: DraftConfig, target_config: Any, embed_table: torch.Tensor, head_ids: torch.Tensor) -> Any:
    """A ``LlamaForCausalLM`` draft for a target with config ``target_config`` and input embedding ``embed_table``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = int(target_config.vocab_size)
    if embed_table.shape[0] != vocab:
        raise ValueError(f"embed_table has {embed_table.shape[0]} rows but the target vocabulary is {vocab}")
    lcfg = LlamaConfig(
        vocab_size=8,  # the real embedding/head are swapped in below; avoids allocating two V x H matrices
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=int(getattr(target_config, "max_position_embeddings", 8192)),
        rope_parameters=getattr(target_config, "rope_parameters", None),
        rms_norm_eps=float(getattr(target_config, "rms_norm_eps", 1e-5)),
        tie_word_embeddings=False,
        bos_token_id=getattr(target_config, "bos_token_id", None),
        eos_token_id=getattr(target_config, "eos_token_id", None),
        pad_token_id=None,
    )
    model = LlamaForCausalLM(lcfg)
    model.config.vocab_size = vocab
    model.model.embed_tokens = ProjectedEmbedding(embed_table, cfg.hidden_size)
    model.lm_head = ReducedHead(cfg.hidden_size, head_ids, vocab)
    model.config.specdec_draft = asdict(cfg)
    return model


def target_embedding(target: Any) -> torch.Tensor:
    """The target's input embedding table [V, E] (the draft reads it, never trains or ships it); of a
    tensor-parallel target, the whole table gathered from the ranks (the draft is replicated, so each rank holds one
    copy: every rank must call this, as every rank loads the draft)."""
    table = target.get_input_embeddings().weight.detach()
    return table.full_tensor() if is_dtensor(table) else table


def _probe_rows(vocab: int) -> list[int]:
    return sorted({r % vocab for r in PROBE_ROWS})


def target_fingerprint(embed_table: torch.Tensor) -> torch.Tensor:
    """A few rows of the target's input embedding: identifies the target a draft was trained against."""
    return embed_table[_probe_rows(embed_table.shape[0])].detach().float().clone()


def check_fingerprint(stored: torch.Tensor, embed_table: torch.Tensor, where: str) -> None:
    rows = _probe_rows(embed_table.shape[0])
    same = stored.shape == (len(rows), embed_table.shape[1])
    if not same or not torch.allclose(stored, embed_table[rows].float(), atol=2e-2, rtol=2e-2):
        raise DraftMismatchError(
            f"{where}: the target's input embedding does not match the one this draft was trained with; "
            "the draft reuses that embedding, so it only works with its own target (SmolLM2-135M-Instruct "
            "for the shipped draft)"
        )


def check_compatible(draft: Any, target: Any, draft_tokenizer: Any = None, target_tokenizer: Any = None) -> None:
    """Raise ValueError unless draft and target share the vocabulary (and tokenizers, when given)."""
    vd, vt = int(draft.config.vocab_size), int(target.config.vocab_size)
    if vd != vt:
        raise ValueError(
            f"draft and target vocabularies differ: draft vocab_size={vd}, target vocab_size={vt}; a draft must "
            "share the target's tokenizer and vocabulary"
        )
    if draft_tokenizer is not None and target_tokenizer is not None:
        if draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
            raise ValueError(
                "draft and target tokenizers differ (different token -> id maps); speculative decoding needs the "
                "same tokenizer for both models"
            )


def check_target_vocab(vocab: int, target: Any, name: str) -> None:
    """Refuse a target whose vocabulary is not the ``vocab`` the draft file ``name`` was trained for."""
    if int(target.config.vocab_size) != vocab:
        raise DraftMismatchError(
            f"{name}: draft trained for vocab_size={vocab}, target has vocab_size={target.config.vocab_size}; "
            "a draft must share the target's tokenizer and vocabulary"
        )


def load_trained(draft: Any, tensors: dict[str, torch.Tensor], shared: str, name: str) -> None:
    """Load a draft file's trained weights into ``draft``; the tensor ending in ``shared`` is the target's (never
    shipped). Raises ValueError naming the file when the weights do not fit the draft's configuration."""
    missing, unexpected = draft.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if not k.endswith(shared)]
    if missing or unexpected:
        raise ValueError(f"{name}: weights do not match the draft config (missing {missing}, extra {unexpected})")
