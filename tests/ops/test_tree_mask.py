"""tree_mask: closed form vs RSD Alg. 5's incremental BuildMask, padding, past columns, dtypes,
bad inputs, backend parity."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_kernels import available_backends, tree_mask
from specdec_kernels.testing.oracles_tree import parents_from_counts, random_parents


def build_mask_incremental(parents: list[int]) -> np.ndarray:
    """RSD Alg. 5, level by level over the draft nodes (root excluded): grow M, copy each new node's parent row,
    set the diagonal. Returns the [N-1, N-1] 0/1 matrix over draft nodes 1..N-1."""
    depth = [0]
    for n in range(1, len(parents)):
        depth.append(depth[parents[n]] + 1)
    levels: list[list[int]] = []
    for n in range(1, len(parents)):
        if depth[n] > len(levels):
            levels.append([])
        levels[depth[n] - 1].append(n)
    m = np.zeros((0, 0), dtype=np.int64)
    n_before = 0
    start_prev = 0
    prev_level: list[int] = [0]
    for level in levels:
        n_new = len(level)
        parent_in_prev = [prev_level.index(parents[node]) for node in level]
        if m.size == 0:
            m = np.zeros((n_new, n_new), dtype=np.int64)
        else:
            grown = np.zeros((n_before + n_new, n_before + n_new), dtype=np.int64)
            grown[:n_before, :n_before] = m
            for i in range(n_new):
                grown[n_before + i] = grown[start_prev + parent_in_prev[i]]
            m = grown
        np.fill_diagonal(m, 1)
        start_prev = n_before
        n_before += n_new
        prev_level = level
    return m


def allowed(mask: torch.Tensor) -> np.ndarray:
    return (mask == 0).numpy()


def tree_part_expected(parents: list[int]) -> np.ndarray:
    """Full [N, N] allowed pattern: the root sees itself; draft nodes see the root plus Alg. 5's row."""
    n = len(parents)
    out = np.zeros((n, n), dtype=bool)
    out[:, 0] = True
    out[0, 0] = True
    out[1:, 1:] = build_mask_incremental(parents).astype(bool)
    return out


def test_incremental_procedure_on_spec_example() -> None:
    """Branching b = (3, 2, 1): node 12 (parent 6 -> 2 -> root) sees exactly nodes 0, 2, 6, 12."""
    parents = [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7, 8, 9]
    mask = tree_mask(torch.tensor([parents]))
    row = np.flatnonzero(allowed(mask)[0, 0, 12])
    assert row.tolist() == [0, 2, 6, 12]
    assert (allowed(mask)[0, 0] == tree_part_expected(parents)).all()


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 3), min_size=1, max_size=24),
    max_nodes=st.integers(1, 24),
    past_len=st.integers(0, 3),
)
def test_closed_form_equals_incremental_build_mask(counts: list[int], max_nodes: int, past_len: int) -> None:
    parents = parents_from_counts(counts, max_nodes)
    n = len(parents)
    mask = tree_mask(torch.tensor([parents]), past_len=past_len)
    assert mask.shape == (1, 1, n, past_len + n)
    got = allowed(mask)[0, 0]
    assert got[:, :past_len].all()  # every committed position is visible
    assert (got[:, past_len:] == tree_part_expected(parents)).all()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 4), past_len=st.integers(0, 4))
def test_ragged_batch_padding_and_past_valid(seed: int, batch: int, past_len: int) -> None:
    rng = np.random.default_rng(seed)
    trees = [random_parents(rng, int(rng.integers(1, 12))) for _ in range(batch)]
    n_max = max(len(t) for t in trees)
    parent = torch.zeros((batch, n_max), dtype=torch.long)
    valid = torch.zeros((batch, n_max), dtype=torch.bool)
    for b, t in enumerate(trees):
        parent[b, : len(t)] = torch.tensor(t)
        valid[b, : len(t)] = True
    past_valid = torch.from_numpy(rng.random((batch, past_len)) < 0.7)
    got = allowed(tree_mask(parent, valid, past_len, past_valid=past_valid))[:, 0]
    for b, t in enumerate(trees):
        k = len(t)
        assert (got[b, :k, :past_len] == past_valid[b].numpy()[None, :]).all()
        assert (got[b, :k, past_len : past_len + k] == tree_part_expected(t)).all()
        assert not got[b, :k, past_len + k :].any()  # valid nodes never see padding
        for i in range(k, n_max):  # padding rows see only themselves
            assert np.flatnonzero(got[b, i]).tolist() == [past_len + i]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_additive_values_and_dtype(dtype: torch.dtype) -> None:
    parents = torch.tensor([[-1, 0, 0, 1]])
    mask = tree_mask(parents, past_len=2, dtype=dtype)
    assert mask.dtype == dtype
    lo = torch.finfo(dtype).min
    assert bool(((mask == 0) | (mask == lo)).all())
    expected = torch.tensor(
        [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 0, 1]], dtype=torch.bool
    )
    assert torch.equal(mask[0, 0] == 0, expected)


