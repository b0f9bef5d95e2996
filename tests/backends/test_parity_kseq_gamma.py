"""cpu vs torch parity of kseq_gamma. Both bisect 40 times in float64 on sums over V; the sums run in a
different order (budget of backend_parity: float outputs within a per-dtype budget), so:

* gamma: the bisection takes the same branch unless h(mid) is within the summation round-off of 0, in which case
  mid is already within that round-off of the root; budget 4 (K - 1) 2^-40 (four final bracket widths);
* beta(gamma): 1-Lipschitz in gamma (|d beta / d g| = sum_{q/g < p} q / g^2 <= 1), plus the worst-case error of a
  recursive sum of V terms of total <= 1: |gamma error| + V 2^-52.
"""

from __future__ import annotations

import pytest
import torch
from backend_parity import VOCABS, dyadic, on, opcheck_devices, requires_cpu_ext

import specdec_kernels as sk
from specdec_kernels import _registry

pytestmark = requires_cpu_ext


def pq(batch: int, vocab: int, seed: int, closeness: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn((batch, vocab), generator=gen) * 2
    return torch.softmax(z, -1), torch.softmax(z + closeness * 2 * torch.randn(z.shape, generator=gen), -1)


def check(p: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g_cpu, b_cpu = sk.kseq_gamma(p, q, k, backend="cpu")
    g_ref, b_ref = sk.kseq_gamma(p, q, k, backend="torch")
    assert g_cpu.dtype == b_cpu.dtype == torch.float64
    g_budget = 4 * (k.double() - 1) * 2.0**-40
    g_err = (g_cpu - g_ref).abs()
    assert bool((g_err <= g_budget).all()), f"gamma error {g_err.max():.3g} > budget"
    b_budget = g_err + p.shape[-1] * 2.0**-52
    assert bool(((b_cpu - b_ref).abs() <= b_budget).all()), f"beta error {(b_cpu - b_ref).abs().max():.3g}"
    assert bool(((g_cpu >= 1) & (g_cpu <= k.double())).all())
    return g_cpu, b_cpu


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_matches_reference(vocab: int, k: int) -> None:
    batch = 2 if vocab > 20000 else 6
    p, q = pq(batch, vocab, seed=vocab + k)
    check(p, q, torch.full((batch,), k))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_dtypes(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    p, q = pq(4, 111, seed=3)
    p, q = dyadic(p, gen).to(dtype), dyadic(q, gen).to(dtype)
    check(p, q, torch.tensor([1, 2, 3, 4]))


@pytest.mark.parametrize("batch", [1, 3, 99])
def test_batch_shapes_and_per_row_k(batch: int) -> None:
    p, q = pq(batch, 7, seed=batch, closeness=1.5)
    k = torch.arange(batch) % 6 + 1
    gamma, _ = check(p, q, k)
    assert gamma.shape == (batch,)


def test_edge_laws() -> None:
    """p = q: gamma = 1 and beta = 1; disjoint supports: beta = 0 (nothing can be accepted)."""
    p, _ = pq(2, 111, seed=4)
    gamma, beta = check(p, p, torch.tensor([3, 4]))
    assert (gamma == 1).all() and torch.allclose(beta, torch.ones(2, dtype=torch.float64))
    a = torch.zeros((1, 10))
    b = torch.zeros((1, 10))
    a[0, :5], b[0, 5:] = 0.2, 0.2
    _, beta = check(a, b, torch.tensor([3]))
    assert beta.item() == 0.0


@pytest.mark.parametrize("device", opcheck_devices())
def test_opcheck(device: str) -> None:
    p, q = pq(3, 17, seed=0)
    torch.library.opcheck(torch.ops.specdec.kseq_gamma, on(device, (p, q, torch.tensor([1, 2, 3]))))


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'kseq_gamma': backend 'cpu' does not support"):
        _registry.resolve("kseq_gamma", "cpu", torch.device("meta"))
