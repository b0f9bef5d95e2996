"""cpu vs torch parity of verify_tree: identical accepted_nodes, n_accepted, next_token and
accepted_rank for every method (greedy and sampling) on static and ragged trees, given identical noise."""

from __future__ import annotations

import pytest
import torch
from backend_parity import VOCABS, on, opcheck_devices, open_uniform, requires_cpu_ext

import specdec_kernels as sk
from specdec_kernels import _registry, branching_parents, chain_parents, kseq_chain_parents
from specdec_kernels.testing.oracles_tree import draw_tree

pytestmark = requires_cpu_ext

METHODS = ("sd", "rrs", "rrsw", "kseq", "spechub", "gds", "block")


def topology(method: str, shape: str) -> list[int]:
    if method in ("sd", "block"):
        return chain_parents(4 if shape == "small" else 7)
    if method == "kseq":
        return kseq_chain_parents(3, 3)
    if method == "spechub":
        return branching_parents([2, 2, 1] if shape == "small" else [2, 2, 2])
    return branching_parents([3, 2, 1] if shape == "small" else [2, 3, 2])


def tree_case(method: str, batch: int, vocab: int, seed: int, shape: str = "small", closeness: float = 0.3) -> dict:
    """Draft trees whose children are drawn from the parent's p row as the method prescribes (ragged where
    Gumbel-top-k or SpecHub leave a candidate invalid: those nodes become padding)."""
    gen = torch.Generator().manual_seed(seed)
    parents = topology(method, shape)
    n = len(parents)
    z = torch.randn((batch, n, vocab), generator=gen) * 2.5
    p_rows = torch.softmax(z, -1)
    q_rows = torch.softmax(z + closeness * 2 * torch.randn(z.shape, generator=gen), -1)
    tokens, valid, parent, hub = draw_tree(method, parents, p_rows, gen, seed)
    return {"tokens": tokens, "parent": parent, "valid": valid, "p_rows": p_rows, "q_rows": q_rows, "hub": hub}


def check(method: str, case: dict, seed: int, greedy: bool = False, eos=None) -> sk.TreeVerdict:
    batch, n = case["tokens"].shape
    vocab = case["q_rows"].shape[-1]
    kmax = max(4, n)
    u = torch.rand((batch, n, kmax), dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    kw = {
        "method": method,
        "valid": case["valid"],
        "hub": None if greedy else case["hub"],
        "accept_u": u,
        "final_noise": open_uniform((batch, vocab), seed + 3),
        "greedy": greedy,
        "eos_token_id": eos,
    }
    p_rows = None if greedy else case["p_rows"]
    q_rows = case["q_rows"].log() if greedy else case["q_rows"]
    args = (case["tokens"], case["parent"], p_rows, q_rows)
    out = sk.verify_tree(*args, backend="cpu", **kw)
    ref = sk.verify_tree(*args, backend="torch", **kw)
    for name in ("accepted_nodes", "n_accepted", "next_token", "accepted_rank"):
        assert torch.equal(getattr(out, name), getattr(ref, name)), (name, getattr(out, name), getattr(ref, name))
    return out


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("method", METHODS)
def test_matches_reference(vocab: int, method: str) -> None:
    batch = 6 if vocab < 20000 else 1  # one row keeps the reference's big-vocabulary walks in the seconds
    case = tree_case(method, batch, vocab, seed=vocab)
    check(method, case, seed=vocab)
    if vocab < 20000:
        check(method, case, seed=vocab, greedy=True)


@pytest.mark.parametrize("batch", [1, 3, 99])
@pytest.mark.parametrize("method", METHODS)
def test_batches_and_acceptance_levels(batch: int, method: str) -> None:
    for closeness in (0.0, 0.3, 2.0):
        case = tree_case(method, batch, 7, seed=batch + int(closeness * 10), shape="large", closeness=closeness)
        out = check(method, case, seed=batch)
        if closeness == 0.0:  # p = q accepts every level
            assert (out.n_accepted >= 1).all()


@pytest.mark.parametrize("method", METHODS)
def test_greedy_and_eos(method: str) -> None:
    case = tree_case(method, 9, 111, seed=21, closeness=0.0)
    out = check(method, case, seed=21)
    eos = [int(case["tokens"][b, int(out.accepted_nodes[b, 0])]) for b in range(3) if out.n_accepted[b] > 0]
    check(method, case, seed=21, eos=eos)
    # greedy: make some rows follow the target's argmax so that the walk goes deep (rrsw and gds siblings must stay
    # distinct: there p = q already puts the argmax among the children most of the time)
    greedy_case = dict(case)
    if method in ("rrsw", "gds"):
        check(method, case, seed=22, greedy=True)
        return
    tokens = case["tokens"].clone()
    for c in range(1, tokens.shape[1]):
        par = case["parent"][:, c].clamp_min(0)
        target = case["q_rows"][torch.arange(9), par].argmax(-1)
        tokens[:, c] = torch.where(torch.rand(9) < 0.6, target, tokens[:, c])
    greedy_case["tokens"] = tokens
    check(method, greedy_case, seed=22, greedy=True)


def test_float64_rows() -> None:
    for method in METHODS:
        case = tree_case(method, 5, 111, seed=31)
        case["p_rows"], case["q_rows"] = case["p_rows"].double(), case["q_rows"].double()
        check(method, case, seed=31)


def test_root_only_tree() -> None:
    case = tree_case("rrs", 4, 111, seed=41)
    root = {k: (v[:, :1] if v is not None else None) for k, v in case.items()}
    out = check("rrs", root, seed=41)
    assert (out.n_accepted == 0).all() and out.accepted_nodes.shape == (4, 0)


@pytest.mark.parametrize("device", opcheck_devices())
def test_opcheck(device: str) -> None:
    for method in METHODS:
        case = tree_case(method, 3, 17, seed=1)
        n = case["tokens"].shape[1]
        u = torch.rand((3, n, 4), dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        args = (
            case["tokens"],
            case["parent"],
            case["valid"],
            case["p_rows"],
            case["q_rows"],
            method,
            case["hub"],
            u,
            open_uniform((3, 17), 2),
            False,
            torch.tensor([5]),
            4,  # >= the depth of every topology above
        )
        torch.library.opcheck(torch.ops.specdec.verify_tree, on(device, args))


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'verify_tree': backend 'cpu' does not support"):
        _registry.resolve("verify_tree", "cpu", torch.device("meta"))
