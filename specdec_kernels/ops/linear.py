"""Public op for a draft model's decode step: a linear layer on a few rows."""

from __future__ import annotations

import torch

from .._registry import resolve
from ._checks import check_float, check_same_device, check_tensor


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """``x @ weight.T`` (no bias) for the few rows of a decode step, where reading ``weight`` is the whole cost.

    Shape: x [..., in], weight [out, in], one floating dtype -> [..., out] in that dtype, accumulated in fp32
    (fp64 for double). The ``cpu`` backend reads ``weight`` once for all rows at close to memory-copy speed (on
    1-16 rows PyTorch's bf16 linear reaches a third of it); its cost grows with the rows, so use ``F.linear`` for
    batches and prefill. No autograd: inference only. On GPU the ``torch`` backend (cuBLAS) serves it.
    """
    check_tensor("x", x, min_ndim=1)
    check_tensor("weight", weight, ndim=2)
    check_float("x", x)
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x must be [..., in={weight.shape[1]}] to match weight [out, in], got {tuple(x.shape)}")
    if x.dtype != weight.dtype:
        raise TypeError(f"x and weight must share a dtype, got {x.dtype} and {weight.dtype}")
    check_same_device(x=x, weight=weight)
    return resolve("skinny_linear", backend, x.device)(x, weight)
