"""``ar``: plain autoregressive sampling from the target, the baseline."""

from __future__ import annotations

from .spec import MethodSpec, register

SPEC = register(
    MethodSpec(
        name="ar",
        description=(
            "Autoregressive decoding: one target forward per token, each token drawn from the target's processed "
            "law q (its argmax when greedy). Nothing is drafted or verified; it is the baseline every speedup is "
            "measured against, as in Y. Leviathan, M. Kalman, Y. Matias, Fast Inference from Transformers via "
            "Speculative Decoding, ICML 2023, arXiv:2211.17192."
        ),
        verifier=None,
        builder=None,
        label=lambda config: "ar",
    )
)
