"""cpu vs torch parity of filter_kv: in-place moves, caches must end bitwise identical."""

from __future__ import annotations

import random

import pytest
import torch
from backend_parity import on, opcheck_devices, requires_cpu_ext

import specdec_kernels as sk
from specdec_kernels import _registry

pytestmark = requires_cpu_ext


def accepted_paths(batch: int, max_len: int, n_nodes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """accepted_nodes [B, L] (strictly increasing ids, id > depth index), n_accepted [B] incl. 0 and L."""
    rng = random.Random(seed)
    nodes = torch.full((batch, max_len), -1, dtype=torch.long)
    n_acc = torch.zeros((batch,), dtype=torch.long)
    for b in range(batch):
        m = rng.choice([0, max_len, rng.randint(0, max_len)])
        ids, last = [], 0
        for j in range(m):
            last = rng.randint(max(last + 1, j + 1), n_nodes - (m - j))
            ids.append(last)
        nodes[b, :m] = torch.tensor(ids, dtype=torch.long)
        n_acc[b] = m
    return nodes, n_acc


def make_kv(batch: int, heads: int, slots: int, dim: int, dtype: torch.dtype, layout: str) -> torch.Tensor:
    if layout == "bshd":  # [B, S, H, D] storage viewed as [B, H, S, D] (non-contiguous)
        return torch.randn((batch, slots, heads, dim)).to(dtype).transpose(1, 2)
    if layout == "strided_d":  # last dim not unit-stride
        return torch.randn((batch, heads, slots, dim * 2)).to(dtype)[..., ::2]
    return torch.randn((batch, heads, slots, dim)).to(dtype)


@pytest.mark.parametrize("batch", [1, 3, 9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["contiguous", "bshd", "strided_d"])
def test_matches_reference(batch: int, dtype: torch.dtype, layout: str) -> None:
    torch.manual_seed(batch)
    n_nodes, max_len = 12, 5
    prefix = torch.randint(1, 20, (batch,))
    slots = int(prefix.max()) + n_nodes + 3
    nodes, n_acc = accepted_paths(batch, max_len, n_nodes, seed=batch)
    kv = [make_kv(batch, 3, slots, 8, dtype, layout) for _ in range(4)]
    kv_ref = [t.clone() for t in kv]
    out = sk.filter_kv(kv, prefix, nodes, n_acc, backend="cpu")
    ref = sk.filter_kv(kv_ref, prefix, nodes, n_acc, backend="torch")
    assert torch.equal(out, ref)
    for a, b in zip(kv, kv_ref, strict=True):
        assert torch.equal(a, b)


def test_int_prefix_and_no_layers() -> None:
    nodes = torch.tensor([[1, 3], [2, -1]])
    n_acc = torch.tensor([2, 1])
    assert torch.equal(sk.filter_kv([], 4, nodes, n_acc, backend="cpu"), torch.tensor([6, 5]))


@pytest.mark.parametrize("device", opcheck_devices())
def test_opcheck(device: str) -> None:
    nodes = torch.tensor([[1, 3, -1], [2, 4, 6]])
    n_acc = torch.tensor([2, 3])
    kv = [torch.randn(2, 2, 12, 4) for _ in range(2)]
    torch.library.opcheck(torch.ops.specdec.filter_kv, on(device, (kv, torch.tensor([3, 5]), nodes, n_acc)))


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'filter_kv': backend 'cpu' does not support"):
        _registry.resolve("filter_kv", "cpu", torch.device("meta"))
