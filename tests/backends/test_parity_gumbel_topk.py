"""cpu vs torch parity of gumbel_topk: identical tokens/valid, scores within 1e-13 (float64 logs)."""

from __future__ import annotations

import pytest
import torch
from backend_parity import VOCABS, on, opcheck_devices, open_uniform, requires_cpu_ext, rows_for

import specdec_kernels as sk
from specdec_kernels import _registry

pytestmark = requires_cpu_ext


def check(logp: torch.Tensor, k: int, u: torch.Tensor) -> sk.GumbelTopK:
    out = sk.gumbel_topk(logp, k, noise=u, backend="cpu")
    ref = sk.gumbel_topk(logp, k, noise=u, backend="torch")
    assert torch.equal(out.tokens, ref.tokens)
    assert torch.equal(out.valid, ref.valid)
    assert out.score.dtype == torch.float64
    assert torch.equal(torch.isneginf(out.score), torch.isneginf(ref.score))
    fin = torch.isfinite(ref.score)
    torch.testing.assert_close(out.score[fin], ref.score[fin], rtol=1e-13, atol=1e-13)
    return out


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("k", [0, 1, 2, 5, 64, 65, 300])
def test_matches_reference(vocab: int, k: int) -> None:
    k = min(k, vocab)
    rows = rows_for(vocab)
    gen = torch.Generator().manual_seed(vocab + k)
    logits = torch.randn((rows, vocab), generator=gen) * 3
    logits[-1, : vocab // 2] = float("-inf")
    logp = torch.log_softmax(logits, -1)
    out = check(logp, k, open_uniform((rows, vocab), seed=k))
    assert out.tokens.shape == (rows, k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_dtypes(dtype: torch.dtype) -> None:
    logp = torch.log_softmax(torch.randn((5, 111)) * 2, -1).to(dtype)
    check(logp, 4, open_uniform((5, 111), seed=1))


@pytest.mark.parametrize("batch", [1, 3, 99])
def test_batch_shapes(batch: int) -> None:
    logp = torch.log_softmax(torch.randn((batch, 3, 7)), -1)
    out = check(logp, 3, open_uniform((batch, 3, 7), seed=batch))
    assert out.tokens.shape == (batch, 3, 3)


def test_full_k_and_masked_tokens_are_invalid() -> None:
    logp = torch.full((4, 111), float("-inf"))
    logp[:, :5] = torch.log_softmax(torch.randn(4, 5), -1)
    out = check(logp, 111, open_uniform((4, 111), seed=2))
    assert int(out.valid.sum(-1).max()) <= 5


def test_exhausted_mass_is_invalid() -> None:
    """p(top) = 1 - 1e-9: the second draw has remaining mass < 1e-7 and must be invalid in both backends."""
    logp = torch.full((2, 32000), -40.0, dtype=torch.float64)
    logp[:, 3] = 0.0
    u = open_uniform((2, 32000), seed=4)
    u[:, 3] = 0.999999
    out = check(logp, 3, u)
    assert out.valid[:, 0].all() and not out.valid[:, 1:].any()


def test_ties() -> None:
    logp = torch.full((2, 64), -2.0)
    u = torch.full((2, 64), 0.25, dtype=torch.float64)
    out = check(logp, 5, u)
    assert out.tokens[0].tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("device", opcheck_devices())
def test_opcheck(device: str) -> None:
    logp = torch.log_softmax(torch.randn(3, 17), -1)
    torch.library.opcheck(torch.ops.specdec.gumbel_topk, on(device, (logp, 4, open_uniform((3, 17), seed=0))))


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'gumbel_topk': backend 'cpu' does not support"):
        _registry.resolve("gumbel_topk", "cpu", torch.device("meta"))
