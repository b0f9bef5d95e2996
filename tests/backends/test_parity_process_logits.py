"""cpu vs torch parity of process_logits: identical kept sets (-inf pattern), fp32 log-probs within
the budget of backend_parity.assert_logp_close."""

from __future__ import annotations

import pytest
import torch
from backend_parity import (
    VOCABS,
    assert_logp_close,
    assert_probs_close,
    on,
    opcheck_devices,
    requires_cpu_ext,
    rows_for,
)

import specdec_kernels as sk
from specdec_kernels import _registry

pytestmark = requires_cpu_ext

SETTINGS = [  # (temperature, top_k, top_p)
    (1.0, 0, 1.0),
    (0.7, 0, 1.0),
    (0.0, 0, 1.0),
    (1.0, 1, 1.0),
    (0.8, 50, 1.0),
    (1.0, 2000, 1.0),
    (1.0, 0, 0.9),
    (1.3, 0, 0.999),
    (0.6, 40, 0.5),
    (1.0, 0, 0.01),
]


def check(logits: torch.Tensor, t: float, k: int, p: float) -> torch.Tensor:
    out = sk.process_logits(logits, t, k, p, backend="cpu")
    ref = sk.process_logits(logits, t, k, p, backend="torch")
    assert out.shape == logits.shape
    assert_logp_close(out, ref, None if t < 1e-5 else logits.float() / t)
    # log=False: the law, written by the cpu kernel in the same pass, vs the reference's softmax of its log-probs
    probs = sk.process_logits(logits, t, k, p, log=False, backend="cpu")
    probs_ref = sk.process_logits(logits, t, k, p, log=False, backend="torch")
    assert probs.shape == logits.shape
    assert torch.equal(probs == 0, torch.isneginf(out)), "log=False must be 0 exactly where log-probs are -inf"
    assert_probs_close(
        probs, probs_ref, None if t < 1e-5 else (logits.float() / t).masked_fill(torch.isneginf(ref), float("-inf"))
    )
    return out


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_matches_reference(vocab: int, setting: tuple[float, int, float]) -> None:
    rows = rows_for(vocab)
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn((rows, vocab), generator=gen) * 3
    logits[0, ::5] = float("-inf")
    check(logits, *setting)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("setting", SETTINGS[:3] + SETTINGS[6:9], ids=str)
def test_dtypes(dtype: torch.dtype, setting: tuple[float, int, float]) -> None:
    logits = (torch.randn((4, 111)) * 4).to(dtype)
    check(logits, *setting)


@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_ties(setting: tuple[float, int, float]) -> None:
    """Integer-valued logits: many exact ties at the top-k boundary and in the top-p order."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randint(-3, 3, (9, 111), generator=gen).float()
    check(logits, *setting)


@pytest.mark.parametrize("batch", [1, 3, 99])
def test_batch_shapes(batch: int) -> None:
    logits = torch.randn((batch, 2, 7)) * 2
    for setting in SETTINGS:
        check(logits, *setting)


def test_single_finite_token() -> None:
    logits = torch.full((2, 32000), float("-inf"))
    logits[0, 5] = logits[1, 31999] = 1.0
    out = check(logits, 1.0, 3, 0.5)
    assert out[0, 5] == 0.0 and out[1, 31999] == 0.0


def test_peaked_rows() -> None:
    """LLM-like rows: a few dominant tokens and a long flat tail (top-p decided in the first buckets)."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn((3, 49152), generator=gen)
    logits[:, :4] += torch.tensor([12.0, 11.0, 10.5, 9.0])
    for p in (0.3, 0.8, 0.95, 0.9999):
        check(logits, 1.0, 0, p)


@pytest.mark.parametrize("device", opcheck_devices())
def test_opcheck(device: str) -> None:
    logits = torch.randn(3, 17)
    for args in ((1.0, 0, 1.0), (0.7, 5, 0.9), (0.0, 0, 1.0)):
        torch.library.opcheck(torch.ops.specdec.process_logits, on(device, (logits, *args)))
        torch.library.opcheck(torch.ops.specdec.process_logits, on(device, (logits, *args, False)))


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'process_logits': backend 'cpu' does not support"):
        _registry.resolve("process_logits", "cpu", torch.device("meta"))
