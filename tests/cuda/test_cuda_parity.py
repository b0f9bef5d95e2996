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
