"""Backend "triton": registration of the Triton launchers (kernels in ``kernels.py``, imported lazily).

The kernel module is imported on first use, so ``TRITON_INTERPRET=1`` set after ``import specdec_kernels`` (but
before the first Triton call) still takes effect. CUDA tensors need a GPU driver; CPU tensors are accepted only
under the interpreter (correctness checks, slow).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

import torch

from .._registry import mark_missing, register

OPS = (
    "sample_categorical",
    "gumbel_topk",
    "tree_positions",
    "tree_mask",
    "verify_chain",
    "emission_law",
    "verify_node",
    "verify_tree",
    "process_logits",
    "spechub_sample",
    "kseq_gamma",
    "filter_kv",
    "sbs_step",
)

HAVE_TRITON = importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _supports(device: torch.device) -> bool:
    if device.type == "cuda":
        return True
    return device.type == "cpu" and interpreting()


def _lazy(op: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        from . import kernels

        return getattr(kernels, op)(*args)

    call.__name__ = f"triton_{op}"
    return call


if HAVE_TRITON:
    for _op in OPS:
        register(_op, "triton", supports=_supports)(_lazy(_op))
else:
    mark_missing("triton", "the triton package is not installed (pip install triton)")
