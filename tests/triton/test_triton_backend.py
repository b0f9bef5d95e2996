"""Backend "triton" vs the torch reference with identical injected noise (small shapes: the CPU interpreter is
slow), plus a compile check of every kernel to PTX/cubin for sm_80 and sm_90.

Budgets: integer outputs (tokens, slots, accept counts, node ids) must be identical; float outputs: Gumbel
scores (float64, computed by numpy in the interpreter vs torch) within 1e-12 relative; acceptance probabilities
and residuals (fp32 sums in a different order) within 2e-6 absolute.
"""

import os
import subprocess
import sys

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.trees import binary_tree_parents, branching_parents, kseq_chain_parents, parents_tensor

pytest.importorskip("triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1", allow_module_level=True)


def _rand_logp(rows: int, vocab: int, gen: torch.Generator, mask_frac: float = 0.0) -> torch.Tensor:
    logits = torch.randn(rows, vocab, generator=gen) * 3
    if mask_frac:
        logits[torch.rand(rows, vocab, generator=gen) < mask_frac] = float("-inf")
        logits[:, 0] = 0.0  # keep one finite entry per row
    return torch.log_softmax(logits, -1).to(DEV)


def _u(shape, gen):
    return torch.rand(shape, dtype=torch.float64, generator=gen).clamp_min(2.0**-60).to(DEV)


