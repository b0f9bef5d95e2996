"""cpu vs torch parity of tree_positions: integer output, must be identical."""

from __future__ import annotations

import pytest
import torch
from backend_parity import depth_of, on, opcheck_devices, ragged_trees, requires_cpu_ext

import specdec_kernels as sk
from specdec_kernels import _registry

pytestmark = requires_cpu_ext


@pytest.mark.parametrize("batch", [1, 3, 99])
@pytest.mark.parametrize("n", [1, 2, 17, 64])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_matches_reference(batch: int, n: int, dtype: torch.dtype) -> None:
    parent, valid = ragged_trees(batch, n, seed=batch * 100 + n)
    depth = depth_of(parent, valid).to(dtype)
    prefix = torch.randint(1, 500, (batch,))
    out = sk.tree_positions(depth, prefix, backend="cpu")
    ref = sk.tree_positions(depth, prefix, backend="torch")
    assert out.dtype == torch.int64
    assert torch.equal(out, ref)


def test_int_prefix() -> None:
    depth = torch.tensor([[0, 1, 1, 2, 3]])
    assert torch.equal(sk.tree_positions(depth, 7, backend="cpu"), torch.tensor([[6, 7, 7, 8, 9]]))


@pytest.mark.parametrize("device", opcheck_devices())
def test_opcheck(device: str) -> None:
    depth = torch.tensor([[0, 1, 1, 2], [0, 1, 2, 3]])
    torch.library.opcheck(torch.ops.specdec.tree_positions, on(device, (depth, torch.tensor([3, 9]))))


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'tree_positions': backend 'cpu' does not support"):
        _registry.resolve("tree_positions", "cpu", torch.device("meta"))


def test_missing_extension_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    impls = dict(_registry._IMPLS["tree_positions"])
    impls.pop("cpu")
    monkeypatch.setitem(_registry._IMPLS, "tree_positions", impls)
    monkeypatch.setitem(_registry._MISSING_REASON, "cpu", "C++ extension not built: simulated")
    with pytest.raises(sk.BackendUnavailableError, match=r"backend 'cpu' is unavailable \(C\+\+ extension not built"):
        sk.tree_positions(torch.zeros((1, 3), dtype=torch.long), 4, backend="cpu")
    # auto quietly falls back to the reference
    assert torch.equal(sk.tree_positions(torch.zeros((1, 3), dtype=torch.long), 4), torch.full((1, 3), 3))
