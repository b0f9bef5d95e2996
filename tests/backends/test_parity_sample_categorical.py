"""cpu vs torch parity of sample_categorical: identical tokens given identical float64 noise."""

from __future__ import annotations

import pytest
import torch
from backend_parity import VOCABS, on, opcheck_devices, open_uniform, requires_cpu_ext, rows_for

import specdec_kernels as sk
from specdec_kernels import _registry

pytestmark = requires_cpu_ext

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def both(logp: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        sk.sample_categorical(logp, noise=u, backend="cpu"),
        sk.sample_categorical(logp, noise=u, backend="torch"),
    )


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(vocab: int, dtype: torch.dtype) -> None:
    rows = rows_for(vocab)
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn((rows, vocab), generator=gen) * 4
    logits[0, 1::3] = float("-inf")  # masked tokens
    logp = torch.log_softmax(logits, -1).to(dtype)
    out, ref = both(logp, open_uniform((rows, vocab), seed=vocab + 1))
    assert out.dtype == torch.int64 and out.shape == (rows,)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("batch", [1, 3, 99])
def test_batch_shapes(batch: int) -> None:
    logp = torch.log_softmax(torch.randn((batch, 2, 111)), -1)
    out, ref = both(logp, open_uniform((batch, 2, 111), seed=batch))
    assert out.shape == (batch, 2)
    assert torch.equal(out, ref)


def test_ties_break_to_lowest_index() -> None:
    logp = torch.full((2, 50), -3.0)
    u = torch.full((2, 50), 0.5, dtype=torch.float64)
    out, ref = both(logp, u)
    assert torch.equal(out, torch.zeros(2, dtype=torch.long)) and torch.equal(out, ref)
    logp[1, 7] = logp[1, 30] = -1.0  # tie between two better tokens
    out, ref = both(logp, u)
    assert out.tolist() == [0, 7] and torch.equal(out, ref)


def test_tail_token_with_extreme_noise_wins() -> None:
    """A token ~30 nats below the mode wins with u = 1 - 2^-53: the race pruning must not skip it."""
    logp = torch.full((1, 32000), -30.0, dtype=torch.float64)
    logp[0, 0] = 0.0
    u = torch.full((1, 32000), 0.5, dtype=torch.float64)
    u[0, 20001] = 1.0 - 2.0**-53
    out, ref = both(logp, u)
    assert out.item() == ref.item() == 20001


def test_single_finite_token() -> None:
    logp = torch.full((3, 49152), float("-inf"))
    logp[torch.arange(3), torch.tensor([0, 49151, 777])] = 0.0
    out, ref = both(logp, open_uniform((3, 49152), seed=5))
    assert out.tolist() == [0, 49151, 777] and torch.equal(out, ref)


@pytest.mark.parametrize("device", opcheck_devices())
def test_opcheck(device: str) -> None:
    logp = torch.log_softmax(torch.randn(3, 17), -1)
    torch.library.opcheck(torch.ops.specdec.sample_categorical, on(device, (logp, open_uniform((3, 17), seed=0))))


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'sample_categorical': backend 'cpu' does not support"):
        _registry.resolve("sample_categorical", "cpu", torch.device("meta"))
