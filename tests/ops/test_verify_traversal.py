"""Traversal verification (``verify_tree(..., method="traversal" | "traversalw")``): its law by exact enumeration,
the kernels against the independent float64 oracle ``specdec_kernels.testing.traversal``, and its negative controls.

* Law: the oracle's output law of one round, enumerated over every draft tree of a fixed shape (children i.i.d. or
  without replacement, laws that depend on the whole prefix) and continued by the target, equals the target's joint law
  within 1e-9.
* Kernel law: each backend's test probabilities are read off the kernel by bisection on its uniforms, and the law
  enumerated from them equals the target's within 1e-9 (float64 rows); the kernels' verdicts equal the oracle's under
  injected uniforms on ragged batches.
* Negative controls: the bonus token from the target's raw row instead of the updated residual, and (children drawn
  without replacement) the draft law kept after a rejection, miss the target law by more than 1e-3.
* Traversal keeps at least as many tokens as recursive rejection sampling on the same trees in expectation, strictly
  more on the cases below, and on a chain it is block verification, verdict for verdict. Greedy, it is the rrs / rrsw
  walk.

Deterministic: enumerations and seeded uniforms.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec_kernels import available_backends, verify_tree
from specdec_kernels.testing import block as B
from specdec_kernels.testing import traversal as T
from specdec_kernels.testing.oracles_tree import draw_tree, random_parents, rule_rrs, rule_rrsw
from specdec_kernels.trees import chain_parents

BACKENDS = [b for b in available_backends("verify_tree") if b not in ("triton", "cuda")]
METHOD = {False: "traversal", True: "traversalw"}
SHAPES = [((2, 2), False, 3, 0), ((2, 1), False, 3, 1), ((1, 1, 1), False, 3, 2), ((3, 1), False, 2, 3),
          ((2, 2), True, 3, 4), ((3, 1), True, 4, 5), ((2, 1, 1), True, 3, 6)]  # fmt: skip


def law_error(law: dict, q_of: B.Laws, depth: int, vocab: int) -> float:
    got = B.extended_law(law, q_of, depth + 1, vocab)
    return float(np.abs(got - B.target_law(q_of, depth + 1, vocab)).max())


@pytest.mark.parametrize(("shape", "swor", "vocab", "seed"), SHAPES)
def test_oracle_round_law_is_the_target_law(shape, swor: bool, vocab: int, seed: int) -> None:
    p_of, q_of = B.random_laws(vocab, seed)
    assert law_error(T.round_law(p_of, q_of, shape, vocab, swor=swor), q_of, len(shape), vocab) < 1e-9


@pytest.mark.parametrize(
    ("shape", "swor", "wrong"), [((2, 2), False, "raw_q"), ((2, 2), True, "raw_q"), ((2, 2), True, "no_removal")]
)
def test_negative_controls_fail(shape, swor: bool, wrong: str) -> None:
    p_of, q_of = B.random_laws(3, 0)
    law = T.round_law(p_of, q_of, shape, 3, swor=swor, wrong=wrong)
    assert law_error(law, q_of, len(shape), 3) > 1e-3


def rrs_expected(p_of: B.Laws, q_of: B.Laws, shape, vocab: int, swor: bool) -> float:
    """Mean tokens RRS (i.i.d.) / RRSw keeps on the trees of ``shape``: at each node its candidates are tried in order
    with the node chain of oracles_tree, and an accepted child's subtree is walked on."""
    rule = rule_rrsw if swor else rule_rrs

    def kept(m: int, kids: list[list[int]], toks: list[int], prefixes: list[tuple[int, ...]]) -> float:
        if not kids[m]:
            return 0.0
        tests, _ = rule([toks[c] for c in kids[m]], p_of(prefixes[m]), q_of(prefixes[m]))
        carry, out = 1.0, 0.0
        for j, den, num in tests:
            h = min(1.0, num / den) if den > 0 else float(num > 0)
            out += carry * h * (1.0 + kept(kids[m][j], kids, toks, prefixes))
            carry *= 1.0 - h
        return out

    total = 0.0
    for parent, toks, prefixes, prob in T._trees(p_of, shape, swor):
        kids = [[c for c in range(1, len(parent)) if parent[c] == m] for m in range(len(parent))]
        total += prob * kept(0, kids, toks, prefixes)
    return total


@pytest.mark.parametrize(("shape", "swor", "vocab", "seed"), SHAPES)
def test_traversal_keeps_at_least_as_many_tokens_as_rrs(shape, swor: bool, vocab: int, seed: int) -> None:
    p_of, q_of = B.random_laws(vocab, seed)
    traversal = T.expected_accepted(p_of, q_of, shape, vocab, swor=swor)
    rrs = rrs_expected(p_of, q_of, shape, vocab, swor)
    assert traversal >= rrs - 1e-12
    if max(shape) > 1 or len(shape) > 1:
        assert traversal > rrs + 1e-4


def test_on_a_chain_traversal_is_block_verification_in_expectation() -> None:
    p_of, q_of = B.random_laws(3, 2)
    assert T.expected_accepted(p_of, q_of, (1, 1, 1), 3, swor=False) == pytest.approx(
        B.expected_accepted(p_of, q_of, 3, 3), abs=1e-13
    )


