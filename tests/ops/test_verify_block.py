"""Block verification (``verify_tree(..., method="block")``): its law by exact enumeration, the kernels against the
independent float64 oracle ``specdec_kernels.testing.block``, and its negative control.

* Law: the oracle's output law of one round, enumerated over every draft chain and continued by the target, equals
  the target's joint law within 1e-9 (it is exact to rounding: about 1e-16 is seen) for chains of 1-4 tokens, laws that
  depend on the whole prefix, and chains whose length is a stopping time of the drafted tokens (SpecDec++'s drafts).
* Kernel law: each backend's stopping probabilities are read off the kernel itself by bisection on its uniforms (53
  halvings give them to 2^-53), and the law enumerated from them equals the target's within 1e-9; the kernel's
  corrections are checked token for token against the oracle under injected final noise.
* Negative control: the same enumeration with the token-level residual Norm[(q - p)^+] in place of the block residual
  (vllm-ascend #7807's bug) misses by more than 1e-4.
* Block verification keeps at least as many tokens as token-level SD in expectation, and strictly more on the cases
  below. Greedy, it is the ``sd`` walk.

Deterministic: enumerations and seeded uniforms, no statistical false alarms.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import available_backends, verify_tree
from specdec_kernels.testing import block as B

# triton (the CPU interpreter is slow) has its own parity tests in tests/triton; cuda in tests/cuda
BACKENDS = [b for b in available_backends("verify_tree") if b not in ("triton", "cuda")]
LAW_CASES = [(3, 1, 0), (3, 2, 1), (3, 3, 2), (4, 3, 3), (2, 4, 4), (5, 2, 5)]  # (V, L, seed)


def max_law_error(law: dict, q_of: B.Laws, length: int, vocab: int) -> float:
    got = B.extended_law(law, q_of, length + 1, vocab)
    return float(np.abs(got - B.target_law(q_of, length + 1, vocab)).max())


@pytest.mark.parametrize(("vocab", "length", "seed"), LAW_CASES)
def test_oracle_round_law_is_the_target_law(vocab: int, length: int, seed: int) -> None:
    p_of, q_of = B.random_laws(vocab, seed)
    assert max_law_error(B.round_law(p_of, q_of, length, vocab), q_of, length, vocab) < 1e-9


@pytest.mark.parametrize(("vocab", "length", "seed"), [(3, 3, 7), (4, 3, 8), (2, 4, 9)])
def test_chains_cut_by_a_stopping_time_stay_exact(vocab: int, length: int, seed: int) -> None:
    p_of, q_of = B.random_laws(vocab, seed)
    law = B.round_law(p_of, q_of, length, vocab, stop=lambda prefix: prefix[-1] == 1)
    assert max_law_error(law, q_of, length, vocab) < 1e-9


@pytest.mark.parametrize(("vocab", "length", "seed"), [(3, 3, 2), (4, 3, 3), (4, 4, 11)])
def test_token_level_residual_control_fails(vocab: int, length: int, seed: int) -> None:
    p_of, q_of = B.random_laws(vocab, seed)
    law = B.round_law(p_of, q_of, length, vocab, weighted=False)
    assert max_law_error(law, q_of, length, vocab) > 1e-4


@pytest.mark.parametrize("seed", range(8))
def test_block_keeps_at_least_as_many_tokens_as_token_level(seed: int) -> None:
    vocab, length = 3, 3
    p_of, q_of = B.random_laws(vocab, 100 + seed)
    block = B.expected_accepted(p_of, q_of, length, vocab, rule="block")
    token = B.expected_accepted(p_of, q_of, length, vocab, rule="token")
    assert block >= token - 1e-12
    assert block > token + 1e-4  # these laws leave room: the block rule uses it


def test_the_papers_binary_example() -> None:
    """Sun et al.'s example: context-free laws p = (2/3, 1/3), q = (1/3, 2/3), two drafted tokens. Token-level SD
    keeps 10/9 drafted tokens per round, block verification 11/9 (the paper's figures)."""
    p_of = lambda prefix: np.array([2 / 3, 1 / 3])  # noqa: E731
    q_of = lambda prefix: np.array([1 / 3, 2 / 3])  # noqa: E731
    assert B.expected_accepted(p_of, q_of, 2, 2, rule="token") == pytest.approx(10 / 9, abs=1e-12)
    assert B.expected_accepted(p_of, q_of, 2, 2, rule="block") == pytest.approx(11 / 9, abs=1e-12)
    assert max_law_error(B.round_law(p_of, q_of, 2, 2), q_of, 2, 2) < 1e-12


# ---- the kernels ----


def chain_batch(vocab: int, length: int, p_of: B.Laws, q_of: B.Laws, dtype=torch.float64):
    """Every draft chain of ``length`` tokens as one batch row each: tokens [B, L+1] (root token 0), p/q rows."""
    chains = list(itertools.product(range(vocab), repeat=length))
    tokens = torch.tensor([[0, *c] for c in chains], dtype=torch.long)
    p_rows = torch.tensor(np.stack([[p_of(c[:i]) for i in range(length + 1)] for c in chains]), dtype=dtype)
    q_rows = torch.tensor(np.stack([[q_of(c[:i]) for i in range(length + 1)] for c in chains]), dtype=dtype)
    parent = torch.arange(-1, length).expand(len(chains), -1).clone()
    prob = np.array([np.prod([p_of(c[:i])[c[i]] for i in range(length)]) for c in chains])
    return chains, tokens, parent, p_rows, q_rows, prob


def kernel_stop_probs(backend: str, tokens, parent, p_rows, q_rows) -> np.ndarray:
    """h_i of every row and level read off the kernel: every other uniform is the largest below 1, which only a
    level with h = 1 passes, so n_accepted is i iff U_i < h_i, and 53 halvings of U_i pin h_i to 2^-53. A level
    under a deeper one with h = 1 is never reached: NaN (the law does not depend on it)."""
    batch, n = tokens.shape
    h = np.ones((batch, n))  # level 0 always stops
    fin = torch.full((batch, p_rows.shape[-1]), 0.5, dtype=torch.float64)
    top = 1.0 - 2.0**-53
    for level in range(1, n):
        lo, hi = torch.zeros(batch, dtype=torch.float64), torch.ones(batch, dtype=torch.float64)
        hidden = torch.zeros(batch, dtype=torch.bool)
        for _ in range(53):
            mid = (lo + hi) / 2
            u = torch.full((batch, n, 1), top, dtype=torch.float64)
            u[:, level, 0] = mid
            out = verify_tree(
                tokens, parent, p_rows, q_rows, method="block", accept_u=u, final_noise=fin, backend=backend
            )
            hidden |= out.n_accepted > level
            stopped = out.n_accepted == level
            lo, hi = torch.where(stopped, mid, lo), torch.where(stopped, hi, mid)
        h[:, level] = np.where(hidden.numpy(), np.nan, hi.numpy())
    return h


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("vocab", "length", "seed", "dtype"), [(3, 3, 2, torch.float64), (4, 2, 3, torch.float32)])
def test_kernel_law_by_enumeration(backend: str, vocab: int, length: int, seed: int, dtype) -> None:
    p_of, q_of = B.random_laws(vocab, seed)
    chains, tokens, parent, p_rows, q_rows, prob = chain_batch(vocab, length, p_of, q_of, dtype)
    h = kernel_stop_probs(backend, tokens, parent, p_rows, q_rows)
    law: dict[tuple[int, ...], float] = {}
    p64, q64 = p_rows.double().numpy(), q_rows.double().numpy()
    for row, chain in enumerate(chains):
        carry = 1.0
        for tau in range(length, -1, -1):
            if carry == 0.0:
                break
            h_tau = 1.0 if tau == 0 else h[row, tau]
            pt = carry * h_tau
            carry *= 1.0 - h_tau
            y_law = B.next_law(tau, chain, p64[row], q64[row])
            for y in np.flatnonzero(y_law > 0):
                key = (*chain[:tau], int(y))
                law[key] = law.get(key, 0.0) + prob[row] * pt * y_law[y]
    # float32 rows: the law is the one of the rounded rows, whose sums are 1 within ~1e-7
    assert max_law_error(law, q_of, length, vocab) < (1e-9 if dtype == torch.float64 else 1e-6)
    oracle = np.array(
        [
            [1.0] + [num / den if den > 0 else 0.0 for den, num in B.stop_tests(c, p64[r], q64[r])]
            for r, c in enumerate(chains)
        ]
    )
    seen = ~np.isnan(h)
    np.testing.assert_allclose(h[seen], oracle[seen], atol=2e-15)


