"""Backend "triton": the in-kernel Philox path (noise=None, seed=s) against ``specdec_kernels._rng``.

* the jit Philox-4x32-10 helper reproduces the Random123 known-answer vectors, and the jit uniform helper is
  bit-identical to ``_rng.philox_uniform`` (rows past 2**32, seeds past 2**31 and 2**32, every purpose);
* seeded Triton calls of the 7 stochastic ops give the integer outputs of the seeded torch reference exactly;
  float outputs within the budgets of test_triton_backend.py (and bit-identical to the Triton noise-tensor path);
* the seeded sampler follows its law (chi-square at false-alarm rate ``DEFAULT_ALPHA`` = 1e-4 per check, with a
  negative control showing the sample size detects a wrong law); same seed, same output; other seed, other output.

Shapes are small: the CPU interpreter runs about 300 Python-level tensor ops per Philox block (~15 ms a program).
"""

import os

import numpy as np
import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import _rng
from specdec_kernels.testing.stats import DEFAULT_ALPHA, law_check
from specdec_kernels.trees import binary_tree_parents, branching_parents, kseq_chain_parents, parents_tensor

triton = pytest.importorskip("triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1", allow_module_level=True)

import triton.language as tl  # noqa: E402

from specdec_kernels.triton import kernels as K  # noqa: E402

# seed 0; a seed whose low word is >= 2**31 and high word is non-zero (both key words matter)
SEEDS = [0, 2**40 + 2**31 + 12345]
MASK32 = 0xFFFFFFFF


# ----------------------------------------------------------------------------------------------------------------
# the jit helpers themselves


