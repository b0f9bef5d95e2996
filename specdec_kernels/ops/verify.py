"""Public verification ops: node verifiers, chains and ragged trees (docs/methods.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from .._registry import resolve
from ..trees import child_counts, depth_from_parents
from ._checks import (
    PATH_METHODS,
    TREE_METHODS,
    NoisePlan,
    check_bool,
    check_float,
    check_int,
    check_leniency,
    check_logp,
    check_method,
    check_probs,
    check_same_device,
    check_shape,
    check_tensor,
    eos_tensor,
)


class NodeVerdict(NamedTuple):
    slot: torch.Tensor  # [B] int64 accepted candidate slot, -1 = none accepted
    token: torch.Tensor  # [B] int64 accepted candidate or a sample of the final residual
    accept_prob: torch.Tensor | None  # [B, K] analytic mode: acceptance probability of each slot if reached
    final_residual: torch.Tensor | None  # [B, V] analytic mode: law of the token emitted when all are rejected


class ChainVerdict(NamedTuple):
    n_accepted: torch.Tensor  # [B] int64
    next_token: torch.Tensor  # [B] int64 correction / bonus token, -1 if the row stopped at EOS


class TreeVerdict(NamedTuple):
    accepted_nodes: torch.Tensor  # [B, L] int64 flattened node ids by depth, -1 padded
    n_accepted: torch.Tensor  # [B] int64
    next_token: torch.Tensor  # [B] int64 correction / bonus token, -1 if the row stopped at EOS
    accepted_rank: torch.Tensor  # [B, L] int64 candidate slot of each accepted node, -1 padded


def _check_pq(p: torch.Tensor, q: torch.Tensor, p_name: str = "p", q_name: str = "q") -> None:
    check_probs(p_name, p)
    check_probs(q_name, q)
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"{p_name} and {q_name} must share the vocabulary size, got {p.shape[-1]} and {q.shape[-1]} "
            "(draft and target vocabularies differ?)"
        )


def kseq_gamma(
    p: torch.Tensor, q: torch.Tensor, k: int | torch.Tensor, *, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """SpecTr K-SEQ parameter: the smallest valid gamma in [1, K] and beta(gamma) (docs/methods.md, SpecTr).

    Shape: p, q [B, V] probabilities; k int or [B] ints >= 1 -> gamma [B], beta [B] float64.
    """
    check_tensor("p", p, ndim=2)
    check_tensor("q", q, ndim=2)
    _check_pq(p, q)
    check_shape("q", q, p.shape)
    if isinstance(k, bool):
        raise ValueError(f"k must be an int >= 1 or an integer tensor [B], got {k!r}")
    kk = torch.full((p.shape[0],), k, dtype=torch.long) if isinstance(k, int) else k
    check_tensor("k", kk, ndim=1)
    check_int("k", kk)
    check_shape("k", kk, (p.shape[0],))
    if kk.numel() and int(kk.min()) < 1:
        raise ValueError(f"k must be >= 1, got {kk.tolist()}")
    return resolve("kseq_gamma", backend, p.device)(p, q, kk)


def _check_candidates(cand: torch.Tensor, cand_valid: torch.Tensor, p: torch.Tensor, vocab: int) -> None:
    live = cand[cand_valid]
    if live.numel() and (int(live.min()) < 0 or int(live.max()) >= vocab):
        raise ValueError(f"cand must hold token ids in [0, {vocab}) where cand_valid is true")
    safe = cand.clamp(0, vocab - 1)
    drafted_p = torch.gather(p, -1, safe)
    if bool((cand_valid & (drafted_p <= 0)).any()):
        raise ValueError(
            "a valid candidate has zero draft probability under p; p must be the exact distribution the "
            "candidates were sampled from"
        )


def verify_node(
    method: str,
    cand: torch.Tensor,
    cand_valid: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    *,
    hub: torch.Tensor | None = None,
    accept_u: torch.Tensor | None = None,
    final_noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    analytic: bool = False,
    backend: str | None = None,
) -> NodeVerdict:
    """Verify the K candidates of one node per row with ``method`` (sd, rrs, rrsw, kseq, spechub, gds; docs/methods.md).

    Shape: cand [B, K] int64 in draft order, cand_valid [B, K] bool, p [B, V] draft law the candidates were drawn
    from, q [B, V] target law, hub [B] (spechub), accept_u [B, K] uniforms in [0, 1) (slot j uses
    accept_u[:, j]), final_noise [B, V] uniforms in (0, 1). ``analytic=True`` also returns each slot's acceptance
    probability (given it is reached) and the final residual, for exact enumeration (docs/exactness.md).
    sd needs K = 1; spechub needs K = 2 with the hub among the valid candidates; rrsw needs distinct candidates.
    gds (greedy draft sampling, ``gds_sample``) needs distinct candidates, the last valid one drawn from p without
    the others.
    """
    method = check_method(method)
    check_tensor("cand", cand, ndim=2)
    check_int("cand", cand)
    check_tensor("cand_valid", cand_valid, ndim=2)
    check_bool("cand_valid", cand_valid)
    check_shape("cand_valid", cand_valid, cand.shape)
    check_tensor("p", p, ndim=2)
    check_tensor("q", q, ndim=2)
    _check_pq(p, q)
    batch, k = cand.shape
    check_shape("p", p, (batch, p.shape[-1]))
    check_shape("q", q, p.shape)
    check_same_device(cand=cand, cand_valid=cand_valid, p=p, q=q, hub=hub)
    vocab = p.shape[-1]
    _check_candidates(cand, cand_valid, p, vocab)
    if method == "sd" and k != 1:
        raise ValueError(f"method 'sd' verifies exactly one candidate per node (K = 1), got K = {k}")
    if method in ("rrsw", "gds"):
        _check_distinct("cand", cand, cand_valid, method)
    if method == "spechub":
        if k != 2:
            raise ValueError(f"method 'spechub' needs K = 2 candidates (hub pair), got K = {k}")
        if hub is None:
            raise ValueError("method 'spechub' needs hub= (the hub token stored by spechub_sample)")
        check_tensor("hub", hub, ndim=1)
        check_int("hub", hub)
        check_shape("hub", hub, (batch,))
        _check_tokens("hub", hub, None, vocab)
        two = cand_valid.all(dim=-1)
        has_hub = (cand == hub[:, None]).any(dim=-1)
        if bool((two & ~has_hub).any()):
            raise ValueError("hub must be one of the two candidates at every spechub node")
        if bool((~cand_valid[:, 0]).any()):
            raise ValueError("spechub nodes need a valid slot-0 candidate")
    elif hub is not None:
        raise ValueError(f"hub= is only used by method 'spechub', got method {method!r}")
    if not isinstance(analytic, bool):
        raise TypeError(f"analytic must be a bool, got {type(analytic).__name__}")
    # accept_u and final_noise come from one generator, or from distinct Philox purposes of one seed: they must
    # stay independent (docs/kernels.md, Randomness contract); two generators seeded alike would correlate them.
    plan = NoisePlan(generator, seed)
    u = plan.noise("accept_u", accept_u, (batch, k), p.device, open_low=False)
    fin = plan.noise("final_noise", final_noise, (batch, vocab), p.device, open_low=True)
    impl = resolve("verify_node", backend, p.device)
    return NodeVerdict(*impl(method, cand, cand_valid, p, q, u, fin, hub, analytic, plan.seed))


def _check_distinct(name: str, cand: torch.Tensor, cand_valid: torch.Tensor, method: str) -> None:
    rows = cand.masked_fill(~cand_valid, -1)
    same = (rows[..., :, None] == rows[..., None, :]) & cand_valid[..., :, None] & cand_valid[..., None, :]
    same &= ~torch.eye(rows.shape[-1], dtype=torch.bool, device=rows.device)
    if bool(same.any()):
        raise ValueError(
            f"{name}: method {method!r} needs distinct sibling candidates (drafted without replacement), found a "
            "duplicate"
        )


def verify_chain(
    draft: torch.Tensor,
    p: torch.Tensor | None,
    q: torch.Tensor,
    *,
    lengths: torch.Tensor | None = None,
    accept_u: torch.Tensor | None = None,
    final_noise: torch.Tensor | None = None,
    greedy: bool = False,
    eos_token_id: int | Sequence[int] | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    backend: str | None = None,
    leniency: float = 1.0,
    validate: bool = True,
) -> ChainVerdict:
    """Standard speculative sampling of a draft chain (docs/methods.md, SD; greedy: accept iff x == argmax q).

    Shape: draft [B, L] int64, p [B, L, V] draft laws the tokens were sampled from (unused and may be None when
    ``greedy``), q [B, L+1, V] target laws (logits are fine when greedy), lengths [B] (default L) for ragged
    chains, accept_u [B, L], final_noise [B, V] -> n_accepted [B], next_token [B]. Stops after an accepted
    token in ``eos_token_id`` (next_token = -1).

    ``leniency`` l >= 1 is the lenient review of CS Drafting (docs/methods.md, CS Drafting): a token is accepted
    iff U * p(x) < l * q(x) and a rejection still draws from res(q, p), so with l > 1 the emitted tokens follow
    :func:`emission_law` instead of q (exact only for l = 1). In greedy mode l > 1 accepts x iff x == argmax q or
    p(x) < l * q(x); p and q must then be probability rows (the reviewers' laws at temperature 1).
    ``validate=False`` skips the O(L V) value checks (laws sum to 1, drafted tokens have p > 0, token ids in range)
    for callers that built the chain and the laws themselves; shapes and types are still checked.
    """
    check_tensor("draft", draft, ndim=2)
    check_int("draft", draft)
    check_tensor("q", q, ndim=3)
    batch, length = draft.shape
    if q.shape[:2] != (batch, length + 1):
        raise ValueError(f"q must have shape (B, L+1, V) = ({batch}, {length + 1}, V), got {tuple(q.shape)}")
    vocab = q.shape[-1]
    check_float("q", q)
    if lengths is None:
        lens = torch.full((batch,), length, dtype=torch.long, device=draft.device)
    else:
        check_tensor("lengths", lengths, ndim=1)
        check_int("lengths", lengths)
        check_shape("lengths", lengths, (batch,))
        if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > length):
            raise ValueError(f"lengths must be in [0, L={length}], got {lengths.tolist()}")
        lens = lengths
    check_same_device(draft=draft, p=p, q=q, lengths=lens)
    leniency = check_leniency(leniency)
    lenient_greedy = greedy and leniency > 1.0
    in_use = torch.arange(length, device=draft.device)[None, :] < lens[:, None]
    q_use = torch.cat([torch.ones((batch, 1), dtype=torch.bool, device=draft.device), in_use], dim=1)  # rows 0..len
    if validate:
        _check_tokens("draft", draft, in_use, vocab)
    if greedy and not lenient_greedy:
        if validate:  # logits: no NaN, no +inf, and a finite entry in every row an argmax is taken of
            check_logp("q (rows in use)", q, rows=q_use)
    else:
        if p is None:
            need = "p is required with greedy=True and leniency > 1" if greedy else "p is required unless greedy=True"
            raise ValueError(need)
        check_tensor("p", p, ndim=3)
        check_float("p", p)
        if p.shape[-1] != vocab:
            raise ValueError(
                f"p and q must share the vocabulary size, got {p.shape[-1]} and {vocab} "
                "(draft and target vocabularies differ?)"
            )
        check_shape("p", p, (batch, length, vocab))
        if validate:
            check_probs("p (rows in use)", p, rows=in_use)
            check_probs("q (rows in use)", q, rows=q_use)
            if not greedy:  # the lenient greedy rule reads p as a law, not as the law the tokens were drawn from
                _check_candidates(draft.reshape(-1, 1), in_use.reshape(-1, 1), p.reshape(-1, vocab), vocab)
    # accept_u and final_noise come from one generator, or from distinct Philox purposes of one seed: they must
    # stay independent (docs/kernels.md, Randomness contract); two generators seeded alike would correlate them.
    plan = NoisePlan(generator, seed, needed=not greedy)
    u = plan.noise("accept_u", accept_u, (batch, length), q.device, open_low=False)
    fin = plan.noise("final_noise", final_noise, (batch, vocab), q.device, open_low=True)
    eos = eos_tensor(eos_token_id, vocab)
    impl = resolve("verify_chain", backend, q.device)
    return ChainVerdict(*impl(draft, p, q, lens, u, fin, bool(greedy), eos, plan.seed, leniency))


def emission_law(
    p: torch.Tensor, q: torch.Tensor, leniency: float = 1.0, *, backend: str | None = None, validate: bool = True
) -> torch.Tensor:
    """The law of the token a lenient review emits at one position (docs/methods.md, CS Drafting).

    A candidate drawn from ``p`` is kept iff U * p(x) < l * q(x) (``verify_chain(..., leniency=l)``), else the
    token is drawn from rho = res(q, p) (q where the residual mass is numerically zero), so the emitted token
    follows E = min(p, l q) + r rho with r = sum_v (p(v) - l q(v))^+. With l = 1, E = q; with l > 1 a cascade
    must pass E, not q, to the review above it for the final output to follow the target's law.

    Shape: p, q [..., V] probability rows of one shape -> E [..., V] (float64 if an input is float64, else
    float32). ``validate=False`` skips the O(V) value checks (rows sum to 1, no NaN or negative entry) for callers
    whose rows come from ``process_logits``; shapes and types are still checked.
    """
    check_tensor("p", p, min_ndim=1)
    check_tensor("q", q, min_ndim=1)
    check_float("p", p)
    check_float("q", q)
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"p and q must share the vocabulary size, got {p.shape[-1]} and {q.shape[-1]} "
            "(draft and target vocabularies differ?)"
        )
    check_shape("q", q, p.shape)
    check_same_device(p=p, q=q)
    leniency = check_leniency(leniency)
    if validate:
        _check_pq(p, q)
    return resolve("emission_law", backend, p.device)(p, q, leniency)


def _check_tokens(name: str, tokens: torch.Tensor, live: torch.Tensor | None, vocab: int) -> None:
    """Token ids in [0, vocab) where ``live`` is true (everywhere when None)."""
    toks = tokens if live is None else tokens[live]
    if toks.numel() and (int(toks.min()) < 0 or int(toks.max()) >= vocab):
        raise ValueError(f"{name} must hold token ids in [0, {vocab}), got {int(toks.min())}..{int(toks.max())}")


def _parent_index(parent: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``parent`` as int64 gather indices: the root's -1 and every padding node's parent (never read) as 0."""
    return torch.where(valid, parent, 0).clamp_min(0).long()


def _check_tree(parent: torch.Tensor, valid: torch.Tensor) -> None:
    n = parent.shape[1]
    if n == 0:
        raise ValueError("the tree must hold at least the root node (N >= 1)")
    parent = parent.long()  # any integer dtype: gather takes int64 indices
    if bool((parent[:, 0] != -1).any()):
        raise ValueError("parent[:, 0] must be -1 (node 0 is the root)")
    if not bool(valid[:, 0].all()):
        raise ValueError("valid[:, 0] must be true (the root always exists)")
    if n == 1:
        return
    ids = torch.arange(n, device=parent.device)[None, :]
    par = parent[:, 1:]
    live = valid[:, 1:]
    bad = live & ((par < 0) | (par >= ids[:, 1:]))
    if bool(bad.any()):
        raise ValueError("parent[b, n] must be in [0, n) for every valid node (flattened level order)")
    par_valid = torch.gather(valid, 1, par.clamp(0, n - 1))
    if bool((live & ~par_valid).any()):
        raise ValueError("every valid node needs a valid parent (padding nodes cannot have children)")
    masked = torch.where(live, par, torch.full_like(par, -1))
    running = torch.cummax(masked, dim=1).values
    if bool((live & (par < running)).any()):
        raise ValueError("valid nodes must be in level order and grouped by parent (parents non-decreasing)")


def verify_tree(
    tokens: torch.Tensor,
    parent: torch.Tensor,
    p_rows: torch.Tensor | None,
    q_rows: torch.Tensor,
    *,
    method: str,
    valid: torch.Tensor | None = None,
    hub: torch.Tensor | None = None,
    accept_u: torch.Tensor | None = None,
    final_noise: torch.Tensor | None = None,
    greedy: bool = False,
    eos_token_id: int | Sequence[int] | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    backend: str | None = None,
    validate: bool = True,
    depth: torch.Tensor | None = None,
) -> TreeVerdict:
    """Walk a batch of ragged draft trees and verify each visited node with ``method``.

    Shape: tokens [B, N] (node 0 = root), parent [B, N] (parent[:, 0] = -1, level order, siblings in draft
    order), valid [B, N] bool (default all), p_rows [B, N, V] draft law at each internal node (None when
    greedy), q_rows [B, N, V] target law at every node, hub [B, N] (spechub), accept_u [B, N, Kmax] (slot j of
    the node's candidates uses accept_u[:, node, j]; for kseq Kmax >= number of chains), final_noise [B, V].
    Returns accepted_nodes [B, L], n_accepted [B], next_token [B], accepted_rank [B, L] with L = max depth.
    ``kseq`` treats the tree as SpecTr chains: after accepting token t, the candidates are the children of all
    alive chain nodes carrying t (docs/methods.md, SpecTr). ``block`` is block verification (docs/methods.md, Block
    verification): each row's tree must be a chain (ragged lengths through ``valid``) drafted token by token from
    ``p_rows``; the chain is judged as a whole, the node at depth i reading its uniform at accept_u[:, node, 0];
    greedy, it is the ``sd`` walk. ``traversal`` / ``traversalw`` are traversal verification (docs/methods.md,
    Traversal verification) of trees whose children were drawn i.i.d. / without replacement, node n reading its
    uniform at accept_u[:, n, 0]; greedy, they are the ``rrs`` / ``rrsw`` walk. ``validate=False`` skips the O(N V)
    value checks (laws sum to 1, drafted tokens have p > 0, hub pairs, distinct siblings) and the tree-structure
    checks, for callers that built the tree and the laws themselves (the driver: laws from ``process_logits``);
    shapes and types are still checked and the kernels still bounds-check. ``depth`` [B, N] int: the nodes' depths
    when the caller already has them (the driver's trees carry them); they only size the outputs (L), are checked
    against ``parent`` when ``validate`` is true, and default to ``depth_from_parents(parent)``.
    """
    method = check_method(method, TREE_METHODS)
    check_tensor("tokens", tokens, ndim=2)
    check_int("tokens", tokens)
    check_tensor("parent", parent, ndim=2)
    check_int("parent", parent)
    check_shape("parent", parent, tokens.shape)
    batch, n = tokens.shape
    if batch == 0:
        raise ValueError(f"tokens must hold at least one row (B >= 1), got shape {tuple(tokens.shape)}")
    if valid is None:
        valid = torch.ones_like(tokens, dtype=torch.bool)
    check_tensor("valid", valid, ndim=2)
    check_bool("valid", valid)
    check_shape("valid", valid, tokens.shape)
    check_tensor("q_rows", q_rows, ndim=3)
    check_float("q_rows", q_rows)
    if q_rows.shape[:2] != (batch, n):
        raise ValueError(f"q_rows must have shape (B, N, V) = ({batch}, {n}, V), got {tuple(q_rows.shape)}")
    vocab = q_rows.shape[-1]
    check_same_device(tokens=tokens, parent=parent, valid=valid, p_rows=p_rows, q_rows=q_rows, hub=hub)
    if validate:
        _check_tree(parent, valid)
        _check_tokens("tokens", tokens, valid, vocab)
        par = _parent_index(parent, valid)
        child = valid.clone()
        child[:, 0] = False
        counts = torch.zeros((batch, n), dtype=torch.long, device=tokens.device)
        counts.scatter_add_(1, par, child.long())
        internal = counts > 0
        max_children = int(counts.max()) if counts.numel() else 0
        root_children = int(counts[:, 0].max()) if counts.numel() else 0
    else:  # the driver's trees are small: count children on host lists instead of a dozen tiny torch ops
        par = None
        counts_l = child_counts(parent, valid)
        max_children = max((c for row in counts_l for c in row), default=0)
        root_children = max((row[0] for row in counts_l if row), default=0)
    if not greedy:
        _check_p_rows(p_rows, batch, n, vocab)
    _check_children(method, max_children, hub)
    if validate:
        _check_tree_values(tokens, par, child, counts, internal, valid, p_rows, q_rows, method, hub, greedy)
    elif method == "spechub" and not greedy and hub is None:
        raise ValueError("method 'spechub' needs hub= [B, N] (hub token of each node, from spechub_sample)")
    # kseq: a uniform per chain; the path verifiers (block, traversal): one per node, read at slot 0
    kmax = root_children if method == "kseq" else 1 if method in PATH_METHODS else max_children
    if accept_u is not None:
        _check_accept_u(accept_u, batch, n, kmax)
    # accept_u and final_noise come from one generator, or from distinct Philox purposes of one seed: they must
    # stay independent (docs/kernels.md, Randomness contract); two generators seeded alike would correlate them.
    plan = NoisePlan(generator, seed, needed=not greedy)
    u_shape = (batch, n, max(kmax, 1) if accept_u is None else accept_u.shape[2])
    u = plan.noise("accept_u", accept_u, u_shape, q_rows.device, open_low=False)
    fin = plan.noise("final_noise", final_noise, (batch, vocab), q_rows.device, open_low=True)
    eos = eos_tensor(eos_token_id, vocab)
    max_depth = _max_depth(depth, parent, valid, par)
    impl = resolve("verify_tree", backend, q_rows.device)
    return TreeVerdict(
        *impl(tokens, parent, valid, p_rows, q_rows, method, hub, u, fin, bool(greedy), eos, max_depth, plan.seed)
    )


def _check_p_rows(p_rows: torch.Tensor | None, batch: int, n: int, vocab: int) -> None:
    if p_rows is None:
        raise ValueError("p_rows is required unless greedy=True")
    check_tensor("p_rows", p_rows, ndim=3)
    check_shape("p_rows", p_rows, (batch, n, p_rows.shape[-1]))
    if p_rows.shape[-1] != vocab:
        raise ValueError(
            f"p_rows and q_rows must share the vocabulary size, got {p_rows.shape[-1]} and {vocab} "
            "(draft and target vocabularies differ?)"
        )


def _check_children(method: str, max_children: int, hub: torch.Tensor | None) -> None:
    """What ``method`` allows of the tree's widest node and of ``hub=``."""
    if method in ("sd", "block") and max_children > 1:
        raise ValueError(f"method {method!r} allows at most one child per node, found a node with {max_children}")
    if method == "spechub" and max_children > 2:
        raise ValueError(f"method 'spechub' supports at most two children per node, found {max_children}")
    if method != "spechub" and hub is not None:
        raise ValueError(f"hub= is only used by method 'spechub', got method {method!r}")


def _check_accept_u(accept_u: torch.Tensor, batch: int, n: int, kmax: int) -> None:
    check_tensor("accept_u", accept_u, ndim=3)
    if accept_u.shape[:2] != (batch, n) or accept_u.shape[2] < kmax:
        raise ValueError(
            f"accept_u must have shape (B, N, Kmax>={kmax}) = ({batch}, {n}, >={kmax}), got {tuple(accept_u.shape)}"
        )


def _max_depth(depth: torch.Tensor | None, parent: torch.Tensor, valid: torch.Tensor, par: torch.Tensor | None) -> int:
    """The deepest valid node's depth: from ``depth`` where the caller has it, else from the parents. ``par``: the
    parent index of a validated call (``depth`` is then checked against it), None for an unvalidated one."""
    if depth is None:
        depth = depth_from_parents(_parent_index(parent, valid) if par is None else par)
    else:
        check_tensor("depth", depth, ndim=2)
        check_int("depth", depth)
        check_shape("depth", depth, parent.shape)
        if par is not None and not torch.equal(depth[valid], depth_from_parents(par)[valid]):
            raise ValueError("depth must be the depth of each valid node in the tree given by parent")
    if par is not None:
        return int(depth.masked_fill(~valid, 0).max())
    # the driver's trees are small: host lists instead of a masked reduction
    rows = zip(depth.tolist(), valid.tolist(), strict=True)
    return max((d for drow, vrow in rows for d, v in zip(drow, vrow, strict=True) if v), default=0)


def _check_tree_values(
    tokens: torch.Tensor,
    par: torch.Tensor,
    child: torch.Tensor,
    counts: torch.Tensor,
    internal: torch.Tensor,
    valid: torch.Tensor,
    p_rows: torch.Tensor | None,
    q_rows: torch.Tensor,
    method: str,
    hub: torch.Tensor | None,
    greedy: bool,
) -> None:
    """verify_tree's O(N V) value checks: laws, drafted tokens with p > 0, hub pairs, distinct rrsw siblings."""
    batch, n = tokens.shape
    vocab = q_rows.shape[-1]
    if greedy:
        check_logp("q_rows (valid nodes)", q_rows, rows=valid)
    else:
        assert p_rows is not None
        check_probs("q_rows (valid nodes)", q_rows, rows=valid)
        check_probs("p_rows (internal nodes)", p_rows, rows=internal)
        # p_rows[b, parent[b, n], tokens[b, n]]: one element per node (flattened index, no [B, N, V] copy)
        flat = par * vocab + tokens.clamp(0, vocab - 1)
        drafted_p = torch.gather(p_rows.reshape(batch, n * vocab), 1, flat)
        if bool((child & (drafted_p <= 0)).any()):
            raise ValueError(
                "a draft node's token has zero probability under p_rows of its parent; p_rows must be the exact "
                "draft laws the children were sampled from"
            )
    if method == "spechub" and not greedy:
        if hub is None:
            raise ValueError("method 'spechub' needs hub= [B, N] (hub token of each node, from spechub_sample)")
        check_tensor("hub", hub, ndim=2)
        check_int("hub", hub)
        check_shape("hub", hub, (batch, n))
        _check_tokens("hub (valid nodes)", hub, valid, vocab)
        _check_hub_pairs(tokens, par, child, counts, hub)
    if method in ("rrsw", "traversalw", "gds"):
        sib = child[:, :, None] & child[:, None, :] & (par[:, :, None] == par[:, None, :])
        dup = sib & (tokens[:, :, None] == tokens[:, None, :])
        dup &= ~torch.eye(n, dtype=torch.bool, device=tokens.device)
        if bool(dup.any()):
            raise ValueError(f"tokens: method {method!r} needs distinct siblings (drafted without replacement)")


def _check_hub_pairs(
    tokens: torch.Tensor, par: torch.Tensor, child: torch.Tensor, counts: torch.Tensor, hub: torch.Tensor
) -> None:
    node_hub = torch.gather(hub, 1, par)
    is_hub = child & (tokens == node_hub)
    hub_children = torch.zeros_like(counts).scatter_add_(1, par, is_hub.long())
    if bool(((counts == 2) & (hub_children < 1)).any()):
        raise ValueError("hub: at every spechub node with two children, one child must be the node's hub token")