@pytest.mark.parametrize("rows,vocab", [(1, 7), (3, 111), (2, 2100)])
@pytest.mark.parametrize("mask_frac", [0.0, 0.5])
def test_sample_categorical_and_gumbel_topk_match_reference(rows, vocab, mask_frac):
    gen = torch.Generator().manual_seed(rows * vocab)
    lp = _rand_logp(rows, vocab, gen, mask_frac)
    u = _u((rows, vocab), gen)
    a = sk.sample_categorical(lp, noise=u, backend="torch")
    b = sk.sample_categorical(lp, noise=u, backend="triton")
    assert torch.equal(a, b)
    for k in (0, 1, 5):
        ra = sk.gumbel_topk(lp, k, noise=u, backend="torch")
        rb = sk.gumbel_topk(lp, k, noise=u, backend="triton")
        assert torch.equal(ra.tokens, rb.tokens) and torch.equal(ra.valid, rb.valid)
        assert torch.allclose(ra.score, rb.score, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_tree_mask_and_positions_match_reference(dtype):
    par = parents_tensor(branching_parents([3, 2, 1]), 2).to(DEV)
    valid = torch.ones_like(par, dtype=torch.bool)
    valid[1, -3:] = False  # ragged second row
    past_valid = (torch.arange(10) % 3 != 1).expand(2, -1).to(DEV)
    ma = sk.tree_mask(par, valid, 10, past_valid=past_valid, dtype=dtype, backend="torch")
    mb = sk.tree_mask(par, valid, 10, past_valid=past_valid, dtype=dtype, backend="triton")
    assert torch.equal(ma, mb)
    depth = sk.depth_from_parents(par)
    plen = torch.tensor([4, 9], device=DEV)
    assert torch.equal(
        sk.tree_positions(depth, plen, backend="torch"), sk.tree_positions(depth, plen, backend="triton")
    )


@pytest.mark.parametrize("greedy", [False, True])
def test_verify_chain_matches_reference(greedy):
    gen = torch.Generator().manual_seed(5)
    batch, length, vocab = 5, 4, 50
    p = torch.softmax(torch.randn(batch, length, vocab, generator=gen), -1)
    q = torch.softmax(torch.randn(batch, length + 1, vocab, generator=gen), -1)
    draft = torch.multinomial(p.reshape(-1, vocab), 1, generator=gen).reshape(batch, length)
    for trial in range(6):
        lens = torch.randint(0, length + 1, (batch,), generator=gen)
        au = torch.rand(batch, length, dtype=torch.float64, generator=gen) * (0.2 if trial % 2 else 1.0)
        fu = _u((batch, vocab), gen)
        eos = [int(draft[0, 1])] if trial >= 3 else None
        kw = dict(lengths=lens.to(DEV), accept_u=au.to(DEV), final_noise=fu, greedy=greedy, eos_token_id=eos)
        for leniency in (1.0, 1.7, 3.0):  # CS Drafting's lenient review
            ra = sk.verify_chain(draft.to(DEV), p.to(DEV), q.to(DEV), backend="torch", leniency=leniency, **kw)
            rb = sk.verify_chain(draft.to(DEV), p.to(DEV), q.to(DEV), backend="triton", leniency=leniency, **kw)
            assert torch.equal(ra.n_accepted, rb.n_accepted) and torch.equal(ra.next_token, rb.next_token)


@pytest.mark.parametrize("vocab", [7, 111, 2100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_emission_law_matches_reference(vocab, dtype):
    """Float output: within 1e-6 (fp32) / 1e-15 (fp64) of the reference; edge rows p = q and a point mass."""
    gen = torch.Generator().manual_seed(vocab)
    p = torch.softmax(torch.randn(5, vocab, generator=gen) * 2, -1).to(dtype)
    q = torch.softmax(torch.randn(5, vocab, generator=gen) * 2, -1).to(dtype)
    q[0] = p[0]
    p[1] = 0.0
    p[1, vocab // 2] = 1.0
    for leniency in (1.0, 1.5, 4.0):
        a = sk.emission_law(p.to(DEV), q.to(DEV), leniency, backend="torch")
        b = sk.emission_law(p.to(DEV), q.to(DEV), leniency, backend="triton")
        assert a.dtype == b.dtype == dtype
        assert torch.allclose(a, b, rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-15)


def _candidates(method, k, p, gen):
    lp = torch.log(p)
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    if method == "spechub":
        d = sk.spechub_sample(lp, seed=seed)
        return d.tokens, d.valid, d.hub
    if method in ("rrsw", "traversalw"):
        d = sk.gumbel_topk(lp, k, seed=seed)
        return d.tokens, d.valid, None
    if method == "gds":
        d = sk.gds_sample(lp, k, seed=seed)
        return d.tokens, d.valid, None
    cand = torch.multinomial(p, k, replacement=True, generator=gen)
    return cand, torch.ones_like(cand, dtype=torch.bool), None


@pytest.mark.parametrize(
    "method,k",
    [("sd", 1), ("rrs", 3), ("rrsw", 2), ("rrsw", 3), ("kseq", 2), ("kseq", 3), ("spechub", 2), ("gds", 2), ("gds", 3)],
)
@pytest.mark.parametrize("vocab", [5, 300])
def test_verify_node_matches_reference(method, k, vocab):
    gen = torch.Generator().manual_seed(vocab * 10 + k)
    batch = 6
    for case in ("random", "zeros"):
        p = torch.softmax(torch.randn(batch, vocab, generator=gen) * 2, -1)
        q = torch.softmax(torch.randn(batch, vocab, generator=gen) * 2, -1)
        if case == "zeros":  # zeros in p and in q
            p[:, 0] = 0
            q[:, 1] = 0
            p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
        cand, valid, hub = _candidates(method, k, p, gen)
        au, fu = _u((batch, k), gen), _u((batch, vocab), gen)
        kw = dict(hub=None if hub is None else hub.to(DEV), accept_u=au, final_noise=fu, analytic=True)
        args = (method, cand.to(DEV), valid.to(DEV), p.to(DEV), q.to(DEV))
        ra = sk.verify_node(*args, backend="torch", **kw)
        rb = sk.verify_node(*args, backend="triton", **kw)
        assert torch.equal(ra.slot, rb.slot) and torch.equal(ra.token, rb.token)
        assert torch.allclose(ra.accept_prob, rb.accept_prob, atol=2e-6)
        assert torch.allclose(ra.final_residual, rb.final_residual, atol=2e-6)


TREES = [
    ("sd", branching_parents([1, 1, 1])),
    ("rrs", branching_parents([2, 2])),
    ("rrsw", branching_parents([3, 2, 1])),
    ("kseq", kseq_chain_parents(3, 2)),
    ("spechub", binary_tree_parents(3)),
    ("gds", branching_parents([3, 2, 1])),
    ("block", branching_parents([1, 1, 1, 1])),
    ("traversal", branching_parents([2, 2])),
    ("traversalw", branching_parents([3, 2, 1])),
]


@pytest.mark.parametrize("method,parents", TREES, ids=[m for m, _ in TREES])
@pytest.mark.parametrize("greedy", [False, True])
def test_verify_tree_matches_reference(method, parents, greedy):
    gen = torch.Generator().manual_seed(len(parents))
    batch, n, vocab = 4, len(parents), 12
    par = parents_tensor(parents, batch)
    for trial in range(2):
        p = torch.softmax(torch.randn(batch, n, vocab, generator=gen) * 1.5, -1)
        q = torch.softmax(torch.randn(batch, n, vocab, generator=gen) * 1.5, -1)
        tokens = torch.zeros(batch, n, dtype=torch.long)
        hub = torch.zeros(batch, n, dtype=torch.long) if method == "spechub" else None
        for node in range(n):
            kids = [c for c in range(1, n) if parents[c] == node]
            if kids:
                cand, _, h = _candidates(method, len(kids), p[:, node], gen)
                tokens[:, kids] = cand[:, : len(kids)]
                if hub is not None:
                    hub[:, node] = h
        valid = torch.ones(batch, n, dtype=torch.bool)
        if method in ("rrs", "rrsw", "gds", "block", "traversal", "traversalw"):
            valid[0, -2:] = False  # a ragged row
        au = torch.rand(batch, n, 3, dtype=torch.float64, generator=gen)
        fu = _u((batch, vocab), gen)
        eos = [int(tokens[0, 1])] if trial else None
        kw = dict(
            method=method,
            valid=valid.to(DEV),
            accept_u=au.to(DEV),
            final_noise=fu,
            greedy=greedy,
            eos_token_id=eos,
            hub=None if hub is None else hub.to(DEV),
        )
        ra = sk.verify_tree(tokens.to(DEV), par.to(DEV), p.to(DEV), q.to(DEV), backend="torch", **kw)
        rb = sk.verify_tree(tokens.to(DEV), par.to(DEV), p.to(DEV), q.to(DEV), backend="triton", **kw)
        for x, y in zip(ra, rb, strict=True):
            assert torch.equal(x, y)


def test_block_verification_draws_the_seeded_noise_of_the_reference():
    """Block verification with the noise drawn in the kernel (Philox, no noise tensors): the reference's verdicts."""
    gen = torch.Generator().manual_seed(5)
    batch, n, vocab = 6, 5, 40
    par = parents_tensor(branching_parents([1, 1, 1, 1]), batch)
    z = torch.randn(batch, n, vocab, generator=gen)
    p = torch.softmax(z, -1)
    q = torch.softmax(0.8 * z + 0.4 * torch.randn(batch, n, vocab, generator=gen), -1)
    tokens = torch.zeros(batch, n, dtype=torch.long)
    for node in range(1, n):
        tokens[:, node] = torch.multinomial(p[:, node - 1], 1, generator=gen).squeeze(1)
    valid = torch.arange(n)[None, :] <= torch.tensor([4, 3, 0, 2, 4, 1])[:, None]
    for seed in (0, 77):
        kw = dict(method="block", valid=valid.to(DEV), seed=seed)
        ra = sk.verify_tree(tokens.to(DEV), par.to(DEV), p.to(DEV), q.to(DEV), backend="torch", **kw)
        rb = sk.verify_tree(tokens.to(DEV), par.to(DEV), p.to(DEV), q.to(DEV), backend="triton", **kw)
        for x, y in zip(ra, rb, strict=True):
            assert torch.equal(x, y)


@pytest.mark.parametrize("vocab", [7, 111, 2100])
def test_process_logits_matches_reference(vocab):
    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(4, vocab, generator=gen) * 3
    x[1, :3] = 5.0  # a tie at the top
    x[2] = torch.round(x[2])  # many ties (top-k boundary and top-p tie groups)
    x = x.to(DEV)
    for temp, top_k, top_p in [
        (1.0, 0, 1.0),
        (0.7, 5, 1.0),
        (1.3, 0, 0.9),
        (0.5, 3, 0.5),
        (0.0, 0, 1.0),
        (2.0, 1, 0.3),
    ]:
        a = sk.process_logits(x, temp, top_k, top_p, backend="torch")
        b = sk.process_logits(x, temp, top_k, top_p, backend="triton")
        assert torch.equal(torch.isinf(a), torch.isinf(b)), (temp, top_k, top_p)
        fin = torch.isfinite(a)
        assert torch.allclose(a[fin], b[fin], atol=1e-5), (temp, top_k, top_p)
        pa = sk.process_logits(x, temp, top_k, top_p, log=False, backend="torch")
        pb = sk.process_logits(x, temp, top_k, top_p, log=False, backend="triton")
        assert bool((pb[~fin] == 0).all()) and torch.allclose(pa, pb, atol=1e-6), (temp, top_k, top_p)


@pytest.mark.parametrize("vocab", [5, 300])
def test_spechub_sample_and_kseq_gamma_match_reference(vocab):
    gen = torch.Generator().manual_seed(vocab)
    lp = torch.log_softmax(torch.randn(6, vocab, generator=gen) * 2, -1)
    lp[0] = float("-inf")
    lp[0, 3] = 0.0  # p(hub) = 1: a single-candidate node
    lp = lp.to(DEV)
    u = _u((6, vocab), gen)
    for x, y in zip(
        sk.spechub_sample(lp, noise=u, backend="torch"), sk.spechub_sample(lp, noise=u, backend="triton"), strict=True
    ):
        assert torch.equal(x, y)
    p = torch.softmax(torch.randn(5, vocab, generator=gen), -1).to(DEV)
    q = torch.softmax(torch.randn(5, vocab, generator=gen), -1).to(DEV)
    k = torch.tensor([1, 2, 3, 4, 2], device=DEV)
    (ga, ba), (gb, bb) = sk.kseq_gamma(p, q, k, backend="torch"), sk.kseq_gamma(p, q, k, backend="triton")
    assert torch.allclose(ga, gb, rtol=1e-9) and torch.allclose(ba, bb, atol=1e-6)


def test_filter_kv_matches_reference():
    gen = torch.Generator().manual_seed(0)
    kv = [torch.randn(3, 2, 12, 5, generator=gen).to(DEV) for _ in range(2)]
    kv2 = [t.clone() for t in kv]
    acc = torch.tensor([[2, 3, -1], [1, 4, 6], [-1, -1, -1]], device=DEV)
    n_acc, plen = torch.tensor([2, 3, 0], device=DEV), torch.tensor([3, 4, 5], device=DEV)
    la = sk.filter_kv(kv, plen, acc, n_acc, backend="torch")
    lb = sk.filter_kv(kv2, plen, acc, n_acc, backend="triton")
    assert torch.equal(la, lb)
    assert all(torch.equal(a, b) for a, b in zip(kv, kv2, strict=True))


@pytest.mark.parametrize("vocab,w_in,w_out", [(3, 1, 2), (3, 2, 2), (10, 3, 3), (50, 2, 4), (7, 4, 9)])
def test_sbs_step_matches_reference(vocab, w_in, w_out):
    gen = torch.Generator().manual_seed(vocab * w_in + w_out)
    batch = 3
    for trial in range(3):
        lp = torch.log_softmax(torch.randn(batch, w_in, vocab, generator=gen) * 2, -1)
        if trial == 1:  # masked tokens
            lp[:, :, 0] = float("-inf")
            lp = torch.log_softmax(lp, -1)
        sig = torch.randn(batch, w_in, dtype=torch.float64, generator=gen) - 3
        gam = torch.randn(batch, w_in, dtype=torch.float64, generator=gen)
        bv = torch.ones(batch, w_in, dtype=torch.bool)
        if trial == 2 and w_in > 1:
            bv[0, -1] = False  # an invalid beam entry
        args = (lp.to(DEV), sig.to(DEV), gam.to(DEV), bv.to(DEV), w_out)
        u = _u((batch, w_in, vocab), gen)
        a = sk.sbs_step(*args, noise=u, backend="torch")
        b = sk.sbs_step(*args, noise=u, backend="triton")
        assert torch.equal(a.parent_slot, b.parent_slot) and torch.equal(a.tokens, b.tokens)
        assert torch.equal(a.valid, b.valid)
        assert torch.allclose(a.sigma[a.valid], b.sigma[b.valid], rtol=1e-12)
        assert torch.allclose(a.gamma[a.valid], b.gamma[b.valid], rtol=1e-9, atol=1e-9)


def test_requested_triton_on_cpu_without_interpreter_names_the_fix(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    lp = torch.log_softmax(torch.randn(2, 5), -1)
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'sample_categorical': backend 'triton' does not support"):
        sk.sample_categorical(lp, seed=0, backend="triton")


def test_every_kernel_compiles_to_ptx_for_sm80_and_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-m", "specdec_kernels.triton.compile_check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    from specdec_kernels.triton.compile_check import SIGNATURES

    assert f"{2 * len(SIGNATURES)} kernel builds OK" in out.stdout


@pytest.mark.parametrize("method,draw", [("traversal", "rrs"), ("traversalw", "rrsw")])
def test_traversal_verification_draws_the_seeded_noise_of_the_reference(method, draw):
    """Traversal verification with the noise drawn in the kernel (Philox, no noise tensors): the reference's
    verdicts, on ragged trees."""
    from specdec_kernels.testing.oracles_tree import draw_tree

    gen = torch.Generator().manual_seed(6)
    batch, vocab = 6, 30
    parents = branching_parents([2, 2])
    n = len(parents)
    z = torch.randn(batch, n, vocab, generator=gen)
    p = torch.softmax(z, -1)
    q = torch.softmax(0.8 * z + 0.5 * torch.randn(batch, n, vocab, generator=gen), -1)
    tokens, valid, par, _ = draw_tree(draw, parents, p, gen, 3)
    valid[1, 5:] = False
    par = torch.where(valid, par, 0)
    par[:, 0] = -1
    for seed in (0, 41):
        kw = dict(method=method, valid=valid.to(DEV), seed=seed)
        ra = sk.verify_tree(tokens.to(DEV), par.to(DEV), p.to(DEV), q.to(DEV), backend="torch", **kw)
        rb = sk.verify_tree(tokens.to(DEV), par.to(DEV), p.to(DEV), q.to(DEV), backend="triton", **kw)
        for x, y in zip(ra, rb, strict=True):
            assert torch.equal(x, y)
