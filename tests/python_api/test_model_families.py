"""Every supported model family, tiny random configs in fp32: the adapter's chain and tree forwards give the model's
own full-forward logits, and greedy speculative decoding gives the model's own greedy decoding. Sliding windows are
set shorter than the contexts, so local layers must hide the keys that fall out of their window."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import specdec
import torch
from specdec.models import SUPPORTED_MODEL_TYPES, HFCausalLM
from specdec.tree import DraftTree
from tiny_models import left_pad, noisy_copy, reference_greedy, transformers

VOCAB = 64
WINDOW = 4
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=128,
    initializer_range=0.2,
)
LOCAL_GLOBAL = ["sliding_attention", "full_attention"]
# family -> (config class, model class, attention implementation, config fields beyond COMMON)
FAMILIES: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "sdpa", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", "sdpa", {"sliding_window": WINDOW}),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        "sdpa",
        {"use_sliding_window": True, "sliding_window": WINDOW, "layer_types": LOCAL_GLOBAL},
    ),
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        "sdpa",
        {"use_sliding_window": True, "sliding_window": WINDOW, "layer_types": LOCAL_GLOBAL},
    ),
    # attention logit softcapping runs in Gemma 2's own eager attention only
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        "eager",
        {"sliding_window": WINDOW, "layer_types": LOCAL_GLOBAL, "final_logit_softcapping": 3.0},
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        "sdpa",
        {"sliding_window": WINDOW, "layer_types": LOCAL_GLOBAL, "final_logit_softcapping": 3.0},
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", "sdpa", {"sliding_window": WINDOW, "pad_token_id": 0}),
}
PROMPTS = [[3, 17, 5, 9, 21, 40, 2, 33, 8], [11, 2, 30, 7, 50, 12]]  # both longer than the window
# a tree of depth 3 laid out level by level (node 0 = root = the prompt's last token)
LEVEL_PARENTS = [[0, 0], [1, 1, 2], [3, 5]]
N_NEW = 10


def tiny(family: str, seed: int = 0, **overrides: Any) -> Any:
    config_cls, model_cls, attn, extra = FAMILIES[family]
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_cls)(**{**COMMON, **extra, **overrides}, attn_implementation=attn)
    model = getattr(transformers, model_cls)(cfg).eval()
    model.generation_config.eos_token_id = None  # runs go to their length: the families' default EOS ids differ
    return model


def test_every_supported_family_has_a_case() -> None:
    assert set(FAMILIES) == set(SUPPORTED_MODEL_TYPES)


def _tree() -> DraftTree:
    g = torch.Generator().manual_seed(0)
    tree = DraftTree.from_roots(torch.tensor([p[-1] for p in PROMPTS]))
    for parents in LEVEL_PARENTS:
        n = len(parents)
        tokens = torch.randint(0, VOCAB, (2, n), generator=g)
        tree.append_level(tokens, torch.tensor([parents] * 2), torch.ones((2, n), dtype=torch.bool))
    return tree


@torch.no_grad()
def _last_logits(model: Any, seq: list[int]) -> torch.Tensor:
    return model(torch.tensor([seq])).logits[0, -1]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_chain_and_tree_logits_equal_full_forwards(family: str) -> None:
    model = tiny(family)
    lm = HFCausalLM(model)
    tree = _tree()
    with torch.inference_mode():
        state = lm.new_state(2)
        # the prompts in two chain forwards (the second past the window), then the tree whose root is the last token
        lm.forward_chain(state, [p[:3] for p in PROMPTS], last_logits=False)
        chain = lm.forward_chain(state, [p[3:-1] for p in PROMPTS], last_logits=True)
        logits = lm.forward_tree(state, tree.tokens, tree.parent, tree.valid, tree.depth)
    worst = 0.0
    for b, p in enumerate(PROMPTS):
        worst = max(worst, float((chain[b] - _last_logits(model, p[:-1])).abs().max()))
        for n in range(tree.size):
            ref = _last_logits(model, p + tree.path_tokens(b, n))
            worst = max(worst, float((logits[b, n] - ref).abs().max()))
    assert worst <= 1e-4, f"{family}: adapter logits differ from the model's full forwards by {worst:.2e}"


@pytest.mark.parametrize("method,params", [("sd", {"draft_length": 3}), ("rsd_c", {"branching": (2, 2, 1)})])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_equals_the_models_own_greedy(family: str, method: str, params: dict[str, Any]) -> None:
    target = tiny(family, 1)
    draft = noisy_copy(target, 2, 0.1)
    refs = []
    for p in PROMPTS:
        toks, gap = reference_greedy(target, p, N_NEW)
        assert gap > 1e-4, f"{family}: reference greedy decoding has a near-tie ({gap:.1e}); pick another seed"
        refs.append(toks)
    ids, mask = left_pad(PROMPTS)
    out = specdec.generate(
        target, draft, ids, method=method, attention_mask=mask, max_new_tokens=N_NEW, do_sample=False, **params
    )
    assert out.new_tokens == refs
    assert out.stats.block_efficiency > 1.2, f"{family}: the draft should often be accepted"


def test_gemma2_softcapped_attention_needs_eager() -> None:
    model = tiny("gemma2")
    model.config._attn_implementation = "sdpa"  # as a model loaded with attn_implementation="sdpa" would be
    with pytest.raises(ValueError, match="attn_logit_softcapping.*attn_implementation='eager'"):
        HFCausalLM(model, name="target")


def test_bidirectional_gemma3_is_refused() -> None:
    model = tiny("gemma3_text")
    model.config.use_bidirectional_attention = True
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        HFCausalLM(model, name="target")


def test_unknown_layer_types_are_refused() -> None:
    model = tiny("qwen3")
    model.config.layer_types = ["chunked_attention", "full_attention"]
    with pytest.raises(ValueError, match="layer_types.*chunked_attention"):
        HFCausalLM(model, name="target")


def test_multimodal_gemma3_is_refused() -> None:
    model = tiny("llama")
    model.config.model_type = "gemma3"
    with pytest.raises(ValueError, match="architecture 'gemma3' is not supported.*Gemma3ForCausalLM"):
        HFCausalLM(model, name="target")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_entry_points_equal_model_generate(family: str) -> None:
    """``specdec.generate`` and ``model.generate(custom_generate=specdec.custom_generate)`` against the family's own
    ``generate`` on a left-padded batch, with a repetition penalty and an EOS id the plain run emits."""
    target = tiny(family, 1)
    draft = noisy_copy(target, 2, 0.1)
    ids, mask = left_pad(PROMPTS)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=N_NEW)
    kw = dict(do_sample=False, max_new_tokens=N_NEW, repetition_penalty=1.3, eos_token_id=int(plain[0, -4]),
              pad_token_id=0)  # fmt: skip
    ref = target.generate(ids, attention_mask=mask, output_scores=True, return_dict_in_generate=True, **kw)
    for step in ref.scores:
        top = torch.topk(step.float(), 2).values
        live = torch.isfinite(top).all(dim=-1)
        assert bool((top[live, 0] - top[live, 1] > 1e-4).all()), f"{family}: near-tie in the reference run"
    ours = specdec.generate(target, draft, ids, method="rsd_c", branching=(2, 1), attention_mask=mask, **kw)
    hooked = target.generate(ids, attention_mask=mask, custom_generate=specdec.custom_generate, assistant_model=draft,
                             method="sd", **kw)  # fmt: skip
    assert torch.equal(ours.sequences, ref.sequences), family
    assert torch.equal(hooked, ref.sequences), family


# RoPE types whose frequencies change with the longest position of a forward past a limit (12 tokens here)
SCALED_ROPE = {
    "dynamic": ("llama", {"max_position_embeddings": 12, "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4,
                                                                            "factor": 2.0}}),
    "longrope": ("phi3", {"max_position_embeddings": 64, "original_max_position_embeddings": 12, "rope_parameters": {
        "rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": 12,
        "short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": [2.0, 2.5, 3.0, 3.5]}}),
    # one rotary module with frequencies per layer type
    "dynamic (gemma3)": ("gemma3_text", {"max_position_embeddings": 12, "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        "full_attention": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}}}),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(SCALED_ROPE))
def test_scaled_rope_within_its_limit_equals_model_generate_and_is_refused_beyond(kind: str) -> None:
    """Up to the limit the frequencies are the model's original ones and every method gives ``generate``'s tokens;
    one token more and the logits would depend on the chunking of each forward, so every method refuses up front."""
    family, over = SCALED_ROPE[kind]
    target = tiny(family, 1, **over)
    draft = noisy_copy(target, 2, 0.1)
    prompt = [3, 17, 5, 9, 21]
    ids = torch.tensor([prompt])
    new = 13 - len(prompt)  # the last forward sees 12 tokens
    ref = target.generate(ids, do_sample=False, max_new_tokens=new)[0, len(prompt) :].tolist()
    for method, params in (("ar", {}), ("sd", {"draft_length": 3}), ("rsd_c", {"branching": (2, 2)})):
        run = functools.partial(
            specdec.generate, target, None if method == "ar" else draft, ids, method=method, do_sample=False, **params
        )
        assert run(max_new_tokens=new).new_tokens[0] == ref, (kind, method)
        with pytest.raises(
            ValueError, match=f"rope_type '{kind.split()[0]}' changes its rotary frequencies.*12 tokens"
        ):
            run(max_new_tokens=new + 1)
    # a ragged batch with a close draft: rows move at their own pace, and no row's tree may reach past its budget
    ids, mask = left_pad([prompt, [11, 2], [7]])
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new)
    close = noisy_copy(target, 2, 0.02)
    out = specdec.generate(
        target, close, ids, attention_mask=mask, method="sd", draft_length=8, do_sample=False, max_new_tokens=new
    )
    assert torch.equal(out.sequences, ref), kind
