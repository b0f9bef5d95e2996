"""verify_tree (TreeVerify with the node verifiers, SpecTr chains, greedy mode): fp64 tree-walk oracle with
injected noise on ragged batches, padding, EOS, accepted_rank, SpecTr path consistency, chain equivalence, bad
inputs, reproducibility, backend parity. Output-law tests of whole decoding loops: tests/reference/."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels import available_backends, depth_from_parents, kseq_chain_parents, verify_chain, verify_tree
from specdec_kernels.testing.oracles_tree import RULES, random_parents, tree_walk

METHODS = ("sd", "rrs", "rrsw", "kseq", "spechub", "gds")
# Semantics run on every backend that is fast on CPU; the Triton interpreter is covered by the parity tests.
BACKENDS = [b for b in available_backends("verify_tree") if b != "triton"]


def random_bigram(
    rng: np.random.Generator, vocab: int, zero_frac: float = 0.15, n_rows: int | None = None
) -> np.ndarray:
    rows = rng.dirichlet(np.full(vocab, 0.8), size=n_rows or vocab)
    rows[rng.random(rows.shape) < zero_frac] = 0.0
    rows[rows.sum(1) == 0, 0] = 1.0
    return rows / rows.sum(1, keepdims=True)


def sparse_rows(rng: np.random.Generator, vocab: int, n_rows: int, support: int) -> np.ndarray:
    """Large-vocabulary laws: each row puts its mass on ``support`` random tokens."""
    rows = np.zeros((n_rows, vocab))
    for r in rows:
        r[rng.choice(vocab, size=support, replace=False)] = rng.dirichlet(np.full(support, 0.8))
    return rows


def topology(rng: np.random.Generator, method: str, n_max: int) -> list[int]:
    if method == "sd":
        return [-1] + list(range(int(rng.integers(0, n_max))))
    if method == "kseq":
        return kseq_chain_parents(int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    return random_parents(rng, int(rng.integers(1, n_max + 1)), max_children=2 if method == "spechub" else 3)


def draft_children(rng: np.random.Generator, method: str, p: np.ndarray, k: int) -> tuple[list[int], int]:
    """Children tokens in draft order, as the method's drafting would produce them, and the hub (SpecHub)."""
    support = int((p > 0).sum())
    if method == "rrsw":
        k = min(k, support)  # SWOR cannot draw more tokens than the support holds
        return [int(x) for x in rng.choice(p.size, size=k, replace=False, p=p)], 0
    if method == "gds":  # the k - 1 most likely tokens (at most all but one of the support), one draw from the rest
        top = [int(x) for x in np.argsort(-p, kind="stable")[: max(0, min(k - 1, support - 1))]]
        rest = p.copy()
        rest[top] = 0.0
        return [*top, int(rng.choice(p.size, p=rest / rest.sum()))], 0
    if method == "spechub":
        hub = int(np.argmax(p))
        x1 = int(rng.choice(p.size, p=p))
        if k == 1 or support == 1:
            return [x1], hub
        if x1 != hub:
            return [x1, hub], hub
        rest = p.copy()
        rest[hub] = 0.0
        return [hub, int(rng.choice(p.size, p=rest / rest.sum()))], hub
    return [int(x) for x in rng.choice(p.size, size=k, p=p)], 0