@triton.jit
def _philox_words_kernel(c_ptr, k_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[i, :] = Philox-4x32-10(counter c[i, :], key k[i, :]) (words held in int64)."""
    i = tl.arange(0, BLOCK)
    m = i < n
    c0 = tl.load(c_ptr + i * 4, mask=m, other=0).to(tl.uint32)
    c1 = tl.load(c_ptr + i * 4 + 1, mask=m, other=0).to(tl.uint32)
    c2 = tl.load(c_ptr + i * 4 + 2, mask=m, other=0).to(tl.uint32)
    c3 = tl.load(c_ptr + i * 4 + 3, mask=m, other=0).to(tl.uint32)
    k0 = tl.load(k_ptr + i * 2, mask=m, other=0).to(tl.uint32)
    k1 = tl.load(k_ptr + i * 2 + 1, mask=m, other=0).to(tl.uint32)
    o0, o1, o2, o3 = K._philox4x32_10(c0, c1, c2, c3, k0, k1)
    tl.store(out_ptr + i * 4, o0.to(tl.int64), mask=m)
    tl.store(out_ptr + i * 4 + 1, o1.to(tl.int64), mask=m)
    tl.store(out_ptr + i * 4 + 2, o2.to(tl.int64), mask=m)
    tl.store(out_ptr + i * 4 + 3, o3.to(tl.int64), mask=m)


@triton.jit
def _uniform_kernel(rows_ptr, out_ptr, n, seed_lo, seed_hi, PURPOSE: tl.constexpr, BLOCK: tl.constexpr):
    """out[p, i] = uniform (rows[p], i) of the stream (seed, PURPOSE), for i < n."""
    p = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    u = K._philox_uniform(seed_lo, seed_hi, PURPOSE, tl.load(rows_ptr + p), offs)
    tl.store(out_ptr + p * n + offs, u, mask=offs < n)


def _kernel_uniforms(seed: int, purpose: int, rows: list[int], n: int) -> torch.Tensor:
    out = torch.empty((len(rows), n), dtype=torch.float64, device=DEV)
    row_t = torch.tensor(rows, dtype=torch.long, device=DEV)
    _uniform_kernel[(len(rows),)](row_t, out, n, *K._seed_args(seed), PURPOSE=purpose, BLOCK=triton.next_power_of_2(n))
    return out.cpu()


def _layout_uniforms(seed: int, purpose: int, rows: list[int], n: int) -> torch.Tensor:
    """The layout of ``_rng`` spelled out per element on top of its integer Philox (any row, even >= 2**32)."""
    r = torch.tensor(rows, dtype=torch.long)[:, None].expand(-1, n)
    i = torch.arange(n)[None, :].expand(len(rows), -1)
    words = _rng.philox4x32_10(i >> 1, r & MASK32, r >> 32, torch.full_like(r, purpose), seed & MASK32, seed >> 32)
    a = torch.where(i % 2 == 1, words[2], words[0])
    b = torch.where(i % 2 == 1, words[3], words[1])
    return (2 * (((a >> 12) << 32) | b) + 1).double() * 2.0**-53


def test_philox_known_answers():
    """Random123 kat_vectors for philox4x32_10 (the published test vectors)."""
    ctr = [[0, 0, 0, 0], [MASK32] * 4, [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344]]
    key = [[0, 0], [MASK32] * 2, [0xA4093822, 0x299F31D0]]
    want = [
        [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8],
        [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD],
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
    ]
    out = torch.zeros((3, 4), dtype=torch.long, device=DEV)
    _philox_words_kernel[(1,)](torch.tensor(ctr, device=DEV), torch.tensor(key, device=DEV), out, 3, BLOCK=4)
    assert out.cpu().tolist() == want


@pytest.mark.parametrize("seed", [0, 1, 2**31 + 7, 2**32 + 3, 0xDEADBEEFCAFE, 2**63 - 1])
def test_jit_uniform_is_bit_identical_to_rng_module(seed):
    for purpose in (_rng.DRAFT, _rng.ACCEPT, _rng.FINAL):
        got = _kernel_uniforms(seed, purpose, [0, 1, 2], 37)  # odd n: the last pair is half used
        assert torch.equal(got, _rng.philox_uniform(seed, purpose, (3, 37)))
    big_rows = [2**32 - 1, 2**32, 2**32 + 5, 2**62 + 3]  # the row's high word goes to counter word 2
    assert torch.equal(_kernel_uniforms(seed, _rng.ACCEPT, big_rows, 9), _layout_uniforms(seed, 1, big_rows, 9))
    assert torch.equal(_layout_uniforms(seed, 2, [0, 1, 2], 37), _rng.philox_uniform(seed, 2, (3, 37)))


def test_seed_words_are_32_bit_and_checked():
    assert K._seed_args(0) == (0, 0)
    assert K._seed_args(2**40 + 2**31 + 5) == (2**31 + 5 - 2**32, 2**8)
    assert K._seed_args(2**63 - 1) == (-1, 2**31 - 1)
    for bad in (-1, 2**63):
        with pytest.raises(ValueError):
            K._seed_args(bad)


def test_jit_uniforms_are_uniform():
    """32 rows x 1024 uniforms (one stream) in 32 equal bins; the values lie in (0, 1)."""
    u = _kernel_uniforms(2024, _rng.DRAFT, list(range(32)), 1024).flatten()
    assert 0 < float(u.min()) and float(u.max()) < 1
    counts = np.bincount((u * 32).long().numpy(), minlength=32)
    check = law_check(counts, np.full(32, 1 / 32), max_tv=0.03)
    assert check.ok, str(check)


# ----------------------------------------------------------------------------------------------------------------
# seeded parity with the torch reference, op by op


def _logp(shape, gen, masked=False):
    logits = torch.randn(shape, generator=gen) * 2
    if masked:  # -inf entries (top-k style), one finite entry kept per row
        logits[torch.rand(shape, generator=gen) < 0.4] = float("-inf")
        logits[..., 1] = 0.0
    return torch.log_softmax(logits, -1).to(DEV)


@pytest.mark.parametrize("shape", [(1, 7), (3, 111), (2, 2, 7)])
def test_sample_categorical_gumbel_topk_spechub_seeded_parity(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    lp = _logp(shape, gen, masked=shape[-1] == 111)
    if shape == (1, 7):
        lp[0] = float("-inf")
        lp[0, 4] = 0.0  # p(hub) = 1: a single-candidate spechub node, and only one valid Gumbel-top-k draw
    k = 3
    for seed in SEEDS:
        assert torch.equal(
            sk.sample_categorical(lp, seed=seed, backend="triton"),
            sk.sample_categorical(lp, seed=seed, backend="torch"),
        )
        a = sk.gumbel_topk(lp, k, seed=seed, backend="torch")
        b = sk.gumbel_topk(lp, k, seed=seed, backend="triton")
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.valid, b.valid)
        assert torch.allclose(a.score, b.score, rtol=1e-12, atol=1e-12)
        # the in-kernel draw and the noise tensor of the same stream give bit-identical scores
        u = _rng.philox_uniform(seed, _rng.DRAFT, lp.shape, DEV)
        c = sk.gumbel_topk(lp, k, noise=u, backend="triton")
        assert torch.equal(b.tokens, c.tokens) and torch.equal(b.score, c.score)
        for x, y in zip(
            sk.spechub_sample(lp, seed=seed, backend="torch"),
            sk.spechub_sample(lp, seed=seed, backend="triton"),
            strict=True,
        ):
            assert torch.equal(x, y)


@pytest.mark.parametrize("batch,w_in,vocab,w_out", [(1, 1, 7, 2), (3, 2, 111, 3)])
def test_sbs_step_seeded_parity(batch, w_in, vocab, w_out):
    gen = torch.Generator().manual_seed(vocab)
    lp = _logp((batch, w_in, vocab), gen)
    sig = (torch.randn(batch, w_in, dtype=torch.float64, generator=gen) - 3).to(DEV)
    gam = torch.randn(batch, w_in, dtype=torch.float64, generator=gen).to(DEV)
    bv = torch.ones(batch, w_in, dtype=torch.bool)
    if w_in > 1:
        bv[0, -1] = False  # an invalid beam entry
    args = (lp, sig, gam, bv.to(DEV), w_out)
    for seed in SEEDS:
        a = sk.sbs_step(*args, seed=seed, backend="torch")
        b = sk.sbs_step(*args, seed=seed, backend="triton")
        assert torch.equal(a.parent_slot, b.parent_slot) and torch.equal(a.tokens, b.tokens)
        assert torch.equal(a.valid, b.valid)
        assert torch.allclose(a.sigma[a.valid], b.sigma[b.valid], rtol=1e-12)
        assert torch.allclose(a.gamma[a.valid], b.gamma[b.valid], rtol=1e-9, atol=1e-9)


def _probs(shape, gen, sharp=1.5):
    return torch.softmax(torch.randn(shape, generator=gen) * sharp, -1)


def _node_candidates(method, k, p, gen):
    """(tokens, valid, hub) of k candidates drafted from p [B, V] as ``method`` expects them."""
    lp = torch.log(p)
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    if method == "spechub":
        d = sk.spechub_sample(lp, seed=seed, backend="torch")
        return d.tokens, d.valid, d.hub
    if method == "rrsw":
        d = sk.gumbel_topk(lp, k, seed=seed, backend="torch")
        return d.tokens, d.valid, None
    cand = torch.multinomial(p, k, replacement=True, generator=gen)
    return cand, torch.ones_like(cand, dtype=torch.bool), None


@pytest.mark.parametrize("method,k", [("sd", 1), ("rrs", 3), ("rrsw", 2), ("kseq", 2), ("spechub", 2)])
@pytest.mark.parametrize("batch,vocab", [(1, 7), (3, 111)])
def test_verify_node_seeded_parity(method, k, batch, vocab):
    gen = torch.Generator().manual_seed(batch * vocab + k)
    p, q = _probs((batch, vocab), gen), _probs((batch, vocab), gen)
    cand, valid, hub = _node_candidates(method, k, p, gen)
    args = (method, cand.to(DEV), valid.to(DEV), p.to(DEV), q.to(DEV))
    kw = dict(hub=None if hub is None else hub.to(DEV), analytic=True)
    for seed in SEEDS:
        a = sk.verify_node(*args, seed=seed, backend="torch", **kw)
        b = sk.verify_node(*args, seed=seed, backend="triton", **kw)
        assert torch.equal(a.slot, b.slot) and torch.equal(a.token, b.token)
        assert torch.allclose(a.accept_prob, b.accept_prob, atol=2e-6)
        assert torch.allclose(a.final_residual, b.final_residual, atol=2e-6)


@pytest.mark.parametrize("batch,vocab", [(1, 7), (3, 111)])
@pytest.mark.parametrize("greedy", [False, True])
def test_verify_chain_seeded_parity(batch, vocab, greedy):
    gen = torch.Generator().manual_seed(batch + vocab)
    length = 3
    p = _probs((batch, length, vocab), gen, sharp=1.0)
    q = _probs((batch, length + 1, vocab), gen, sharp=1.0)
    draft = torch.multinomial(p.reshape(-1, vocab), 1, generator=gen).reshape(batch, length)
    lens = torch.tensor([length, 0, 2][:batch])
    eos = [int(draft[0, 2])]
    for seed in SEEDS:
        kw = dict(lengths=lens.to(DEV), greedy=greedy, eos_token_id=eos, seed=seed)
        a = sk.verify_chain(draft.to(DEV), p.to(DEV), q.to(DEV), backend="torch", **kw)
        b = sk.verify_chain(draft.to(DEV), p.to(DEV), q.to(DEV), backend="triton", **kw)
        assert torch.equal(a.n_accepted, b.n_accepted) and torch.equal(a.next_token, b.next_token)


TREES = [
    ("single", "sd", [-1], 7),
    ("chain", "sd", branching_parents([1, 1, 1]), 7),
    ("ragged", "rrs", branching_parents([2, 2]), 7),
    ("rrsw", "rrsw", branching_parents([3, 2]), 111),
    ("kseq", "kseq", kseq_chain_parents(3, 2), 7),
    ("spechub", "spechub", binary_tree_parents(3), 7),
]


@pytest.mark.parametrize("name,method,parents,vocab", TREES, ids=[t[0] for t in TREES])
def test_verify_tree_seeded_parity(name, method, parents, vocab):
    gen = torch.Generator().manual_seed(len(parents) * vocab)
    batch, n = 3, len(parents)
    par = parents_tensor(parents, batch)
    p = _probs((batch, n, vocab), gen)
    q = _probs((batch, n, vocab), gen)
    tokens = torch.zeros(batch, n, dtype=torch.long)
    hub = torch.zeros(batch, n, dtype=torch.long) if method == "spechub" else None
    for node in range(n):
        kids = [c for c in range(1, n) if parents[c] == node]
        if kids:
            cand, _, h = _node_candidates(method, len(kids), p[:, node], gen)
            tokens[:, kids] = cand[:, : len(kids)]
            if hub is not None:
                hub[:, node] = h
    valid = torch.ones(batch, n, dtype=torch.bool)
    if name == "ragged":
        valid[0, -2:] = False  # row 0: node 2 has no children
        valid[2, 2:] = False  # row 2: a single draft node
    kw = dict(method=method, valid=valid.to(DEV), hub=None if hub is None else hub.to(DEV))
    for seed in SEEDS:
        a = sk.verify_tree(tokens.to(DEV), par.to(DEV), p.to(DEV), q.to(DEV), seed=seed, backend="torch", **kw)
        b = sk.verify_tree(tokens.to(DEV), par.to(DEV), p.to(DEV), q.to(DEV), seed=seed, backend="triton", **kw)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)


def test_verifier_with_one_noise_tensor_uses_the_stream_for_the_other():
    """Launcher-level mixed case (the op layer never passes it): the missing tensor is the Philox stream."""
    gen = torch.Generator().manual_seed(3)
    batch, vocab, seed = 3, 7, 99
    p, q = _probs((batch, vocab), gen).to(DEV), _probs((batch, vocab), gen).to(DEV)
    cand = torch.multinomial(p.cpu(), 2, replacement=True, generator=gen).to(DEV)
    ok = torch.ones_like(cand, dtype=torch.bool)
    au = _rng.philox_uniform(seed, _rng.ACCEPT, (batch, 2), DEV)
    fin = _rng.philox_uniform(seed, _rng.FINAL, (batch, vocab), DEV)
    want = K.verify_node("rrs", cand, ok, p, q, None, None, None, False, seed)
    for got in (
        K.verify_node("rrs", cand, ok, p, q, au, None, None, False, seed),
        K.verify_node("rrs", cand, ok, p, q, None, fin, None, False, seed),
        K.verify_node("rrs", cand, ok, p, q, au, fin, None, False, 0),
    ):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ----------------------------------------------------------------------------------------------------------------
# the backend's own stream: law and reproducibility

LAW = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05], dtype=torch.float64)


def test_seeded_sampling_follows_the_law_and_the_check_has_power():
    """600 identical rows in one call: each row uses its own Philox row, so the draws are i.i.d. from LAW."""
    rows = 600
    lp = torch.log(LAW).float().expand(rows, -1).contiguous().to(DEV)
    draws = sk.sample_categorical(lp, seed=20240611, backend="triton").cpu()
    counts = np.bincount(draws.numpy(), minlength=LAW.numel())
    check = law_check(counts, LAW.numpy(), alpha=DEFAULT_ALPHA, max_tv=0.1)
    assert check.ok, str(check)
    # negative control: the same counts against a law with two tokens swapped must be rejected
    wrong = LAW[[1, 0, 2, 3, 4]].numpy()
    control = law_check(counts, wrong, alpha=DEFAULT_ALPHA, max_tv=0.1)
    assert not control.ok, f"the check cannot tell LAW from a swapped law at N={rows}: {control}"


def test_seeded_node_verification_emits_the_target_law():
    """Recursive rejection sampling with 2 i.i.d. drafts from P, all noise drawn in the kernel (ACCEPT and FINAL
    streams): the emitted token follows Q exactly, over 300 identical rows; negative control: not P."""
    rows = 300
    p = LAW.float().expand(rows, -1).contiguous().to(DEV)
    q = torch.tensor([0.1, 0.3, 0.2, 0.15, 0.25]).expand(rows, -1).contiguous().to(DEV)
    cand = torch.stack([sk.sample_categorical(torch.log(p), seed=s, backend="torch") for s in (11, 12)], dim=-1)
    out = sk.verify_node("rrs", cand, torch.ones_like(cand, dtype=torch.bool), p, q, seed=77, backend="triton")
    counts = np.bincount(out.token.cpu().numpy(), minlength=LAW.numel())
    check = law_check(counts, q[0].double().cpu().numpy(), alpha=DEFAULT_ALPHA, max_tv=0.12)
    assert check.ok, str(check)
    control = law_check(counts, LAW.numpy(), alpha=DEFAULT_ALPHA, max_tv=0.12)
    assert not control.ok, f"the check cannot tell Q from P at N={rows}: {control}"


def test_same_seed_same_output_other_seed_other_output():
    gen = torch.Generator().manual_seed(1)
    lp = _logp((8, 111), gen)
    a = sk.sample_categorical(lp, seed=5, backend="triton")
    assert torch.equal(a, sk.sample_categorical(lp, seed=5, backend="triton"))
    assert not torch.equal(a, sk.sample_categorical(lp, seed=6, backend="triton"))
    t1 = sk.gumbel_topk(lp[:2], 2, seed=5, backend="triton")
    t2 = sk.gumbel_topk(lp[:2], 2, seed=5, backend="triton")
    assert torch.equal(t1.tokens, t2.tokens) and torch.equal(t1.score, t2.score)
    assert not torch.equal(t1.score, sk.gumbel_topk(lp[:2], 2, seed=2**32 + 5, backend="triton").score)  # high word
