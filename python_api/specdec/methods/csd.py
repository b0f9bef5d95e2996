"""``csd``: Cascade Speculative Drafting, vertical and horizontal cascades (docs/methods.md, CS Drafting)."""

from __future__ import annotations

from .builders.cascade import CascadeBuilder
from .spec import MethodSpec, register

SPEC = register(
    MethodSpec(
        name="csd",
        description=(
            "Cascade Speculative Drafting: drafters never generate alone. Each neural drafter reviews, in one "
            "forward, the block proposed by the cascade of smaller models below it (vertical cascade), down to the "
            "Max-Gram statistical drafter; within a block, earlier positions come from larger sub-cascades and "
            "later ones from smaller ones (horizontal cascade, the step-limit matrix K); inner reviews may be "
            "lenient (l >= 1). The target reviews the block as an SD chain whose laws are the emission laws of the "
            "reviews below, so sampling stays exact for any leniency. The cascade is the draft "
            "(specdec.CascadeDrafter); draft_length caps the block the target reviews. Z. Chen, X. Yang, "
            "J. Lin, C. Sun, K. C.-C. Chang, J. Huang, Cascade Speculative Drafting for Even Faster LLM Inference, "
            "NeurIPS 2024, arXiv:2312.11462."
        ),
        verifier="sd",
        verifiers=frozenset({"token", "block"}),
        builder=CascadeBuilder,
        label=lambda config: f"csd(L<={config.draft_length})",
        defaults={"draft_length": 24},
        allowed=frozenset({"draft_length"}),
        # the demo's --draft-length is a fixed chain length L; here draft_length only caps the cascade's block
        cli_params=frozenset(),
        cascade=True,
    )
)
