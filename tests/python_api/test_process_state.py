"""A generate call leaves the user's process as it found it: greedy decoding draws from no generator the user owns
(torch's global one, Python's, a generator passed in), the user's modules and config carry nothing new, and
transformers' registries gain only the one documented entry (docs/methods.md, What a call leaves behind)."""

from __future__ import annotations

import random

import pytest
import specdec
import torch
from tiny_models import noisy_copy, tiny_llama

METHODS = [("ar", {}), ("sd", {}), ("rsd_c", {"branching": (2, 1)}), ("rsd_s", {}), ("spectr", {}), ("spechub", {})]
METHODS += [("rrs", {}), ("rrsw", {})]


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(3, vocab=64, std=0.3)
    return target, noisy_copy(target, 4, 0.2)


def module_state(model: torch.nn.Module) -> dict[str, object]:
    """Each module's attribute names, the config, and every parameter's values."""
    return {
        "attrs": {name: sorted(vars(m)) for name, m in model.named_modules()},
        "config": model.config.to_dict(),
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }


def same_state(a: dict[str, object], b: dict[str, object]) -> bool:
    params_a, params_b = a["params"], b["params"]
    assert isinstance(params_a, dict) and isinstance(params_b, dict)
    same_params = params_a.keys() == params_b.keys() and all(torch.equal(params_a[k], params_b[k]) for k in params_a)
    return a["attrs"] == b["attrs"] and a["config"] == b["config"] and same_params


@pytest.mark.parametrize("method,kw", METHODS, ids=[m for m, _ in METHODS])
def test_greedy_draws_from_no_generator_of_the_users(pair, method: str, kw: dict) -> None:
    target, draft = pair
    ids = torch.tensor([[5, 9, 13, 2]])
    torch.manual_seed(1234)
    random.seed(7)
    before, py_before = torch.get_rng_state(), random.getstate()
    mine = torch.Generator().manual_seed(99)
    mine_before = mine.get_state()
    ref = target.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(torch.get_rng_state(), before)  # transformers' greedy generate draws nothing either
    use = None if method == "ar" else draft
    out = specdec.generate(target, use, ids, method=method, max_new_tokens=8, do_sample=False, **kw)
    out2 = specdec.generate(target, use, ids, method=method, max_new_tokens=8, do_sample=False, generator=mine, **kw)
    hook = target.generate(
        ids, max_new_tokens=8, do_sample=False, custom_generate=specdec.custom_generate, draft=use, method=method, **kw
    )
    assert out.sequences.tolist() == out2.sequences.tolist() == hook.tolist() == ref.tolist()
    assert torch.equal(torch.get_rng_state(), before), "torch's global generator advanced"
    assert random.getstate() == py_before, "Python's generator advanced"
    assert torch.equal(mine.get_state(), mine_before), "the generator passed in advanced"


def test_a_call_leaves_the_users_models_and_transformers_registries_as_they_were(pair) -> None:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    target, draft = tiny_llama(5, vocab=64, std=0.3), None
    draft = noisy_copy(target, 6, 0.2)
    ids = torch.tensor([[5, 9, 13, 2]])
    attention, masks = set(ALL_ATTENTION_FUNCTIONS.keys()), set(ALL_MASK_ATTENTION_FUNCTIONS.keys())
    states = module_state(target), module_state(draft)
    for method, kw in METHODS:
        specdec.generate(target, draft, ids, method=method, max_new_tokens=6, do_sample=True, seed=0, **kw)
        specdec.generate(target, draft, ids, method=method, max_new_tokens=6, do_sample=False, **kw)
    assert same_state(states[0], module_state(target)) and same_state(states[1], module_state(draft))
    # the one entry that stays: the adapter's attention, registered under its own name (never over "sdpa")
    assert set(ALL_ATTENTION_FUNCTIONS.keys()) - attention <= {specdec.models.SPECDEC_ATTENTION}
    assert set(ALL_MASK_ATTENTION_FUNCTIONS.keys()) - masks <= {specdec.models.SPECDEC_ATTENTION}
    after = set(ALL_ATTENTION_FUNCTIONS.keys())
    specdec.generate(target, draft, ids, method="sd", max_new_tokens=6, do_sample=False)
    assert set(ALL_ATTENTION_FUNCTIONS.keys()) == after  # registered once per process


class _FreezeProbe:
    """A stopping criterion that records how many objects the collector had frozen at each round."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object) -> torch.Tensor:
        import gc

        self.seen.append(gc.get_freeze_count())
        return torch.zeros((input_ids.shape[0],), dtype=torch.bool)


def test_the_heap_is_frozen_for_the_call_only(pair) -> None:
    """During a call the objects that predate it are out of the collector's walks (gc.freeze); afterwards the
    collector is as the caller left it, also where the caller froze objects of their own or turned it off."""
    import gc

    from transformers import StoppingCriteriaList

    target, draft = pair
    prompt = torch.tensor([[3, 4, 5]])
    assert gc.get_freeze_count() == 0
    probe = _FreezeProbe()
    specdec.generate(target, draft, prompt, method="sd", max_new_tokens=6, do_sample=False,
                     stopping_criteria=StoppingCriteriaList([probe]))  # fmt: skip
    assert probe.seen and min(probe.seen) > 0
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    # the caller's own frozen objects stay frozen, and theirs only
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        specdec.generate(target, draft, prompt, method="sd", max_new_tokens=6, do_sample=False)
        # still frozen (unfreezing would have released them all; a few frozen objects may have died meanwhile)
        assert gc.get_freeze_count() > 0.9 * mine
    finally:
        gc.unfreeze()
    # a collector the caller turned off stays off, nothing frozen
    gc.disable()
    try:
        probe = _FreezeProbe()
        specdec.generate(target, draft, prompt, method="sd", max_new_tokens=6, do_sample=False,
                         stopping_criteria=StoppingCriteriaList([probe]))  # fmt: skip
        assert probe.seen and max(probe.seen) == 0 and not gc.isenabled()
    finally:
        gc.enable()
    assert gc.get_freeze_count() == 0
