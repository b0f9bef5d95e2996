"""The runs the tensor-parallel tests compare (tests/python_api/test_tensor_parallel.py): every method, greedy
and seeded sampled, on a tiny Llama target and a noisy copy as draft, in one process or on every rank of
``tp_worker.py``. Shared by both sides so that both run exactly the same calls."""

from __future__ import annotations

from typing import Any

import numpy as np
import specdec
import torch
from specdec.drafters.cascade import CascadeDrafter
from specdec.drafters.networks.head import AcceptanceHead

VOCAB = 48
PROMPTS = [[5, 17, 3, 9, 22], [7, 1, 30, 12, 44, 2, 8, 19]]
NEW_TOKENS = 12
TEMPERATURE = 0.8
SEED = 11
#: the key of the custom_generate hook's run
HOOK = "hook-sd/sampled"

#: (label, method, draft kind, method parameters)
CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    ("ar", "ar", "none", {}),
    ("sd", "sd", "model", {"draft_length": 3}),
    ("sd-ngram", "sd", "ngram", {"draft_length": 3}),
    ("rrs", "rrs", "model", {"branching": (2, 1)}),
    ("rrsw", "rrsw", "model", {"branching": (2, 1)}),
    ("rsd_c", "rsd_c", "model", {"branching": (2, 2)}),
    ("rsd_c-auto", "rsd_c", "model", {"branching": "auto"}),
    ("rsd_s", "rsd_s", "model", {"beam_width": 2, "draft_length": 2}),
    ("spectr", "spectr", "model", {"num_chains": 2, "draft_length": 2}),
    ("spechub", "spechub", "model", {"branching": (2, 1)}),
    ("specdec_pp", "specdec_pp", "model", {"draft_length": 3}),
    ("csd", "csd", "cascade", {}),
]


def _head(hidden: int) -> AcceptanceHead:
    torch.manual_seed(5)
    head = AcceptanceHead(hidden, 2)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
    return head.eval()


def decoder(target: Any, draft: Any, method: str, kind: str, params: dict[str, Any]) -> specdec.SpeculativeDecoder:
    extra: dict[str, Any] = {}
    if specdec.methods.get(method).needs_head:
        extra = {"head": _head(int(draft.config.hidden_size)), "threshold": 0.5}
    use: Any = {"none": None, "model": draft, "ngram": "ngram"}.get(kind)
    if kind == "cascade":
        bigram = (3 * np.arange(VOCAB) + 1) % VOCAB
        use = CascadeDrafter([draft], bigram=bigram, steps=[[2, 1], [0, 1]], leniency=2.0, mag_tokens=3)
    return specdec.SpeculativeDecoder(target, use, method=method, **params, **extra)


def run_cases(target: Any, draft: Any) -> dict[str, list[list[int]]]:
    """Every case greedy and sampled: label/mode -> each prompt's new tokens."""
    from tiny_models import left_pad

    ids, mask = left_pad(PROMPTS)
    out: dict[str, list[list[int]]] = {}
    for label, method, kind, params in CASES:
        dec = decoder(target, draft, method, kind, params)
        for mode, settings in (("greedy", {}), ("sampled", {"do_sample": True, "temperature": TEMPERATURE})):
            res = dec.generate(ids, mask, max_new_tokens=NEW_TOKENS, seed=SEED, **settings)
            out[f"{label}/{mode}"] = res.new_tokens
    # the transformers hook: the target's own generate with specdec's custom_generate
    seqs = target.generate(
        ids, attention_mask=mask, custom_generate=specdec.custom_generate, assistant_model=draft, method="sd",
        draft_length=3, max_new_tokens=NEW_TOKENS, do_sample=True, temperature=TEMPERATURE, seed=SEED,
    )  # fmt: skip
    out[HOOK] = seqs[:, ids.shape[1] :].tolist()
    return out


def run_families(models: dict[str, Any]) -> dict[str, list[list[int]]]:
    """Each family's tiny model (name -> model) with Max-Gram drafting: SD greedy and sampled, family/mode -> each
    prompt's new tokens."""
    from tiny_models import left_pad

    ids, mask = left_pad(PROMPTS)
    out: dict[str, list[list[int]]] = {}
    for name, model in models.items():
        dec = specdec.SpeculativeDecoder(model, "ngram", method="sd", draft_length=3)
        for mode, settings in (("greedy", {}), ("sampled", {"do_sample": True, "temperature": TEMPERATURE})):
            res = dec.generate(ids, mask, max_new_tokens=NEW_TOKENS, seed=SEED, pad_token_id=0, **settings)
            out[f"{name}/{mode}"] = res.new_tokens
    return out
