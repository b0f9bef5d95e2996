"""cpu vs torch parity of sbs_step: identical parent slots, tokens and validity given identical float64
noise; sigma (one float64 addition in both) bitwise equal; gamma (the stable Trunc formula, libm vs SLEEF logs of
<= 1 ulp each, amplified at most a few times by the formula) within 1e-12 absolute + relative."""

from __future__ import annotations

import pytest
import torch
from backend_parity import VOCABS, on, opcheck_devices, open_uniform, requires_cpu_ext

import specdec_kernels as sk
from specdec_kernels import _registry

pytestmark = requires_cpu_ext

F64 = torch.float64
NEG_INF = float("-inf")


def beam(
    batch: int, w_in: int, vocab: int, seed: int, dtype: torch.dtype = torch.float32, p_valid: float = 0.8
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A beam state: logp [B, Win, V] with a masked token, sigma/gamma [B, Win] and random validity (slot 0 valid);
    rows of invalid entries are NaN (neither backend may read them)."""
    gen = torch.Generator().manual_seed(seed)
    logits = 2.5 * torch.randn((batch, w_in, vocab), generator=gen, dtype=F64)
    logits[..., min(1, vocab - 1)] = NEG_INF if vocab > 1 else 0.0
    logp = torch.log_softmax(logits, -1).to(dtype)
    sigma = -5 * torch.rand((batch, w_in), generator=gen, dtype=F64)
    gamma = torch.sort(3 * torch.randn((batch, w_in), generator=gen, dtype=F64), -1, descending=True).values
    valid = torch.rand((batch, w_in), generator=gen) < p_valid
    valid[:, 0] = True
    logp[~valid] = float("nan")
    return logp, sigma, gamma, valid


def check(logp, sigma, gamma, valid, w_out: int, u: torch.Tensor) -> sk.SBSStep:
    out = sk.sbs_step(logp, sigma, gamma, valid, w_out, noise=u, backend="cpu")
    ref = sk.sbs_step(logp, sigma, gamma, valid, w_out, noise=u, backend="torch")
    assert torch.equal(out.parent_slot, ref.parent_slot), (out.parent_slot, ref.parent_slot)
    assert torch.equal(out.tokens, ref.tokens), (out.tokens, ref.tokens)
    assert torch.equal(out.valid, ref.valid)
    assert out.sigma.dtype == out.gamma.dtype == F64
    assert torch.equal(out.sigma, ref.sigma)
    assert torch.equal(torch.isneginf(out.gamma), torch.isneginf(ref.gamma))
    fin = torch.isfinite(ref.gamma)
    torch.testing.assert_close(out.gamma[fin], ref.gamma[fin], rtol=1e-12, atol=1e-12)
    return out


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("w_in,w_out", [(1, 1), (1, 4), (3, 2), (4, 4), (8, 8), (3, 9)])
def test_matches_reference(vocab: int, w_in: int, w_out: int) -> None:
    batch = 2 if vocab > 20000 else 5
    w_out = min(w_out, w_in * vocab)
    logp, sigma, gamma, valid = beam(batch, w_in, vocab, seed=vocab + 10 * w_in + w_out)
    out = check(logp, sigma, gamma, valid, w_out, open_uniform((batch, w_in, vocab), seed=w_out))
    assert out.tokens.shape == (batch, w_out)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_dtypes(dtype: torch.dtype) -> None:
    logp, sigma, gamma, valid = beam(4, 3, 111, seed=1, dtype=dtype)
    check(logp, sigma.float(), gamma.float(), valid, 3, open_uniform((4, 3, 111), seed=1))


@pytest.mark.parametrize("batch", [1, 3, 99])
def test_batch_shapes(batch: int) -> None:
    logp, sigma, gamma, valid = beam(batch, 3, 7, seed=batch)
    check(logp, sigma, gamma, valid, 3, open_uniform((batch, 3, 7), seed=batch))


def test_w_out_beyond_vocab_and_masked_children_are_invalid() -> None:
    """w_out = Win * V: every child is a candidate; the masked children (p = 0) come out invalid, last."""
    logp, sigma, gamma, valid = beam(3, 2, 5, seed=3, p_valid=1.0)
    out = check(logp, sigma, gamma, valid, 10, open_uniform((3, 2, 5), seed=3))
    assert not out.valid[:, -2:].any() and out.valid[:, :-2].all()


def test_ties_break_to_lowest_flat_index() -> None:
    """Equal log-probs and equal noise: every psi ties, the selection is the first w_out flattened indices."""
    logp = torch.full((2, 3, 64), -64.0).log_softmax(-1)
    zeros = torch.zeros((2, 3), dtype=F64)
    u = torch.full((2, 3, 64), 0.25, dtype=F64)
    out = check(logp, zeros, zeros, torch.ones((2, 3), dtype=torch.bool), 5, u)
    assert out.parent_slot[0].tolist() == [0, 0, 0, 0, 0]
    assert out.tokens[0].tolist() == [0, 1, 2, 3, 4]


def test_flattened_truncation_ties_resolved_by_index() -> None:
    """gamma far below the children's maximum (u << Z): Trunc rounds to gamma for many children, so the reference
    orders them by index, not by perturbed score; the cpu backend must notice and evaluate every child."""
    logp, sigma, _, valid = beam(2, 2, 3000, seed=5, p_valid=1.0)
    gamma = torch.tensor([[-60.0, -61.0], [-45.0, -80.0]], dtype=F64)
    out = check(logp, sigma * 0, gamma, valid, 4, open_uniform((2, 2, 3000), seed=5))
    assert out.valid.all()


def test_minus_inf_gamma_or_sigma_gives_no_children() -> None:
    logp, sigma, gamma, valid = beam(2, 2, 50, seed=6, p_valid=1.0)
    gamma[0, 1] = NEG_INF
    sigma[1, 1] = NEG_INF
    out = check(logp, sigma, gamma, valid, 4, open_uniform((2, 2, 50), seed=6))
    assert not (out.parent_slot[0] == 1).any() and not (out.parent_slot[1] == 1).any()


@pytest.mark.parametrize("device", opcheck_devices())
def test_opcheck(device: str) -> None:
    logp, sigma, gamma, valid = beam(3, 2, 17, seed=0, p_valid=1.0)
    args = (logp, sigma, gamma, valid, 3, open_uniform((3, 2, 17), seed=0))
    torch.library.opcheck(torch.ops.specdec.sbs_step, on(device, args))


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'sbs_step': backend 'cpu' does not support"):
        _registry.resolve("sbs_step", "cpu", torch.device("meta"))
