"""``sd``: speculative sampling of one draft chain (docs/methods.md, SD)."""

from __future__ import annotations

import specdec_kernels as sk

from .builders.chain import ChainBuilder
from .spec import MethodSpec, register

SPEC = register(
    MethodSpec(
        name="sd",
        description=(
            "Speculative sampling: the draft samples a chain of draft_length tokens from p, the target scores the "
            "chain in one forward, and each token is accepted with probability min(1, q/p); the first rejection "
            "emits a token from the residual norm((q - p)^+), a fully accepted chain gets a bonus token from q. "
            "Y. Leviathan, M. Kalman, Y. Matias, Fast Inference from Transformers via Speculative Decoding, ICML "
            "2023, arXiv:2211.17192; C. Chen, S. Borgeaud, G. Irving, J.-B. Lespiau, L. Sifre, J. Jumper, "
            "Accelerating Large Language Model Decoding with Speculative Sampling, 2023, arXiv:2302.01318."
        ),
        verifier="sd",
        verifiers=frozenset({"token", "block"}),
        builder=ChainBuilder,
        label=lambda config: f"sd(L={config.draft_length})",
        defaults={"draft_length": 4},
        allowed=frozenset({"draft_length"}),
        template=lambda opts: sk.chain_parents(opts["draft_length"]),
    )
)