def ragged_chains(batch: int, vocab: int, n: int, seed: int, dtype=torch.float64, closeness: float = 0.5):
    """A batch of chains of random lengths 0..n-1, drafted from p, with target rows near p."""
    g = torch.Generator().manual_seed(seed)
    zp = torch.randn((batch, n, vocab), generator=g, dtype=torch.float64)
    zq = closeness * zp + (1 - closeness) * torch.randn((batch, n, vocab), generator=g, dtype=torch.float64)
    p_rows, q_rows = torch.softmax(zp, -1).to(dtype), torch.softmax(zq, -1).to(dtype)
    tokens = torch.zeros((batch, n), dtype=torch.long)
    for i in range(1, n):
        tokens[:, i] = torch.multinomial(p_rows[:, i - 1].double(), 1, generator=g).squeeze(1)
    lengths = torch.randint(0, n, (batch,), generator=g)
    valid = torch.arange(n)[None, :] <= lengths[:, None]
    parent = torch.arange(-1, n - 1).expand(batch, -1).masked_fill(~valid, 0).clone()
    parent[:, 0] = -1
    tokens = tokens.masked_fill(~valid, 0)
    u = torch.rand((batch, n, 1), generator=g, dtype=torch.float64)
    fin = torch.rand((batch, vocab), generator=g, dtype=torch.float64).clamp_min(2.0**-60)
    return tokens, parent, valid, p_rows, q_rows, u, fin


