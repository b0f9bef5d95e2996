"""The verify and commit steps of a round: the verdict of the method's verifier on the target's pass over the tree,
then each row's emitted tokens appended, streamed and checked against the stopping rules."""

from __future__ import annotations

from collections.abc import Callable

import torch

import specdec_kernels as sk

from .edge import RoundOutputs
from .methods import MethodConfig
from .methods.builders.base import op_seed
from .metrics import GenerationStats
from .sampling import RunContext, SamplingConfig
from .tree import DraftTree, LawBuffer

#: accepted nodes [B, L], their count [B], the next token [B], the accepted ranks [B, L]
Verdict = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def verify_round(
    config: MethodConfig,
    tree: DraftTree,
    q_logits: torch.Tensor,
    sampling: SamplingConfig,
    eos: list[int],
    generator: torch.Generator | None,
    sampled: Callable[..., Verdict],
) -> Verdict:
    """The round's verdict: the target's laws with the shared processing, then the tree walk of the method's
    verifier; in sampling mode the walk is ``sampled(tree, q_logits, q_probs, eos, generator)`` (the decoder's
    ``_verify_tree``, :func:`verify_sampled` unless a subclass reads the laws first). Shape: q_logits [B, N, V];
    returns accepted nodes [B, L], their count [B], the next token [B] (-1 after EOS) and the accepted ranks
    [B, L]."""
    batch = tree.batch
    # padding nodes already hold zero logits (HFCausalLM computes rows of valid nodes only)
    q_logits = sampling.adjust(q_logits, tree, 0, tree.size)
    if tree.size > 1 and not sampling.greedy:  # the verifier reads the target's law: get it in one call
        q_probs = sampling.process(q_logits, "target", log=False)
        return sampled(tree, q_logits, q_probs, eos, generator)
    q_logp = sampling.process(q_logits, "target")
    if tree.size == 1:  # nothing drafted: a plain autoregressive step
        if sampling.greedy:
            nxt = q_logp[:, 0].argmax(dim=-1)
        else:
            nxt = sk.sample_categorical(q_logp[:, 0], seed=op_seed(generator), validate=False)
        empty = torch.zeros((batch, 0), dtype=torch.long, device=tree.device)
        return empty, torch.zeros((batch,), dtype=torch.long, device=tree.device), nxt, empty
    verifier = config.verifier
    assert verifier is not None
    out = sk.verify_tree(
        tree.tokens,
        tree.parent,
        None,
        q_logp,
        method=verifier,
        valid=tree.valid,
        greedy=True,
        eos_token_id=eos or None,
        validate=False,
        depth=tree.depth,
    )
    return out.accepted_nodes, out.n_accepted, out.next_token, out.accepted_rank


def verify_sampled(
    config: MethodConfig,
    laws: LawBuffer,
    tree: DraftTree,
    q_logits: torch.Tensor,
    q_probs: torch.Tensor,
    eos: list[int],
    generator: torch.Generator | None,
) -> Verdict:
    """Sampling mode: the tree walk against the target's law ``q_probs`` [B, N, V]."""
    verifier = config.verifier
    assert verifier is not None
    out = sk.verify_tree(
        tree.tokens,
        tree.parent,
        tree.p_rows(q_logits.shape[-1], laws),
        q_probs,
        method=verifier,
        valid=tree.valid,
        hub=tree.hub() if config.spec.hub_pairs else None,
        eos_token_id=eos or None,
        seed=op_seed(generator),
        validate=False,  # the tree and both laws come from the validated processing above
        depth=tree.depth,
    )
    return out.accepted_nodes, out.n_accepted, out.next_token, out.accepted_rank


def commit_round(
    tree: DraftTree,
    verdict: Verdict,
    q_logits: torch.Tensor,
    active: list[int],
    committed: list[list[int]],
    new_tokens: list[list[int]],
    max_new: int,
    eos_set: set[int],
    stats: GenerationStats,
    out: RoundOutputs,
    context: RunContext | None,
) -> list[bool]:
    """Append each row's emitted tokens; return which rows finished (EOS, max_new_tokens or a stopping
    criterion)."""
    acc_nodes, n_acc, next_tok, acc_rank = verdict
    has_kids = tree.has_children() if tree.size > 1 else [[False]] * tree.batch
    tokens = tree.tokens.tolist()
    nodes, counts, nxt, ranks = acc_nodes.tolist(), n_acc.tolist(), next_tok.tolist(), acc_rank.tolist()
    finished = []
    for i, r in enumerate(active):
        m = counts[i]
        path = nodes[i][:m]
        emitted = [tokens[i][n] for n in path] + ([nxt[i]] if nxt[i] >= 0 else [])
        ended_on_eos = nxt[i] < 0
        cap = out.cap(max_new)
        emitted = emitted[: cap - len(new_tokens[r])]
        # the j-th emitted token was drawn at node [root, *path][j]: its logits go to the stopping criteria
        cut = None
        if r not in out.stop_at:
            cut = out.cut(r, new_tokens[r], emitted, lambda j, i=i, at=[0, *path]: q_logits[i, at[j]])
        if cut is not None and out.hold:
            out.stop_at[r] = len(new_tokens[r]) + cut
            cut = None
        if cut is not None:
            emitted = emitted[:cut]
        new_tokens[r].extend(emitted)
        committed[r].extend(emitted)
        if context is not None:
            context.commit(i, emitted)
        out.put(emitted)
        visited = [0, *path] if not ended_on_eos else [0, *path[:-1]]
        steps = sum(1 for n in visited if has_kids[i][n])
        stats.record_round(m, len(emitted), ranks[i][:m], steps)
        done = cut is not None or len(new_tokens[r]) >= cap or any(t in eos_set for t in emitted)
        finished.append(done)
    if out.hold and out.limit is None and len(out.stop_at) == len(out.rows):
        # every row has met a criterion: transformers stops them all after the last one's token
        out.limit = max(out.stop_at.values())
        for i, r in enumerate(active):
            extra = len(new_tokens[r]) - out.limit
            if extra >= 0:
                del new_tokens[r][out.limit :], committed[r][len(committed[r]) - extra :]
                finished[i] = True
    return finished