# ---- the kernels ----


def every_tree(p_of: B.Laws, q_of: B.Laws, shape, swor: bool, dtype=torch.float64):
    trees = list(T._trees(p_of, shape, swor))
    tokens = torch.tensor([t for _, t, _, _ in trees], dtype=torch.long)
    parent = torch.tensor([par for par, _, _, _ in trees], dtype=torch.long)
    p_rows = torch.tensor(np.stack([[p_of(x) for x in pre] for _, _, pre, _ in trees]), dtype=dtype)
    q_rows = torch.tensor(np.stack([[q_of(x) for x in pre] for _, _, pre, _ in trees]), dtype=dtype)
    return trees, tokens, parent, p_rows, q_rows


def kernel_pass_probs(backend: str, method: str, tokens, parent, p_rows, q_rows) -> np.ndarray:
    """h[b, n]: the probability with which the kernel's test of node n passes, read by 53 halvings of n's uniform
    while every other uniform is the largest below 1 (which only a test of probability 1 passes)."""
    batch, n = tokens.shape
    h = np.ones((batch, n))
    fin = torch.full((batch, p_rows.shape[-1]), 0.5, dtype=torch.float64)
    top = 1.0 - 2.0**-53
    for node in range(1, n):
        lo, hi = torch.zeros(batch, dtype=torch.float64), torch.ones(batch, dtype=torch.float64)
        for _ in range(53):
            mid = (lo + hi) / 2
            u = torch.full((batch, n, 1), top, dtype=torch.float64)
            u[:, node, 0] = mid
            out = verify_tree(
                tokens, parent, p_rows, q_rows, method=method, accept_u=u, final_noise=fin, backend=backend
            )
            last = out.accepted_nodes.gather(1, (out.n_accepted - 1).clamp_min(0)[:, None]).squeeze(1)
            hit = (out.n_accepted > 0) & (last == node)
            lo, hi = torch.where(hit, mid, lo), torch.where(hit, hi, mid)
        h[:, node] = hi.numpy()
    return h


@pytest.mark.parametrize("backend", [*BACKENDS, "torch"])
@pytest.mark.parametrize(("shape", "swor", "seed"), [((2, 1), False, 1), ((2, 1), True, 2)])
def test_kernel_law_by_enumeration(backend: str, shape, swor: bool, seed: int) -> None:
    vocab = 3
    p_of, q_of = B.random_laws(vocab, seed)
    trees, tokens, parent, p_rows, q_rows = every_tree(p_of, q_of, shape, swor)
    h = kernel_pass_probs(backend, METHOD[swor], tokens, parent, p_rows, q_rows)
    law: dict[tuple[int, ...], float] = {}
    for b, (par, toks, prefixes, prob) in enumerate(trees):
        tests = T.walk_tests(par, toks, p_rows[b].numpy(), q_rows[b].numpy(), swor=swor)
        carry = 1.0
        for node, den, num, y_law in tests:
            if carry == 0.0:
                break
            oracle_h = 1.0 if node == 0 else min(1.0, num / den) if den > 0 else float(num > 0)
            assert h[b, node] == pytest.approx(oracle_h, abs=2e-15), (b, node)
            pa = carry * h[b, node]
            carry *= 1.0 - h[b, node]
            for y in np.flatnonzero(y_law > 0):
                key = (*prefixes[node], int(y))
                law[key] = law.get(key, 0.0) + prob * pa * y_law[y]
    assert law_error(law, q_of, len(shape), vocab) < 1e-9


def ragged_trees(batch: int, vocab: int, seed: int, swor: bool, dtype=torch.float64, closeness: float = 0.6):
    """A random level-order topology (at most 10 nodes, 3 children), children drawn from p as ``swor`` says, target
    rows near the draft's; random subtrees of each row cut off as padding, row 0 the root alone."""
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    parents = random_parents(rng, 10, 3)
    n = len(parents)
    zp = torch.randn((batch, n, vocab), generator=g, dtype=torch.float64) * 1.5
    zq = closeness * zp + (1 - closeness) * torch.randn((batch, n, vocab), generator=g, dtype=torch.float64) * 1.5
    p_rows, q_rows = torch.softmax(zp, -1).to(dtype), torch.softmax(zq, -1).to(dtype)
    tokens, valid, parent, _ = draw_tree("rrsw" if swor else "rrs", parents, p_rows, g, seed)
    # padding: random subtrees cut off, and row 0 holds the root alone
    drop = torch.rand((batch, n), generator=g) < 0.2
    drop[:, 0] = False
    drop[0, 1:] = True
    for c in range(1, n):
        valid[:, c] &= ~drop[:, c] & valid[:, parents[c]]
    parent = torch.where(valid, torch.tensor(parents).expand(batch, n), 0)
    parent[:, 0] = -1
    tokens = tokens.masked_fill(~valid, 0)
    u = torch.rand((batch, n, 1), generator=g, dtype=torch.float64)
    fin = torch.rand((batch, vocab), generator=g, dtype=torch.float64).clamp_min(2.0**-60)
    return tokens, parent, valid, p_rows, q_rows, u, fin