@pytest.mark.parametrize("backend", [*BACKENDS, "torch"])
@pytest.mark.parametrize(
    ("vocab", "dtype", "closeness"), [(5, torch.float64, 0.5), (37, torch.float32, 0.8), (300, torch.float32, 0.95)]
)
def test_kernel_matches_the_oracle(backend: str, vocab: int, dtype, closeness: float) -> None:
    for seed in range(4):
        tokens, parent, valid, p_rows, q_rows, u, fin = ragged_chains(24, vocab, 7, seed, dtype, closeness)
        out = verify_tree(
            tokens, parent, p_rows, q_rows, method="block", valid=valid, accept_u=u, final_noise=fin, backend=backend
        )
        nodes, n_acc, nxt, ranks = B.block_tree_walk(
            tokens.numpy(),
            parent.numpy(),
            valid.numpy(),
            p_rows.double().numpy(),
            q_rows.double().numpy(),
            u.numpy(),
            fin.numpy(),
        )
        assert out.n_accepted.tolist() == n_acc.tolist()
        assert out.next_token.tolist() == nxt.tolist()
        width = out.accepted_nodes.shape[1]
        assert out.accepted_nodes.tolist() == nodes[:, :width].tolist()
        assert out.accepted_rank.tolist() == ranks[:, :width].tolist()


@pytest.mark.parametrize("backend", [*BACKENDS, "torch"])
def test_accepted_eos_ends_the_row(backend: str) -> None:
    tokens, parent, valid, p_rows, q_rows, u, fin = ragged_chains(16, 6, 6, 3, closeness=1.0)
    u.zero_()  # every level stops: tau = L, then the first accepted EOS cuts the row
    eos = 2
    out = verify_tree(
        tokens,
        parent,
        p_rows,
        q_rows,
        method="block",
        valid=valid,
        accept_u=u,
        final_noise=fin,
        eos_token_id=eos,
        backend=backend,
    )
    hits = 0
    for b in range(16):
        chain = tokens[b, 1 : int(valid[b].sum())].tolist()
        if eos in chain:
            hits += 1
            assert out.n_accepted[b] == chain.index(eos) + 1 and out.next_token[b] == -1
        else:
            assert out.n_accepted[b] == len(chain) and out.next_token[b] >= 0
    assert 0 < hits < 16  # both kinds of rows occur