def random_batch(rng: np.random.Generator, method: str, batch: int, vocab: int, n_max: int = 12, n_rows: int = 0):
    """A ragged batch of trees drafted from random bigram laws (the rows of node n are the laws of its token, or of
    its token mod ``n_rows`` with sparse rows for large vocabularies), padded with valid = False, parent 0, token 0
    (docs/kernels.md); SWOR may draw fewer children than the topology asks for."""
    if n_rows:
        p_big = sparse_rows(rng, vocab, n_rows, 12)
        q_big = 0.5 * p_big + 0.5 * sparse_rows(rng, vocab, n_rows, 12)  # overlapping supports: some acceptances
    else:
        p_big, q_big = random_bigram(rng, vocab), random_bigram(rng, vocab)
    same = rng.random(len(p_big)) < 0.2  # some rows with q = p
    q_big[same] = p_big[same]
    rows = len(p_big)
    trees = []
    for _ in range(batch):
        shape = topology(rng, method, n_max)
        kids: list[list[int]] = [[] for _ in shape]
        for c in range(1, len(shape)):
            kids[shape[c]].append(c)
        tok = {0: int(rng.integers(vocab))}
        par, hubs = {0: -1}, {}
        order = [0]
        for node in range(len(shape)):
            if node not in tok or not kids[node]:
                continue
            new, hubs[node] = draft_children(rng, method, p_big[tok[node] % rows], len(kids[node]))
            for c, x in zip(kids[node], new, strict=False):
                tok[c], par[c] = x, node
                order.append(c)
        # Renumber the surviving nodes in level order (children of dropped slots vanish with them).
        old_ids = sorted(order)
        new_id = {o: i for i, o in enumerate(old_ids)}
        trees.append(
            (
                [tok[o] for o in old_ids],
                [-1] + [new_id[par[o]] for o in old_ids[1:]],
                {new_id[o]: h for o, h in hubs.items()},
            )
        )
    n = max(len(t[0]) for t in trees)
    tokens = np.zeros((batch, n), dtype=np.int64)
    parent = np.zeros((batch, n), dtype=np.int64)
    valid = np.zeros((batch, n), dtype=bool)
    hub = np.zeros((batch, n), dtype=np.int64)
    for b, (tk, pa, hb) in enumerate(trees):
        tokens[b, : len(tk)], parent[b, : len(pa)], valid[b, : len(tk)] = tk, pa, True
        for node, h in hb.items():
            hub[b, node] = h
    p_rows, q_rows = p_big[tokens % rows], q_big[tokens % rows]
    kmax = 3 if method != "spechub" else 2
    u = rng.random((batch, n, kmax))
    fin = rng.random((batch, vocab)) * (1 - 2e-12) + 1e-12
    return tokens, parent, valid, p_rows, q_rows, hub, u, fin


def run_op(method, tokens, parent, valid, p_rows, q_rows, hub, u, fin, **kw):
    t = torch.from_numpy
    return verify_tree(
        t(tokens),
        t(parent),
        None if p_rows is None else t(p_rows),
        t(q_rows),
        method=method,
        valid=t(valid),
        hub=t(hub) if method == "spechub" and p_rows is not None else None,
        accept_u=None if u is None else t(u),
        final_noise=None if fin is None else t(fin),
        **kw,
    )


def path_tokens(tokens: np.ndarray, nodes: np.ndarray, n_acc: np.ndarray) -> list[list[int]]:
    return [[int(tokens[b, x]) for x in nodes[b, : n_acc[b]]] for b in range(len(n_acc))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("vocab", [4, 9])
def test_matches_fp64_tree_walk_oracle(method: str, vocab: int, backend: str) -> None:
    rng = np.random.default_rng(METHODS.index(method) * 100 + vocab)
    inst = random_batch(rng, method, 48, vocab)
    tokens, parent, valid, p_rows, q_rows, hub, u, fin = inst
    res = run_op(method, *inst, eos_token_id=vocab - 1, backend=backend)
    nodes, n_acc, nxt, ranks = tree_walk(
        tokens, parent, valid, p_rows, q_rows, u, fin, RULES[method], hub=hub, chains=method == "kseq", eos=[vocab - 1]
    )
    assert res.n_accepted.tolist() == n_acc.tolist()
    assert res.next_token.tolist() == nxt.tolist()
    assert res.accepted_rank.tolist() == ranks.tolist()
    if method == "kseq":  # duplicate chains carry the same tokens; any parent-consistent choice is fine
        assert path_tokens(tokens, res.accepted_nodes.numpy(), n_acc) == path_tokens(tokens, nodes, n_acc)
    else:
        assert res.accepted_nodes.tolist() == nodes.tolist()
    assert (n_acc > 0).any() and (n_acc == 0).any()  # the batch exercised both outcomes


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), method=st.sampled_from(METHODS[:-1]), vocab=st.integers(2, 6))
def test_p_equal_q_accepts_the_first_child_everywhere(seed: int, method: str, vocab: int, backend: str) -> None:
    """With q = p every verifier but gds accepts its first candidate for any uniforms in [0, 1), so the walk
    descends through rank-0 children down to a leaf and ends with a bonus token (gds tests its drawn candidate, the
    last, first, against the law it was drawn from, which is not p)."""
    rng = np.random.default_rng(seed)
    tokens, parent, valid, p_rows, _, hub, u, fin = random_batch(rng, method, 6, vocab)
    u = 1.0 - u * 1e-3  # uniforms close to 1 are the hardest case
    res = run_op(method, tokens, parent, valid, p_rows, p_rows.copy(), hub, u, fin, backend=backend)
    for b in range(len(tokens)):
        node, depth = 0, 0
        while True:
            kids = [c for c in range(1, tokens.shape[1]) if valid[b, c] and parent[b, c] == node]
            if not kids:
                break
            node, depth = kids[0], depth + 1
            got = int(res.accepted_nodes[b, depth - 1])
            if method == "kseq":
                # SpecTr chains that carry the same tokens are interchangeable: the accepted path may run through a
                # duplicate chain (rebuilt parent-consistently from its last node), so compare tokens, not node ids
                assert int(tokens[b, got]) == int(tokens[b, node])
                assert int(parent[b, got]) == (0 if depth == 1 else int(res.accepted_nodes[b, depth - 2]))
            else:
                assert got == node
        assert int(res.n_accepted[b]) == depth
        assert (res.accepted_rank[b, :depth] == 0).all()
        assert int(res.next_token[b]) >= 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["rrs", "rrsw", "spechub"])
