"""Toy decoders whose draft grows the tree itself (``testing.toy``'s models and loop): stochastic beam search (RSD-S)
and a two-level cascade (CS Drafting), with their negative controls (``wrong_*``, ``beam_untruncated``)."""

from __future__ import annotations

import torch

from ..ops import emission_law, gumbel_topk, sbs_step, verify_chain
from .toy import NEG_INF, Decoder, Step, ToyModel, Tree, _append_next, _finish_tree, _verify

__all__ = ["beam", "beam_untruncated", "cascade", "wrong_beam_token_order"]


# ---------------------------------------------------------------------------------------------------------------
# Trees grown by stochastic beam search


def _beam_untruncated(
    logp: torch.Tensor, sigma: torch.Tensor, beam_valid: torch.Tensor, width: int, gen: torch.Generator
) -> tuple[torch.Tensor, ...]:
    """Wrong SBS step (RSD Alg. 9 taken literally): top-W of the untruncated phit = Sigma + log p + Gumbel."""
    batch, w_in, vocab = logp.shape
    phi = (sigma[..., None] + logp).masked_fill(~beam_valid[..., None], NEG_INF).reshape(batch, w_in * vocab)
    draw = gumbel_topk(phi, width, generator=gen)
    idx = draw.tokens.clamp_min(0)
    sig = phi.gather(1, idx).masked_fill(~draw.valid, NEG_INF)
    return idx // vocab, idx % vocab, sig, draw.score, draw.valid


def _beam_greedy(
    logp: torch.Tensor, sigma: torch.Tensor, beam_valid: torch.Tensor, width: int
) -> tuple[torch.Tensor, ...]:
    """Greedy: deterministic beam search, top-W sequences by summed draft log-prob (ties -> lower index)."""
    batch, w_in, vocab = logp.shape
    phi = (sigma[..., None] + logp).masked_fill(~beam_valid[..., None], NEG_INF).reshape(batch, w_in * vocab)
    val, idx = torch.sort(phi, dim=-1, descending=True, stable=True)
    val, idx = val[:, :width], idx[:, :width]
    return idx // vocab, idx % vocab, val, val, torch.isfinite(val)


