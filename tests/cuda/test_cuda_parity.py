"""Backend "cuda" vs the torch reference on a GPU, with identical injected noise: integer outputs identical,
float outputs within 2e-6 (fp32 sums in another order). Skipped where no GPU or no CUDA build is present.

The seeded tests at the end cover the kernels' own noise: with ``seed=`` (no noise tensor) each kernel draws the
Philox stream of ``specdec_kernels._rng`` itself, so CUDA and the torch reference must make the same decisions from
the same seed, the draws must equal the explicit Philox tensors, and sample_categorical's draws must follow the law.
"""

import numpy as np
import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import _rng
from specdec_kernels.testing.oracles import tv_bound
from specdec_kernels.testing.stats import law_check
from specdec_kernels.trees import branching_parents, kseq_chain_parents, parents_tensor

if not torch.cuda.is_available():
    pytest.skip("no CUDA device on this machine (CUDA kernels are compile-checked only)", allow_module_level=True)
if "cuda" not in sk.available_backends():
    pytest.skip("the CUDA extension is not built (torch without CUDA or no nvcc)", allow_module_level=True)

DEV = "cuda"


def _u(shape, gen):
    return torch.rand(shape, dtype=torch.float64, generator=gen).clamp_min(2.0**-60).to(DEV)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [7, 111, 32000, 128256])
def test_sampling_ops_match_reference(vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(3, vocab, generator=gen) * 3).to(DEV)
    for temp, top_k, top_p in [(1.0, 0, 1.0), (0.7, 50, 0.9), (0.0, 0, 1.0)]:
        a = sk.process_logits(logits, temp, top_k, top_p, backend="torch")
        b = sk.process_logits(logits, temp, top_k, top_p, backend="cuda")
        assert torch.equal(torch.isinf(a), torch.isinf(b))
        assert torch.allclose(a[torch.isfinite(a)], b[torch.isfinite(b)], atol=1e-5)
        pa = sk.process_logits(logits, temp, top_k, top_p, log=False, backend="torch")
        pb = sk.process_logits(logits, temp, top_k, top_p, log=False, backend="cuda")
        assert bool((pb[torch.isinf(b)] == 0).all()) and torch.allclose(pa, pb, atol=1e-6)
    lp = torch.log_softmax(logits, -1)
    u = _u((3, vocab), gen)
    assert torch.equal(
        sk.sample_categorical(lp, noise=u, backend="torch"), sk.sample_categorical(lp, noise=u, backend="cuda")
    )
    ra, rb = sk.gumbel_topk(lp, 4, noise=u, backend="torch"), sk.gumbel_topk(lp, 4, noise=u, backend="cuda")
    assert torch.equal(ra.tokens, rb.tokens) and torch.equal(ra.valid, rb.valid)