def test_large_vocabulary_matches_oracle(method: str, backend: str) -> None:
    rng = np.random.default_rng(METHODS.index(method))
    inst = random_batch(rng, method, 8, 32000, n_rows=8)
    tokens, parent, valid, p_rows, q_rows, hub, u, fin = inst
    res = run_op(method, *inst, backend=backend)
    nodes, n_acc, nxt, _ = tree_walk(tokens, parent, valid, p_rows, q_rows, u, fin, RULES[method], hub=hub)
    assert res.n_accepted.tolist() == n_acc.tolist()
    assert res.next_token.tolist() == nxt.tolist()
    assert res.accepted_nodes.tolist() == nodes.tolist()
    assert (n_acc > 0).any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
def test_greedy_matches_oracle(method: str, backend: str) -> None:
    rng = np.random.default_rng(17)
    tokens, parent, valid, p_rows, q_rows, hub, _, _ = random_batch(rng, method, 32, 6)
    logits = np.log(q_rows) + 0.01 * rng.standard_normal(q_rows.shape)  # logits with -inf entries, tie-free
    res = run_op(method, tokens, parent, valid, None, logits, hub, None, None, greedy=True, backend=backend)
    nodes, n_acc, nxt, ranks = tree_walk(tokens, parent, valid, None, logits, None, None, None, chains=method == "kseq")
    assert res.n_accepted.tolist() == n_acc.tolist()
    assert res.next_token.tolist() == nxt.tolist()
    assert res.accepted_rank.tolist() == ranks.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["rrs", "rrsw", "spechub", "kseq"])
def test_padded_rows_equal_rows_alone(method: str, backend: str) -> None:
    """Ragged batch: each row's verdict equals the verdict of that row verified alone without padding, and padded
    rows are never read (NaN there is fine)."""
    rng = np.random.default_rng(5)
    tokens, parent, valid, p_rows, q_rows, hub, u, fin = random_batch(rng, method, 12, 5)
    p_rows[~valid] = np.nan
    q_rows[~valid] = np.nan
    res = run_op(method, tokens, parent, valid, p_rows, q_rows, hub, u, fin, backend=backend)
    for b in range(len(tokens)):
        k = int(valid[b].sum())
        kmax = u.shape[2]
        one = run_op(
            method,
            tokens[b : b + 1, :k],
            parent[b : b + 1, :k],
            valid[b : b + 1, :k],
            p_rows[b : b + 1, :k],
            q_rows[b : b + 1, :k],
            hub[b : b + 1, :k],
            u[b : b + 1, :k, :kmax],
            fin[b : b + 1],
            backend=backend,
        )
        m = int(one.n_accepted[0])
        assert int(res.n_accepted[b]) == m
        assert int(res.next_token[b]) == int(one.next_token[0])
        assert res.accepted_nodes[b, :m].tolist() == one.accepted_nodes[0, :m].tolist()
        assert (res.accepted_nodes[b, m:] == -1).all() and (res.accepted_rank[b, m:] == -1).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_accepted_rank_is_sibling_rank_and_path_is_a_tree_path(backend: str) -> None:
    rng = np.random.default_rng(8)
    tokens, parent, valid, p_rows, q_rows, hub, u, fin = random_batch(rng, "rrs", 64, 4)
    res = run_op("rrs", tokens, parent, valid, p_rows, q_rows, hub, u, fin, backend=backend)
    seen_rank = set()
    for b in range(len(tokens)):
        prev = 0
        for d in range(int(res.n_accepted[b])):
            node = int(res.accepted_nodes[b, d])
            assert valid[b, node] and parent[b, node] == prev
            siblings = [c for c in range(1, tokens.shape[1]) if valid[b, c] and parent[b, c] == prev]
            assert siblings.index(node) == int(res.accepted_rank[b, d])
            seen_rank.add(int(res.accepted_rank[b, d]))
            prev = node
    assert seen_rank >= {0, 1}


