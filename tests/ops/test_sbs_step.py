"""sbs_step: one stochastic-beam-search expansion with truncated Gumbels (RSD-S, docs/methods.md).

False alarms: each law check is a chi-square at alpha = 1e-4 plus a TV bound exceeded with probability <= 1e-6;
the seeds are fixed, so a pass is reproducible for a given torch version.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels import BackendUnavailableError, available_backends, sbs_step
from specdec_kernels.testing import oracles as O
from specdec_kernels.testing import wrong as W
from specdec_kernels.testing.stats import law_check

F64 = torch.float64
NEG_INF = float("-inf")
# The backends that run CPU tensors natively (torch, cpu) get the full grid; Triton on CPU runs under its
# interpreter (seconds per call) and gets one small case (tests/backends/ covers parity in depth).
FAST_BACKENDS = [b for b in available_backends("sbs_step") if b in ("torch", "cpu")]

# Toy draft of the sequence-level SWOR oracle (V = 3): first-token law and rows p(y | x).
P1 = np.array([0.5, 0.3, 0.2])
P2 = np.array([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.1, 0.45, 0.45]])


def _uniforms(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.rand(shape, dtype=F64, generator=torch.Generator().manual_seed(seed)).clamp_min(2.0**-60)


def _root(n: int) -> dict:
    return dict(
        sigma=torch.zeros((n, 1), dtype=F64),
        gamma=torch.zeros((n, 1), dtype=F64),
        beam_valid=torch.ones((n, 1), dtype=torch.bool),
    )


# ---------------------------------------------------------------------------------------------------------------
# 1. Exactness against the NumPy oracle with injected noise


def _beam(gen: torch.Generator, batch: int, w_in: int, vocab: int) -> tuple[torch.Tensor, ...]:
    logits = 2 * torch.randn((batch, w_in, vocab), generator=gen, dtype=F64)
    logits[..., 1] = NEG_INF
    logp = torch.log_softmax(logits, -1)
    sigma = -5 * torch.rand((batch, w_in), generator=gen, dtype=F64)
    gamma = torch.sort(3 * torch.randn((batch, w_in), generator=gen, dtype=F64), -1, descending=True).values
    valid = torch.rand((batch, w_in), generator=gen) < 0.8
    valid[:, 0] = True
    logp[~valid] = float("nan")  # rows of invalid entries are never read
    return logp, sigma, gamma, valid


def _cases() -> list[tuple[str, int, int, int, int]]:
    out = []
    for backend in available_backends("sbs_step"):
        if backend in FAST_BACKENDS:
            cases = [(1, 1, 7, 2), (3, 2, 111, 4), (99, 3, 7, 3), (1, 2, 32000, 5), (2, 2, 5, 10)]
        else:
            cases = [(2, 2, 11, 3)]
        out += [(backend, *c) for c in cases]
    return out


@pytest.mark.parametrize("backend,batch,w_in,vocab,w_out", _cases())
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_matches_oracle_with_injected_noise(backend, batch, w_in, vocab, w_out, dtype):
    gen = torch.Generator().manual_seed(batch * vocab + w_in)
    logp, sigma, gamma, valid = _beam(gen, batch, w_in, vocab)
    logp = logp.to(dtype)
    noise = _uniforms((batch, w_in, vocab), vocab)
    try:
        out = sbs_step(logp, sigma, gamma, valid, w_out, noise=noise, backend=backend)
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))
    tol = 1e-9 if backend == "torch" else 1e-4  # kernels keep scores in fp32
    for b in range(batch):
        want = O.sbs_step_oracle(
            logp[b].double().numpy(), sigma[b].numpy(), gamma[b].numpy(), valid[b].numpy(), w_out, noise[b].numpy()
        )
        assert out.parent_slot[b].tolist() == want[0].tolist()
        assert out.tokens[b].tolist() == want[1].tolist()
        assert out.valid[b].tolist() == want[4].tolist()
        np.testing.assert_allclose(out.sigma[b].double().numpy(), want[2], atol=tol, rtol=0)
        np.testing.assert_allclose(out.gamma[b].double().numpy(), want[3], atol=tol, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# 2. Distribution: the sequence-level SWOR oracle


def _two_steps(step, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two SBS steps (W = 2) on the toy draft; returns level-1 tokens [n, 2] and level-2 sequences [n, 2]."""
    gen = torch.Generator().manual_seed(seed)
    lp1 = torch.log(torch.tensor(P1)).expand(n, 1, 3)
    s1 = step(lp1, w_out=2, generator=gen, **_root(n))
    lp2 = torch.log(torch.tensor(P2))[s1.tokens]  # [n, 2, 3]: p(. | token of each beam entry)
    s2 = step(lp2, s1.sigma, s1.gamma, s1.valid, 2, generator=gen)
    first = torch.gather(s1.tokens, 1, s2.parent_slot)
    seqs = (3 * first + s2.tokens).numpy()
    return s1.tokens.numpy(), seqs


