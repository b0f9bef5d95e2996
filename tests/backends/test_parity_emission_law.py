"""cpu vs torch parity of emission_law (CS Drafting's lenient review): float outputs within a budget earned from
the reference's own error against the float64 evaluation of the same inputs (2x it plus 4 fp32 ulps of each
entry); float64 inputs within 1e-15 (the order of the two sums over V); injected edge rows (p = q, point masses,
zeros, a residual mass at the zero-mass tolerance)."""

from __future__ import annotations

import pytest
import torch
from backend_parity import VOCABS, dyadic, on, opcheck_devices, requires_cpu_ext, rows_for

import specdec_kernels as sk
from specdec_kernels import _registry

pytestmark = requires_cpu_ext


def case(rows: int, vocab: int, seed: int, closeness: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """p, q [rows, V] fp32 with edge rows: p = q, a point mass (Max-Gram), zeros in q, q nearly p."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn((rows, vocab), generator=gen) * 2
    p = torch.softmax(z, -1)
    q = torch.softmax(z + closeness * torch.randn(z.shape, generator=gen) * 2, -1)
    if rows >= 4:
        q[0] = p[0]
        p[1] = 0.0
        p[1, int(torch.randint(vocab, (), generator=gen))] = 1.0
        q[2, : vocab // 2] = 0.0
        q[2] /= q[2].sum()
        q[3] = p[3]
        q[3, 0] += 3e-7  # residual mass at the fp32 zero-mass tolerance
        q[3, 1] -= 3e-7
    return p, q


def check(p: torch.Tensor, q: torch.Tensor, leniency: float) -> None:
    out = sk.emission_law(p, q, leniency, backend="cpu", validate=False)
    ref = sk.emission_law(p, q, leniency, backend="torch", validate=False)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if ref.dtype == torch.float64:
        assert torch.allclose(out, ref, rtol=0, atol=1e-15)
        return
    truth = sk.emission_law(p.double(), q.double(), float(torch.tensor(leniency, dtype=torch.float32)), backend="torch")
    ref_err = (ref.double() - truth).abs().max()
    budget = 2 * ref_err + 4 * torch.finfo(torch.float32).eps * truth.abs()
    err = (out.double() - truth).abs()
    assert bool((err <= budget + 1e-45).all()), (
        f"cpu error {float(err.max()):.3g}, reference error {float(ref_err):.3g}"
    )


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("leniency", [1.0, 1.1, 2.0, 10.0])
def test_matches_reference(vocab: int, leniency: float) -> None:
    p, q = case(rows_for(vocab) + 2, vocab, seed=vocab)
    check(p, q, leniency)


@pytest.mark.parametrize("rows", [1, 3, 99])
def test_row_counts_and_leading_shapes(rows: int) -> None:
    p, q = case(rows, 111, seed=rows)
    check(p, q, 2.0)
    check(p.reshape(rows, 1, 111).expand(rows, 2, 111), q.reshape(rows, 1, 111).expand(rows, 2, 111), 1.5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_dtypes(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    p = dyadic(torch.softmax(torch.randn((9, 111), generator=gen), -1), gen)
    q = dyadic(torch.softmax(torch.randn((9, 111), generator=gen), -1), gen)
    check(p.to(dtype), q.to(dtype), 2.0)
    check(p.float(), q.to(dtype), 1.5)


def test_empty_rows() -> None:
    out = sk.emission_law(torch.zeros((0, 7)), torch.zeros((0, 7)), 2.0, backend="cpu")
    assert out.shape == (0, 7)


@pytest.mark.parametrize("device", opcheck_devices())
def test_opcheck(device: str) -> None:
    p, q = case(4, 17, seed=0)
    torch.library.opcheck(torch.ops.specdec.emission_law, on(device, (p, q, 2.0)))
    torch.library.opcheck(torch.ops.specdec.emission_law, on(device, (p.double(), q, 1.0)))


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'emission_law': backend 'cpu' does not support"):
        _registry.resolve("emission_law", "cpu", torch.device("meta"))