@pytest.mark.parametrize("backend", BACKENDS)
def test_kseq_path_follows_the_chain_of_the_accepted_token(backend: str) -> None:
    """SpecTr 3 x 2 chains with tokens (a, a, b) at depth 1. After accepting a (chain 0, slot 0) the candidates are
    the depth-2 nodes of chains 0 and 1; q forbids chain 0's token, so chain 1's is accepted and the reported path
    must be chain 1's nodes (2, 5), not (1, 5)."""
    parents = kseq_chain_parents(3, 2)  # [-1, 0, 0, 0, 1, 2, 3]
    assert parents == [-1, 0, 0, 0, 1, 2, 3]
    tokens = torch.tensor([[0, 1, 1, 2, 3, 2, 3]])
    p = torch.full((1, 7, 4), 0.25, dtype=torch.float64)
    q = torch.full((1, 7, 4), 0.25, dtype=torch.float64)
    q[0, 1] = torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64)  # at prefix (0, 1): token 3 has q = 0
    u = torch.zeros((1, 7, 3), dtype=torch.float64)
    res = verify_tree(tokens, torch.tensor([parents]), p, q, method="kseq", accept_u=u, seed=0, backend=backend)
    assert res.n_accepted.tolist() == [2]
    assert res.accepted_nodes.tolist() == [[2, 5]]
    assert res.accepted_rank.tolist() == [[0, 1]]
    assert tokens[0, res.accepted_nodes[0]].tolist() == [1, 2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_eos_child_stops_the_walk(backend: str) -> None:
    # Binary tree; u = 0 accepts the first child with q > 0. Node 1 holds EOS = 3.
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 2]])
    tokens = torch.tensor([[0, 3, 1, 0, 1, 2, 0]])
    p = torch.full((1, 7, 4), 0.25, dtype=torch.float64)
    u = torch.zeros((1, 7, 2), dtype=torch.float64)
    res = verify_tree(tokens, parents, p, p.clone(), method="rrsw", accept_u=u, eos_token_id=3, seed=0, backend=backend)
    assert res.n_accepted.tolist() == [1] and res.next_token.tolist() == [-1]
    assert res.accepted_nodes.tolist() == [[1, -1]]
    res = verify_tree(
        tokens, parents, p, p.clone(), method="rrsw", accept_u=u, eos_token_id=[2], seed=0, backend=backend
    )
    assert res.n_accepted.tolist() == [2] and res.next_token.tolist() != [-1]  # leaf reached: bonus token