def _public(logp, sigma, gamma, beam_valid, w_out, **kw):
    return sbs_step(logp, sigma, gamma, beam_valid, w_out, **kw)


def _untruncated(logp, sigma, gamma, beam_valid, w_out, **kw):
    return W.sbs_step_untruncated(logp, sigma, gamma, beam_valid, w_out, **kw)


N_SBS = 100000


@pytest.fixture(scope="module")
def sbs_runs() -> tuple[np.ndarray, np.ndarray]:
    return _two_steps(_public, N_SBS, seed=5)


def _pair_check(seqs: np.ndarray) -> object:
    law = O.seq_swor_pair_law(P1, P2)
    counts = np.zeros_like(law)
    np.add.at(counts, (seqs[:, 0], seqs[:, 1]), 1)
    return law_check(counts, law, max_tv=O.tv_bound(len(seqs), 72))


def test_ordered_top2_sequences_follow_sequence_level_swor(sbs_runs):
    check = _pair_check(sbs_runs[1])
    assert check.ok, str(check)


def test_untruncated_selection_fails_the_same_check():
    """Negative control: top-W by untruncated scores, TV about 0.15 from the SWOR law."""
    check = _pair_check(_two_steps(_untruncated, N_SBS, seed=5)[1])
    assert not check.ok
    assert check.tv > 0.1


def test_top1_at_every_level_is_an_exact_sample(sbs_runs):
    """The top-1 sequence at every level is an exact sample of the sequence law, and level 1 as a whole is the
    Gumbel-top-2 (SWOR) of p_1."""
    level1, seqs = sbs_runs
    seq_law = (P1[:, None] * P2).ravel()
    for counts, law in [
        (np.bincount(level1[:, 0], minlength=3), P1),
        (np.bincount(seqs[:, 0], minlength=9), seq_law),
    ]:
        check = law_check(counts, law, max_tv=O.tv_bound(N_SBS, len(law)))
        assert check.ok, str(check)
    pairs = O.swor_law(P1, 2)
    counts = np.zeros(9)
    np.add.at(counts, 3 * level1[:, 0] + level1[:, 1], 1)
    law = np.zeros(9)
    for (x, y), w in pairs.items():
        law[3 * x + y] = w
    assert law_check(counts, law, max_tv=O.tv_bound(N_SBS, 6)).ok


