"""cpu vs torch parity of verify_node: identical slot and token for every method given identical
accept_u and final_noise; analytic diagnostics within the budget of backend_parity (verifier diagnostics)."""

from __future__ import annotations

import pytest
import torch
from backend_parity import VOCABS, dyadic, on, opcheck_devices, open_uniform, requires_cpu_ext

import specdec_kernels as sk
from specdec_kernels import _registry

pytestmark = requires_cpu_ext

METHODS = ("sd", "rrs", "rrsw", "kseq", "spechub", "gds")


def node_case(
    method: str, batch: int, vocab: int, k: int, seed: int, closeness: float = 0.5, dtype: torch.dtype = torch.float32
) -> dict:
    """p, q [B, V] and the node's candidates drawn from p as the method prescribes."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn((batch, vocab), generator=gen) * 2
    p = torch.softmax(z, -1)
    q = torch.softmax(z + closeness * 2 * torch.randn(z.shape, generator=gen), -1)
    if dtype in (torch.bfloat16, torch.float16):  # rows that stay normalised after the cast
        p, q = dyadic(p, gen).float(), dyadic(q, gen).float()
    hub = None
    if method == "sd":
        k = 1
    if method in ("sd", "rrs", "kseq"):
        cand = torch.multinomial(p, k, replacement=True, generator=gen)
        cand_valid = torch.ones_like(cand, dtype=torch.bool)
    elif method == "rrsw":
        draw = sk.gumbel_topk(p.log(), min(k, vocab), noise=open_uniform((batch, vocab), seed + 1))
        cand, cand_valid = draw.tokens.clamp_min(0), draw.valid
    elif method == "gds":
        draw = sk.gds_sample(p.log(), min(k, vocab), noise=open_uniform((batch, vocab), seed + 1))
        cand, cand_valid = draw.tokens.clamp_min(0), draw.valid
    else:
        draw = sk.spechub_sample(p.log(), noise=open_uniform((batch, vocab), seed + 1))
        cand, cand_valid, hub = draw.tokens.clamp_min(0), draw.valid, draw.hub
    return {"cand": cand, "cand_valid": cand_valid, "p": p.to(dtype), "q": q.to(dtype), "hub": hub}


def check(method: str, case: dict, seed: int, analytic: bool = True) -> sk.NodeVerdict:
    batch, k = case["cand"].shape
    vocab = case["p"].shape[-1]
    u = torch.rand((batch, k), dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    fin = open_uniform((batch, vocab), seed=seed + 7)
    args = (method, case["cand"], case["cand_valid"], case["p"], case["q"])
    kw = {"hub": case["hub"], "accept_u": u, "final_noise": fin, "analytic": analytic}
    out = sk.verify_node(*args, backend="cpu", **kw)
    ref = sk.verify_node(*args, backend="torch", **kw)
    assert torch.equal(out.slot, ref.slot), (out.slot, ref.slot)
    assert torch.equal(out.token, ref.token), (out.token, ref.token)
    if analytic:
        assert out.accept_prob.dtype == ref.accept_prob.dtype and out.final_residual.dtype == ref.final_residual.dtype
        if ref.final_residual.dtype == torch.float64:
            torch.testing.assert_close(out.accept_prob, ref.accept_prob, rtol=1e-12, atol=1e-15)
            torch.testing.assert_close(out.final_residual, ref.final_residual, rtol=1e-12, atol=1e-15)
        else:  # budget earned from the reference's own fp32 error against its float64 evaluation
            truth = sk.verify_node(*args[:3], case["p"].double(), case["q"].double(), backend="torch", **kw)
            for name in ("accept_prob", "final_residual"):
                mine, theirs, exact = getattr(out, name), getattr(ref, name), getattr(truth, name)
                budget = 2 * (theirs.double() - exact).abs().max() + 4 * torch.finfo(torch.float32).eps
                err = (mine.double() - exact).abs().max()
                assert err <= budget, f"{name}: cpu error {err:.3g} > budget {budget:.3g}"
    else:
        assert out.accept_prob is None and out.final_residual is None
    return out


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("method", METHODS)
def test_matches_reference(vocab: int, method: str) -> None:
    batch = 8 if vocab < 20000 else 2
    case = node_case(method, batch, vocab, k=3, seed=vocab)
    check(method, case, seed=vocab)
    check(method, case, seed=vocab + 1, analytic=False)


@pytest.mark.parametrize("batch", [1, 3, 99])
@pytest.mark.parametrize("method", METHODS)
def test_batches(batch: int, method: str) -> None:
    for closeness in (0.05, 0.5, 2.0):
        case = node_case(method, batch, 7, k=4, seed=batch, closeness=closeness)
        check(method, case, seed=int(closeness * 100) + batch)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_dtypes(method: str, dtype: torch.dtype) -> None:
    case = node_case(method, 9, 111, k=3, seed=5, dtype=dtype)
    check(method, case, seed=6)


@pytest.mark.parametrize("method", ["rrs", "rrsw", "kseq"])
def test_invalid_slots_and_k0(method: str) -> None:
    case = node_case(method, 6, 111, k=4, seed=9)
    case["cand_valid"] = case["cand_valid"].clone()
    case["cand_valid"][:, 1] = False
    case["cand_valid"][0] = False  # a row without candidates samples the final law directly
    check(method, case, seed=9)


def test_p_equals_q_and_disjoint() -> None:
    for method in METHODS:
        case = node_case(method, 5, 111, k=2, seed=3)
        case["q"] = case["p"].clone()
        out = check(method, case, seed=3)
        assert (out.slot >= 0).all()
    p = torch.zeros((4, 10))
    p[:, :5] = 0.2
    q = torch.zeros((4, 10))
    q[:, 5:] = 0.2
    cand = torch.multinomial(p, 3, replacement=True, generator=torch.Generator().manual_seed(0))
    case = {"cand": cand, "cand_valid": torch.ones_like(cand, dtype=torch.bool), "p": p, "q": q, "hub": None}
    for method in ("rrs", "kseq"):  # kseq: beta = 0 branch
        out = check(method, case, seed=4)
        assert (out.slot == -1).all() and (out.token >= 5).all()


def test_zero_mass_residual() -> None:
    """q = p up to 2e-7: a forced rejection leaves residual mass < 1e-6 -> the final law falls back to q."""
    p = torch.full((2, 7), 1.0 / 7)
    q = p.clone()
    q[:, 0] -= 2e-7
    q[:, 1] += 2e-7
    case = {"cand": torch.zeros((2, 1), dtype=torch.long), "p": p, "q": q, "hub": None}
    case["cand_valid"] = torch.ones((2, 1), dtype=torch.bool)
    u = torch.full((2, 1), 0.999999, dtype=torch.float64)
    for backend in ("cpu", "torch"):
        out = sk.verify_node(
            "sd", case["cand"], case["cand_valid"], p, q, accept_u=u, seed=1, analytic=True, backend=backend
        )
        assert (out.slot == -1).all()
        torch.testing.assert_close(out.final_residual, q)


@pytest.mark.parametrize("device", opcheck_devices())
def test_opcheck(device: str) -> None:
    for method in METHODS:
        case = node_case(method, 3, 17, k=2, seed=1)
        u = torch.rand((3, case["cand"].shape[1]), dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        args = (
            method,
            case["cand"],
            case["cand_valid"],
            case["p"],
            case["q"],
            u,
            open_uniform((3, 17), 2),
            case["hub"],
        )
        torch.library.opcheck(torch.ops.specdec.verify_node, on(device, args))


def test_unsupported_device_raises() -> None:
    with pytest.raises(sk.BackendUnavailableError, match=r"op 'verify_node': backend 'cpu' does not support"):
        _registry.resolve("verify_node", "cpu", torch.device("meta"))
