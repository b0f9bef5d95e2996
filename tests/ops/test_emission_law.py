"""emission_law (CS Drafting's lenient review, spec section 6.4): the law of the token a review with leniency l
emits, against an fp64 enumeration over the candidate; the law the lenient verify_chain really emits (Monte Carlo);
the exact output law of whole two- and three-level cascades by enumeration (l = 1 and l = 2), with the negative
control that hands the reviewer's row up instead of E; properties; bad inputs.

Statistics: chi-square at a false-alarm rate of 1e-4 per check (specdec_kernels.testing.stats), 5 checks of a correct
law in this file (the lenient review at two leniencies on two backends, the toy cascade loop), so a spurious failure
has probability below 5e-4 per run; seeds are fixed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec_kernels import available_backends, emission_law, verify_chain
from specdec_kernels.testing import toy, toy_grown
from specdec_kernels.testing.cascade import ToyCascade, emission_law_np, first_tokens_law
from specdec_kernels.testing.stats import law_check

BACKENDS = [b for b in available_backends("emission_law") if b != "triton"]  # triton: tests/triton
LENIENCIES = (1.0, 1.5, 2.0, 3.0)


def random_law(rng: np.random.Generator, v: int, zero_frac: float = 0.25) -> np.ndarray:
    x = rng.dirichlet(np.full(v, 0.6))
    x[rng.random(v) < zero_frac] = 0.0
    if x.sum() == 0:
        x[rng.integers(v)] = 1.0
    return x / x.sum()


def instances(rng: np.random.Generator, rows: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    """p, q [rows, v]: random laws with zeros, and on purpose p = q rows, one-hot p rows (Max-Gram's) and rows where
    q is nearly p (the zero-mass rule)."""
    p = np.stack([random_law(rng, v) for _ in range(rows)])
    q = np.stack([random_law(rng, v) for _ in range(rows)])
    if rows >= 4:
        q[0] = p[0]
        p[1] = np.eye(v)[rng.integers(v)]
        p[2] = np.eye(v)[int(np.argmax(q[2]))]
        q[3] = p[3].copy()
        i, j = np.argsort(q[3])[-2:]
        q[3, i] += 1e-14
        q[3, j] -= 1e-14
    return p, q


# ---- 1. exactness against the fp64 enumeration --------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("leniency", LENIENCIES)
@pytest.mark.parametrize(("rows", "vocab"), [(1, 2), (8, 3), (99, 5), (6, 7)])
def test_fp64_equals_the_enumerated_emission(backend: str, leniency: float, rows: int, vocab: int) -> None:
    """E(v) = sum_x p(x) [a(x) [v = x] + (1 - a(x)) res(q, p)(v)], a(x) = min(1, l q(x) / p(x)), to 1e-12."""
    rng = np.random.default_rng(rows * 100 + vocab)
    p, q = instances(rng, rows, vocab)
    got = emission_law(torch.from_numpy(p), torch.from_numpy(q), leniency, backend=backend)
    assert got.dtype == torch.float64 and got.shape == (rows, vocab)
    want = np.stack([emission_law_np(p[r], q[r], leniency) for r in range(rows)])
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vocab", [7, 111, 32000, 49152])
@pytest.mark.parametrize("leniency", [1.0, 2.0])
def test_fp32_within_its_rounding_budget(backend: str, vocab: int, leniency: float) -> None:
    """fp32 rows: the result is within a few fp32 ulps of the fp64 evaluation of the same fp32 inputs (the budget
    is earned from the reference's own error: 4x it plus 2 ulps of the largest entry)."""
    g = torch.Generator().manual_seed(vocab)
    z = torch.randn((3, 4, vocab), generator=g) * 3
    p = torch.softmax(z, -1)
    q = torch.softmax(z + torch.randn(z.shape, generator=g), -1)
    exact = emission_law(p.double(), q.double(), leniency, backend="torch")
    ref = emission_law(p, q, leniency, backend="torch")
    got = emission_law(p, q, leniency, backend=backend)
    assert got.dtype == torch.float32 and got.shape == p.shape
    ref_err = float((ref.double() - exact).abs().max())
    budget = 4 * ref_err + 2 * torch.finfo(torch.float32).eps * float(exact.max())
    assert float((got.double() - exact).abs().max()) <= budget


@pytest.mark.parametrize("backend", BACKENDS)
def test_leading_dimensions_and_mixed_dtypes(backend: str) -> None:
    rng = np.random.default_rng(1)
    p, q = instances(rng, 24, 6)
    tp, tq = torch.from_numpy(p).reshape(2, 3, 4, 6), torch.from_numpy(q).reshape(2, 3, 4, 6)
    flat = emission_law(tp.reshape(-1, 6), tq.reshape(-1, 6), 2.0, backend=backend)
    assert torch.equal(emission_law(tp, tq, 2.0, backend=backend), flat.reshape(2, 3, 4, 6))
    single = emission_law(tp[0, 0, 0], tq[0, 0, 0], 2.0, backend=backend)
    assert single.shape == (6,) and torch.equal(single, flat[0])
    mixed = emission_law(tp.float(), tq, 2.0, backend=backend)  # a float64 input makes the compute dtype float64
    assert mixed.dtype == torch.float64
    for dtype in (torch.bfloat16, torch.float16):
        low = emission_law(tp.to(dtype), tq.to(dtype), 1.5, validate=False, backend=backend)
        want = emission_law(tp.to(dtype).float(), tq.to(dtype).float(), 1.5, validate=False, backend="torch")
        assert low.dtype == torch.float32 and torch.allclose(low, want, atol=1e-6)


# ---- 2. distributions -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("leniency", [1.5, 2.0])
def test_the_lenient_review_emits_the_emission_law(backend: str, leniency: float) -> None:
    """Monte Carlo, N = 40000 one-position chains: x ~ p, verify_chain(..., leniency=l) against q; the emitted token
    (x if accepted, else the correction) follows emission_law(p, q, l) (chi-square p >= 1e-4) and not q (the
    reviewer's row, which a cascade must not hand up: p < 1e-12 on this instance, whose exact TV from q is 0.25
    at l = 2 and 0.20 at l = 1.5)."""
    n = 40_000
    p = np.array([0.45, 0.3, 0.15, 0.1, 0.0])
    q = np.array([0.3, 0.1, 0.2, 0.2, 0.2])
    g = torch.Generator().manual_seed(int(10 * leniency))
    tp = torch.from_numpy(p)
    draft = torch.multinomial(tp.expand(n, -1), 1, replacement=True, generator=g)
    res = verify_chain(draft, tp.expand(n, 1, -1), torch.from_numpy(q).expand(n, 2, -1), generator=g,
                       leniency=leniency, backend=backend)  # fmt: skip
    emitted = torch.where(res.n_accepted > 0, draft[:, 0], res.next_token).numpy()
    counts = np.bincount(emitted, minlength=5)
    e = emission_law(tp, torch.from_numpy(q), leniency, backend=backend).numpy()
    assert abs(0.5 * np.abs(e - q).sum() - {1.5: 0.2, 2.0: 0.25}[leniency]) < 1e-12
    check = law_check(counts, e, max_tv=0.02)
    assert check.ok, check
    wrong = law_check(counts, q, max_tv=0.02)
    assert wrong.p_value < 1e-12, wrong


def _cascade_cases() -> list:
    spec, peaked = toy.SPEC_TOY, toy.PEAKED_TOY
    two = ToyCascade(spec.target.numpy(), [spec.draft.numpy()], spec.draft.numpy().argmax(1), [[2, 0], [0, 2]], [1], 2)
    three = ToyCascade(
        spec.target.numpy(),
        [spec.draft.numpy(), peaked.draft.numpy()],
        peaked.draft.numpy().argmax(1),
        [[2, 1, 0], [0, 2, 0], [0, 0, 2]],
        [1, 1],
        2,
    )
    ragged = toy.RAGGED_TOY
    zeros = ToyCascade(ragged.target.numpy(), [ragged.draft.numpy()], np.array([1, 3, 0, 2]), [[1, 2], [0, 3]], [1], 3)
    return [("two levels", two), ("three levels", three), ("zeros, horizontal", zeros)]


def _with_leniency(c: ToyCascade, leniency: float) -> ToyCascade:
    return ToyCascade(c.target, c.reviewers, c.table, c.steps, [leniency] * len(c.reviewers), c.proposal)


def _op_law_up(p: np.ndarray, q: np.ndarray, leniency: float) -> np.ndarray:
    return emission_law(torch.from_numpy(p), torch.from_numpy(q), leniency, backend="torch").numpy()


@pytest.mark.parametrize("leniency", [1.0, 2.0])
@pytest.mark.parametrize("case", _cascade_cases(), ids=lambda c: c[0])
def test_cascade_output_law_by_enumeration(case, leniency: float) -> None:
    """Every acceptance, correction and bonus draw of the round enumerated (the drafters' blocks, the inner lenient
    reviews, the target's review): with the op's E handed up, the first two tokens follow q(y1) q(y2 | y1) to 1e-12,
    from every start token."""
    name, base = case
    c = _with_leniency(base, leniency)
    model = toy.ToyModel(torch.from_numpy(c.target), torch.from_numpy(c.target))
    for start in range(c.vocab):
        law = first_tokens_law(c, start, _op_law_up)
        np.testing.assert_allclose(law, toy.joint_law(model, 2, start), rtol=0, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("case", _cascade_cases(), ids=lambda c: c[0])
def test_cascade_handing_up_the_reviewer_row_is_biased_at_leniency_2(case) -> None:
    """Negative control (the authors' code): the reviewer's row q_j handed up instead of E_j. Exact at l = 1 (E = q
    there), biased at l = 2: TV from the target law above 0.05 from some start token."""
    name, base = case
    reviewer_row = lambda p, q, leniency: q  # noqa: E731
    model = toy.ToyModel(torch.from_numpy(base.target), torch.from_numpy(base.target))
    tvs = []
    for leniency in (1.0, 2.0):
        c = _with_leniency(base, leniency)
        tv = max(
            0.5 * float(np.abs(first_tokens_law(c, s, reviewer_row) - toy.joint_law(model, 2, s)).sum())
            for s in range(c.vocab)
        )
        tvs.append(tv)
    assert tvs[0] < 1e-12 and tvs[1] > 0.05, (name, tvs)


def test_toy_cascade_loop_keeps_the_target_law() -> None:
    """The two-level cascade run as a loop of the public ops (toy_grown.cascade, l = 2, Monte Carlo N = 20000) follows
    the target's law of the first two tokens; the same loop handing up the reviewer's rows fails (p < 1e-12)."""
    check = toy.check_first_tokens(toy.SPEC_TOY, toy_grown.cascade(2, 2, 2.0), 20_000, seed=3, max_tv=0.03)
    assert check.ok, check
    wrong = toy.check_first_tokens(
        toy.SPEC_TOY, toy_grown.cascade(2, 2, 2.0, reviewer_row=True), 20_000, seed=3, max_tv=0.03
    )
    assert not wrong.ok and wrong.p_value < 1e-12, wrong


def test_toy_cascade_loop_greedy_is_target_greedy() -> None:
    model = toy.random_toy(12, seed=5)
    start = torch.arange(12).repeat(2)
    for leniency in (1.0, 2.0):
        run = toy.generate(model, toy_grown.cascade(3, 3, leniency, greedy=True), len(start), seed=0, n_tokens=20,
                           start=start)  # fmt: skip
        assert (run.tokens == toy.target_greedy(model, start, 20)).all()


# ---- 3. properties ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_properties(backend: str) -> None:
    rng = np.random.default_rng(7)
    p, q = instances(rng, 200, 6)
    tp, tq = torch.from_numpy(p), torch.from_numpy(q)
    for leniency in LENIENCIES:
        e = emission_law(tp, tq, leniency, backend=backend)
        assert torch.allclose(e.sum(-1), torch.ones(200, dtype=torch.float64), atol=1e-12)
        assert bool((e >= torch.minimum(tp, leniency * tq) - 1e-15).all())  # every kept candidate stays
        assert bool((e[tq == 0] <= tp[tq == 0] + 1e-15).all())  # mass at q = 0 only from kept candidates
    assert torch.allclose(emission_law(tp, tq, 1.0, backend=backend), tq, atol=1e-12)  # l = 1: E = q
    assert torch.equal(emission_law(tp, tp, 2.5, backend=backend), tp)  # p = q: nothing is rejected
    # l q >= p everywhere: every candidate is kept and E = p
    big = emission_law(tp, tq, 1e6, backend=backend)
    covered = ((1e6 * tq) >= tp).all(-1)
    assert torch.allclose(big[covered], tp[covered], atol=1e-12)
    # a point mass (Max-Gram) on x: kept with probability min(1, l q(x))
    x = rng.integers(6, size=200)
    one_hot = torch.from_numpy(np.eye(6)[x])
    e = emission_law(one_hot, tq, 2.0, backend=backend)
    keep = torch.clamp(2.0 * tq[torch.arange(200), torch.from_numpy(x)], max=1.0)
    assert torch.allclose(e[torch.arange(200), torch.from_numpy(x)], keep, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_mass_residual_falls_back_to_q(backend: str) -> None:
    """q equals p up to 1e-9 (below the fp32 zero-mass tolerance 1e-6): the correction law is q itself, as in the
    verifier, so E = min(p, l q) + r q."""
    p = torch.tensor([[0.5, 0.3, 0.2]])
    q = p + torch.tensor([[1e-9, -1e-9, 0.0]])
    e = emission_law(p, q, 1.5, backend=backend)
    lq = torch.tensor(1.5) * q
    want = torch.minimum(p, lq) + (p - lq).clamp_min(0).sum(-1, keepdim=True) * q
    assert torch.equal(e, want)


def test_deterministic_and_bitwise_reproducible() -> None:
    rng = np.random.default_rng(9)
    p, q = (torch.from_numpy(a).float() for a in instances(rng, 50, 9))
    for backend in BACKENDS:
        assert torch.equal(emission_law(p, q, 2.0, backend=backend), emission_law(p, q, 2.0, backend=backend))


# ---- 4. bad inputs -----------------------------------------------------------------------------------------------


def good() -> dict:
    return {"p": torch.full((2, 5), 0.2), "q": torch.full((2, 5), 0.2)}


def change(**kw):
    return lambda: good() | kw


def with_value(name: str, index, value):
    def make():
        args = good()
        t = args[name].clone()
        t[index] = value
        args[name] = t
        return args

    return make


BAD = [
    (change(p=[[0.5, 0.5]]), TypeError, "p must be a torch.Tensor"),
    (change(q=torch.ones((2, 5), dtype=torch.long)), TypeError, "q must be a floating-point tensor"),
    (change(p=torch.zeros(())), ValueError, "p must have at least 1 dimension"),
    (change(q=torch.full((2, 4), 0.25)), ValueError, "p and q must share the vocabulary size, got 5 and 4"),
    (change(q=torch.full((3, 5), 0.2)), ValueError, r"q must have shape \(2, 5\)"),
    (with_value("p", (0, 1), 0.7), ValueError, "p rows must sum to 1"),
    (with_value("q", (1, 0), float("nan")), ValueError, "q contains NaN or inf"),
    (with_value("p", (0, 0), -0.1), ValueError, "p contains negative probabilities"),
    (change(leniency=0.5), ValueError, r"leniency must be a finite number >= 1 \(1 = exact review\), got 0.5"),
    (change(leniency=float("inf")), ValueError, "leniency must be a finite number >= 1"),
    (change(leniency=float("nan")), ValueError, "leniency must be a finite number >= 1"),
    (change(leniency=True), TypeError, "leniency must be a number >= 1, got bool"),
    (change(leniency="2"), TypeError, "leniency must be a number >= 1, got str"),
    (change(backend="nope"), ValueError, "backend"),
]


@pytest.mark.parametrize(("make", "exc", "match"), BAD, ids=[b[2][:48] for b in BAD])
def test_bad_inputs(make, exc, match) -> None:
    args = make()
    with pytest.raises(exc, match=match):
        emission_law(args.pop("p"), args.pop("q"), **args)


def test_validate_false_skips_only_the_value_checks() -> None:
    p = torch.full((2, 5), 0.3)  # rows sum to 1.5: refused when validating, computed when not
    with pytest.raises(ValueError, match="p rows must sum to 1"):
        emission_law(p, torch.full((2, 5), 0.2))
    assert emission_law(p, torch.full((2, 5), 0.2), validate=False).shape == (2, 5)
    with pytest.raises(ValueError, match="p and q must share the vocabulary size"):
        emission_law(p, torch.full((2, 4), 0.25), validate=False)