@pytest.mark.parametrize("backend", [*BACKENDS, "torch"])
def test_p_equal_q_keeps_every_token(backend: str) -> None:
    tokens, parent, valid, p_rows, _, u, fin = ragged_chains(16, 9, 6, 4)
    out = verify_tree(
        tokens, parent, p_rows, p_rows, method="block", valid=valid, accept_u=u, final_noise=fin, backend=backend
    )
    assert out.n_accepted.tolist() == (valid.sum(1) - 1).tolist()


@pytest.mark.parametrize("backend", [*BACKENDS, "torch"])
def test_greedy_block_is_the_sd_walk(backend: str) -> None:
    tokens, parent, valid, p_rows, q_rows, _, _ = ragged_chains(16, 7, 6, 5, closeness=0.9)
    logits = torch.log(q_rows)
    a = verify_tree(tokens, parent, None, logits, method="block", valid=valid, greedy=True, backend=backend)
    b = verify_tree(tokens, parent, None, logits, method="sd", valid=valid, greedy=True, backend=backend)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("backend", [*BACKENDS, "torch"])
def test_seeded_noise_is_reproducible_and_backend_independent(backend: str) -> None:
    tokens, parent, valid, p_rows, q_rows, _, _ = ragged_chains(32, 11, 6, 6, dtype=torch.float32)
    ref = verify_tree(tokens, parent, p_rows, q_rows, method="block", valid=valid, seed=1234, backend="torch")
    out = verify_tree(tokens, parent, p_rows, q_rows, method="block", valid=valid, seed=1234, backend=backend)
    for x, y in zip(out, ref, strict=True):
        assert torch.equal(x, y)


def test_a_branching_tree_is_refused() -> None:
    tokens = torch.tensor([[0, 1, 2]])
    parent = torch.tensor([[-1, 0, 0]])
    rows = torch.full((1, 3, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="method 'block' allows at most one child per node"):
        verify_tree(tokens, parent, rows, rows, method="block", seed=0)


def test_block_is_a_tree_method_only() -> None:
    p = torch.full((1, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="method must be one of"):
        sk.verify_node("block", torch.tensor([[0]]), torch.tensor([[True]]), p, p, seed=0)


# ---- Hierarchical Speculative Decoding (arXiv 2601.05724) ----


@pytest.mark.parametrize("seed", range(6))
def test_hsd_capped_prefix_ratios_are_the_block_weights(seed: int) -> None:
    """HSD's lossless rule caps the prefix ratio r_i at its running maximum, r_i / max(1, r_1..r_i); that is the closed
    form of the block weight recursion, so its stop probabilities and residuals are block verification's."""
    rng = np.random.default_rng(seed)
    vocab, length = 6, 7
    p_rows = rng.dirichlet(np.full(vocab, 0.5), size=length + 1)
    q_rows = rng.dirichlet(np.full(vocab, 0.5), size=length + 1)
    tokens = [int(rng.choice(vocab, p=p_rows[i])) for i in range(length)]
    np.testing.assert_allclose(
        B.hsd_capped_ratios(tokens, p_rows, q_rows), B.weights(tokens, p_rows, q_rows), rtol=1e-13, atol=0
    )


@pytest.mark.parametrize(("vocab", "length", "seed"), [(3, 2, 1), (3, 3, 2), (4, 3, 3)])
def test_hsd_with_the_uncapped_final_acceptance_is_not_exact(vocab: int, length: int, seed: int) -> None:
    """The public code of HSD accepts a whole chain with min(1, r_L) instead of the capped ratio: it keeps more
    tokens, and its law is not the target's (a negative control)."""
    p_of, q_of = B.random_laws(vocab, seed)
    law = B.round_law(p_of, q_of, length, vocab, uncapped_final=True)
    assert max_law_error(law, q_of, length, vocab) > 1e-3
    uncapped = B.expected_accepted(p_of, q_of, length, vocab, rule="uncapped")
    assert uncapped > B.expected_accepted(p_of, q_of, length, vocab, rule="block")