@pytest.mark.parametrize("backend", BACKENDS)
def test_sd_tree_equals_verify_chain(backend: str) -> None:
    """A chain-shaped tree verified with 'sd' is verify_chain: node j's uniform is accept_u[:, j, 0]."""
    rng = np.random.default_rng(6)
    batch, length, vocab = 40, 4, 5
    p_big, q_big = random_bigram(rng, vocab, 0.0), random_bigram(rng, vocab)
    tokens = np.zeros((batch, length + 1), dtype=np.int64)
    tokens[:, 0] = rng.integers(vocab, size=batch)
    for j in range(length):
        tokens[:, j + 1] = [rng.choice(vocab, p=p_big[x]) for x in tokens[:, j]]
    u = rng.random((batch, length + 1, 1))
    fin = rng.random((batch, vocab)) + 1e-9
    fin = np.minimum(fin, 1 - 1e-9)
    t = torch.from_numpy
    tree = verify_tree(
        t(tokens),
        torch.tensor([[-1] + list(range(length))] * batch),
        t(p_big[tokens]),
        t(q_big[tokens]),
        method="sd",
        accept_u=t(u),
        final_noise=t(fin),
        backend=backend,
    )
    chain = verify_chain(
        t(tokens[:, 1:]),
        t(p_big[tokens[:, :-1]]),
        t(q_big[tokens]),
        accept_u=t(u[:, :length, 0]),
        final_noise=t(fin),
        backend=backend,
    )
    assert torch.equal(tree.n_accepted, chain.n_accepted)
    assert torch.equal(tree.next_token, chain.next_token)


def test_reproducible_by_seed() -> None:
    rng = np.random.default_rng(12)
    tokens, parent, valid, p_rows, q_rows, hub, _, _ = random_batch(rng, "rrsw", 64, 5)
    a = run_op("rrsw", tokens, parent, valid, p_rows, q_rows, hub, None, None, seed=3)
    b = run_op("rrsw", tokens, parent, valid, p_rows, q_rows, hub, None, None, seed=3)
    c = run_op("rrsw", tokens, parent, valid, p_rows, q_rows, hub, None, None, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


# ---------------------------------------------------------------------------------------------------------------
# Bad inputs: one case per validation rule, message pinned.


def good(method: str = "rrs"):
    """Root 0 with children 1, 2 (tokens 1, 2); node 1 has child 3 (token 0)."""
    p = torch.full((1, 4, 4), 0.25, dtype=torch.float64)
    return {
        "tokens": torch.tensor([[0, 1, 2, 0]]),
        "parent": torch.tensor([[-1, 0, 0, 1]]),
        "p_rows": p,
        "q_rows": p.clone(),
        "method": method,
    }


def edit(method: str = "rrs", **kw):
    return lambda: good(method) | kw


def set_item(name: str, index, value, method: str = "rrs"):
    def make():
        args = good(method)
        t = args[name].clone()
        t[index] = value
        args[name] = t
        return args

    return make


BAD = [
    (edit(tokens=torch.zeros((1, 4))), TypeError, "tokens must be an integer tensor"),
    (
        edit(tokens=torch.zeros((0, 4), dtype=torch.long), parent=torch.zeros((0, 4), dtype=torch.long)),
        ValueError,
        r"tokens must hold at least one row \(B >= 1\)",
    ),
    (edit(tokens=torch.zeros(4, dtype=torch.long)), ValueError, "tokens must have 2 dimensions"),
    (edit(parent=torch.tensor([[-1, 0, 0]])), ValueError, r"parent must have shape \(1, 4\)"),
    (edit(valid=torch.ones((1, 4), dtype=torch.long)), TypeError, "valid must be a bool tensor"),
    (edit(q_rows=torch.full((1, 3, 4), 0.25)), ValueError, r"q_rows must have shape \(B, N, V\) = \(1, 4, V\)"),
    (edit(q_rows=torch.ones((1, 4, 4), dtype=torch.long)), TypeError, "q_rows must be a floating-point tensor"),
    (edit(method="rsd"), ValueError, "method must be one of"),
    (set_item("parent", (0, 0), 0), ValueError, r"parent\[:, 0\] must be -1"),
    (edit(valid=torch.tensor([[False, True, True, True]])), ValueError, r"valid\[:, 0\] must be true"),
    (set_item("parent", (0, 3), 3), ValueError, r"parent\[b, n\] must be in \[0, n\)"),
    (edit(valid=torch.tensor([[True, False, True, True]])), ValueError, "every valid node needs a valid parent"),
    (edit(parent=torch.tensor([[-1, 0, 1, 0]])), ValueError, "level order and grouped by parent"),
    (set_item("tokens", (0, 2), 4), ValueError, r"tokens must hold token ids in \[0, 4\)"),
    (edit(p_rows=None), ValueError, "p_rows is required unless greedy=True"),
    (edit(p_rows=torch.full((1, 4, 5), 0.2)), ValueError, "p_rows and q_rows must share the vocabulary size"),
    (set_item("q_rows", (0, 3, 1), float("nan")), ValueError, r"q_rows \(valid nodes\) contains NaN or inf"),
    (set_item("p_rows", (0, 1, 1), 0.5), ValueError, r"p_rows \(internal nodes\) rows must sum to 1"),
    (
        set_item("p_rows", (0, 0), torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)),
        ValueError,
        "a draft node's token has zero probability under p_rows of its parent",
    ),
    (edit(method="sd"), ValueError, "method 'sd' allows at most one child per node, found a node with 2"),
    (
        edit(tokens=torch.tensor([[0, 1, 2, 3]]), parent=torch.tensor([[-1, 0, 0, 0]]), method="spechub"),
        ValueError,
        "method 'spechub' supports at most two children per node, found 3",
    ),
    (edit(method="spechub"), ValueError, r"method 'spechub' needs hub= \[B, N\]"),
    (edit(method="spechub", hub=torch.zeros((1, 3), dtype=torch.long)), ValueError, r"hub must have shape \(1, 4\)"),
    (
        edit(method="spechub", hub=torch.tensor([[3, 0, 0, 0]])),
        ValueError,
        "one child must be the node's hub token",
    ),
    (
        edit(method="spechub", hub=torch.tensor([[1, 99, -5, 0]])),
        ValueError,
        r"hub \(valid nodes\) must hold token ids in \[0, 4\), got -5..99",
    ),
    (edit(hub=torch.zeros((1, 4), dtype=torch.long)), ValueError, "hub= is only used by method 'spechub'"),
    (set_item("tokens", (0, 2), 1, method="rrsw"), ValueError, "method 'rrsw' needs distinct siblings"),
    (
        edit(accept_u=torch.zeros((1, 4, 1), dtype=torch.float64)),
        ValueError,
        r"accept_u must have shape \(B, N, Kmax>=2\)",
    ),
    (
        edit(accept_u=torch.full((1, 4, 2), 1.0, dtype=torch.float64)),
        ValueError,
        r"accept_u must hold uniforms in \[0, 1\)",
    ),
    (
        edit(final_noise=torch.full((1, 3), 0.5, dtype=torch.float64)),
        ValueError,
        r"final_noise must have shape \(1, 4\)",
    ),
    (edit(eos_token_id=[1, 4]), ValueError, r"eos_token_id must be token ids in \[0, 4\)"),
    (edit(eos_token_id=2.7), ValueError, "eos_token_id must be a token id, a list of them or an integer tensor"),
    (edit(eos_token_id=[1, 2.0]), ValueError, "eos_token_id must hold integer token ids"),
    (edit(eos_token_id=torch.tensor([1.0])), ValueError, "eos_token_id must hold integer token ids"),
    (edit(seed=1, generator=torch.Generator()), ValueError, "pass either generator= or seed=, not both"),
    (
        edit(p_rows=None, greedy=True, q_rows=torch.full((1, 4, 4), float("nan"))),
        ValueError,
        r"q_rows \(valid nodes\) contains NaN",
    ),
]


