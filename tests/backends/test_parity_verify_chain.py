"""cpu vs torch parity of verify_chain: identical n_accepted and next_token given identical
accept_u and final_noise (integer outputs only)."""

from __future__ import annotations

import pytest
import torch
from backend_parity import VOCABS, dyadic, on, opcheck_devices, open_uniform, requires_cpu_ext

import specdec_kernels as sk
from specdec_kernels import _registry

pytestmark = requires_cpu_ext


def chain_case(
    batch: int, length: int, vocab: int, seed: int, closeness: float = 0.5
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """draft [B, L] sampled from p [B, L, V]; q [B, L+1, V] a perturbation of p (acceptance in between 0 and 1)."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn((batch, length + 1, vocab), generator=gen) * 2
    p = torch.softmax(z[:, :length], -1)
    q = torch.softmax(z + closeness * torch.randn(z.shape, generator=gen) * 2, -1)
    draft = torch.multinomial(p.reshape(-1, vocab), 1, generator=gen).reshape(batch, length)
    return draft, p, q


def check(draft, p, q, u, fin, **kw) -> sk.ChainVerdict:
    out = sk.verify_chain(draft, p, q, accept_u=u, final_noise=fin, backend="cpu", **kw)
    ref = sk.verify_chain(draft, p, q, accept_u=u, final_noise=fin, backend="torch", **kw)
    assert torch.equal(out.n_accepted, ref.n_accepted), (out.n_accepted, ref.n_accepted)
    assert torch.equal(out.next_token, ref.next_token), (out.next_token, ref.next_token)
    return out


def noise(batch: int, length: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    u = torch.rand((batch, length), dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return u, open_uniform((batch, vocab), seed=seed + 1)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("greedy", [False, True])
def test_matches_reference(vocab: int, greedy: bool) -> None:
    batch, length = (6, 5) if vocab < 20000 else (2, 3)
    draft, p, q = chain_case(batch, length, vocab, seed=vocab, closeness=0.3)
    if greedy:  # make some greedy drafts right: draft = argmax q where the coin says so
        right = torch.rand((batch, length), generator=torch.Generator().manual_seed(1)) < 0.7
        draft = torch.where(right, q[:, :length].argmax(-1), draft)
    u, fin = noise(batch, length, vocab, seed=vocab)
    check(draft, None if greedy else p, q, u, fin, greedy=greedy)


@pytest.mark.parametrize("batch", [1, 3, 99])
@pytest.mark.parametrize("length", [1, 4, 7])
def test_ragged_batches(batch: int, length: int) -> None:
    draft, p, q = chain_case(batch, length, 111, seed=batch * 10 + length)
    lengths = torch.randint(0, length + 1, (batch,), generator=torch.Generator().manual_seed(batch))
    u, fin = noise(batch, length, 111, seed=length)
    check(draft, p, q, u, fin, lengths=lengths)
    check(draft, None, q, u, fin, lengths=lengths, greedy=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_dtypes(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    p = dyadic(torch.softmax(torch.randn((9, 4, 111), generator=gen), -1), gen)
    q = dyadic(torch.softmax(torch.randn((9, 5, 111), generator=gen), -1), gen)
    draft = torch.multinomial(p.reshape(-1, 111), 1, generator=gen).reshape(9, 4)
    u, fin = noise(9, 4, 111, seed=3)
    check(draft, p.to(dtype), q.to(dtype), u, fin)
    check(draft, p.float(), q.to(dtype), u, fin)  # mixed dtypes (float64 q makes the compute dtype float64)


def test_eos_stops_the_row() -> None:
    draft, p, _ = chain_case(4, 5, 111, seed=8)
    q = torch.cat([p, p[:, -1:]], dim=1)  # p = q: everything is accepted
    eos = [int(draft[0, 1]), int(draft[2, 3])]
    u, fin = noise(4, 5, 111, seed=8)
    out = check(draft, p, q, u, fin, eos_token_id=eos)
    assert out.n_accepted[0] == 2 and out.next_token[0] == -1


def test_p_equals_q_accepts_all_and_disjoint_rejects() -> None:
    draft, p, _ = chain_case(5, 4, 49152, seed=9)
    q = torch.cat([p, torch.softmax(torch.randn(5, 1, 49152), -1)], dim=1)
    u, fin = noise(5, 4, 49152, seed=9)
    assert check(draft, p, q, u, fin).n_accepted.tolist() == [4] * 5
    q0 = q.clone()
    q0[torch.arange(5), 0, draft[:, 0]] = 0.0  # q(x) = 0: always rejected
    q0 = q0 / q0.sum(-1, keepdim=True)
    assert check(draft, p, q0, u, fin).n_accepted.tolist() == [0] * 5


def test_zero_mass_residual_falls_back_to_q() -> None:
    """q = p up to 2e-7 on one token: a forced rejection leaves residual mass < 1e-6 -> sample q (the zero-mass
    rule)."""
    vocab = 7
    p = torch.full((1, 1, vocab), 1.0 / vocab)
    q = torch.full((1, 2, vocab), 1.0 / vocab)
    q[0, 0, 0] -= 2e-7
    q[0, 0, 1] += 2e-7
    draft = torch.zeros((1, 1), dtype=torch.long)
    u = torch.full((1, 1), 0.999999, dtype=torch.float64)
    for seed in range(10):
        out = check(draft, p, q, u, open_uniform((1, vocab), seed=seed))
        assert out.n_accepted.item() == 0


@pytest.mark.parametrize("vocab", [7, 111, 49152])
@pytest.mark.parametrize("leniency", [1.1, 2.0, 5.0])
@pytest.mark.parametrize("greedy", [False, True])
def test_lenient_review_matches_reference(vocab: int, leniency: float, greedy: bool) -> None:
    """CS Drafting's lenient review: U p(x) < l q(x); greedy: x == argmax q or p(x) < l q(x)."""
    batch, length = (6, 5) if vocab < 20000 else (2, 3)
    draft, p, q = chain_case(batch, length, vocab, seed=vocab + int(10 * leniency), closeness=0.6)
    lengths = torch.randint(0, length + 1, (batch,), generator=torch.Generator().manual_seed(vocab))
    u, fin = noise(batch, length, vocab, seed=vocab)
    out = check(draft, p, q, u, fin, greedy=greedy, leniency=leniency, lengths=lengths)
    exact = check(draft, p, q, u, fin, greedy=greedy, lengths=lengths)
    assert bool((out.n_accepted >= exact.n_accepted).all())


@pytest.mark.parametrize("device", opcheck_devices())
def test_opcheck(device: str) -> None:
    draft, p, q = chain_case(3, 4, 17, seed=0)
    u, fin = noise(3, 4, 17, seed=0)
    lengths = torch.tensor([4, 2, 0])
    for args in (
        (draft, p, q, lengths, u, fin, False, None),
        (draft, None, q, lengths, u, fin, True, torch.tensor([3, 5])),
        (draft, p, q, lengths, u, fin, False, None, 0, 2.0),
        (draft, p, q, lengths, u, fin, True, None, 0, 1.5),
    ):
        torch.library.opcheck(torch.ops.specdec.verify_chain, on(device, args))


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'verify_chain': backend 'cpu' does not support"):
        _registry.resolve("verify_chain", "cpu", torch.device("meta"))