def _toy_step2(n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    s1 = sbs_step(torch.log(torch.tensor(P1)).expand(n, 1, 3), w_out=2, generator=gen, **_root(n))
    lp2 = torch.log(torch.tensor(P2))[s1.tokens]
    noise = _uniforms((n, 2, 3), seed + 1)
    s2 = sbs_step(lp2, s1.sigma, s1.gamma, s1.valid, 2, noise=noise)
    phit = s1.sigma[..., None] + lp2 - torch.log(-torch.log(noise))
    return s1, lp2, phit, s2


def test_children_of_a_parent_survive_in_gumbel_order():
    """Property (ii): Trunc is increasing in phit, so within a parent gamma' follows phit."""
    _, _, phit, s2 = _toy_step2(5000, 1)
    same = s2.parent_slot[:, 0] == s2.parent_slot[:, 1]
    assert bool(same.any())
    par = s2.parent_slot[same, 0]
    ph = phit[same][torch.arange(int(same.sum())), par]  # [m, 3] perturbed scores of that parent
    t = s2.tokens[same]
    assert bool((ph.gather(1, t[:, :1]) > ph.gather(1, t[:, 1:])).all())
    assert bool((t[:, 0] == ph.argmax(-1)).all())  # the parent's best child comes first


def test_truncation_bounds_and_stable_formula():
    """Properties (iii) and (iv): gamma' <= gamma(parent) with equality for the parent's argmax child, and the
    stable formula agrees with the naive RSD eq. (11) where the latter does not overflow."""
    s1, _, phit, s2 = _toy_step2(5000, 2)
    par_gamma = s1.gamma.gather(1, s2.parent_slot)
    assert bool((s2.gamma <= par_gamma).all())
    assert torch.equal(s2.gamma[:, 0], s1.gamma.max(-1).values)  # top entry = argmax child of the top parent
    ph = phit.gather(1, s2.parent_slot[..., None].expand(-1, -1, 3))  # [n, 2, 3] rows of each entry's parent
    z = ph.max(-1).values
    phit_sel = ph.gather(2, s2.tokens[..., None]).squeeze(-1)
    naive = O.trunc_naive(par_gamma.numpy(), phit_sel.numpy(), z.numpy())
    ok = np.isfinite(naive)
    assert ok.mean() > 0.99
    np.testing.assert_allclose(s2.gamma.numpy()[ok], naive[ok], atol=1e-5, rtol=0)


def test_oracle_trunc_formulas_agree():
    u = np.linspace(-3, 5, 9)[:, None]
    z = 2.0
    phit = np.concatenate([np.linspace(-6, z, 40), [NEG_INF]])[None, :]
    stable = O.trunc_stable(u, phit, z)
    naive = O.trunc_naive(u, phit[:, :-1], z)
    np.testing.assert_allclose(stable[:, :-1], naive, atol=1e-9, rtol=0)
    assert np.all(stable <= u) and np.all(stable[:, -2] == u[:, 0]) and np.all(stable[:, -1] == NEG_INF)
    assert np.all(np.diff(stable[:, :-1], axis=1) > 0)  # strictly increasing in phit


def test_stable_formula_survives_large_scores():
    """Sequence log-probs reach -100s: the stable form stays finite where RSD eq. (11) overflows."""
    logp = torch.log(torch.tensor([[[0.5, 0.3, 0.2]]], dtype=F64))
    out = sbs_step(logp, torch.tensor([[-800.0]], dtype=F64), torch.tensor([[-790.0]], dtype=F64),
                   torch.ones((1, 1), dtype=torch.bool), 3, seed=0)  # fmt: skip
    assert out.valid.all() and torch.isfinite(out.gamma).all()
    assert out.gamma[0, 0] == -790.0 and bool((out.gamma <= -790.0).all())


# ---------------------------------------------------------------------------------------------------------------
# 3. Properties


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    w_in=st.integers(1, 4),
    vocab=st.integers(2, 9),
    w_frac=st.floats(0, 1),
    seed=st.integers(0, 10**6),
)
def test_properties(batch, w_in, vocab, w_frac, seed):
    gen = torch.Generator().manual_seed(seed)
    logp, sigma, gamma, valid = _beam(gen, batch, w_in, vocab)
    w_out = max(1, round(w_frac * w_in * vocab))
    out = sbs_step(logp, sigma, gamma, valid, w_out, generator=gen)
    n_live = (valid.sum(-1) * (vocab - 1)).clamp(max=w_out)  # token 1 is masked in every row
    assert torch.equal(out.valid.sum(-1), n_live)
    assert bool((out.gamma[:, 1:] <= out.gamma[:, :-1]).all())  # descending
    inv = ~out.valid
    assert bool((out.parent_slot[inv] == -1).all() and (out.tokens[inv] == -1).all())
    assert bool((out.gamma[inv] == NEG_INF).all() and (out.sigma[inv] == NEG_INF).all())
    b_idx, j_idx = torch.nonzero(out.valid, as_tuple=True)
    par, tok = out.parent_slot[b_idx, j_idx], out.tokens[b_idx, j_idx]
    assert bool(valid[b_idx, par].all())  # parents are valid beam entries
    assert bool((tok != 1).all())  # masked tokens are never expanded
    torch.testing.assert_close(out.sigma[b_idx, j_idx], sigma[b_idx, par] + logp[b_idx, par, tok], rtol=0, atol=0)
    assert bool((out.gamma[b_idx, j_idx] <= gamma[b_idx, par]).all())
    pairs = set(zip(b_idx.tolist(), par.tolist(), tok.tolist(), strict=True))
    assert len(pairs) == len(b_idx)  # no (parent, token) selected twice


# ---------------------------------------------------------------------------------------------------------------
# 4. Bad inputs

