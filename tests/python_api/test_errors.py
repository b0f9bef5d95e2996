"""The package's typed exceptions: each fault class raises its own, which is also the built-in exception callers
catch for it (ValueError, OSError), so `except ValueError` keeps working."""

from __future__ import annotations

import pytest
import specdec
import torch
import transformers
from specdec.errors import (
    CacheDirError,
    DraftMismatchError,
    SpecDecError,
    UnsupportedModelError,
    UnsupportedSettingError,
)
from tiny_models import tiny_llama


def test_every_error_is_a_specdec_error_and_a_builtin_one() -> None:
    for cls, builtin in (
        (UnsupportedSettingError, ValueError),
        (UnsupportedModelError, ValueError),
        (DraftMismatchError, ValueError),
        (CacheDirError, OSError),
    ):
        assert issubclass(cls, SpecDecError) and issubclass(cls, builtin)


def test_an_unsupported_architecture_raises_unsupported_model_error() -> None:
    cfg = transformers.GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions=64)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with pytest.raises(UnsupportedModelError, match="architecture 'gpt2' is not supported"):
        specdec.generate(model, None, torch.tensor([[1, 2]]), method="ar", max_new_tokens=2)


def test_a_draft_trained_for_another_target_raises_draft_mismatch_error() -> None:
    from specdec.train import load_draft

    target = tiny_llama(0, vocab=64, hidden=32)
    with pytest.raises(DraftMismatchError, match="vocab_size=49152"):
        load_draft("smollm2-csd-l2", target)
    with pytest.raises(DraftMismatchError, match="vocab_size=49152"):
        load_draft("smollm2-eagle", target)


def test_an_unsupported_setting_raises_unsupported_setting_error() -> None:
    target = tiny_llama(0, vocab=64, hidden=32)
    with pytest.raises(UnsupportedSettingError, match="no_repeat_ngram_size=2"):
        specdec.generate(target, "ngram", torch.tensor([[1, 2]]), method="sd", no_repeat_ngram_size=2)
