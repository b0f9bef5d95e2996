"""``validate=False`` (driver fast path) skips only O(V) value and tree-structure checks: same results on valid
inputs, and shape/type errors still raise."""

from __future__ import annotations

import pytest
import torch

import specdec_kernels as sk


def _laws(rows: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rows * vocab)
    return (
        torch.log_softmax(torch.randn(rows, vocab, generator=g), -1),
        torch.log_softmax(torch.randn(rows, vocab, generator=g), -1),
    )


def test_sampling_ops_same_result_with_and_without_checks() -> None:
    logp, _ = _laws(3, 50)
    for validate in (True, False):
        assert torch.equal(sk.sample_categorical(logp, seed=1, validate=validate), sk.sample_categorical(logp, seed=1))
        assert torch.equal(
            sk.gumbel_topk(logp, 4, seed=2, validate=validate).tokens, sk.gumbel_topk(logp, 4, seed=2).tokens
        )
        assert torch.equal(
            sk.spechub_sample(logp, seed=3, validate=validate).tokens, sk.spechub_sample(logp, seed=3).tokens
        )
    lp3 = logp[:, None].expand(3, 2, 50).contiguous()
    z = torch.zeros(3, 2, dtype=torch.float64)
    bv = torch.ones(3, 2, dtype=torch.bool)
    a = sk.sbs_step(lp3, z, z, bv, 3, seed=4, validate=False)
    b = sk.sbs_step(lp3, z, z, bv, 3, seed=4)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parent_slot, b.parent_slot)


@pytest.mark.parametrize("method", ["rrs", "rrsw", "spechub"])
def test_verify_tree_same_result_with_and_without_checks(method: str) -> None:
    parent = torch.tensor([[-1, 0, 0, 1, 2]])
    p_logp, q_logp = _laws(5, 30)
    p_rows, q_rows = p_logp.exp()[None], q_logp.exp()[None]
    if method == "spechub":
        draw = sk.spechub_sample(p_logp, seed=5)
        hub = draw.hub[None]
        tokens = torch.tensor([[0, int(draw.tokens[0, 0]), int(draw.tokens[0, 1]), 3, 4]])
    else:
        hub = None
        first = sk.gumbel_topk(p_logp[0], 2, seed=5).tokens
        tokens = torch.tensor([[0, int(first[0]), int(first[1]), 3, 4]])
    for seed in range(5):
        kw = dict(method=method, hub=hub, seed=seed)
        a = sk.verify_tree(tokens, parent, p_rows, q_rows, validate=False, **kw)
        b = sk.verify_tree(tokens, parent, p_rows, q_rows, **kw)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)


def test_structural_errors_still_raise_without_checks() -> None:
    logp, _ = _laws(2, 10)
    with pytest.raises(ValueError, match="k must be an int in"):
        sk.gumbel_topk(logp, 11, validate=False)
    with pytest.raises(TypeError, match="logp must be a torch.Tensor"):
        sk.sample_categorical(logp.tolist(), validate=False)  # type: ignore[arg-type]
    parent = torch.tensor([[-1, 0]])
    with pytest.raises(ValueError, match="p_rows and q_rows must share the vocabulary size"):
        sk.verify_tree(
            torch.tensor([[0, 1]]),
            parent,
            torch.ones(1, 2, 9) / 9,
            torch.ones(1, 2, 10) / 10,
            method="rrs",
            validate=False,
        )
    # an invalid tree that the skipped checks would name stays memory-safe in the kernel: the node with an
    # out-of-range parent is detached (sees only itself), nothing is read out of bounds
    mask = sk.tree_mask(torch.tensor([[-1, 5]]), validate=False)
    assert mask.shape == (1, 1, 2, 2)
    assert mask[0, 0, 1, 1] == 0 and mask[0, 0, 1, 0] == torch.finfo(torch.float32).min


def test_checks_run_by_default() -> None:
    logp, _ = _laws(2, 10)
    bad = logp.clone()
    bad[0, 3] = float("nan")
    with pytest.raises(ValueError, match="logp contains NaN"):
        sk.sample_categorical(bad, seed=0)
    with pytest.raises(ValueError, match="parent"):
        sk.tree_mask(torch.tensor([[-1, 5]]))
