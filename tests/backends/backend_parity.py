"""Shared helpers of the cpu-vs-torch parity tests: skip marker, tree and noise generators, float budgets.

Float budgets: integer outputs (tokens, slots, counts, masks of kept tokens) must be identical;
float outputs are compared against the reference with a per-dtype budget that reflects how both were computed:

* fp32 log-probs (process_logits): both backends compute a fp32 log-softmax of the same fp32 inputs, with
  different summation orders and exp/log implementations. The reference itself is off the float64 truth by up to
  ~1.5e-5 at V = 32000 (it sums V terms in fp32), so the budget is earned from it: the cpu result must be within
  2x the reference's worst error on the same call plus 4 fp32 ulps of max(1, |value|) of the float64 truth;
  -inf entries (the kept set) must coincide exactly.
* float64 Gumbel scores (gumbel_topk): logp + (-log(-log u)) in double with libm vs SLEEF logs (<= 1 ulp each):
  budget 1e-13 relative.
* verifier diagnostics (verify_node analytic mode: accept_prob, final residual): in fp64 they may differ from the
  reference only by the order of sums over V: rtol 1e-12 / atol 1e-15. In fp32 some are differences of sums
  (SpecHub's q(a) - min(q(a), S_ai)) that amplify the reference's own rounding, so the budget is earned from it:
  the cpu error against the float64 evaluation of the same node must be within 2x the reference's error plus
  4 fp32 eps.
* copies (filter_kv, tree_mask): bitwise equal.
"""

from __future__ import annotations

import random

import pytest
import torch

from specdec_kernels import native
from specdec_kernels.testing.oracles_tree import open_uniform  # noqa: F401  (re-exported)

requires_cpu_ext = pytest.mark.skipif(
    not native.HAVE_CPU,
    reason="specdec_kernels._C is not built (run `pip install --no-build-isolation -e .`); cpu backend absent",
)

VOCABS = (7, 111, 32000, 49152, 128256)


def opcheck_devices() -> list[str]:
    """Devices the ops' test_opcheck runs on: the CPU, and the GPU where one is present and the CUDA extension is
    built (the ops with a CUDA kernel)."""
    import specdec_kernels as sk

    return ["cpu", "cuda"] if torch.cuda.is_available() and "cuda" in sk.available_backends() else ["cpu"]


def on(device: str, args: tuple) -> tuple:
    """``args`` with every tensor, also inside a list, moved to ``device``."""

    def move(a: object) -> object:
        if isinstance(a, torch.Tensor):
            return a.to(device)
        return [move(x) for x in a] if isinstance(a, list) else a

    return tuple(move(a) for a in args)


def rows_for(vocab: int) -> int:
    """Few rows for the big vocabularies so that each case stays in the tens of milliseconds."""
    return 2 if vocab > 20000 else 9


def random_tree(n_valid: int, rng: random.Random) -> list[int]:
    """A random level-order tree with n_valid nodes (parents non-decreasing, siblings contiguous)."""
    parents = [-1]
    level = [0]
    while len(parents) < n_valid:
        size = min(n_valid - len(parents), rng.randint(1, 4))
        chosen = sorted(rng.choice(level) for _ in range(size))
        start = len(parents)
        parents.extend(chosen)
        level = list(range(start, len(parents)))
    return parents


def ragged_trees(batch: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """parent [B, N], valid [B, N]: ragged rows, padding nodes (parent 0) at random positions after the root."""
    rng = random.Random(seed)
    parent = torch.zeros((batch, n), dtype=torch.long)
    valid = torch.zeros((batch, n), dtype=torch.bool)
    for b in range(batch):
        n_valid = rng.randint(1, n)
        tree = random_tree(n_valid, rng)
        slots = [0] + sorted(rng.sample(range(1, n), n_valid - 1)) if n > 1 else [0]
        for old, new in enumerate(slots):
            parent[b, new] = -1 if old == 0 else slots[tree[old]]
            valid[b, new] = True
    return parent, valid


def depth_of(parent: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    depth = torch.zeros_like(parent)
    for i in range(1, parent.shape[1]):
        par = parent[:, i].clamp_min(0)
        depth[:, i] = torch.where(valid[:, i], depth.gather(1, par[:, None]).squeeze(1) + 1, 0)
    return depth


def assert_logp_close(out: torch.Tensor, ref: torch.Tensor, x32: torch.Tensor | None) -> None:
    """fp32 log-prob budget (module docstring). ``x32``: the fp32 values both backends feed to the final
    log-softmax (logits.float() / T); None for greedy rows, which must match exactly."""
    assert out.dtype == ref.dtype == torch.float32
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref)), "masked (-inf) tokens differ"
    if x32 is None:
        assert torch.equal(out, ref)
        return
    masked = torch.isneginf(ref)
    truth = torch.log_softmax(x32.double().masked_fill(masked, float("-inf")), -1)
    fin = ~masked
    ref_err = (ref.double() - truth)[fin].abs().max()
    budget = 2 * ref_err + 4 * torch.finfo(torch.float32).eps * truth[fin].abs().clamp_min(1.0)
    err = (out.double() - truth)[fin].abs()
    worst = int(torch.argmax(err - budget))
    assert bool((err <= budget).all()), f"cpu error {err[worst]:.3g} > budget {budget[worst]:.3g} (ref {ref_err:.3g})"


def assert_probs_close(out: torch.Tensor, ref: torch.Tensor, x32: torch.Tensor | None) -> None:
    """process_logits(log=False): no mass where the reference has none (masked tokens exactly 0), and each
    probability within 2x the reference's own error from the float64 softmax plus 4 ulps (relative) and 1e-37
    (absolute: the cpu kernel's exp stops at exp(-87)); greedy rows are one-hot on both."""
    assert out.dtype == ref.dtype == torch.float32
    if x32 is None:
        assert torch.equal(out, ref)
        return
    masked = ref == 0
    assert bool((out[masked] <= 1e-37).all()), "a token the reference masks has mass"
    truth = torch.softmax(x32.double().masked_fill(torch.isneginf(x32) | masked, float("-inf")), -1)
    ref_err = (ref.double() - truth).abs().max()
    budget = 2 * ref_err + 4 * torch.finfo(torch.float32).eps * truth + 1e-37
    err = (out.double() - truth).abs()
    worst = int(torch.argmax((err - budget).flatten()))
    assert bool((err <= budget).all()), f"cpu error {err.flatten()[worst]:.3g} > budget {budget.flatten()[worst]:.3g}"


def dyadic(probs: torch.Tensor, gen: torch.Generator, draws: int = 256) -> torch.Tensor:
    """Rows of k/256 drawn from ``probs``: exact in bf16 and fp16, so the rows still sum to 1 after the cast."""
    flat = probs.reshape(-1, probs.shape[-1])
    counts = torch.stack(
        [torch.bincount(torch.multinomial(r, draws, True, generator=gen), minlength=probs.shape[-1]) for r in flat]
    )
    return (counts.double() / draws).reshape(probs.shape)
