"""filter_kv: the compacted cache equals the gathered accepted path; ragged n_accepted (incl. 0),
per-row prefix lengths, in place on every layer tensor; bad inputs; backend parity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec_kernels import available_backends, filter_kv
from specdec_kernels.testing.oracles_tree import random_parents


def labelled_cache(batch: int, slots: int, layer: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[B, H=2, S, D=3] whose entries encode (row, slot, layer, head, dim) so any misplaced copy is visible.

    Half-precision labels keep only (slot, layer), which they represent exactly."""
    b = torch.arange(batch, dtype=torch.float64)[:, None, None, None]
    s = torch.arange(slots, dtype=torch.float64)[None, None, :, None]
    h = torch.arange(2, dtype=torch.float64)[None, :, None, None]
    d = torch.arange(3, dtype=torch.float64)[None, None, None, :]
    if dtype in (torch.float16, torch.bfloat16):
        return (s + 0.25 * layer + 0 * (b + h + d)).to(dtype)
    return (b * 1000 + s * 10 + layer * 0.5 + h * 0.25 + d * 0.125).to(dtype)


def random_path(rng: np.random.Generator, parents: list[int]) -> list[int]:
    """Root-to-node path (node ids by increasing depth, root excluded) ending at a random node."""
    node = int(rng.integers(0, len(parents)))
    path = []
    while node > 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def expected_rows(cache: torch.Tensor, b: int, p: int, path: list[int]) -> torch.Tensor:
    src = list(range(p)) + [p - 1 + n for n in path]
    return cache[b, :, src]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_filtered_cache_equals_gathered_path(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(0)
    batch = 5
    trees = [random_parents(rng, int(rng.integers(2, 16))) for _ in range(batch)]
    paths = [random_path(rng, t) for t in trees]
    paths[0] = []  # nothing accepted
    prefix = torch.tensor([int(rng.integers(1, 6)) for _ in range(batch)])
    max_l = max(max(len(p) for p in paths), 1)
    nodes = torch.full((batch, max_l), -1, dtype=torch.long)
    for b, path in enumerate(paths):
        nodes[b, : len(path)] = torch.tensor(path, dtype=torch.long)
    n_acc = torch.tensor([len(p) for p in paths])
    slots = int((prefix - 1).max()) + max(len(t) for t in trees)
    kv = [labelled_cache(batch, slots, layer, dtype) for layer in range(3)]
    before = [t.clone() for t in kv]
    ptrs = [t.data_ptr() for t in kv]
    trusted = [t.clone() for t in kv]
    new_len = filter_kv(kv, prefix, nodes, n_acc)
    assert new_len.tolist() == (prefix + n_acc).tolist()
    # the driver's call (validate=False) moves the same slots
    assert torch.equal(filter_kv(trusted, prefix, nodes, n_acc, validate=False), new_len)
    assert all(torch.equal(a, b) for a, b in zip(trusted, kv, strict=True))
    for t, old, ptr in zip(kv, before, ptrs, strict=True):
        assert t.data_ptr() == ptr  # in place
        for b in range(batch):
            m, p = len(paths[b]), int(prefix[b])
            assert torch.equal(t[b, :, : p + m], expected_rows(old, b, p, paths[b]))


def test_chain_path_is_identity_and_zero_accepted_keeps_cache() -> None:
    kv = [labelled_cache(2, 8, 0)]
    old = kv[0].clone()
    nodes = torch.tensor([[1, 2, 3], [-1, -1, -1]])
    new_len = filter_kv(kv, 4, nodes, torch.tensor([3, 0]))
    assert new_len.tolist() == [7, 4]
    assert torch.equal(kv[0], old)  # chain nodes 1..3 already sit at P..P+2; row 1 accepted nothing


def test_branch_moves_slots_down() -> None:
    # Tree [-1, 0, 0, 1, 2]: accepting nodes 2 -> 4 moves slots P+1 -> P and P+3 -> P+1.
    kv = [labelled_cache(1, 8, 0)]
    old = kv[0].clone()
    filter_kv(kv, torch.tensor([3]), torch.tensor([[2, 4]]), torch.tensor([2]))
    assert torch.equal(kv[0][0, :, :5], old[0, :, [0, 1, 2, 4, 6]])


def ok_args():
    return [labelled_cache(1, 8, 0)], 3, torch.tensor([[1, 3]]), torch.tensor([2])


BAD = [
    ({"kv": labelled_cache(1, 8, 0)}, TypeError, "kv must be a sequence"),
    ({"accepted_nodes": torch.tensor([[1.0, 3.0]])}, TypeError, "accepted_nodes must be an integer tensor"),
    ({"accepted_nodes": torch.tensor([1, 3])}, ValueError, "accepted_nodes must have 2 dimensions"),
    ({"n_accepted": torch.tensor([3])}, ValueError, r"n_accepted must be in \[0, L=2\]"),
    ({"n_accepted": torch.tensor([-1])}, ValueError, r"n_accepted must be in \[0, L=2\]"),
    ({"n_accepted": torch.tensor([2, 2])}, ValueError, r"n_accepted must have shape \(1,\)"),
    ({"accepted_nodes": torch.tensor([[-1, 3]])}, ValueError, "draft node ids >= 1"),
    ({"accepted_nodes": torch.tensor([[1, 1]])}, ValueError, "node of depth j\\+1"),
    ({"prefix_len": 0}, ValueError, "prefix_len must be >= 1"),
    ({"kv": [labelled_cache(1, 4, 0)]}, ValueError, "has 4 slots but the accepted nodes need 6"),
    ({"kv": [labelled_cache(2, 8, 0)]}, ValueError, "must have batch size 1"),
    ({"kv": [labelled_cache(1, 8, 0)[0]]}, ValueError, r"kv\[0\] must have 4 dimensions"),
]


@pytest.mark.parametrize(("change", "exc", "match"), BAD, ids=[b[2][:40] for b in BAD])
def test_bad_inputs(change, exc, match) -> None:
    kv, prefix, nodes, n_acc = ok_args()
    args = {"kv": kv, "prefix_len": prefix, "accepted_nodes": nodes, "n_accepted": n_acc} | change
    with pytest.raises(exc, match=match):
        filter_kv(args["kv"], args["prefix_len"], args["accepted_nodes"], args["n_accepted"])


OTHER_BACKENDS = [b for b in available_backends("filter_kv") if b != "torch"]


@pytest.mark.parametrize("backend", OTHER_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_backend_matches_reference(backend: str, dtype: torch.dtype) -> None:
    rng = np.random.default_rng(2)
    batch = 6
    trees = [random_parents(rng, int(rng.integers(2, 20))) for _ in range(batch)]
    paths = [random_path(rng, t) for t in trees]
    max_l = max(max(len(p) for p in paths), 1)
    nodes = torch.full((batch, max_l), -1, dtype=torch.long)
    for b, path in enumerate(paths):
        nodes[b, : len(path)] = torch.tensor(path, dtype=torch.long)
    n_acc = torch.tensor([len(p) for p in paths])
    prefix = torch.from_numpy(rng.integers(1, 9, size=batch))
    slots = int(prefix.max()) + 20
    ref = [labelled_cache(batch, slots, i, dtype) for i in range(2)]
    got = [t.clone() for t in ref]
    assert torch.equal(filter_kv(got, prefix, nodes, n_acc, backend=backend), filter_kv(ref, prefix, nodes, n_acc))
    for g, r in zip(got, ref, strict=True):
        for b in range(batch):
            m = int(prefix[b] + n_acc[b])
            assert torch.equal(g[b, :, :m], r[b, :, :m])


# (change, exception, message of the host-side checks | message of the cpu kernel, which checks for itself)
BAD_TRUSTED = [
    ({"n_accepted": torch.tensor([3])}, ValueError, r"n_accepted(\[0\])? must be in \[0, (L=)?2\]"),
    ({"n_accepted": torch.tensor([-1])}, ValueError, r"n_accepted(\[0\])? must be in \[0, (L=)?2\]"),
    (
        {"accepted_nodes": torch.tensor([[-1, 3]])},
        ValueError,
        r"min id -1, must be >= 1|accepted_nodes\[0, 0\] must be > 0",
    ),
    ({"accepted_nodes": torch.tensor([[1, 9]])}, ValueError, "need 12 slots|the accepted nodes need 12"),
    (
        {"kv": [labelled_cache(1, 4, 0)]},
        ValueError,
        "need 6 slots .* the smallest has 4|has 4 slots, the accepted nodes need 6",
    ),
    (
        {"kv": [labelled_cache(2, 8, 0)]},
        ValueError,
        r"need 6 slots .* the smallest has 0|kv\[0\] must be \[B=1, H, S, D\]",
    ),
    (
        {"kv": [labelled_cache(1, 8, 0)[0]]},
        ValueError,
        r"need 6 slots .* the smallest has 0|kv\[0\] must be \[B=1, H, S, D\]",
    ),
    ({"kv": [[1, 2]]}, TypeError, r"kv must be a sequence of \[B, H, S, D\] tensors"),
    ({"prefix_len": 0}, ValueError, "prefix_len must be >= 1"),
]


@pytest.mark.parametrize("backend", [b for b in available_backends("filter_kv") if b != "triton"])
@pytest.mark.parametrize(("change", "exc", "match"), BAD_TRUSTED, ids=[b[2][:40] for b in BAD_TRUSTED])
def test_trusted_calls_still_keep_every_move_in_bounds(change, exc, match, backend) -> None:
    """validate=False skips the node-order checks, never the ones that keep the moves inside the tensors: on the
    host for backends without their own checks (torch, triton), in the kernel for cpu."""
    kv, prefix, nodes, n_acc = ok_args()
    args = {"kv": kv, "prefix_len": prefix, "accepted_nodes": nodes, "n_accepted": n_acc} | change
    with pytest.raises(exc, match=match):
        filter_kv(
            args["kv"], args["prefix_len"], args["accepted_nodes"], args["n_accepted"], validate=False, backend=backend
        )
