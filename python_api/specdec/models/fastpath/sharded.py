"""Tensor-parallel linears (transformers' ``tp_plan``) on the decode kernels: the same computation as the forward
transformers installs on a sharded ``nn.Linear`` at inference (the local matmul, then the style's collective), with
:func:`~specdec.models.fastpath.linear.thread_linear` for the local matmul. Taken only for the styles whose inference
path is read here; any other module keeps transformers' forward."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...distributed import is_dtensor
from .linear import thread_linear

#: what transformers' tensor-parallel forward of a linear closes over (``TensorParallelLayer.install_forward``)
_TP_FORWARD = "tp_forward"


def _tp_style(module: torch.nn.Linear) -> tuple[Any, Any] | None:
    """(style, mesh) of the tensor-parallel forward transformers installed on ``module``, or None."""
    f = module.__dict__.get("forward")
    code = getattr(f, "__code__", None)
    if code is None or code.co_name != _TP_FORWARD or not getattr(f, "__closure__", None):
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in f.__closure__), strict=True))
    style, mesh = cells.get("self"), cells.get("mesh")
    return None if style is None or mesh is None else (style, mesh)


def sharded_forward(module: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """A forward for a bias-free ``nn.Linear`` whose weight transformers sharded, computing at inference what its
    tensor-parallel forward computes, with the decode kernel for the local matmul: ``colwise`` (a replicated input,
    this rank's slice of the output), ``rowwise`` (this rank's slice of the input, the partial products all-reduced)
    and ``colwise_gather_output`` (the slices all-gathered, even shards only). None for any other module or style;
    the forward hands calls with autograd or DTensor inputs to transformers' own."""
    if type(module) is not torch.nn.Linear or module.bias is not None or not is_dtensor(module.weight):
        return None
    found = _tp_style(module)
    if found is None:
        return None
    style, mesh = found
    from torch.distributed.tensor import Replicate, Shard

    try:  # where transformers keeps its tensor-parallel styles (the layout read here)
        from transformers.distributed.tensor_parallel import ColwiseParallel, RowwiseParallel
    except ImportError:
        return None

    if mesh.ndim != 1 or not getattr(style, "use_local_output", False):
        return None
    group = mesh.get_group()
    size = torch.distributed.get_world_size(group)
    local = module.weight.to_local()
    if not local.is_contiguous():
        return None
    kind = None
    if type(style) is ColwiseParallel and style.input_layouts == Replicate():
        if style.output_layouts == Shard(-1):
            kind = "colwise"
        elif style.output_layouts == Replicate() and local.shape[0] * size == module.out_features:
            kind = "gather"
    elif type(style) is RowwiseParallel and style.input_layouts == Shard(-1) and style.output_layouts == Replicate():
        kind = "rowwise"
    if kind is None:
        return None
    own = module.__dict__["forward"]

    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or is_dtensor(x):
            return own(x)
        y = thread_linear(x, local)
        if kind == "rowwise":
            torch.distributed.all_reduce(y, group=group)
        elif kind == "gather":
            parts = [torch.empty_like(y) for _ in range(size)]
            torch.distributed.all_gather(parts, y.contiguous(), group=group)
            y = torch.cat(parts, dim=-1)
        return y

    return forward
