"""SpecDec++ decoding (docs/methods.md) on tiny models: the adaptive stopping rule keeps the target law and greedy
output.

Law test: target = tiny Llama, vocabulary 8, temperature 1.7; draft = a reduced-head draft (6 of the
8 tokens, so p = 0 on two tokens) built on the target's embedding; head = a random acceptance head (any stopping
rule based on draft-side information must keep exactness). The joint law of the first two generated tokens is
compared with the exact law by specdec_kernels.testing.stats.law_check: chi-square p >= 1e-4 (false-alarm rate 1e-4
per check, 2 checks, fixed seeds so runs are reproducible) and empirical TV <= 0.08 (sampling noise ~0.04 at N =
4000 per prompt).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from specdec import SpecDecPPDecoder
from specdec.sampling import SamplingConfig
from specdec.train.draft import DraftConfig, build_draft
from specdec.train.head import AcceptanceHead
from tiny_models import assert_target_greedy, left_pad, tiny_llama

from specdec_kernels.testing.stats import law_check

VOCAB = 8
TEMPERATURE = 1.7
PROMPTS = [[3, 1], [5, 2, 7, 4]]


def random_head(hidden: int, seed: int) -> AcceptanceHead:
    torch.manual_seed(seed)
    head = AcceptanceHead(hidden, 2)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)  # Phat spread over (0, 1) without saturating to exactly 1
    return head.eval()


def reduced_draft(target, head_ids: list[int], seed: int):
    torch.manual_seed(seed)
    cfg = DraftConfig(
        hidden_size=32, num_layers=1, intermediate_size=64, num_heads=2, num_kv_heads=1, head_vocab=len(head_ids)
    )
    draft = build_draft(cfg, target.config, target.get_input_embeddings().weight, torch.tensor(head_ids))
    with torch.no_grad():
        draft.lm_head.reduced_weight.normal_(0, 0.5)  # a non-flat draft law
    return draft.eval()


@torch.no_grad()
def exact_law(target, prompt: list[int], sampling: SamplingConfig) -> np.ndarray:
    first = sampling.process(target(torch.tensor([prompt])).logits[0, -1]).double().exp()
    ids = torch.tensor([prompt + [y] for y in range(VOCAB)])
    second = sampling.process(target(ids).logits[:, -1]).double().exp()
    law = first[:, None] * second
    return (law / law.sum()).numpy()


def test_specdec_pp_keeps_the_target_law():
    target = tiny_llama(0, vocab=VOCAB, hidden=32, std=0.3)
    draft = reduced_draft(target, [0, 1, 2, 4, 5, 7], seed=1)
    dec = SpecDecPPDecoder(target, draft, random_head(32, 2), threshold=0.5, max_draft_length=3)
    n = 4000
    rows = [PROMPTS[i % 2] for i in range(2 * n)]
    ids, mask = left_pad(rows)
    out = dec.generate(ids, mask, max_new_tokens=4, do_sample=True, temperature=TEMPERATURE, seed=3)
    assert_first_two_law(target, out.new_tokens)


def assert_first_two_law(target, new_tokens: list[list[int]]) -> None:
    """Rows alternate over PROMPTS; the joint law of each prompt's first two tokens must be the exact one."""
    first_two = np.array([t[:2] for t in new_tokens])
    for i, prompt in enumerate(PROMPTS):
        counts = np.zeros((VOCAB, VOCAB))
        np.add.at(counts, (first_two[i :: len(PROMPTS), 0], first_two[i :: len(PROMPTS), 1]), 1)
        check = law_check(counts, exact_law(target, prompt, SamplingConfig(temperature=TEMPERATURE)), max_tv=0.08)
        assert check.ok, check


def test_stopping_rule_varies_the_length():
    target = tiny_llama(0, vocab=VOCAB, hidden=32, std=0.3)
    draft = reduced_draft(target, [0, 1, 2, 4, 5, 7], seed=1)
    seen = set()
    for h in (0.0, 0.5, 1.0):
        dec = SpecDecPPDecoder(target, draft, random_head(32, 2), threshold=h, max_draft_length=4)
        ids, mask = left_pad([PROMPTS[i % 2] for i in range(64)])
        dec.generate(ids, mask, max_new_tokens=5, do_sample=True, temperature=TEMPERATURE, seed=0)
        lengths = dec.builder.stop_rule.round_lengths[0]  # the first round may draft up to the cap (enough room)
        seen.update(lengths)
        if h == 0.0:
            # The first candidate is never predicted, so even h = 0 drafts two before stopping.
            assert max(lengths) <= 2
        if h == 1.0:
            assert min(lengths) == 4  # never stops early: the hard cap
    assert len(seen) >= 2


def test_specdec_pp_greedy_equals_target_greedy():
    target = tiny_llama(0, vocab=32, hidden=64)
    draft = reduced_draft(target, list(range(0, 32, 2)) + [1, 3, 5], seed=4)
    dec = SpecDecPPDecoder(target, draft, random_head(32, 5), threshold=0.6, max_draft_length=5)
    g = torch.Generator().manual_seed(0)
    prompts = [[int(t) for t in torch.randint(0, 32, (int(n),), generator=g)] for n in (3, 6, 4, 5)]
    ids, mask = left_pad(prompts)
    out = dec.generate(ids, mask, max_new_tokens=24, do_sample=False)
    assert_target_greedy(target, prompts, out.new_tokens, 24)


def test_bad_specdec_pp_inputs():
    target = tiny_llama(0, vocab=VOCAB, hidden=32)
    draft = reduced_draft(target, [0, 1, 2], seed=1)
    with pytest.raises(ValueError, match=r"threshold must lie in \[0, 1\]"):
        SpecDecPPDecoder(target, draft, random_head(32, 0), threshold=1.5)
    other = tiny_llama(0, vocab=VOCAB + 4, hidden=32)
    with pytest.raises(ValueError, match="differs from the target"):
        SpecDecPPDecoder(other, draft, random_head(32, 0))
    with pytest.raises(ValueError, match="depth must be >= 0"):
        AcceptanceHead(8, -1)
