"""SpecDec++ (docs/methods.md): SD chains whose length adapts per row with an acceptance-prediction head.

``SpeculativeDecoder(target, draft, method="specdec_pp", head=head, threshold=h, draft_length=cap)`` is the
decoder; the stopping rule lives in :mod:`specdec.decoders.adaptive` (shared with adaptive-depth trees) and the
draft's hidden states come from :class:`specdec.drafting.HiddenStateDrafter`. This module keeps the named
constructor :class:`SpecDecPPDecoder`.
"""

from __future__ import annotations

from typing import Any

from ..decoder import DEFAULT_THRESHOLD, SpeculativeDecoder
from ..drafting import HiddenStateDrafter

__all__ = ["HiddenStateDrafter", "SpecDecPPDecoder"]


class SpecDecPPDecoder(SpeculativeDecoder):
    """``method="specdec_pp"``: SD with per-row adaptive draft length.

    ``draft``: HF draft model (same vocabulary as the target). ``head``: acceptance head (e.g.
    :func:`specdec.train.load_head`) or any callable hidden [..., H] -> Phat. ``threshold``: h (stop once the
    predicted probability of at least one rejection exceeds h; default 0.7). ``max_draft_length``: hard cap (20).
    """

    def __init__(
        self, target: Any, draft: Any, head: Any, *, threshold: float = DEFAULT_THRESHOLD, max_draft_length: int = 20
    ) -> None:
        super().__init__(
            target, draft, method="specdec_pp", draft_length=max_draft_length, head=head, threshold=threshold
        )
