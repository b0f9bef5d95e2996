"""Tiny random HF models and helpers for the driver tests (built from a config in the test, no downloads)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the driver tests need transformers")


def tiny_llama(
    seed: int,
    *,
    vocab: int = 32,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    std: float = 0.02,
    attn: str = "sdpa",
    dtype: torch.dtype = torch.float32,
) -> transformers.LlamaForCausalLM:
    """A random LlamaForCausalLM in eval mode; ``std`` (initializer_range) sets how peaked its laws are. Its
    generation config has no EOS (transformers' Llama default is id 2), so runs go to their length unless a test
    passes ``eos_token_id``."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        initializer_range=std,
        attn_implementation=attn,
    )
    model = transformers.LlamaForCausalLM(cfg).to(dtype).eval()
    model.generation_config.eos_token_id = None
    return model


def noisy_copy(model: transformers.LlamaForCausalLM, seed: int, scale: float) -> transformers.LlamaForCausalLM:
    """The same architecture with every weight perturbed: a draft that agrees with the target often, not always."""
    clone = type(model)(model.config).eval()
    clone.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().clamp_min(1e-3))
    return clone


def left_pad(prompts: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """HF-style left padding. Returns input_ids [B, P], attention_mask [B, P]."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :] = torch.tensor(p)
        mask[b, width - len(p) :] = 1
    return ids, mask


@torch.no_grad()
def reference_greedy(model: transformers.PreTrainedModel, prompt: list[int], n: int) -> tuple[list[int], float]:
    """Plain greedy decoding with full forwards (no cache). Returns the tokens and the smallest top-2 logit gap."""
    ids = torch.tensor([prompt])
    out, gap = [], float("inf")
    for _ in range(n):
        logits = model(ids).logits[0, -1].float()
        top = torch.topk(logits, 2).values
        gap = min(gap, float(top[0] - top[1]))
        nxt = int(logits.argmax())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out, gap


def assert_target_greedy(
    model: transformers.PreTrainedModel, prompts: list[list[int]], new_tokens: list[list[int]], n: int
) -> None:
    """Every row's output equals plain greedy decoding of ``model`` (on tie-free prompts: top-2 gap > 1e-4)."""
    for p, toks in zip(prompts, new_tokens, strict=True):
        ref, gap = reference_greedy(model, p, n)
        assert gap > 1e-4  # tie-free
        assert toks == ref