@pytest.mark.parametrize("backend", [*BACKENDS, "torch"])
@pytest.mark.parametrize("swor", [False, True])
@pytest.mark.parametrize(("vocab", "dtype"), [(5, torch.float64), (37, torch.float32), (300, torch.float32)])
def test_kernel_matches_the_oracle(backend: str, swor: bool, vocab: int, dtype) -> None:
    for seed in range(4):
        tokens, parent, valid, p_rows, q_rows, u, fin = ragged_trees(16, vocab, seed, swor, dtype)
        out = verify_tree(
            tokens, parent, p_rows, q_rows, method=METHOD[swor], valid=valid, accept_u=u, final_noise=fin,
            backend=backend,
        )  # fmt: skip
        nodes, n_acc, nxt, ranks = T.traversal_tree(
            tokens.numpy(), parent.numpy(), valid.numpy(), p_rows.double().numpy(), q_rows.double().numpy(),
            u.numpy(), fin.numpy(), swor=swor,
        )  # fmt: skip
        width = out.accepted_nodes.shape[1]
        assert out.n_accepted.tolist() == n_acc.tolist()
        assert out.next_token.tolist() == nxt.tolist()
        assert out.accepted_nodes.tolist() == nodes[:, :width].tolist()
        assert out.accepted_rank.tolist() == ranks[:, :width].tolist()


@pytest.mark.parametrize("backend", [*BACKENDS, "torch"])
def test_on_a_chain_traversal_is_block_verification(backend: str) -> None:
    g = torch.Generator().manual_seed(9)
    batch, n, vocab = 24, 6, 20
    z = torch.randn((batch, n, vocab), generator=g)
    p_rows, q_rows = torch.softmax(z, -1), torch.softmax(0.7 * z + 0.5 * torch.randn(z.shape, generator=g), -1)
    tokens, valid, parent, _ = draw_tree("sd", chain_parents(n - 1), p_rows, g, 0)
    for seed in range(3):
        kw = dict(valid=valid, seed=seed, backend=backend)
        a = verify_tree(tokens, parent, p_rows, q_rows, method="traversal", **kw)
        b = verify_tree(tokens, parent, p_rows, q_rows, method="block", **kw)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)


@pytest.mark.parametrize("backend", [*BACKENDS, "torch"])
@pytest.mark.parametrize("swor", [False, True])
def test_greedy_traversal_is_the_rrs_walk(backend: str, swor: bool) -> None:
    tokens, parent, valid, _, q_rows, _, _ = ragged_trees(16, 9, 4, swor, closeness=0.9)
    logits = torch.log(q_rows)
    a = verify_tree(tokens, parent, None, logits, method=METHOD[swor], valid=valid, greedy=True, backend=backend)
    b = verify_tree(
        tokens, parent, None, logits, method="rrsw" if swor else "rrs", valid=valid, greedy=True, backend=backend
    )
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("backend", [*BACKENDS, "torch"])
def test_accepted_eos_ends_the_row(backend: str) -> None:
    tokens, parent, valid, p_rows, q_rows, u, fin = ragged_trees(16, 6, 5, False)
    eos = 2
    out = verify_tree(
        tokens, parent, p_rows, q_rows, method="traversal", valid=valid, accept_u=u, final_noise=fin,
        eos_token_id=eos, backend=backend,
    )  # fmt: skip
    free = verify_tree(
        tokens, parent, p_rows, q_rows, method="traversal", valid=valid, accept_u=u, final_noise=fin, backend=backend
    )
    hits = 0
    for b in range(16):
        path = [int(tokens[b, m]) for m in free.accepted_nodes[b, : int(free.n_accepted[b])]]
        if eos in path:
            hits += 1
            assert int(out.n_accepted[b]) == path.index(eos) + 1 and int(out.next_token[b]) == -1
        else:
            assert int(out.n_accepted[b]) == len(path) and int(out.next_token[b]) == int(free.next_token[b])
    assert 0 < hits < 16  # both kinds of rows occur


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeded_noise_matches_the_reference(backend: str) -> None:
    for swor in (False, True):
        tokens, parent, valid, p_rows, q_rows, _, _ = ragged_trees(32, 41, 7, swor, torch.float32)
        kw = dict(method=METHOD[swor], valid=valid, seed=99)
        ref = verify_tree(tokens, parent, p_rows, q_rows, backend="torch", **kw)
        out = verify_tree(tokens, parent, p_rows, q_rows, backend=backend, **kw)
        for x, y in zip(out, ref, strict=True):
            assert torch.equal(x, y)


def test_traversalw_needs_distinct_siblings() -> None:
    tokens = torch.tensor([[0, 1, 1]])
    parent = torch.tensor([[-1, 0, 0]])
    rows = torch.full((1, 3, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="method 'traversalw' needs distinct siblings"):
        verify_tree(tokens, parent, rows, rows, method="traversalw", seed=0)
    verify_tree(tokens, parent, rows, rows, method="traversal", seed=0)  # i.i.d. children may repeat
