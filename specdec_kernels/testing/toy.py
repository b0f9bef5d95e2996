"""Toy Markov ("bigram") models and whole speculative decoding loops built from the public ops.

A toy model is a pair of V x V row-stochastic matrices: row x of ``draft`` / ``target`` is p(.|x) / q(.|x), so
the next-token law depends on the last token only and a prefix is summarized by its last token. A ``Decoder``
runs one speculative iteration for a batch of rows: it drafts a tree with the public sampling ops
(``sample_categorical``, ``gumbel_topk``, ``sbs_step``, ``spechub_sample``), looks up p and q rows for every
node (what a draft and a target forward would return) and verifies with ``verify_chain`` / ``verify_tree``.
``generate`` repeats iterations for many independent generations at once (one batch row each) until every row
holds enough tokens. Exact decoders reproduce the target's law; the ``wrong_*`` variants (negative controls) change
one drafting or verification detail and must fail the same law check.

Decoders are named by their parts, the sibling draw (:data:`DRAWS`, or a beam: ``testing.toy_grown``) and the
``verify_tree`` verifier, never by a decoding method: which parts a method combines is the driver's knowledge
(``specdec.methods``), and its tests build the toy loop of every registered method from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ..ops import (
    gds_sample,
    gumbel_topk,
    sample_categorical,
    spechub_sample,
    verify_chain,
    verify_tree,
)
from ..trees import chain_parents, check_parents
from . import block as block_oracle
from . import oracles_tree
from .stats import LawCheck, law_check

NEG_INF = float("-inf")

__all__ = [
    "DRAWS",
    "PEAKED_TOY",
    "RAGGED_TOY",
    "SPEC_TOY",
    "Decoder",
    "Generation",
    "ToyModel",
    "Tree",
    "chain",
    "check_first_tokens",
    "first_tokens_counts",
    "generate",
    "joint_law",
    "random_toy",
    "target_greedy",
    "tree",
    "wrong_gamma_one",
    "wrong_skip_duplicates",
    "wrong_token_order",
    "wrong_unrenormalized",
]


@dataclass(frozen=True)
class ToyModel:
    """Bigram draft and target: ``draft[x]`` = p(.|x), ``target[x]`` = q(.|x), float64 [V, V]."""

    draft: torch.Tensor
    target: torch.Tensor
    start: int = 0

    @property
    def vocab(self) -> int:
        return self.draft.shape[-1]

    @property
    def draft_logp(self) -> torch.Tensor:
        return torch.log(self.draft)

    @property
    def target_logp(self) -> torch.Tensor:
        return torch.log(self.target)


def _model(draft: list[list[float]], target: list[list[float]]) -> ToyModel:
    return ToyModel(torch.tensor(draft, dtype=torch.float64), torch.tensor(target, dtype=torch.float64))


# The small worked example of the law tests: V = 3, start token 0.
SPEC_TOY = _model(
    [[0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]],
    [[0.2, 0.5, 0.3], [0.3, 0.3, 0.4], [0.5, 0.1, 0.4]],
)

# Zeros on purpose: tokens p never drafts, drafted tokens with q = 0, a point-mass draft row
# (SpecHub's second draft and SWOR's later candidates do not exist there), so trees are ragged within a batch.
RAGGED_TOY = _model(
    [[0.5, 0.3, 0.2, 0.0], [0.0, 1.0, 0.0, 0.0], [0.1, 0.0, 0.45, 0.45], [0.25, 0.25, 0.25, 0.25]],
    [[0.1, 0.2, 0.3, 0.4], [0.3, 0.3, 0.0, 0.4], [0.0, 0.5, 0.2, 0.3], [0.4, 0.1, 0.1, 0.4]],
)


# Peaked draft rows (row 0 is the golden instance I3 of tests/strategies.py): i.i.d. drafts repeat often, so the
# duplicate-handling and renormalization errors of the negative controls show at the loop level with few generations.
PEAKED_TOY = _model(
    [[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.6, 0.1, 0.3]],
    [[0.3, 0.3, 0.4], [0.4, 0.2, 0.4], [0.2, 0.5, 0.3]],
)


def random_toy(vocab: int, seed: int, *, temperature: float = 1.0, agreement: float = 0.7) -> ToyModel:
    """Random tie-free bigram pair: target logits ~ N(0, 1) / T, draft logits = agreement * target logits +
    (1 - agreement) * fresh noise, so the draft's argmax often (not always) matches the target's."""
    g = torch.Generator().manual_seed(seed)
    zt = torch.randn((vocab, vocab), dtype=torch.float64, generator=g) / temperature
    zn = torch.randn((vocab, vocab), dtype=torch.float64, generator=g) / temperature
    zd = agreement * zt + (1.0 - agreement) * zn
    return ToyModel(torch.softmax(zd, -1), torch.softmax(zt, -1))


def joint_law(model: ToyModel, n_tokens: int = 2, start: int | None = None) -> np.ndarray:
    """Exact law of the first ``n_tokens`` generated tokens, shape [V] * n_tokens: prod_t q(y_t | y_{t-1})."""
    q = model.target.numpy()
    law = q[model.start if start is None else start]
    for _ in range(n_tokens - 1):
        law = law[..., None] * q  # law[..., y, z] = law[..., y] * q(z | y)
    return law


class Tree(NamedTuple):
    tokens: torch.Tensor  # [B, N] int64, node 0 = root = last committed token, 0 on padding
    parent: torch.Tensor  # [B, N] int64, -1 at the root, 0 on padding
    valid: torch.Tensor  # [B, N] bool
    p_rows: torch.Tensor  # [B, N, V] draft law at each node (the law its children were drawn from)
    q_rows: torch.Tensor  # [B, N, V] target law (greedy: log-probs used as logits)
    hub: torch.Tensor | None  # [B, N] SpecHub hub token per node


Step = Callable[[ToyModel, torch.Tensor, torch.Generator], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Decoder:
    """One speculative iteration: ``step(model, last [B], generator) -> (tokens [B, S], n_emitted [B])``."""

    name: str
    step: Step


class Generation(NamedTuple):
    tokens: np.ndarray  # [n, n_tokens] the first generated tokens of every row
    iterations: np.ndarray  # [n] speculative iterations (target calls) each row used


def generate(
    model: ToyModel,
    decoder: Decoder,
    n: int,
    *,
    seed: int,
    n_tokens: int = 2,
    start: torch.Tensor | None = None,
) -> Generation:
    """Run ``n`` independent generations as batch rows until each holds ``n_tokens`` tokens.

    Each iteration emits at least one token per row; only rows that still need tokens take part in the next one.
    """
    gen = torch.Generator().manual_seed(seed)
    out = torch.full((n, n_tokens), -1, dtype=torch.long)
    count = torch.zeros(n, dtype=torch.long)
    iters = torch.zeros(n, dtype=torch.long)
    last = torch.full((n,), model.start, dtype=torch.long) if start is None else start.clone().long()
    while True:
        rows = torch.nonzero(count < n_tokens).squeeze(1)
        if rows.numel() == 0:
            return Generation(out.numpy(), iters.numpy())
        iters[rows] += 1
        seq, n_emit = decoder.step(model, last[rows], gen)
        if bool((n_emit < 1).any()):
            raise RuntimeError(f"{decoder.name}: an iteration emitted no token (EOS is not used by toy models)")
        for j in range(seq.shape[1]):
            pos = count[rows] + j
            w = (j < n_emit) & (pos < n_tokens)
            out[rows[w], pos[w]] = seq[w, j]
        count[rows] += n_emit
        last[rows] = seq.gather(1, (n_emit - 1)[:, None]).squeeze(1)


def first_tokens_counts(samples: np.ndarray, vocab: int) -> np.ndarray:
    """Histogram [V] * M of the rows of ``samples`` [n, M]."""
    counts = np.zeros((vocab,) * samples.shape[1], dtype=np.int64)
    np.add.at(counts, tuple(samples.T), 1)
    return counts


def check_first_tokens(
    model: ToyModel, decoder: Decoder, n: int, *, seed: int, max_tv: float, n_tokens: int = 2, alpha: float = 1e-4
) -> LawCheck:
    """Law check (chi-square + TV) of the first ``n_tokens`` tokens of ``n`` generations."""
    samples = generate(model, decoder, n, seed=seed, n_tokens=n_tokens).tokens
    return law_check(first_tokens_counts(samples, model.vocab), joint_law(model, n_tokens), alpha=alpha, max_tv=max_tv)


def target_greedy(model: ToyModel, start: torch.Tensor, n_tokens: int) -> np.ndarray:
    """Plain greedy decoding of the target (argmax, lowest id on ties): [len(start), n_tokens]."""
    out = []
    last = start.long()
    for _ in range(n_tokens):
        last = torch.argmax(model.target[last], dim=-1)
        out.append(last)
    return torch.stack(out, dim=1).numpy()


# ---------------------------------------------------------------------------------------------------------------
# Emission helpers


def _append_next(path: torch.Tensor, n_acc: torch.Tensor, nxt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens of one iteration: the accepted path followed by the correction/bonus token (none after EOS)."""
    seq = torch.cat([path, path.new_zeros((path.shape[0], 1))], dim=1)
    seq.scatter_(1, n_acc[:, None], nxt.clamp_min(0)[:, None])
    return seq, n_acc + (nxt >= 0).long()


