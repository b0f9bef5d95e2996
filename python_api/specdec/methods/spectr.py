"""``spectr``: K i.i.d. draft chains verified with K-SEQ (docs/methods.md, SpecTr)."""

from __future__ import annotations

import specdec_kernels as sk

from .builders.spectr import SpecTrBuilder
from .spec import MethodSpec, register

SPEC = register(
    MethodSpec(
        name="spectr",
        description=(
            "SpecTr: num_chains i.i.d. draft chains of draft_length tokens, verified depth by depth with K-SEQ, an "
            "acceptance test scaled by the smallest gamma in [1, K] that keeps the residual non-negative, among "
            "the chains that still agree with the accepted prefix. Z. Sun, A. T. Suresh, J. H. Ro, A. Beirami, "
            "H. Jain, F. Yu, SpecTr: Fast Speculative Decoding via Optimal Transport, NeurIPS 2023, "
            "arXiv:2310.15141."
        ),
        verifier="kseq",
        builder=SpecTrBuilder,
        label=lambda config: f"spectr(K={config.num_chains},L={config.draft_length})",
        defaults={"num_chains": 2, "draft_length": 3},
        allowed=frozenset({"num_chains", "draft_length"}),
        template=lambda opts: sk.kseq_chain_parents(opts["num_chains"], opts["draft_length"]),
    )
)
