"""cpu vs torch parity of spechub_sample: identical drafts, hub and validity given identical
float64 noise (every output is an integer or a flag)."""

from __future__ import annotations

import pytest
import torch
from backend_parity import VOCABS, on, opcheck_devices, open_uniform, requires_cpu_ext, rows_for

import specdec_kernels as sk
from specdec_kernels import _registry

pytestmark = requires_cpu_ext

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def check(logp: torch.Tensor, u: torch.Tensor) -> sk.SpecHubDraft:
    out = sk.spechub_sample(logp, noise=u, backend="cpu")
    ref = sk.spechub_sample(logp, noise=u, backend="torch")
    assert torch.equal(out.tokens, ref.tokens), (out.tokens, ref.tokens)
    assert torch.equal(out.hub, ref.hub)
    assert torch.equal(out.valid, ref.valid)
    return out


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(vocab: int, dtype: torch.dtype) -> None:
    rows = rows_for(vocab)
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn((rows, vocab), generator=gen) * 3
    logits[0, 1::3] = float("-inf")  # masked tokens
    logits[1, :2] += 12.0  # a dominant pair: the hub is often drawn first
    logp = torch.log_softmax(logits, -1).to(dtype)
    out = check(logp, open_uniform((rows, vocab), seed=vocab + 1))
    assert out.tokens.shape == (rows, 2) and out.hub.shape == (rows,)
    assert bool((out.tokens == out.hub[:, None]).any(-1)[out.valid[:, 1]].all()), "the hub is one of the two drafts"


@pytest.mark.parametrize("shape", [(111,), (1, 7), (3, 111), (99, 7), (2, 3, 5)])
def test_batch_shapes(shape: tuple[int, ...]) -> None:
    logp = torch.log_softmax(torch.randn(shape) * 2, -1)
    out = check(logp, open_uniform(shape, seed=len(shape)))
    assert out.tokens.shape == (*shape[:-1], 2)


def test_many_seeds_small_vocab() -> None:
    """Both pair types ((a, i) and (i, a)) occur many times on a 3-token vocabulary."""
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).expand(2000, 3).contiguous()
    out = check(logp, open_uniform((2000, 3), seed=11))
    first_is_hub = out.tokens[:, 0] == out.hub
    assert 0 < int(first_is_hub.sum()) < 2000


def test_single_token_vocabulary_and_certain_hub() -> None:
    """V = 1 and p(hub) = 1 - 1e-9: no second draft exists (slot 1 invalid, token -1) in both backends."""
    out = check(torch.zeros((3, 1)), open_uniform((3, 1), seed=2))
    assert not out.valid[:, 1].any() and (out.tokens[:, 1] == -1).all()
    logp = torch.full((2, 32000), -40.0, dtype=torch.float64)
    logp[:, 5] = 0.0
    out = check(logp, open_uniform((2, 32000), seed=3))
    assert (out.hub == 5).all() and not out.valid[:, 1].any()


def test_ties_pick_the_lowest_hub() -> None:
    logp = torch.full((2, 64), -3.0)
    logp[:, 9] = logp[:, 40] = -1.0
    out = check(logp, torch.full((2, 64), 0.5, dtype=torch.float64))
    assert (out.hub == 9).all()


@pytest.mark.parametrize("device", opcheck_devices())
def test_opcheck(device: str) -> None:
    logp = torch.log_softmax(torch.randn(3, 17), -1)
    torch.library.opcheck(torch.ops.specdec.spechub_sample, on(device, (logp, open_uniform((3, 17), seed=0))))


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'spechub_sample': backend 'cpu' does not support"):
        _registry.resolve("spechub_sample", "cpu", torch.device("meta"))