@pytest.mark.gpu
@pytest.mark.parametrize("method,k", [("sd", 1), ("rrs", 3), ("rrsw", 3), ("kseq", 2), ("spechub", 2), ("gds", 3)])
def test_verify_node_matches_reference(method, k):
    gen = torch.Generator().manual_seed(k)
    batch, vocab = 8, 300
    p = torch.softmax(torch.randn(batch, vocab, generator=gen) * 2, -1).to(DEV)
    q = torch.softmax(torch.randn(batch, vocab, generator=gen) * 2, -1).to(DEV)
    hub = None
    if method == "spechub":
        d = sk.spechub_sample(torch.log(p), seed=1)
        cand, valid, hub = d.tokens, d.valid, d.hub
    elif method == "rrsw":
        d = sk.gumbel_topk(torch.log(p), k, seed=1)
        cand, valid = d.tokens, d.valid
    elif method == "gds":
        d = sk.gds_sample(torch.log(p), k, seed=1)
        cand, valid = d.tokens, d.valid
    else:
        cand = torch.multinomial(p, k, replacement=True)
        valid = torch.ones_like(cand, dtype=torch.bool)
    kw = dict(hub=hub, accept_u=_u((batch, k), gen), final_noise=_u((batch, vocab), gen), analytic=True)
    ra = sk.verify_node(method, cand, valid, p, q, backend="torch", **kw)
    rb = sk.verify_node(method, cand, valid, p, q, backend="cuda", **kw)
    assert torch.equal(ra.slot, rb.slot) and torch.equal(ra.token, rb.token)
    assert torch.allclose(ra.accept_prob, rb.accept_prob, atol=2e-6)
    assert torch.allclose(ra.final_residual, rb.final_residual, atol=2e-6)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "method,parents",
    [
        ("rrsw", branching_parents([3, 2, 1])),
        ("kseq", kseq_chain_parents(3, 2)),
        ("block", branching_parents([1, 1, 1, 1])),
        ("traversal", branching_parents([2, 2, 1])),
    ],
)
@pytest.mark.parametrize("greedy", [False, True])
def test_verify_tree_and_layout_match_reference(method, parents, greedy):
    gen = torch.Generator().manual_seed(len(parents))
    batch, n, vocab = 4, len(parents), 50
    par = parents_tensor(parents, batch).to(DEV)
    p = torch.softmax(torch.randn(batch, n, vocab, generator=gen), -1).to(DEV)
    q = torch.softmax(torch.randn(batch, n, vocab, generator=gen), -1).to(DEV)
    tokens = torch.zeros(batch, n, dtype=torch.long, device=DEV)
    for node in range(n):
        kids = [c for c in range(1, n) if parents[c] == node]
        if kids:
            if method == "rrsw":
                tokens[:, kids] = sk.gumbel_topk(torch.log(p[:, node]), len(kids), seed=node).tokens
            else:
                tokens[:, kids] = torch.multinomial(p[:, node], len(kids), replacement=True)
    kw = dict(method=method, accept_u=_u((batch, n, 3), gen), final_noise=_u((batch, vocab), gen), greedy=greedy)
    ra = sk.verify_tree(tokens, par, p, q, backend="torch", **kw)
    rb = sk.verify_tree(tokens, par, p, q, backend="cuda", **kw)
    for x, y in zip(ra, rb, strict=True):
        assert torch.equal(x, y)
    valid = torch.ones_like(par, dtype=torch.bool)
    assert torch.equal(sk.tree_mask(par, valid, 5, backend="torch"), sk.tree_mask(par, valid, 5, backend="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [7, 111, 49152])
@pytest.mark.parametrize("w_in,w_out", [(1, 4), (3, 2), (8, 8)])
def test_sbs_step_matches_reference(vocab, w_in, w_out):
    """Integer outputs identical, sigma bitwise (one float64 addition), gamma within 1e-12 (float64 transcendental
    functions of CUDA vs SLEEF); includes invalid beam entries and a flattened-truncation parent (Gamma << Z)."""
    gen = torch.Generator().manual_seed(vocab + w_in)
    args = _sbs_args(vocab, w_in, vocab + w_in)
    u = _u((4, w_in, vocab), gen)
    ra = sk.sbs_step(*args, w_out, noise=u, backend="torch")
    rb = sk.sbs_step(*args, w_out, noise=u, backend="cuda")
    assert torch.equal(ra.parent_slot, rb.parent_slot) and torch.equal(ra.tokens, rb.tokens)
    assert torch.equal(ra.valid, rb.valid) and torch.equal(ra.sigma, rb.sigma)
    fin = torch.isfinite(ra.gamma)
    assert torch.equal(fin, torch.isfinite(rb.gamma))
    torch.testing.assert_close(ra.gamma[fin], rb.gamma[fin], rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [1, 3, 111, 128256])
def test_spechub_sample_matches_reference(vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(2, 5, vocab, generator=gen) * 3
    logits[0, 0, :] = -40.0
    logits[0, 0, 0] = 0.0  # p(hub) ~ 1: no second draft
    lp = torch.log_softmax(logits, -1).to(DEV)
    u = _u((2, 5, vocab), gen)
    ra, rb = sk.spechub_sample(lp, noise=u, backend="torch"), sk.spechub_sample(lp, noise=u, backend="cuda")
    for x, y in zip(ra, rb, strict=True):
        assert torch.equal(x, y)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_kseq_gamma_matches_reference(k):
    """Bisection in float64 on sums in another order: gamma within 4 (K - 1) 2^-40, beta within that + V 2^-52."""
    gen = torch.Generator().manual_seed(k)
    batch, vocab = 6, 32000
    z = torch.randn(batch, vocab, generator=gen) * 2
    p = torch.softmax(z, -1).to(DEV)
    q = torch.softmax(z + torch.randn(batch, vocab, generator=gen), -1).to(DEV)
    kk = torch.full((batch,), k, device=DEV)
    (ga, ba), (gb, bb) = sk.kseq_gamma(p, q, kk, backend="torch"), sk.kseq_gamma(p, q, kk, backend="cuda")
    g_err = (ga - gb).abs()
    assert bool((g_err <= 4 * (k - 1) * 2.0**-40).all())
    assert bool(((ba - bb).abs() <= g_err + vocab * 2.0**-52).all())


# ---- seeded path: the kernels draw the Philox noise of ``seed`` themselves (docs/kernels.md, Randomness contract) ----

SEEDS = [0, 5, 2**62 + 12345]  # the last one uses both key words


def _draft_logp(shape, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn((*shape, vocab), generator=gen) * 3
    logits.view(-1, vocab)[0, 1::3] = float("-inf")  # zero-probability tokens in the first row
    return torch.log_softmax(logits, -1).to(DEV)


def _assert_close_finite(a, b, tol):
    fin = torch.isfinite(a)
    assert torch.equal(fin, torch.isfinite(b))
    torch.testing.assert_close(a[fin], b[fin], rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [7, 111, 32000, 50257, 128256])  # 7, 111, 50257: a half Philox pair at the end
@pytest.mark.parametrize("seed", SEEDS)
def test_seeded_sampling_ops_match_reference(vocab, seed):
    """[2, 3, V]: the noise row of each draw is its flat leading index."""
    lp = _draft_logp((2, 3), vocab, vocab)
    a = sk.sample_categorical(lp, seed=seed, backend="torch")
    b = sk.sample_categorical(lp, seed=seed, backend="cuda")
    assert torch.equal(a, b)
    k = min(5, vocab)
    ra, rb = sk.gumbel_topk(lp, k, seed=seed, backend="torch"), sk.gumbel_topk(lp, k, seed=seed, backend="cuda")
    assert torch.equal(ra.tokens, rb.tokens) and torch.equal(ra.valid, rb.valid)
    _assert_close_finite(ra.score, rb.score, 1e-12)
    ha, hb = sk.spechub_sample(lp, seed=seed, backend="torch"), sk.spechub_sample(lp, seed=seed, backend="cuda")
    for x, y in zip(ha, hb, strict=True):
        assert torch.equal(x, y)


def _sbs_args(vocab, w_in, seed):
    gen = torch.Generator().manual_seed(seed)
    batch = 4
    logp = torch.log_softmax(torch.randn(batch, w_in, vocab, generator=gen) * 2.5, -1)
    sigma = -5 * torch.rand(batch, w_in, generator=gen, dtype=torch.float64)
    gamma = torch.sort(3 * torch.randn(batch, w_in, generator=gen, dtype=torch.float64), -1, descending=True).values
    gamma[-1, 0] = -60.0  # psi rounds to gamma for many children: ties resolved by index
    valid = torch.rand(batch, w_in, generator=gen) < 0.8
    valid[:, 0] = True
    return [t.to(DEV) for t in (logp, sigma, gamma, valid)]


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [7, 111, 49152])
@pytest.mark.parametrize("w_in,w_out", [(1, 4), (3, 2), (8, 8)])
def test_seeded_sbs_step_matches_reference(vocab, w_in, w_out):
    """Noise row b * Win + w; same tolerances as with injected noise."""
    args = _sbs_args(vocab, w_in, vocab + w_in)
    for seed in SEEDS:
        ra = sk.sbs_step(*args, w_out, seed=seed, backend="torch")
        rb = sk.sbs_step(*args, w_out, seed=seed, backend="cuda")
        assert torch.equal(ra.parent_slot, rb.parent_slot) and torch.equal(ra.tokens, rb.tokens)
        assert torch.equal(ra.valid, rb.valid) and torch.equal(ra.sigma, rb.sigma)
        _assert_close_finite(ra.gamma, rb.gamma, 1e-12)


def _node_case(method, k, batch, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(batch, vocab, generator=gen) * 2, -1).to(DEV)
    q = torch.softmax(torch.randn(batch, vocab, generator=gen) * 2, -1).to(DEV)
    hub = None
    if method == "spechub":
        d = sk.spechub_sample(torch.log(p), seed=seed, backend="torch")
        cand, valid, hub = d.tokens.clamp_min(0), d.valid, d.hub
    elif method == "rrsw":
        d = sk.gumbel_topk(torch.log(p), k, seed=seed, backend="torch")
        cand, valid = d.tokens.clamp_min(0), d.valid
    elif method == "gds":
        d = sk.gds_sample(torch.log(p), k, seed=seed, backend="torch")
        cand, valid = d.tokens.clamp_min(0), d.valid
    else:
        cand = sk.sample_categorical(torch.log(p)[:, None, :].expand(-1, k, -1), seed=seed, backend="torch")
        valid = torch.ones_like(cand, dtype=torch.bool)
    return cand, valid, p, q, hub


@pytest.mark.gpu
@pytest.mark.parametrize("method,k", [("sd", 1), ("rrs", 3), ("rrsw", 3), ("kseq", 2), ("spechub", 2), ("gds", 3)])
@pytest.mark.parametrize("vocab", [7, 300, 32001])
def test_seeded_verify_node_matches_reference(method, k, vocab):
    """accept_u row b, element = slot (ACCEPT); final_noise row b (FINAL)."""
    cand, valid, p, q, hub = _node_case(method, k, 64, vocab, vocab + k)
    for seed in SEEDS:
        ra = sk.verify_node(method, cand, valid, p, q, hub=hub, seed=seed, analytic=True, backend="torch")
        rb = sk.verify_node(method, cand, valid, p, q, hub=hub, seed=seed, analytic=True, backend="cuda")
        assert torch.equal(ra.slot, rb.slot) and torch.equal(ra.token, rb.token)
        assert torch.allclose(ra.accept_prob, rb.accept_prob, atol=2e-6)
        assert torch.allclose(ra.final_residual, rb.final_residual, atol=2e-6)


def _chain_case(batch, length, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(batch, length, vocab, generator=gen) * 2, -1).to(DEV)
    q = torch.softmax(torch.randn(batch, length + 1, vocab, generator=gen) * 2, -1).to(DEV)
    draft = sk.sample_categorical(p.log(), seed=seed, backend="torch")
    lengths = (torch.arange(batch) % (length + 1)).to(DEV)
    return draft, p, q, lengths


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [7, 300, 32001])
@pytest.mark.parametrize("greedy", [False, True])
def test_seeded_verify_chain_matches_reference(vocab, greedy):
    """accept_u row b, element j (ACCEPT); final_noise row b (FINAL); ragged lengths and an EOS token."""
    draft, p, q, lengths = _chain_case(16, 4, vocab, vocab)
    for seed in SEEDS:
        kw = dict(lengths=lengths, greedy=greedy, seed=seed, eos_token_id=3)
        ra = sk.verify_chain(draft, p, q, backend="torch", **kw)
        rb = sk.verify_chain(draft, p, q, backend="cuda", **kw)
        assert torch.equal(ra.n_accepted, rb.n_accepted) and torch.equal(ra.next_token, rb.next_token)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [7, 300, 32001])
@pytest.mark.parametrize("greedy", [False, True])
def test_seeded_lenient_verify_chain_matches_reference(vocab, greedy):
    """CS Drafting's lenient review (leniency > 1; greedy: x == argmax q or p(x) < l q(x))."""
    draft, p, q, lengths = _chain_case(16, 4, vocab, vocab)
    for seed in SEEDS:
        for leniency in (1.5, 3.0):
            kw = dict(lengths=lengths, greedy=greedy, seed=seed, leniency=leniency)
            ra = sk.verify_chain(draft, p, q, backend="torch", **kw)
            rb = sk.verify_chain(draft, p, q, backend="cuda", **kw)
            assert torch.equal(ra.n_accepted, rb.n_accepted) and torch.equal(ra.next_token, rb.next_token)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [7, 300, 128256])
