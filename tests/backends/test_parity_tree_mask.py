"""cpu vs torch parity of tree_mask: the additive mask must be bitwise identical."""

from __future__ import annotations

import pytest
import torch
from backend_parity import on, opcheck_devices, ragged_trees, requires_cpu_ext

import specdec_kernels as sk
from specdec_kernels import _registry, branching_parents, kseq_chain_parents, parents_tensor

pytestmark = requires_cpu_ext

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.mark.parametrize("batch", [1, 3, 99])
@pytest.mark.parametrize("n", [1, 5, 33])
@pytest.mark.parametrize("past_len", [0, 6])
def test_ragged_matches_reference(batch: int, n: int, past_len: int) -> None:
    parent, valid = ragged_trees(batch, n, seed=7 * batch + n + past_len)
    gen = torch.Generator().manual_seed(n)
    past_valid = torch.rand((batch, past_len), generator=gen) < 0.8
    for dtype in DTYPES:
        out = sk.tree_mask(parent, valid, past_len, past_valid=past_valid, dtype=dtype, backend="cpu")
        ref = sk.tree_mask(parent, valid, past_len, past_valid=past_valid, dtype=dtype, backend="torch")
        assert out.dtype == dtype and out.shape == (batch, 1, n, past_len + n)
        assert torch.equal(out, ref)


@pytest.mark.parametrize("parents", [branching_parents([3, 2, 1]), kseq_chain_parents(3, 4), [-1]])
def test_static_trees(parents: list[int]) -> None:
    parent = parents_tensor(parents, batch=2)
    out = sk.tree_mask(parent, past_len=3, backend="cpu")
    assert torch.equal(out, sk.tree_mask(parent, past_len=3, backend="torch"))


def test_int32_parent() -> None:
    parent, valid = ragged_trees(4, 9, seed=3)
    out = sk.tree_mask(parent.int(), valid, 2, backend="cpu")
    assert torch.equal(out, sk.tree_mask(parent, valid, 2, backend="torch"))


@pytest.mark.parametrize("device", opcheck_devices())
def test_opcheck(device: str) -> None:
    parent, valid = ragged_trees(3, 7, seed=1)
    past_valid = torch.ones((3, 4), dtype=torch.bool)
    for dtype in (torch.float32, torch.bfloat16):
        torch.library.opcheck(torch.ops.specdec.tree_mask, on(device, (parent, valid, past_valid, dtype)))


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'tree_mask': backend 'cpu' does not support"):
        _registry.resolve("tree_mask", "cpu", torch.device("meta"))
