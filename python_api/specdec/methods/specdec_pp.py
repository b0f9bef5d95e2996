"""``specdec_pp``: SD chains whose length adapts per row with an acceptance head (docs/methods.md, SpecDec++).

The stopping rule is :class:`specdec.methods.builders.adaptive.AdaptiveStop`, attached by the decoder from ``head=``.
"""

from __future__ import annotations

import specdec_kernels as sk

from .builders.chain import ChainBuilder
from .spec import MethodSpec, register

SPEC = register(
    MethodSpec(
        name="specdec_pp",
        description=(
            "SpecDec++: an SD chain that stops growing once an acceptance head, reading the draft's hidden states, "
            "predicts that the chain already holds a rejection with probability above the threshold h, or at the "
            "hard cap draft_length. The stop reads draft-side information only, so verification is plain SD and "
            "stays exact. K. Huang, X. Guo, M. Wang, SpecDec++: Boosting Speculative Decoding via Adaptive "
            "Candidate Lengths, 2024, arXiv:2405.19715."
        ),
        verifier="sd",
        verifiers=frozenset({"token", "block"}),
        builder=ChainBuilder,
        label=lambda config: f"specdec_pp(cap={config.draft_length})",
        defaults={"draft_length": 20},  # the hard cap of the paper's runs
        allowed=frozenset({"draft_length"}),
        template=lambda opts: sk.chain_parents(opts["draft_length"]),
        needs_head=True,
        # the demo's --draft-length is a fixed chain length L; here draft_length is the adaptive chain's cap
        cli_params=frozenset(),
    )
)