@pytest.mark.parametrize(("make", "exc", "match"), BAD, ids=[b[2][:48] for b in BAD])
def test_bad_inputs(make, exc, match) -> None:
    args = make()
    with pytest.raises(exc, match=match):
        verify_tree(args.pop("tokens"), args.pop("parent"), args.pop("p_rows"), args.pop("q_rows"), **args)


def test_padding_nodes_parents_are_never_read() -> None:
    """A padding node's parent may hold anything (here far out of range) and any integer dtype works."""
    args = good()
    valid = torch.tensor([[True, True, True, False]])
    kw = dict(valid=valid, seed=0, method="rrs")
    base = verify_tree(args["tokens"], args["parent"], args["p_rows"], args["q_rows"], **kw)
    for parent in (torch.tensor([[-1, 0, 0, 10**9]]), torch.tensor([[-1, 0, 0, 1]], dtype=torch.int8)):
        out = verify_tree(args["tokens"], parent, args["p_rows"], args["q_rows"], **kw)
        assert out.n_accepted.tolist() == base.n_accepted.tolist()
        assert out.next_token.tolist() == base.next_token.tolist()


def test_kseq_accept_u_must_cover_every_chain() -> None:
    # SpecTr with 3 chains: the candidates after an acceptance are the children of every alive chain, so accept_u
    # needs one uniform per chain (3) at every node.
    p = torch.full((1, 4, 4), 0.25, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"Kmax>=3"):
        verify_tree(
            torch.tensor([[0, 1, 1, 2]]),
            torch.tensor([kseq_chain_parents(3, 1)]),
            p,
            p.clone(),
            method="kseq",
            accept_u=torch.zeros((1, 4, 2), dtype=torch.float64),
        )