def _emit_tree(
    tree: Tree, nodes: torch.Tensor, n_acc: torch.Tensor, nxt: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    path = torch.gather(tree.tokens, 1, nodes.clamp_min(0))
    return _append_next(path, n_acc, nxt)


def _finish_tree(
    tokens: torch.Tensor, parents: Sequence[int] | torch.Tensor, valid: torch.Tensor, model: ToyModel, greedy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padding convention (token 0, parent 0) and the p/q rows a draft/target forward would give."""
    batch = tokens.shape[0]
    if isinstance(parents, torch.Tensor):
        parent = parents.clone()
    else:
        parent = torch.tensor(list(parents), dtype=torch.long).expand(batch, -1).clone()
    parent = parent.masked_fill(~valid, 0)
    parent[:, 0] = -1
    tokens = tokens.masked_fill(~valid, 0)
    q_rows = model.target_logp[tokens] if greedy else model.target[tokens]
    return tokens, parent, model.draft[tokens], q_rows


def _verify(tree: Tree, method: str, greedy: bool, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    v = verify_tree(
        tree.tokens,
        tree.parent,
        None if greedy else tree.p_rows,
        tree.q_rows,
        method=method,
        valid=tree.valid,
        hub=None if greedy else tree.hub,
        greedy=greedy,
        generator=None if greedy else gen,
    )
    return _emit_tree(tree, v.accepted_nodes, v.n_accepted, v.next_token)


def _sort_siblings(cand: torch.Tensor, ok: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Siblings in token-id order (valid first): the wrong order of the negative controls."""
    key = torch.where(ok, cand, cand.new_full((), 2 * vocab))
    perm = torch.sort(key, dim=-1, stable=True).indices
    return cand.gather(-1, perm), ok.gather(-1, perm)


# ---------------------------------------------------------------------------------------------------------------
# Chains verified by verify_chain


def _chain_step(length: int, ragged: bool, greedy: bool, method: str, stop_token: int | None) -> Step:
    def step(model: ToyModel, last: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        batch = last.shape[0]
        draft = torch.empty((batch, length), dtype=torch.long)
        prev = last
        for j in range(length):
            logp = model.draft_logp[prev]
            prev = torch.argmax(logp, -1) if greedy else sample_categorical(logp, generator=gen)
            draft[:, j] = prev
        ctx = torch.cat([last[:, None], draft], dim=1)
        q = model.target_logp[ctx] if greedy else model.target[ctx]
        lengths = torch.randint(0, length + 1, (batch,), generator=gen) if ragged else None
        if stop_token is not None:  # the chain ends after its first stop_token: a length set by the drafted tokens
            hit = torch.cumsum((draft == stop_token).long(), 1) - (draft == stop_token).long()
            lengths = (hit == 0).sum(1)
        if method != "sd":
            return _verify_chain_as_tree(model, ctx, lengths, method, greedy, gen)
        v = verify_chain(
            draft,
            None if greedy else model.draft[ctx[:, :length]],
            q,
            lengths=lengths,
            greedy=greedy,
            generator=None if greedy else gen,
        )
        return _append_next(draft, v.n_accepted, v.next_token)

    return step


def _verify_chain_as_tree(
    model: ToyModel,
    ctx: torch.Tensor,
    lengths: torch.Tensor | None,
    method: str,
    greedy: bool,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chain ctx[:, 1:] (root ctx[:, 0]) verified by verify_tree's ``method``, the first lengths[b] tokens of
    row b valid."""
    batch, n = ctx.shape
    valid = torch.ones((batch, n), dtype=torch.bool)
    if lengths is not None:
        valid = torch.arange(n)[None, :] <= lengths[:, None]
    parent = torch.arange(-1, n - 1).expand(batch, -1)
    tokens, parent, p_rows, q_rows = _finish_tree(ctx, parent, valid, model, greedy)
    tree = Tree(tokens, parent, valid, p_rows, q_rows, None)
    return _verify(tree, method, greedy, gen)


def chain(
    length: int, *, ragged: bool = False, greedy: bool = False, method: str = "sd", stop_token: int | None = None
) -> Decoder:
    """A draft chain of ``length`` verified by ``verify_chain``, or by ``verify_tree``'s ``method`` when it is not
    "sd" (``ragged``: each row verifies a random length in [0, length]; ``stop_token``: the chain ends after its
    first ``stop_token``, a length that depends on the drafted tokens as an adaptive draft's does)."""
    flags = [f for f, on in (("ragged", ragged), ("greedy", greedy)) if on]
    flags += [method] if method != "sd" else []
    flags += [f"stop at {stop_token}"] if stop_token is not None else []
    name = f"chain(L={length}{''.join(', ' + f for f in flags)})"
    return Decoder(name, _chain_step(length, ragged, greedy, method, stop_token))


# ---------------------------------------------------------------------------------------------------------------
# Static trees verified by verify_tree. A tree is the pair (sibling draw, node verifier); which pair a decoding method
# uses is the method's own business (specdec.methods), so nothing here is named after a method.

#: how a node's children are drawn: i.i.d. (``sample_categorical``), without replacement (``gumbel_topk``), as a
#: SpecHub hub pair (``spechub_sample``), or greedy draft sampling (``gds_sample``); "beam" (``sbs_step``) grows the
#: tree level by level instead, see :func:`beam`
DRAWS = ("iid", "swor", "spechub", "gds")


def _draw_tree(
    model: ToyModel,
    last: torch.Tensor,
    par: list[int],
    kids: list[list[int]],
    draw: str,
    greedy: bool,
    gen: torch.Generator,
    *,
    token_order: bool = False,
    skip_duplicates: bool = False,
) -> Tree:
    batch, n, vocab = last.shape[0], len(par), model.vocab
    tokens = torch.zeros((batch, n), dtype=torch.long)
    tokens[:, 0] = last
    valid = torch.ones((batch, n), dtype=torch.bool)
    hub = torch.zeros((batch, n), dtype=torch.long) if draw == "spechub" else None
    for node in range(n):
        ids = kids[node]
        if not ids:
            continue
        k = len(ids)
        logp = model.draft_logp[tokens[:, node]]
        if greedy:
            # Greedy: i.i.d. children degenerate to copies of argmax p; SWOR, SpecHub and gds take the top-k.
            order = torch.sort(logp, dim=-1, descending=True, stable=True).indices
            cand = order[:, :1].expand(-1, k) if draw == "iid" else order[:, :k]
            ok = torch.isfinite(logp.gather(-1, cand))
        elif draw == "iid":
            cand = sample_categorical(logp[:, None, :].expand(-1, k, -1), generator=gen)
            ok = torch.ones_like(cand, dtype=torch.bool)
        elif draw == "swor":
            pick = gumbel_topk(logp, k, generator=gen)
            cand, ok = pick.tokens, pick.valid
        elif draw == "gds":
            g = gds_sample(logp, k, generator=gen)
            cand, ok = g.tokens, g.valid
        else:
            pair = spechub_sample(logp, generator=gen)
            cand, ok = pair.tokens[:, :k], pair.valid[:, :k]
            assert hub is not None
            hub[:, node] = pair.hub
        if skip_duplicates:
            for j in range(1, k):
                dup = ((cand[:, :j] == cand[:, j : j + 1]) & ok[:, :j]).any(dim=1)
                ok[:, j] &= ~dup
        if token_order:
            cand, ok = _sort_siblings(cand, ok, vocab)
        cols = torch.tensor(ids)
        tokens[:, cols] = cand.clamp_min(0)
        valid[:, cols] = ok & valid[:, node : node + 1]
    tokens, parent, p_rows, q_rows = _finish_tree(tokens, par, valid, model, greedy)
    return Tree(tokens, parent, valid, p_rows, q_rows, hub)


def _template(parents: Sequence[int], draw: str) -> tuple[list[int], list[list[int]]]:
    if draw not in DRAWS:
        raise ValueError(f"draw must be one of {DRAWS}, got {draw!r}")
    par = check_parents(parents)
    kids: list[list[int]] = [[] for _ in par]
    for c in range(1, len(par)):
        kids[par[c]].append(c)
    if draw == "spechub" and max(len(k) for k in kids) > 2:
        raise ValueError("SpecHub trees need at most two children per node")
    return par, kids


def _static_step(
    parents: Sequence[int],
    draw: str,
    verifier: str,
    greedy: bool,
    *,
    token_order: bool = False,
    skip_duplicates: bool = False,
) -> Step:
    par, kids = _template(parents, draw)

    def step(model: ToyModel, last: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        tree = _draw_tree(
            model, last, par, kids, draw, greedy, gen, token_order=token_order, skip_duplicates=skip_duplicates
        )
        return _verify(tree, verifier, greedy, gen)

    return step


def tree(parents: Sequence[int], *, draw: str, verifier: str, greedy: bool = False) -> Decoder:
    """The static tree ``parents`` (level order, node 0 = root) with children drawn by ``draw`` (:data:`DRAWS`) and
    verified by ``verify_tree`` method ``verifier``."""
    name = f"{verifier}:{draw}{list(parents)}{' greedy' if greedy else ''}"
    return Decoder(name, _static_step(parents, draw, verifier, greedy))


def wrong_skip_duplicates(parents: Sequence[int]) -> Decoder:
    """Negative control: duplicate i.i.d. siblings are dropped, so their 'rrs' residual update is skipped."""
    return Decoder("wrong: rrs skipping duplicates", _static_step(parents, "iid", "rrs", False, skip_duplicates=True))


def wrong_unrenormalized(parents: Sequence[int]) -> Decoder:
    """Negative control: children drawn without replacement, verified with the unrenormalized p ('rrs')."""
    return Decoder("wrong: swor children verified by rrs", _static_step(parents, "swor", "rrs", False))


def wrong_token_order(parents: Sequence[int], *, draw: str, verifier: str) -> Decoder:
    """Negative control: siblings (and hub pairs) laid out in token-id order instead of draft order."""
    step = _static_step(parents, draw, verifier, False, token_order=True)
    return Decoder(f"wrong: {verifier}:{draw} in token order", step)


def wrong_block_token_residual(length: int) -> Decoder:
    """Negative control: block verification of a chain drawing its correction from the token-level residual
    Norm[(q - p)^+] instead of the block residual Norm[(w_tau q - p)^+], run by the fp64 block oracle."""
    par, kids = _template(chain_parents(length), "iid")

    def step(model: ToyModel, last: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        tree = _draw_tree(model, last, par, kids, "iid", False, gen)
        batch, n = tree.tokens.shape
        u = torch.rand((batch, n, 1), dtype=torch.float64, generator=gen)
        fin = torch.rand((batch, model.vocab), dtype=torch.float64, generator=gen).clamp_min(2.0**-60)
        nodes, n_acc, nxt, _ = block_oracle.block_tree_walk(
            tree.tokens.numpy(),
            tree.parent.numpy(),
            tree.valid.numpy(),
            tree.p_rows.numpy(),
            tree.q_rows.numpy(),
            u.numpy(),
            fin.numpy(),
            weighted=False,
        )
        return _emit_tree(tree, torch.from_numpy(nodes), torch.from_numpy(n_acc), torch.from_numpy(nxt))

    return Decoder("wrong: block verification with the token-level residual", step)


def wrong_gamma_one(parents: Sequence[int]) -> Decoder:
    """Negative control: i.i.d. children verified by K-SEQ with gamma = 1, run by the fp64 tree-walk oracle."""
    par, kids = _template(parents, "iid")

    def rule(cand: list[int], p: np.ndarray, q: np.ndarray, hub: int | None) -> tuple[oracles_tree.Tests, np.ndarray]:
        return oracles_tree.rule_kseq(cand, p, q, hub, gamma=1.0)

    def step(model: ToyModel, last: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        tree = _draw_tree(model, last, par, kids, "iid", False, gen)
        batch, n = tree.tokens.shape
        k = max(len(c) for c in kids)
        u = torch.rand((batch, n, k), dtype=torch.float64, generator=gen)
        fin = torch.rand((batch, model.vocab), dtype=torch.float64, generator=gen).clamp_min(2.0**-60)
        nodes, n_acc, nxt, _ = oracles_tree.tree_walk(
            tree.tokens.numpy(),
            tree.parent.numpy(),
            tree.valid.numpy(),
            tree.p_rows.numpy(),
            tree.q_rows.numpy(),
            u.numpy(),
            fin.numpy(),
            rule,
            chains=True,
        )
        return _emit_tree(tree, torch.from_numpy(nodes), torch.from_numpy(n_acc), torch.from_numpy(nxt))

    return Decoder("wrong: kseq with gamma = 1", step)
