"""Backends "cpu"/"cuda": thin wrappers over ``torch.ops.specdec.*`` from the compiled extension.

The extension is optional: when it is missing, the backends are recorded as unavailable with the reason, and
``backend="auto"`` falls back to ``torch``.
"""

from __future__ import annotations

import torch

from ._registry import mark_missing, register

try:
    from . import _C  # noqa: F401  (loads TORCH_LIBRARY(specdec) registrations; must follow `import torch`)

    HAVE_CPU = True
except ImportError as exc:  # pragma: no cover - depends on the build
    HAVE_CPU = False
    mark_missing("cpu", f"C++ extension not built: {exc}; run `pip install --no-build-isolation -e .`")
mark_missing("cuda", "no CUDA build of the extension on this machine")


def _on_cpu(device: torch.device) -> bool:
    return device.type == "cpu"


if HAVE_CPU:

    @register("tree_positions", "cpu", supports=_on_cpu)
    def tree_positions(depth: torch.Tensor, prefix_len: torch.Tensor) -> torch.Tensor:
        return torch.ops.specdec.tree_positions(depth.long().contiguous(), prefix_len.long().contiguous())

    @register("tree_mask", "cpu", supports=_on_cpu)
    def tree_mask(
        parent: torch.Tensor, valid: torch.Tensor, past_valid: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        return torch.ops.specdec.tree_mask(
            parent.long().contiguous(), valid.contiguous(), past_valid.contiguous(), dtype
        )