def test_siblings_and_cousins_never_see_each_other() -> None:
    parents = [-1, 0, 0, 1, 1, 2, 2]
    got = allowed(tree_mask(torch.tensor([parents])))[0, 0]
    for i in range(1, 7):
        for j in range(1, 7):
            anc = j == i or (j == parents[i]) or (parents[i] > 0 and j == parents[parents[i]])
            assert got[i, j] == anc


BAD = [
    (torch.tensor([[-1.0, 0.0]]), None, {}, TypeError, "parent must be an integer tensor"),
    (torch.tensor([-1, 0]), None, {}, ValueError, "parent must have 2 dimensions"),
    (torch.tensor([[-1, 0]]), torch.ones((1, 3), dtype=torch.bool), {}, ValueError, "valid must have shape"),
    (torch.tensor([[-1, 0]]), torch.ones((1, 2), dtype=torch.long), {}, TypeError, "valid must be a bool tensor"),
    (torch.tensor([[-1, 0]]), None, {"past_len": -1}, ValueError, "past_len must be an int >= 0"),
    (torch.tensor([[-1, 0]]), None, {"past_len": True}, ValueError, "past_len must be an int >= 0"),
    (
        torch.tensor([[-1, 0]]),
        None,
        {"past_len": 2, "past_valid": torch.ones((1, 3), dtype=torch.bool)},
        ValueError,
        "past_valid must have shape",
    ),
    (torch.tensor([[-1, 0]]), None, {"dtype": torch.int32}, TypeError, "dtype must be a floating torch.dtype"),
    (torch.tensor([[0, 0]]), None, {}, ValueError, r"parent\[:, 0\] must be -1"),
    (torch.zeros((1, 0), dtype=torch.long), None, {}, ValueError, "at least the root"),
    (torch.tensor([[-1, 0]]), torch.tensor([[False, False]]), {}, ValueError, r"valid\[:, 0\] must be true"),
    (torch.tensor([[-1, 0, 3, 1]]), None, {}, ValueError, r"parent\[b, n\] must be in \[0, n\)"),
    (torch.tensor([[-1, 1]]), None, {}, ValueError, r"parent\[b, n\] must be in \[0, n\)"),
    (
        torch.tensor([[-1, 0, 1]]),
        torch.tensor([[True, False, True]]),
        {},
        ValueError,
        "every valid node needs a valid parent",
    ),
    (torch.tensor([[-1, 0, 1, 0]]), None, {}, ValueError, "level order and grouped by parent"),
]


@pytest.mark.parametrize(("parent", "valid", "kwargs", "exc", "match"), BAD, ids=[b[4][:40] for b in BAD])
def test_bad_inputs(parent, valid, kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        tree_mask(parent, valid, **kwargs)


def test_any_integer_dtype_of_parent() -> None:
    parent = torch.tensor([[-1, 0, 0, 1]])
    for dtype in (torch.int8, torch.int16, torch.int32):
        assert torch.equal(tree_mask(parent.to(dtype)), tree_mask(parent))


OTHER_BACKENDS = [b for b in available_backends("tree_mask") if b != "torch"]


@pytest.mark.parametrize("backend", OTHER_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_backend_matches_reference(backend: str, dtype: torch.dtype) -> None:
    rng = np.random.default_rng(0)
    for _ in range(4 if backend == "triton" else 20):  # the Triton interpreter is slow on CPU
        batch = int(rng.integers(1, 4))
        trees = [random_parents(rng, int(rng.integers(1, 40))) for _ in range(batch)]
        n_max = max(len(t) for t in trees)
        parent = torch.zeros((batch, n_max), dtype=torch.long)
        valid = torch.zeros((batch, n_max), dtype=torch.bool)
        for b, t in enumerate(trees):
            parent[b, : len(t)] = torch.tensor(t)
            valid[b, : len(t)] = True
        past_valid = torch.from_numpy(rng.random((batch, 5)) < 0.8)
        ref = tree_mask(parent, valid, 5, past_valid=past_valid, dtype=dtype, backend="torch")
        got = tree_mask(parent, valid, 5, past_valid=past_valid, dtype=dtype, backend=backend)
        assert torch.equal(got, ref)