def _beam_step(
    width: int, depth: int, verifier: str, greedy: bool, *, untruncated: bool = False, token_order: bool = False
) -> Step:
    def step(model: ToyModel, last: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        batch, vocab = last.shape[0], model.vocab
        tok_l, par_l, ok_l = [last[:, None]], [torch.full((batch, 1), -1)], [torch.ones((batch, 1), dtype=torch.bool)]
        beam_node = torch.zeros((batch, 1), dtype=torch.long)
        beam_tok = last[:, None]
        sigma = torch.zeros((batch, 1), dtype=torch.float64)
        gamma = torch.zeros((batch, 1), dtype=torch.float64)
        beam_ok = torch.ones((batch, 1), dtype=torch.bool)
        first = 1
        for _ in range(depth):
            logp = model.draft_logp[beam_tok]
            if greedy:
                slot, tok, sig, gam, ok = _beam_greedy(logp, sigma, beam_ok, width)
            elif untruncated:
                slot, tok, sig, gam, ok = _beam_untruncated(logp, sigma, beam_ok, width, gen)
            else:
                slot, tok, sig, gam, ok = sbs_step(logp, sigma, gamma, beam_ok, width, generator=gen)
            tok = tok.clamp_min(0)
            par_node = beam_node.gather(1, slot.clamp_min(0))
            # Layout (docs/kernels.md): regroup the level by parent with a stable sort, which keeps each parent's
            # children in descending score = draft order; padding entries go last.
            key = par_node * (vocab + 1) + (tok if token_order else 0)
            key = torch.where(ok, key, key.new_full((), 1 << 40))
            perm = torch.sort(key, dim=1, stable=True).indices
            tok_l.append(tok.gather(1, perm))
            par_l.append(par_node.gather(1, perm))
            ok_l.append(ok.gather(1, perm))
            pos = torch.empty_like(perm).scatter_(1, perm, torch.arange(perm.shape[1]).expand_as(perm))
            beam_node, beam_tok, sigma, gamma, beam_ok = first + pos, tok, sig, gam, ok
            first += perm.shape[1]
        tokens, valid = torch.cat(tok_l, 1), torch.cat(ok_l, 1)
        tokens, parent, p_rows, q_rows = _finish_tree(tokens, torch.cat(par_l, 1), valid, model, greedy)
        return _verify(Tree(tokens, parent, valid, p_rows, q_rows, None), verifier, greedy, gen)

    return step


def beam(width: int, depth: int, *, verifier: str, greedy: bool = False) -> Decoder:
    """``depth`` SBS steps of width ``width`` (``sbs_step``), each node verified by ``verifier`` against its
    conditional p row."""
    name = f"{verifier}:beam(W={width}, L={depth}){' greedy' if greedy else ''}"
    return Decoder(name, _beam_step(width, depth, verifier, greedy))


def beam_untruncated(width: int, depth: int, *, verifier: str) -> Decoder:
    """RSD Alg. 9 line 7 taken literally: the beam is the top-W by untruncated scores.

    Its beam does not follow the sequence-level SWOR law, yet the verified output stays exact: every
    node's children are still a Gumbel-top prefix of p(.|node) whose length does not depend on the next child's
    identity (the argument for RSD-S in docs/methods.md). So it is not a loop-level negative control; the tests
    show it passes."""
    name = f"{verifier}:beam_untruncated(W={width}, L={depth})"
    return Decoder(name, _beam_step(width, depth, verifier, False, untruncated=True))


def wrong_beam_token_order(width: int, depth: int, *, verifier: str) -> Decoder:
    """Negative control: beam levels regrouped by parent with siblings in token-id order (not draft order)."""
    return Decoder(
        f"wrong: {verifier}:beam in token order", _beam_step(width, depth, verifier, False, token_order=True)
    )


# ---------------------------------------------------------------------------------------------------------------
# A two-level cascade (CS Drafting): the draft matrix reviews the blocks of a deterministic proposer


def _cascade_step(quota: int, proposal: int, leniency: float, greedy: bool, reviewer_row: bool) -> Step:
    def step(model: ToyModel, last: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        batch, vocab = last.shape[0], model.vocab
        table = torch.argmax(model.draft, dim=-1)  # the proposer: the draft's greedy bigram table
        width = quota + proposal
        block = torch.zeros((batch, width), dtype=torch.long)
        laws = torch.zeros((batch, width, vocab), dtype=torch.float64)
        size = torch.zeros(batch, dtype=torch.long)
        while True:
            rows = torch.nonzero(size < quota).squeeze(1)
            if rows.numel() == 0:
                break
            ctx_last = torch.where(size[rows] > 0, block[rows, (size[rows] - 1).clamp_min(0)], last[rows])
            z = torch.empty((rows.numel(), proposal), dtype=torch.long)
            prev = ctx_last
            for i in range(proposal):
                prev = table[prev]
                z[:, i] = prev
            ctx = torch.cat([ctx_last[:, None], z], dim=1)
            p = torch.nn.functional.one_hot(z, vocab).double()
            q = model.draft[ctx]  # the reviewer's laws (temperature 1: also what a greedy lenient review reads)
            v = verify_chain(z, p, q, greedy=greedy, leniency=leniency, generator=None if greedy else gen)
            seq, n_emit = _append_next(z, v.n_accepted, v.next_token)
            if greedy or reviewer_row or leniency == 1.0:
                up = q
            else:
                up = torch.cat([emission_law(p, q[:, :proposal], leniency), q[:, proposal:]], dim=1)
            for k, b in enumerate(rows.tolist()):
                n, at = int(n_emit[k]), int(size[b])
                block[b, at : at + n] = seq[k, :n]
                laws[b, at : at + n] = up[k, :n]
                size[b] += n
        ctx = torch.cat([last[:, None], block], dim=1)
        q = model.target_logp[ctx] if greedy else model.target[ctx]
        v = verify_chain(
            block, None if greedy else laws, q, lengths=size, greedy=greedy, generator=None if greedy else gen
        )
        return _append_next(block, v.n_accepted, v.next_token)

    return step


def cascade(
    quota: int = 2, proposal: int = 2, leniency: float = 2.0, *, greedy: bool = False, reviewer_row: bool = False
) -> Decoder:
    """CS Drafting with two drafters: the proposer (the draft's greedy bigram table, standing for Max-Gram) proposes
    ``proposal`` tokens; the draft reviews them with ``verify_chain(..., leniency=)`` and hands up its accepted
    prefix plus one token, with ``emission_law`` for every reviewed position; the target reviews the block once it
    holds ``quota`` tokens. ``reviewer_row``: the negative control that hands up the draft's rows instead (the
    authors' code), biased once ``leniency`` > 1."""
    name = f"cascade(K={quota}, n={proposal}, l={leniency}{', reviewer rows' if reviewer_row else ''})"
    return Decoder(name + (" greedy" if greedy else ""), _cascade_step(quota, proposal, leniency, greedy, reviewer_row))
