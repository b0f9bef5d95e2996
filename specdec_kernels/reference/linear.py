"""Backend "torch": the skinny linear of a draft model's decode step (PyTorch's own linear)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._registry import register


@register("skinny_linear", "torch")
def skinny_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x weight^T in the input dtype; PyTorch's CPU and CUDA linears accumulate bf16/fp16 products in fp32."""
    return F.linear(x, weight)