OTHER_BACKENDS = [b for b in available_backends("verify_tree") if b != "torch"]


@pytest.mark.parametrize("backend", OTHER_BACKENDS)
@pytest.mark.parametrize("method", METHODS)
def test_backend_matches_reference(backend: str, method: str) -> None:
    rng = np.random.default_rng(21)
    inst = random_batch(rng, method, 4, 6, n_max=8)
    tokens, parent, valid, p_rows, q_rows, hub, u, fin = inst
    p32 = p_rows.astype(np.float32)
    q32 = q_rows.astype(np.float32)
    ref = run_op(method, tokens, parent, valid, p32, q32, hub, u, fin, eos_token_id=5, backend="torch")
    got = run_op(method, tokens, parent, valid, p32, q32, hub, u, fin, eos_token_id=5, backend=backend)
    assert torch.equal(got.n_accepted, ref.n_accepted)
    assert torch.equal(got.next_token, ref.next_token)
    assert torch.equal(got.accepted_rank, ref.accepted_rank)
    m = ref.n_accepted.numpy()
    assert path_tokens(tokens, got.accepted_nodes.numpy(), m) == path_tokens(tokens, ref.accepted_nodes.numpy(), m)


def test_given_depth_sizes_the_outputs_and_is_checked() -> None:
    """depth= (the driver passes its trees' depths) gives the verdict of the computed depths; a wrong depth is an
    error when validate is true."""
    rng = np.random.default_rng(5)
    arrays = random_batch(rng, "rrs", 64, 3)[:5]
    tokens, parent, valid, p_rows, q_rows = (torch.from_numpy(a) for a in arrays)
    depth = depth_from_parents(parent)
    kw = {"method": "rrs", "valid": valid, "seed": 7}
    want = verify_tree(tokens, parent, p_rows, q_rows, **kw)
    for validate in (True, False):
        got = verify_tree(tokens, parent, p_rows, q_rows, validate=validate, depth=depth, **kw)
        assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True))
    wrong = depth.clone()
    wrong[valid & (depth > 0)] += 1
    with pytest.raises(ValueError, match="depth must be the depth of each valid node"):
        verify_tree(tokens, parent, p_rows, q_rows, depth=wrong, **kw)
    with pytest.raises(ValueError, match="depth must have shape"):
        verify_tree(tokens, parent, p_rows, q_rows, depth=depth[:, :-1], **kw)


@pytest.mark.parametrize("method", METHODS)
def test_trusted_call_gives_the_validated_verdict(method: str) -> None:
    """validate=False (the driver's call: child counts and output length from host lists, depth given or not)
    returns exactly the verdict of the validated call on ragged batches, for every method."""
    rng = np.random.default_rng(11)
    for _ in range(6):
        tokens, parent, valid, p_rows, q_rows, hub, u, fin = random_batch(rng, method, 5, 6)
        ref = run_op(method, tokens, parent, valid, p_rows, q_rows, hub, u, fin)
        depth = depth_from_parents(torch.from_numpy(parent))
        for kw in ({}, {"depth": depth}):
            got = run_op(method, tokens, parent, valid, p_rows, q_rows, hub, u, fin, validate=False, **kw)
            for a, b in zip(got, ref, strict=True):
                assert torch.equal(a, b)


def test_trusted_call_still_rejects_a_parent_out_of_order() -> None:
    tokens, parent, valid, p_rows, q_rows, hub, u, fin = random_batch(np.random.default_rng(2), "rrs", 2, 5)
    parent[0, 1] = 5  # a valid node pointing past itself
    with pytest.raises(ValueError, match="valid node 1 has parent 5"):
        run_op("rrs", tokens, parent, valid, p_rows, q_rows, hub, u, fin, validate=False)