LP = torch.log(torch.tensor([[[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]]], dtype=F64))
SIG = torch.tensor([[-1.0, -2.0]], dtype=F64)
GAM = torch.tensor([[0.5, -0.5]], dtype=F64)
BV = torch.ones((1, 2), dtype=torch.bool)
BAD = [
    (dict(logp=LP[0]), ValueError, "logp must have 3 dimensions"),
    (dict(logp=torch.ones((1, 2, 3), dtype=torch.long)), TypeError, "logp must be a floating-point tensor"),
    (dict(sigma=SIG[0]), ValueError, "sigma must have 2 dimensions"),
    (dict(sigma=torch.zeros((1, 3), dtype=F64)), ValueError, r"sigma must have shape \(1, 2\)"),
    (dict(gamma=torch.zeros((2, 2), dtype=F64)), ValueError, r"gamma must have shape \(1, 2\)"),
    (dict(beam_valid=torch.ones((1, 3), dtype=torch.bool)), ValueError, r"beam_valid must have shape \(1, 2\)"),
    (dict(sigma=torch.zeros((1, 2), dtype=torch.long)), TypeError, "sigma must be a floating-point tensor"),
    (dict(gamma=torch.zeros((1, 2), dtype=torch.long)), TypeError, "gamma must be a floating-point tensor"),
    (dict(beam_valid=torch.ones((1, 2))), TypeError, "beam_valid must be a bool tensor"),
    (dict(beam_valid=torch.zeros((1, 2), dtype=torch.bool)), ValueError, "at least one valid beam entry per row"),
    (
        dict(logp=torch.tensor([[[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0]]])),
        ValueError,
        r"logp \(valid beam entries\) contains NaN",
    ),
    (dict(logp=torch.tensor([[[0.0, float("inf"), 0.0], [0.0, 0.0, 0.0]]])), ValueError, r"contains \+inf"),
    (dict(logp=torch.tensor([[[NEG_INF] * 3, [0.0, 0.0, 0.0]]])), ValueError, "every entry is -inf"),
    (dict(sigma=torch.tensor([[float("nan"), 0.0]])), ValueError, "sigma and gamma must not be NaN"),
    (dict(gamma=torch.tensor([[0.0, float("nan")]])), ValueError, "sigma and gamma must not be NaN"),
    (dict(gamma=torch.tensor([[float("inf"), 0.0]])), ValueError, r"sigma and gamma must not be NaN or \+inf"),
    (dict(sigma=torch.tensor([[0.0, float("inf")]])), ValueError, r"sigma and gamma must not be NaN or \+inf"),
    (dict(w_out=0), ValueError, r"w_out must be an int in \[1, Win\*V=6\], got 0"),
    (dict(w_out=7), ValueError, r"w_out must be an int in \[1, Win\*V=6\]"),
    (dict(w_out=2.0), ValueError, r"w_out must be an int in \[1, Win\*V=6\]"),
    (dict(noise=torch.full((1, 2, 4), 0.5, dtype=F64)), ValueError, r"noise must have shape \(1, 2, 3\)"),
    (dict(noise=torch.zeros((1, 2, 3), dtype=F64)), ValueError, r"noise must hold uniforms in \(0, 1\)"),
    (dict(seed=1, generator=torch.Generator()), ValueError, "pass either generator= or seed=, not both"),
    (dict(backend="cuda"), BackendUnavailableError, "backend 'cuda' is unavailable"),
]


@pytest.mark.parametrize("kw,exc,msg", BAD, ids=lambda x: x if isinstance(x, str) else None)
def test_bad_input(kw, exc, msg):
    args = dict(logp=LP, sigma=SIG, gamma=GAM, beam_valid=BV, w_out=2)
    args.update(kw)
    pos = [args.pop(k) for k in ("logp", "sigma", "gamma", "beam_valid", "w_out")]
    with pytest.raises(exc, match=msg):
        sbs_step(*pos, **args)


def test_invalid_beam_rows_are_not_validated():
    """Padding entries (beam_valid false) may hold anything, even NaN; they are never expanded."""
    logp = LP.clone()
    logp[0, 1] = float("nan")
    out = sbs_step(logp, SIG, GAM, torch.tensor([[True, False]]), 3, seed=0)
    assert out.parent_slot.tolist() == [[0, 0, 0]]


# ---------------------------------------------------------------------------------------------------------------
# 5. Reproducibility


def test_seed_and_noise_reproducibility():
    n = 200
    lp = LP.expand(n, 2, 3)
    args = (SIG.expand(n, 2), GAM.expand(n, 2), BV.expand(n, 2), 3)
    a = sbs_step(lp, *args, seed=1)
    assert torch.equal(a.tokens, sbs_step(lp, *args, seed=1).tokens)
    assert not torch.equal(a.tokens, sbs_step(lp, *args, seed=2).tokens)
    noise = _uniforms((n, 2, 3), 4)
    b, c = sbs_step(lp, *args, noise=noise), sbs_step(lp, *args, noise=noise)
    assert torch.equal(b.gamma, c.gamma) and torch.equal(b.parent_slot, c.parent_slot)
