"""tree_positions: position = P - 1 + depth, siblings share positions; bad inputs; backend parity."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels import available_backends, depth_from_parents, tree_positions
from specdec_kernels.testing.oracles_tree import parents_from_counts, random_parents


def test_spec_example() -> None:
    # Root = last committed token at P-1; depth-d nodes at P-1+d.
    depth = torch.tensor([[0, 1, 1, 2, 2, 3]])
    assert tree_positions(depth, 5).tolist() == [[4, 5, 5, 6, 6, 7]]


@settings(max_examples=50, deadline=None)
@given(counts=st.lists(st.integers(0, 3), min_size=1, max_size=20), prefix=st.integers(1, 1000))
def test_positions_are_prefix_minus_one_plus_depth(counts: list[int], prefix: int) -> None:
    parents = parents_from_counts(counts, 30)
    par = torch.tensor([parents])
    depth = depth_from_parents(par)
    pos = tree_positions(depth, prefix)
    assert pos.dtype == torch.int64
    assert pos[0, 0] == prefix - 1
    for n in range(1, len(parents)):
        assert pos[0, n] == pos[0, parents[n]] + 1  # one step below the parent
        # siblings share the position of the parent's next token
        assert all(pos[0, m] == pos[0, n] for m in range(1, len(parents)) if parents[m] == parents[n])


def test_per_row_prefix_lengths() -> None:
    depth = torch.tensor([[0, 1, 2], [0, 1, 1]])
    pos = tree_positions(depth, torch.tensor([3, 10]))
    assert pos.tolist() == [[2, 3, 4], [9, 10, 10]]


BAD = [
    (torch.tensor([[0.0, 1.0]]), 3, TypeError, "depth must be an integer tensor"),
    (torch.tensor([0, 1]), 3, ValueError, "depth must have 2 dimensions"),
    (torch.tensor([[0, -1]]), 3, ValueError, "depth must be >= 0"),
    (torch.tensor([[0, 1]]), 0, ValueError, "prefix_len must be >= 1"),
    (torch.tensor([[0, 1]]), True, TypeError, "prefix_len must be an int or an int64 tensor"),
    (torch.tensor([[0, 1]]), torch.tensor([3.0]), TypeError, "prefix_len must be an integer tensor"),
    (torch.tensor([[0, 1]]), torch.tensor([3, 4]), ValueError, r"prefix_len must have shape \(1,\)"),
]


@pytest.mark.parametrize(("depth", "prefix", "exc", "match"), BAD, ids=[b[3][:40] for b in BAD])
def test_bad_inputs(depth, prefix, exc, match) -> None:
    with pytest.raises(exc, match=match):
        tree_positions(depth, prefix)


OTHER_BACKENDS = [b for b in available_backends("tree_positions") if b != "torch"]


@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_backend_matches_reference(backend: str) -> None:
    rng = np.random.default_rng(1)
    for _ in range(5):
        batch = int(rng.integers(1, 5))
        n = int(rng.integers(1, 40))
        par = torch.zeros((batch, n), dtype=torch.long)
        for b in range(batch):
            t = random_parents(rng, n)
            par[b, : len(t)] = torch.tensor(t)
        depth = depth_from_parents(par)
        prefix = torch.from_numpy(rng.integers(1, 500, size=batch))
        assert torch.equal(
            tree_positions(depth, prefix, backend=backend), tree_positions(depth, prefix, backend="torch")
        )


def test_trusted_call_matches_and_still_checks_types() -> None:
    """validate=False (the driver) gives the same positions and still rejects wrong types and shapes."""
    depth = torch.tensor([[0, 1, 2], [0, 1, 1]])
    prefix = torch.tensor([3, 10], dtype=torch.int32)
    assert torch.equal(tree_positions(depth, prefix, validate=False), tree_positions(depth, prefix))
    assert tree_positions(depth, prefix, validate=False).dtype == torch.int64
    assert tree_positions(depth, 4, validate=False).tolist() == [[3, 4, 5], [3, 4, 4]]
    for bad_depth, bad_prefix, exc, match in BAD:
        if "must be >=" in match:
            continue  # the value checks are what validate=False skips
        with pytest.raises(exc, match=match):
            tree_positions(bad_depth, bad_prefix, validate=False)
