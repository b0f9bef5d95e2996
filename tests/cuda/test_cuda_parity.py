"""Backend "cuda" vs the torch reference on a GPU, with identical injected noise: integer outputs identical,
float outputs within 2e-6 (fp32 sums in another order). Skipped where no GPU or no CUDA build is present."""

import pytest
import torch

import specdec_kernels as sk
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
    lp = torch.log_softmax(logits, -1)
    u = _u((3, vocab), gen)
    assert torch.equal(
        sk.sample_categorical(lp, noise=u, backend="torch"), sk.sample_categorical(lp, noise=u, backend="cuda")
    )
    ra, rb = sk.gumbel_topk(lp, 4, noise=u, backend="torch"), sk.gumbel_topk(lp, 4, noise=u, backend="cuda")
    assert torch.equal(ra.tokens, rb.tokens) and torch.equal(ra.valid, rb.valid)


@pytest.mark.gpu
@pytest.mark.parametrize("method,k", [("sd", 1), ("rrs", 3), ("rrsw", 3), ("kseq", 2), ("spechub", 2)])
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
@pytest.mark.parametrize("method,parents", [("rrsw", branching_parents([3, 2, 1])), ("kseq", kseq_chain_parents(3, 2))])
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
    batch = 4
    logp = torch.log_softmax(torch.randn(batch, w_in, vocab, generator=gen) * 2.5, -1)
    sigma = -5 * torch.rand(batch, w_in, generator=gen, dtype=torch.float64)
    gamma = torch.sort(3 * torch.randn(batch, w_in, generator=gen, dtype=torch.float64), -1, descending=True).values
    gamma[-1, 0] = -60.0  # psi rounds to gamma for many children: ties resolved by index
    valid = torch.rand(batch, w_in, generator=gen) < 0.8
    valid[:, 0] = True
    args = [t.to(DEV) for t in (logp, sigma, gamma, valid)]
    u = _u((batch, w_in, vocab), gen)
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
