"""verify_chain (chain SD, greedy, EOS, CS Drafting's lenient review): fp64 oracle with injected noise, output law,
ragged lengths, EOS, greedy, leniency, bad inputs, reproducibility, backend parity. The law a lenient review emits
is tested in test_emission_law.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec_kernels import available_backends, verify_chain
from specdec_kernels.testing.oracles_tree import residual, sample_gumbel_max
from specdec_kernels.testing.stats import law_check, rate_tolerance

# Semantics run on every backend that is fast on CPU; the Triton interpreter is covered by the parity tests.
BACKENDS = [b for b in available_backends("verify_chain") if b != "triton"]


def chain_oracle(draft, p, q, lengths, u, fin, eos=(), leniency=1.0):
    """Chain SD in fp64 NumPy: accept x_j iff U_j p_j(x_j) < l q_j(x_j) (l = 1: plain SD; l > 1: CS Drafting's
    lenient review); correction ~ res(q_j, p_j); bonus ~ q_{L+1}; stop after an accepted EOS with no extra token."""
    n_acc, nxt = [], []
    for b in range(draft.shape[0]):
        out = None
        j = 0
        while j < lengths[b]:
            x = draft[b, j]
            if not u[b, j] * p[b, j, x] < leniency * q[b, j, x]:
                out = sample_gumbel_max(residual(q[b, j], p[b, j]), fin[b])
                break
            j += 1
            if x in eos:
                out = -1
                break
        if out is None:
            out = sample_gumbel_max(q[b, j], fin[b])
        n_acc.append(j)
        nxt.append(out)
    return np.array(n_acc), np.array(nxt)


def random_law(rng: np.random.Generator, v: int, zero_frac: float = 0.2) -> np.ndarray:
    x = rng.dirichlet(np.full(v, 0.7))
    x[rng.random(v) < zero_frac] = 0.0
    if x.sum() == 0:
        x[rng.integers(v)] = 1.0
    return x / x.sum()


def random_chain(rng: np.random.Generator, batch: int, length: int, vocab: int):
    """Draft tokens really sampled from their p rows; q rows include p = q rows and zeros."""
    p = np.stack([[random_law(rng, vocab) for _ in range(length)] for _ in range(batch)]).reshape(batch, length, vocab)
    q = np.stack([[random_law(rng, vocab) for _ in range(length + 1)] for _ in range(batch)])
    same = rng.random((batch, length)) < 0.2
    q[:, :length][same] = p[same]
    draft = np.array([[rng.choice(vocab, p=p[b, j]) for j in range(length)] for b in range(batch)], dtype=np.int64)
    lengths = rng.integers(0, length + 1, size=batch)
    u = rng.random((batch, length))
    fin = rng.random((batch, vocab)) * (1 - 2e-12) + 1e-12
    return draft, p, q, lengths, u, fin


def as_t(*arrays, dtype=torch.float64):
    return [torch.from_numpy(a) if a.dtype == np.int64 else torch.from_numpy(a).to(dtype) for a in arrays]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("batch", "vocab", "length"), [(1, 3, 1), (99, 5, 4), (64, 111, 3), (3, 32000, 2)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_fp64_oracle_with_injected_noise(
    batch: int, vocab: int, length: int, dtype: torch.dtype, backend: str
) -> None:
    rng = np.random.default_rng(vocab * 10 + length)
    draft, p, q, lengths, u, fin = random_chain(rng, batch, length, vocab)
    if dtype == torch.float32:  # the oracle sees exactly the values the op sees
        p, q = p.astype(np.float32).astype(np.float64), q.astype(np.float32).astype(np.float64)
    td, tp, tq, tl = as_t(draft, p, q, lengths, dtype=dtype)
    res = verify_chain(
        td, tp, tq, lengths=tl, accept_u=torch.from_numpy(u), final_noise=torch.from_numpy(fin), backend=backend
    )
    n_acc, nxt = chain_oracle(draft, p, q, lengths, u, fin)
    assert res.n_accepted.tolist() == n_acc.tolist()
    assert res.next_token.tolist() == nxt.tolist()
    assert res.n_accepted.dtype == torch.int64 and res.next_token.dtype == torch.int64


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("leniency", [1.5, 2.0, 7.0])
@pytest.mark.parametrize(("batch", "vocab", "length"), [(1, 3, 1), (99, 5, 4), (3, 32000, 2)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_lenient_review_matches_fp64_oracle(
    batch: int, vocab: int, length: int, dtype: torch.dtype, backend: str, leniency: float
) -> None:
    """leniency l: accept iff U p(x) < l q(x) (l q(x) in float64), the correction still from res(q, p)."""
    rng = np.random.default_rng(vocab * 10 + length + int(leniency))
    draft, p, q, lengths, u, fin = random_chain(rng, batch, length, vocab)
    if dtype == torch.float32:
        p, q = p.astype(np.float32).astype(np.float64), q.astype(np.float32).astype(np.float64)
    td, tp, tq, tl = as_t(draft, p, q, lengths, dtype=dtype)
    kw = {"lengths": tl, "accept_u": torch.from_numpy(u), "final_noise": torch.from_numpy(fin), "backend": backend}
    res = verify_chain(td, tp, tq, leniency=leniency, **kw)
    n_acc, nxt = chain_oracle(draft, p, q, lengths, u, fin, leniency=leniency)
    assert res.n_accepted.tolist() == n_acc.tolist() and res.next_token.tolist() == nxt.tolist()
    exact = verify_chain(td, tp, tq, **kw)  # a lenient review accepts at least as much as the exact one
    assert bool((res.n_accepted >= exact.n_accepted).all())
    assert bool((res.n_accepted > exact.n_accepted).any()) or batch < 10


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_lenient_rule(backend: str) -> None:
    """Greedy with l > 1 (the authors' rule, on temperature-1 laws): x is accepted iff x == argmax q or
    p(x) < l q(x); the correction and the bonus are argmax q; l = 1 ignores p."""
    p = torch.tensor([[[0.1, 0.6, 0.3], [0.2, 0.2, 0.6], [0.5, 0.25, 0.25]]], dtype=torch.float64)
    q = torch.tensor([[[0.5, 0.35, 0.15], [0.1, 0.6, 0.3], [0.7, 0.2, 0.1], [0.2, 0.3, 0.5]]], dtype=torch.float64)
    draft = torch.tensor([[1, 2, 0]])
    # position 0: token 1, not argmax; 0.6 < l * 0.35 iff l > 1.714...; position 1: 0.6 < l * 0.3 iff l > 2
    cases = [(1.0, 0, 0), (1.5, 0, 0), (1.8, 1, 1), (2.5, 3, 2)]
    for leniency, n_acc, nxt in cases:
        res = verify_chain(draft, p, q, greedy=True, leniency=leniency, backend=backend)
        assert (res.n_accepted.tolist(), res.next_token.tolist()) == ([n_acc], [nxt]), leniency
    assert verify_chain(draft, None, q.log(), greedy=True, backend=backend).n_accepted.tolist() == [0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_position_output_law_and_acceptance_rate(backend: str) -> None:
    """Monte Carlo at one position: the emitted token ~ q and P(accept) = sum min(p, q). N = 20k rows;
    chi-square false-alarm rate 1e-4."""
    n, vocab = 20_000, 5
    p = np.array([0.4, 0.3, 0.2, 0.1, 0.0])
    q = np.array([0.1, 0.2, 0.3, 0.25, 0.15])
    g = torch.Generator().manual_seed(7)
    draft = torch.multinomial(torch.from_numpy(p).expand(n, -1), 1, replacement=True, generator=g)
    tp = torch.from_numpy(p).expand(n, 1, -1)
    tq = torch.from_numpy(q).expand(n, 2, -1)
    res = verify_chain(draft, tp, tq, generator=g, backend=backend)
    first = torch.where(res.n_accepted > 0, draft[:, 0], res.next_token).numpy()
    check = law_check(np.bincount(first, minlength=vocab), q, max_tv=0.02)
    assert check.ok, check
    alpha = float(np.minimum(p, q).sum())
    rate = float(res.n_accepted.double().mean())
    assert abs(rate - alpha) <= rate_tolerance(alpha, n)


@pytest.mark.parametrize("backend", BACKENDS)
def test_eos_stops_without_bonus(backend: str) -> None:
    # u = 0 accepts every drafted token with q > 0; token 2 is EOS.
    p = torch.full((3, 3, 4), 0.25, dtype=torch.float64)
    q = torch.full((3, 4, 4), 0.25, dtype=torch.float64)
    draft = torch.tensor([[1, 2, 3], [1, 1, 1], [2, 0, 0]])
    u = torch.zeros((3, 3), dtype=torch.float64)
    res = verify_chain(draft, p, q, accept_u=u, eos_token_id=2, seed=0, backend=backend)
    assert res.n_accepted.tolist() == [2, 3, 1]
    assert res.next_token[0] == -1 and res.next_token[2] == -1  # stopped at the accepted EOS
    assert 0 <= int(res.next_token[1]) < 4  # no EOS: bonus token
    # EOS given as a list of ids; a rejected EOS (q(eos) = 0) is just a rejection followed by a correction.
    q2 = q[:1, :2].clone()
    q2[0, 0] = torch.tensor([0.0, 0.5, 0.5, 0.0], dtype=torch.float64)
    res = verify_chain(
        torch.tensor([[3]]), p[:1, :1], q2, accept_u=u[:1, :1], eos_token_id=[2, 3], seed=0, backend=backend
    )
    assert res.n_accepted.tolist() == [0]
    assert int(res.next_token[0]) in (1, 2)  # a sample of res(q, p) = Norm[(q - p)^+]


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_target_probability_is_never_accepted(backend: str) -> None:
    # Division-free test (sglang #35771): even U = 0 rejects a token with q(x) = 0.
    p = torch.tensor([[[0.5, 0.5]]], dtype=torch.float64)
    q = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]], dtype=torch.float64)
    res = verify_chain(
        torch.tensor([[1]]), p, q, accept_u=torch.zeros((1, 1), dtype=torch.float64), seed=1, backend=backend
    )
    assert res.n_accepted.tolist() == [0] and res.next_token.tolist() == [0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_p_equal_q_accepts_everything(backend: str) -> None:
    p = torch.softmax(torch.randn(4, 3, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64), -1)
    q = torch.cat([p, p[:, :1]], dim=1)
    draft = torch.multinomial(p.reshape(-1, 6), 1, generator=torch.Generator().manual_seed(1)).reshape(4, 3)
    u = torch.full((4, 3), 1 - 2**-40, dtype=torch.float64)
    assert verify_chain(draft, p, q, accept_u=u, seed=2, backend=backend).n_accepted.tolist() == [3, 3, 3, 3]


@pytest.mark.parametrize("backend", BACKENDS)
def test_ragged_lengths_ignore_unused_rows(backend: str) -> None:
    """Rows beyond lengths[b] are never read: they may hold out-of-range ids and non-normalized p rows."""
    rng = np.random.default_rng(3)
    draft, p, q, _, u, fin = random_chain(rng, 4, 3, 5)
    lengths = np.array([0, 1, 3, 2])
    n_acc, nxt = chain_oracle(draft, p, q, lengths, u, fin)
    draft[0, :] = 99
    draft[3, 2] = -5
    p[0] = np.nan
    p[3, 2] = 7.0
    td, tp, tq, tl = as_t(draft, p, q, lengths)
    res = verify_chain(
        td, tp, tq, lengths=tl, accept_u=torch.from_numpy(u), final_noise=torch.from_numpy(fin), backend=backend
    )
    assert res.n_accepted.tolist() == n_acc.tolist()
    assert res.next_token.tolist() == nxt.tolist()
    assert int(res.n_accepted[0]) == 0  # length 0: the bonus is a plain sample of q row 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_mode(backend: str) -> None:
    # Logits, -inf allowed, p unused (None); ties in argmax go to the lowest id.
    q = torch.tensor(
        [[[0.0, 2.0, 1.0, 2.0], [3.0, -1.0, float("-inf"), 0.0], [0.0, 0.0, 5.0, 0.0]]], dtype=torch.float32
    )
    cases = [([1, 0], None, 2, 2), ([3, 0], None, 0, 1), ([1, 2], None, 1, 0), ([1, 0], 0, 2, -1)]
    for draft, eos, n_acc, nxt in cases:
        res = verify_chain(torch.tensor([draft]), None, q, greedy=True, eos_token_id=eos, backend=backend)
        assert (res.n_accepted.tolist(), res.next_token.tolist()) == ([n_acc], [nxt]), draft


def test_reproducible_by_seed() -> None:
    rng = np.random.default_rng(4)
    draft, p, q, lengths, _, _ = random_chain(rng, 200, 3, 6)
    args = as_t(draft, p, q)
    a = verify_chain(*args, seed=11)
    b = verify_chain(*args, seed=11)
    c = verify_chain(*args, seed=12)
    assert torch.equal(a.n_accepted, b.n_accepted) and torch.equal(a.next_token, b.next_token)
    assert not (torch.equal(a.n_accepted, c.n_accepted) and torch.equal(a.next_token, c.next_token))
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(verify_chain(*args, generator=g1).next_token, verify_chain(*args, generator=g2).next_token)


def good():
    p = torch.full((2, 3, 5), 0.2, dtype=torch.float64)
    q = torch.full((2, 4, 5), 0.2, dtype=torch.float64)
    return {"draft": torch.zeros((2, 3), dtype=torch.long), "p": p, "q": q}


def with_value(name: str, index, value):
    def make():
        args = good()
        t = args[name].clone()
        t[index] = value
        args[name] = t
        return args

    return make


def change(**kw):
    return lambda: good() | kw


BAD = [
    (change(draft=[[0, 0, 0]]), TypeError, "draft must be a torch.Tensor"),
    (change(draft=torch.zeros(3, dtype=torch.long)), ValueError, "draft must have 2 dimensions"),
    (change(draft=torch.zeros((2, 3))), TypeError, "draft must be an integer tensor"),
    (change(q=torch.full((2, 4), 0.2)), ValueError, "q must have 3 dimensions"),
    (change(q=torch.full((2, 3, 5), 0.2)), ValueError, r"q must have shape \(B, L\+1, V\) = \(2, 4, V\)"),
    (change(q=torch.ones((2, 4, 5), dtype=torch.long)), TypeError, "q must be a floating-point tensor"),
    (change(lengths=torch.tensor([1.0, 2.0])), TypeError, "lengths must be an integer tensor"),
    (change(lengths=torch.tensor([1, 2, 3])), ValueError, r"lengths must have shape \(2,\)"),
    (change(lengths=torch.tensor([4, 1])), ValueError, r"lengths must be in \[0, L=3\]"),
    (change(lengths=torch.tensor([-1, 1])), ValueError, r"lengths must be in \[0, L=3\]"),
    (with_value("draft", (1, 2), 5), ValueError, r"draft must hold token ids in \[0, 5\)"),
    (change(p=None), ValueError, "p is required unless greedy=True"),
    (change(p=torch.full((2, 3), 0.2)), ValueError, "p must have 3 dimensions"),
    (change(p=torch.ones((2, 3, 5), dtype=torch.long)), TypeError, "p must be a floating-point tensor"),
    (change(p=torch.full((2, 3, 4), 0.25)), ValueError, "p and q must share the vocabulary size"),
    (change(p=torch.full((2, 2, 5), 0.2)), ValueError, r"p must have shape \(2, 3, 5\)"),
    (with_value("p", (0, 1, 1), 0.7), ValueError, r"p \(rows in use\) rows must sum to 1"),
    (with_value("q", (1, 3, 0), float("nan")), ValueError, r"q \(rows in use\) contains NaN or inf"),
    (with_value("q", (0, 0, 0), -0.2), ValueError, r"q \(rows in use\) contains negative probabilities"),
    (
        lambda: good() | {"p": torch.tensor([[0.0, 0.25, 0.25, 0.25, 0.25]] * 3, dtype=torch.float64).expand(2, 3, 5)},
        ValueError,
        "a valid candidate has zero draft probability under p",
    ),
    (change(accept_u=torch.zeros((2, 2), dtype=torch.float64)), ValueError, r"accept_u must have shape \(2, 3\)"),
    (change(accept_u=torch.ones((2, 3), dtype=torch.float64)), ValueError, r"accept_u must hold uniforms in \[0, 1\)"),
    (
        change(final_noise=torch.zeros((2, 5), dtype=torch.float64)),
        ValueError,
        r"final_noise must hold uniforms in \(0, 1\)",
    ),
    (change(eos_token_id=5), ValueError, r"eos_token_id must be token ids in \[0, 5\)"),
    (change(seed=1, generator=torch.Generator()), ValueError, "pass either generator= or seed=, not both"),
    (change(seed=1.5), TypeError, "seed must be an int"),
    (
        lambda: good() | {"p": None, "greedy": True, "q": torch.full((2, 4, 5), float("nan"))},
        ValueError,
        r"q \(rows in use\) contains NaN",
    ),
    (
        lambda: good() | {"p": None, "greedy": True, "q": torch.full((2, 4, 5), float("-inf"))},
        ValueError,
        r"q \(rows in use\) has a row where every entry is -inf",
    ),
    (change(eos_token_id=2.7), ValueError, "eos_token_id must be a token id, a list of them or an integer tensor"),
    (change(leniency=0.9), ValueError, r"leniency must be a finite number >= 1 \(1 = exact review\), got 0.9"),
    (change(leniency=float("nan")), ValueError, "leniency must be a finite number >= 1"),
    (change(leniency=None), TypeError, "leniency must be a number >= 1, got NoneType"),
    (change(p=None, greedy=True, leniency=2.0), ValueError, "p is required with greedy=True and leniency > 1"),
    (
        change(greedy=True, leniency=2.0, q=torch.zeros((2, 4, 5))),
        ValueError,
        r"q \(rows in use\) rows must sum to 1",
    ),
]


@pytest.mark.parametrize(("make", "exc", "match"), BAD, ids=[b[2][:48] for b in BAD])
def test_bad_inputs(make, exc, match) -> None:
    args = make()
    with pytest.raises(exc, match=match):
        verify_chain(args.pop("draft"), args.pop("p"), args.pop("q"), **args)


def test_empty_chains_and_numpy_eos_ids() -> None:
    """A chain of length 0 verifies to the target's own token (sampling and greedy); numpy ints are token ids."""
    q = torch.softmax(torch.randn((2, 1, 5), generator=torch.Generator().manual_seed(0)), -1)
    draft = torch.zeros((2, 0), dtype=torch.long)
    for greedy in (False, True):
        out = verify_chain(draft, torch.zeros((2, 0, 5)), q, greedy=greedy, seed=0)
        assert out.n_accepted.tolist() == [0, 0] and all(0 <= t < 5 for t in out.next_token.tolist())
    out = verify_chain(draft, None, q, greedy=True, eos_token_id=np.int64(3))
    assert out.next_token.tolist() == q[:, 0].argmax(-1).tolist()


OTHER_BACKENDS = [b for b in available_backends("verify_chain") if b != "torch"]


@pytest.mark.parametrize("backend", OTHER_BACKENDS)
@pytest.mark.parametrize("greedy", [False, True])
def test_backend_matches_reference(backend: str, greedy: bool) -> None:
    rng = np.random.default_rng(9)
    draft, p, q, lengths, u, fin = random_chain(rng, 6, 3, 7)
    td, tp, tq, tl = as_t(draft, p, q, lengths, dtype=torch.float32)
    if greedy:
        tp, tq = None, torch.log(tq)
    kw = {"lengths": tl, "accept_u": torch.from_numpy(u), "final_noise": torch.from_numpy(fin), "greedy": greedy}
    ref = verify_chain(td, tp, tq, eos_token_id=3, backend="torch", **kw)
    got = verify_chain(td, tp, tq, eos_token_id=3, backend=backend, **kw)
    assert torch.equal(got.n_accepted, ref.n_accepted) and torch.equal(got.next_token, ref.next_token)
    tp, tq = as_t(p, q, dtype=torch.float32)  # lenient: probability rows in both modes
    ref = verify_chain(td, tp, tq, eos_token_id=3, backend="torch", leniency=2.0, **kw)
    got = verify_chain(td, tp, tq, eos_token_id=3, backend=backend, leniency=2.0, **kw)
    assert torch.equal(got.n_accepted, ref.n_accepted) and torch.equal(got.next_token, ref.next_token)