def test_emission_law_matches_reference(vocab):
    """Float output within 2e-6 of the reference (fp32 sums in another order); edge rows p = q and a point mass."""
    gen = torch.Generator().manual_seed(vocab)
    p = torch.softmax(torch.randn(6, vocab, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(6, vocab, generator=gen) * 2, -1)
    q[0] = p[0]
    p[1] = 0.0
    p[1, vocab // 2] = 1.0
    for leniency in (1.0, 2.0, 5.0):
        a = sk.emission_law(p.to(DEV), q.to(DEV), leniency, backend="torch")
        b = sk.emission_law(p.to(DEV), q.to(DEV), leniency, backend="cuda")
        assert a.dtype == b.dtype and torch.allclose(a, b, rtol=0, atol=2e-6)


def _tree_case(method, parents, batch, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    n = len(parents)
    par = parents_tensor(parents, batch).to(DEV)
    p = torch.softmax(torch.randn(batch, n, vocab, generator=gen), -1).to(DEV)
    q = torch.softmax(torch.randn(batch, n, vocab, generator=gen), -1).to(DEV)
    tokens = torch.zeros(batch, n, dtype=torch.long, device=DEV)
    hub = torch.zeros(batch, n, dtype=torch.long, device=DEV) if method == "spechub" else None
    for node in range(n):
        kids = [c for c in range(1, n) if parents[c] == node]
        if not kids:
            continue
        lp = torch.log(p[:, node])
        if method in ("rrsw", "traversalw"):
            tokens[:, kids] = sk.gumbel_topk(lp, len(kids), seed=seed + node, backend="torch").tokens
        elif method == "gds":
            tokens[:, kids] = sk.gds_sample(lp, len(kids), seed=seed + node, backend="torch").tokens
        elif method == "spechub":  # two children per internal node: the hub pair
            d = sk.spechub_sample(lp, seed=seed + node, backend="torch")
            tokens[:, kids] = torch.where(d.valid, d.tokens, d.hub[:, None])
            hub[:, node] = d.hub
        else:
            lp_kids = lp[:, None, :].expand(-1, len(kids), -1)
            tokens[:, kids] = sk.sample_categorical(lp_kids, seed=seed + node, backend="torch")
    return tokens, par, p, q, hub


TREES = [
    ("rrs", branching_parents([3, 2, 1])),
    ("rrsw", branching_parents([3, 2, 1])),
    ("kseq", kseq_chain_parents(3, 2)),
    ("spechub", branching_parents([2, 2])),
    ("gds", branching_parents([3, 2, 1])),
    ("block", branching_parents([1, 1, 1, 1])),
    ("traversal", branching_parents([3, 2, 1])),
    ("traversalw", branching_parents([3, 2, 1])),
]


@pytest.mark.gpu
@pytest.mark.parametrize("method,parents", TREES, ids=[m for m, _ in TREES])
@pytest.mark.parametrize("vocab", [7, 50])
def test_seeded_verify_tree_matches_reference(method, parents, vocab):
    """accept_u row b * N + node, element = candidate rank (ACCEPT); final_noise row b (FINAL)."""
    tokens, par, p, q, hub = _tree_case(method, parents, 8, vocab, len(parents) + vocab)
    for seed in SEEDS:
        kw = dict(method=method, hub=hub, seed=seed)
        ra = sk.verify_tree(tokens, par, p, q, backend="torch", **kw)
        rb = sk.verify_tree(tokens, par, p, q, backend="cuda", **kw)
        for x, y in zip(ra, rb, strict=True):
            assert torch.equal(x, y)


@pytest.mark.gpu
def test_seeded_draws_equal_explicit_philox_noise():
    """The in-kernel draws are the tensors of _rng.philox_uniform with the op's purpose, row and index layout."""
    seed = 2**40 + 7
    lp = _draft_logp((2, 3), 1001, 1)
    draft_u = _rng.philox_uniform(seed, _rng.DRAFT, lp.shape, DEV)
    assert torch.equal(
        sk.sample_categorical(lp, seed=seed, backend="cuda"), sk.sample_categorical(lp, noise=draft_u, backend="cuda")
    )
    ga, gb = sk.gumbel_topk(lp, 4, seed=seed, backend="cuda"), sk.gumbel_topk(lp, 4, noise=draft_u, backend="cuda")
    assert torch.equal(ga.tokens, gb.tokens) and torch.equal(ga.score, gb.score)
    ha, hb = sk.spechub_sample(lp, seed=seed, backend="cuda"), sk.spechub_sample(lp, noise=draft_u, backend="cuda")
    for x, y in zip(ha, hb, strict=True):
        assert torch.equal(x, y)
    args = _sbs_args(111, 3, 3)
    u3 = _rng.philox_uniform(seed, _rng.DRAFT, args[0].shape, DEV)
    sa = sk.sbs_step(*args, 4, seed=seed, backend="cuda")
    sb = sk.sbs_step(*args, 4, noise=u3, backend="cuda")
    for x, y in zip(sa, sb, strict=True):
        assert torch.equal(x, y)

    cand, valid, p, q, _ = _node_case("rrs", 3, 64, 300, 2)
    acc = _rng.philox_uniform(seed, _rng.ACCEPT, cand.shape, DEV)
    fin = _rng.philox_uniform(seed, _rng.FINAL, p.shape, DEV)
    na = sk.verify_node("rrs", cand, valid, p, q, seed=seed, backend="cuda")
    nb = sk.verify_node("rrs", cand, valid, p, q, accept_u=acc, final_noise=fin, backend="cuda")
    assert torch.equal(na.slot, nb.slot) and torch.equal(na.token, nb.token)

    draft, p, q, lengths = _chain_case(16, 4, 300, 3)
    acc = _rng.philox_uniform(seed, _rng.ACCEPT, draft.shape, DEV)
    fin = _rng.philox_uniform(seed, _rng.FINAL, (16, 300), DEV)
    ca = sk.verify_chain(draft, p, q, lengths=lengths, seed=seed, backend="cuda")
    cb = sk.verify_chain(draft, p, q, lengths=lengths, accept_u=acc, final_noise=fin, backend="cuda")
    assert torch.equal(ca.n_accepted, cb.n_accepted) and torch.equal(ca.next_token, cb.next_token)

    parents = kseq_chain_parents(3, 2)
    tokens, par, p, q, _ = _tree_case("kseq", parents, 8, 7, 4)
    n = len(parents)
    acc = _rng.philox_uniform(seed, _rng.ACCEPT, (8, n, n - 1), DEV)  # any width: element = rank
    fin = _rng.philox_uniform(seed, _rng.FINAL, (8, 7), DEV)
    ta = sk.verify_tree(tokens, par, p, q, method="kseq", seed=seed, backend="cuda")
    tb = sk.verify_tree(tokens, par, p, q, method="kseq", accept_u=acc, final_noise=fin, backend="cuda")
    for x, y in zip(ta, tb, strict=True):
        assert torch.equal(x, y)


@pytest.mark.gpu
def test_seeded_cuda_ops_are_reproducible_by_seed():
    """Same seed: identical outputs; another seed: other draws (P(all equal) is negligible at these sizes)."""
    lp = _draft_logp((64,), 1000, 0)

    def draws(seed):
        out = [
            sk.sample_categorical(lp, seed=seed, backend="cuda"),
            sk.gumbel_topk(lp, 3, seed=seed, backend="cuda").tokens,
            sk.spechub_sample(lp, seed=seed, backend="cuda").tokens,
            sk.sbs_step(*_sbs_args(1000, 2, 0), 4, seed=seed, backend="cuda").tokens,
        ]
        cand, valid, p, q, _ = _node_case("rrs", 1, 256, 50, 0)
        out.append(sk.verify_node("rrs", cand, valid, p, q, seed=seed, backend="cuda").token)
        draft, p, q, lengths = _chain_case(256, 3, 50, 0)
        out.append(sk.verify_chain(draft, p, q, lengths=lengths, seed=seed, backend="cuda").next_token)
        tokens, par, p, q, _ = _tree_case("rrsw", branching_parents([2, 2]), 256, 50, 0)
        out.append(sk.verify_tree(tokens, par, p, q, method="rrsw", seed=seed, backend="cuda").next_token)
        return out

    first, again, other = draws(123), draws(123), draws(124)
    for k, (a, b, c) in enumerate(zip(first, again, other, strict=True)):
        assert torch.equal(a, b), f"output {k} differs between two calls with the same seed"
        assert not torch.equal(a, c), f"output {k} is the same for seeds 123 and 124"


LAWS = {
    "skewed, two zero-probability tokens": [0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02, 0.0, 0.0],
    "uniform over 16": [1 / 16] * 16,
}


@pytest.mark.gpu
@pytest.mark.parametrize("law", list(LAWS.values()), ids=list(LAWS))
def test_seeded_sample_categorical_law_over_rows(law):
    """One call, 200k identical rows: each row draws its own Philox row; chi-square and TV at alpha = 1e-4."""
    n = 200_000
    logp = torch.log(torch.tensor(law, dtype=torch.float64)).float()
    exact = torch.softmax(logp.double(), -1).numpy()
    toks = sk.sample_categorical(logp.to(DEV).expand(n, -1), seed=2024, backend="cuda")
    counts = np.bincount(toks.cpu().numpy(), minlength=len(law))
    check = law_check(counts, exact, max_tv=tv_bound(n, len(law)))
    assert check.ok, check


@pytest.mark.gpu
def test_seeded_sample_categorical_law_over_seeds():
    """One row, one call per seed (the raw op with noise=None): draws of distinct seeds follow the law."""
    n = 5000
    law = np.array([0.4, 0.25, 0.2, 0.1, 0.05])
    logp = torch.log(torch.tensor(law)).float().to(DEV)[None, :]
    toks = torch.cat([torch.ops.specdec.sample_categorical(logp, None, s) for s in range(n)])
    counts = np.bincount(toks.cpu().numpy(), minlength=len(law))
    check = law_check(counts, torch.softmax(logp.double().cpu(), -1)[0].numpy(), max_tv=tv_bound(n, len(law)))
    assert check.ok, check


@pytest.mark.gpu
def test_seeded_sample_categorical_law_with_large_odd_vocab():
    """V = 1001 with the mass on a few tokens, including the last one (a half Philox pair) and both words of a pair;
    every other token is masked and must never be drawn."""
    n, vocab = 20_000, 1001
    support = torch.tensor([0, 1, 500, 998, 1000])
    mass = torch.tensor([0.1, 0.3, 0.2, 0.15, 0.25], dtype=torch.float64)
    logp = torch.full((vocab,), float("-inf"), dtype=torch.float64)
    logp[support] = mass.log()
    logp = logp.float()
    exact = torch.softmax(logp.double(), -1).numpy()
    toks = sk.sample_categorical(logp.to(DEV).expand(n, -1), seed=7, backend="cuda")
    counts = np.bincount(toks.cpu().numpy(), minlength=vocab)
    check = law_check(counts, exact, max_tv=tv_bound(n, len(support)))
    assert check.ok, check
