"""SpecDec++ acceptance-prediction head (docs/drafts.md): the network and its loader; training lives in
:mod:`specdec.train.head`.

Head: ``D`` residual blocks ``x <- x + SiLU(W_d x + b_d)`` then ``Linear(H, 2)`` on the draft's final hidden state
(after the final norm, fp32); ``Phat = softmax(logits)[1]`` = predicted probability that the token whose hidden state
it sees is accepted. Blocks have independent weights by default; ``tie_blocks=True`` reuses one block D times (the
reference code's quirk, needed to load its released checkpoints).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ..store import resolve_asset


class ResBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)  # start as identity: the head begins as a linear probe
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class AcceptanceHead(nn.Module):
    """Shape: hidden [..., H] (any float dtype; computed in fp32) -> logits [..., 2]; :meth:`prob` -> [...]."""

    def __init__(self, hidden_size: int, depth: int = 3, *, tie_blocks: bool = False) -> None:
        super().__init__()
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        self.hidden_size, self.depth, self.tie_blocks = int(hidden_size), int(depth), bool(tie_blocks)
        n_blocks = min(depth, 1) if tie_blocks else depth
        self.blocks = nn.ModuleList(ResBlock(hidden_size) for _ in range(n_blocks))
        self.out = nn.Linear(hidden_size, 2)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden.float()
        for d in range(self.depth):
            x = self.blocks[0 if self.tie_blocks else d](x)
        return self.out(x)

    def prob(self, hidden: torch.Tensor) -> torch.Tensor:
        """Predicted acceptance probability of the token whose hidden state this is."""
        return torch.softmax(self(hidden), dim=-1)[..., 1]


def load_head(name_or_path: str | Path = "smollm2-distill-head") -> tuple[AcceptanceHead, float]:
    """Load an acceptance head (shipped asset name or path) in fp32; returns (head, default threshold h). The head
    also carries h as ``head.threshold``, which the decoders use when no ``threshold=`` is given."""
    from safetensors import safe_open

    path = resolve_asset(name_or_path)
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["head_config"])
        tensors = {k: f.get_tensor(k).float() for k in f.keys()}  # noqa: SIM118
    head = AcceptanceHead(meta["hidden_size"], meta["depth"], tie_blocks=meta["tie_blocks"])
    head.load_state_dict(tensors)
    head.threshold = float(meta["threshold"])
    return head.eval(), head.threshold
