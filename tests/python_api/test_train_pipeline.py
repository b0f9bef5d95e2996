"""Training pipeline on tiny random models: data -> distillation -> acceptance head, reduced-head exactness,
save/load round trip and bad inputs (no real model, no downloads)."""

from __future__ import annotations

import pytest
import torch
from specdec.train.assets import load_draft, save_draft
from specdec.train.data import label_sequences, sample_responses
from specdec.train.distill import DistillConfig, batch_indices, run_distill
from specdec.train.draft import DraftConfig, ReducedHead, build_draft, check_compatible, select_head_ids
from specdec.train.head import AcceptanceHead, HeadConfig, run_head, weighted_bce
from tiny_models import tiny_llama

VOCAB = 64
TINY_DRAFT = DraftConfig(hidden_size=32, num_layers=1, intermediate_size=64, num_heads=2, num_kv_heads=1, head_vocab=48)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0, vocab=VOCAB, hidden=64, std=0.1)


@pytest.fixture(scope="module")
def records(target):
    """Target-sampled responses (top-k labelled while sampling) plus teacher-forced labelled sequences."""
    g = torch.Generator().manual_seed(0)
    prompts = [[int(t) for t in torch.randint(3, VOCAB, (n,), generator=g)] for n in (3, 5, 4, 6) * 4]
    recs = []
    for p, (toks, ids, lp) in zip(
        prompts, sample_responses(target, prompts, max_new_tokens=12, eos_id=2, generator=g, top_k=8), strict=True
    ):
        recs.append({"tokens": torch.tensor(p + toks), "start": len(p), "topk_ids": ids, "topk_logp": lp})
    seqs = [p + [int(t) for t in torch.randint(3, VOCAB, (10,), generator=g)] for p in prompts[:8]]
    labels = label_sequences(target, seqs, [len(p) for p in prompts[:8]], top_k=8)
    for s, p, (ids, lp) in zip(seqs, prompts[:8], labels, strict=True):
        recs.append({"tokens": torch.tensor(s), "start": len(p), "topk_ids": ids, "topk_logp": lp})
    return recs


def test_sampled_labels_match_teacher_forcing(target, records):
    """The top-k stored while sampling equals a teacher-forced labelling of the same text (same target law)."""
    r = records[0]
    ids, lp = label_sequences(target, [r["tokens"].tolist()], [r["start"]], top_k=8)[0]
    assert torch.equal(ids[:, 0], r["topk_ids"][:, 0])
    torch.testing.assert_close(lp.float(), r["topk_logp"].float(), atol=2e-2, rtol=0)


def test_reduced_head_is_a_full_vocab_distribution(target):
    head_ids = torch.tensor([2, 5, 7, 11, 40])
    draft = build_draft(
        DraftConfig(hidden_size=32, num_layers=1, intermediate_size=64, num_heads=2, num_kv_heads=1, head_vocab=5),
        target.config,
        target.get_input_embeddings().weight,
        head_ids,
    ).eval()
    with torch.no_grad():
        logits = draft(torch.tensor([[3, 4, 5, 6]])).logits
    assert logits.shape == (1, 4, VOCAB)
    p = torch.softmax(logits.float(), dim=-1)
    torch.testing.assert_close(p.sum(-1), torch.ones(1, 4))
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[head_ids] = False
    assert torch.all(p[..., outside] == 0)
    assert torch.all(p[..., head_ids] > 0)


def test_pipeline_end_to_end_loss_decreases(tmp_path, target, records):
    cfg = DistillConfig(draft=TINY_DRAFT, steps=60, batch_size=8, warmup=5, eval_every=30, ckpt_every=30, lr=1e-2)
    info = run_distill(tmp_path, cfg, target=target, records=records, progress=False)
    hist = [h for h in torch.load(tmp_path / "distill" / "final.pt", weights_only=False)["history"] if "loss" in h]
    assert info["steps"] == 60
    assert hist[-1]["loss"] < 0.8 * hist[0]["loss"]
    assert hist[-1]["alpha_topk"] > hist[0]["alpha_topk"]
    # Resuming a finished run is a no-op that returns the same weights.
    again = run_distill(tmp_path, cfg, target=target, records=records, progress=False)
    assert again["weights_sha256"] == info["weights_sha256"]

    from specdec.train.assets import draft_from_checkpoint

    draft = draft_from_checkpoint(tmp_path / "distill" / "final.pt", target)
    hcfg = HeadConfig(steps=50, batch_size=32, depth=2)
    hinfo = run_head(tmp_path, hcfg, draft=draft, records=records, progress=False)
    assert hinfo["positions"] > 50
    assert 0.0 <= hinfo["mean_label"] <= 1.0
    assert (tmp_path / "head" / "head.safetensors").is_file()
    assert "distill" in (tmp_path / "manifest.json").read_text()


def test_distill_reproducible_batches():
    assert batch_indices(7, 50, 8, seed=3) == batch_indices(7, 50, 8, seed=3)
    assert batch_indices(7, 50, 8, seed=3) != batch_indices(7, 50, 8, seed=4)


def test_save_load_roundtrip(tmp_path, target, records):
    table = target.get_input_embeddings().weight
    head_ids = select_head_ids(records, VOCAB, 48, always=(2,))
    assert 2 in head_ids.tolist() and head_ids.numel() == 48
    draft = build_draft(TINY_DRAFT, target.config, table, head_ids).eval()
    path = save_draft(draft, tmp_path / "d.safetensors", TINY_DRAFT)
    loaded = load_draft(path, target, dtype=torch.float32)
    x = torch.tensor([[3, 9, 4]])
    with torch.no_grad():
        a, b = draft(x).logits, loaded(x).logits
    finite = torch.isfinite(a)
    assert torch.equal(finite, torch.isfinite(b))
    torch.testing.assert_close(a[finite], b[finite], atol=3e-2, rtol=3e-2)  # saved in bf16


def test_head_tie_blocks_and_loss():
    tied = AcceptanceHead(16, 3, tie_blocks=True)
    free = AcceptanceHead(16, 3)
    assert len(tied.blocks) == 1 and len(free.blocks) == 3
    logits = torch.tensor([[0.0, 2.0], [1.0, -1.0]])
    p = torch.tensor([1.0, 0.0])
    # Perfect-ish predictions in the right direction cost less than the swapped ones.
    assert weighted_bce(logits, p, 6.0) < weighted_bce(logits, 1 - p, 6.0)


# ---- bad inputs -------------------------------------------------------------------------------------------------


def test_load_with_other_vocab_is_rejected(tmp_path, target):
    draft = build_draft(TINY_DRAFT, target.config, target.get_input_embeddings().weight, torch.arange(48)).eval()
    path = save_draft(draft, tmp_path / "d.safetensors", TINY_DRAFT)
    other = tiny_llama(0, vocab=VOCAB + 8, hidden=64)
    with pytest.raises(ValueError, match="vocab_size=64, target has vocab_size=72"):
        load_draft(path, other)
    impostor = tiny_llama(5, vocab=VOCAB, hidden=64, std=0.1)
    with pytest.raises(ValueError, match="input embedding does not match"):
        load_draft(path, impostor)
    with pytest.raises(FileNotFoundError, match="no draft asset"):
        load_draft("no-such-draft", target)


class _Tok:
    def __init__(self, vocab: dict[str, int]) -> None:
        self._v = vocab

    def get_vocab(self) -> dict[str, int]:
        return self._v


def test_check_compatible_rejects_mismatches(target):
    draft = build_draft(TINY_DRAFT, target.config, target.get_input_embeddings().weight, torch.arange(48))
    other = tiny_llama(0, vocab=VOCAB + 8, hidden=64)
    with pytest.raises(ValueError, match="vocabularies differ: draft vocab_size=64, target vocab_size=72"):
        check_compatible(draft, other)
    with pytest.raises(ValueError, match="tokenizers differ"):
        check_compatible(draft, target, _Tok({"a": 0, "b": 1}), _Tok({"a": 1, "b": 0}))
    check_compatible(draft, target, _Tok({"a": 0}), _Tok({"a": 0}))


def test_bad_draft_shapes(target):
    table = target.get_input_embeddings().weight
    with pytest.raises(ValueError, match="embed_table has 10 rows but the target vocabulary is 64"):
        build_draft(TINY_DRAFT, target.config, table[:10], torch.arange(4))
    with pytest.raises(ValueError, match=r"head_ids must lie in \[0, 64\)"):
        ReducedHead(8, torch.tensor([0, 64]), VOCAB)
    with pytest.raises(ValueError, match="must not repeat"):
        ReducedHead(8, torch.tensor([1, 1]), VOCAB)
    with pytest.raises(ValueError, match="exceeds the vocabulary size"):
        select_head_ids([], VOCAB, VOCAB + 1)
    with pytest.raises(ValueError, match="no training data"):
        run_distill(__import__("pathlib").Path("/nonexistent-specdec"), DistillConfig(), target=target, records=[])


def test_sampling_temperature_changes_draws_not_stored_law(target):
    """A near-zero temperature draws the argmax at every step, while the stored top-k stays the T = 1 law (the
    teacher-forced labels of the same text); a non-positive temperature is refused by name."""
    prompts = [[5, 9, 3], [7, 4, 11, 6]]
    g = torch.Generator().manual_seed(1)
    res = sample_responses(target, prompts, max_new_tokens=10, eos_id=2, generator=g, top_k=8, temperature=1e-4)
    for p, (toks, ids, lp) in zip(prompts, res, strict=True):
        assert toks == ids[: len(toks), 0].tolist()
        ref_ids, ref_lp = label_sequences(target, [p + toks], [len(p)], top_k=8)[0]
        assert torch.equal(ref_ids[:, 0], ids[:, 0])
        torch.testing.assert_close(lp.float(), ref_lp.float(), atol=2e-2, rtol=0)
    # at T = 1 the same generator does not follow the argmax (the tiny model's laws are flat)
    g = torch.Generator().manual_seed(1)
    hot = sample_responses(target, prompts, max_new_tokens=10, eos_id=2, generator=g, top_k=8)
    assert any(toks != ids[: len(toks), 0].tolist() for toks, ids, _ in hot)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            sample_responses(target, prompts, max_new_tokens=2, eos_id=2, generator=g, temperature=bad)


def test_data_dir_comes_from_the_environment_only(tmp_path, monkeypatch):
    """The external data folder is ``$SPECDEC_DATA_DIR``, nothing outside the repository by default: unset or not a
    folder, the error names the variable and the two files it must hold."""
    from specdec.train.common import shared_data_dir

    monkeypatch.delenv("SPECDEC_DATA_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match=r"\$SPECDEC_DATA_DIR is not set.*gsm8k_train\.jsonl.*vicuna_bench"):
        shared_data_dir()
    monkeypatch.setenv("SPECDEC_DATA_DIR", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match=r"\$SPECDEC_DATA_DIR='.*missing' is not a folder.*gsm8k_train"):
        shared_data_dir()
    monkeypatch.setenv("SPECDEC_DATA_DIR", str(tmp_path))
    assert shared_data_dir() == tmp_path


def test_retrain_command_carries_the_sampled_questions_and_their_cue():
    """A draft trained on the target's own answers to GSM8K questions (with a cue after each) records a retrain
    command that asks for the same data: the counts and the cue, quoted so that a shell reads it back whole."""
    import shlex

    from specdec.train.assets import retrain_command
    from specdec.train.data import DataConfig

    cue = "Let's think step by step."
    data = DataConfig(n_gsm8k_sample=4000, n_gsm8k_label=0, n_magpie=0, gsm8k_cue=cue)
    manifest = {"data": {"config": data.__dict__}}
    distill = {"seed": 0, "steps": 1200, "draft": {**TINY_DRAFT.__dict__}}
    argv = shlex.split(retrain_command(manifest, distill, "d"))
    assert argv[argv.index("--gsm8k-sample") + 1] == "4000"
    assert argv[argv.index("--gsm8k-cue") + 1] == cue
    assert argv[argv.index("--gsm8k-label") + 1] == "0"
    odd = DataConfig(n_gsm8k_sample=8, gsm8k_cue='Pay $5 "now"!').__dict__
    argv = shlex.split(retrain_command({"data": {"config": odd}}, distill, "d"))
    assert argv[argv.index("--gsm8k-cue") + 1] == 'Pay $5 "now"!'
    plain = retrain_command({"data": {"config": DataConfig().__dict__}}, distill, "d")
    assert "--gsm8k-sample" not in plain and "--gsm8k-cue" not in plain and "--code-sample" not in plain
    assert "--answer-temperature" not in plain
    code = DataConfig(n_gsm8k_sample=8, n_code_sample=1500, answer_temperature=0.7).__dict__
    argv = shlex.split(retrain_command({"data": {"config": code}}, distill, "d"))
    assert argv[argv.index("--code-sample") + 1] == "1500"
    assert argv[argv.index("--answer-temperature") + 1] == "0.7"


def test_train_cli_rejects_a_negative_sample_count(capsys):
    from specdec.train.cli import main

    with pytest.raises(SystemExit):
        main(["data", "--gsm8k-sample", "-1"])
    assert "--gsm8k-sample must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["data", "--code-sample", "-2"])
    assert "--code-sample must be >= 0" in capsys.readouterr().err
    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(SystemExit):
            main(["data", "--answer-temperature", bad])
        assert "--answer-temperature must be a positive finite number" in capsys.readouterr().err


def _write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_code_stubs_are_documented_public_signatures_in_a_seeded_order(tmp_path):
    """The code source's prompts: public functions and public classes' public methods with a docstring of 20 to
    600 characters, as a signature plus that docstring (valid Python), none from test folders; the same seed gives
    the same list, another seed another order of the same stubs; asking for more than there are is an error."""
    import ast

    from specdec.train.data import code_stubs

    doc = "Return the sum of a and b, both integers."
    _write(
        tmp_path / "mod.py",
        f'''
def add(a: int, b: int = 2) -> int:
    """{doc}"""
    return a + b

def _private(x):
    """A private helper with a long enough docstring."""

def terse(x):
    """Too short."""

class Box:
    def put(self, item, *, where=None):
        """Put item into the box.

        Where: an optional slot.
        """

    def _hidden(self):
        """Hidden method with a long enough docstring."""

class _Internal:
    def run(self):
        """Run the internal thing, never listed."""
''',
    )
    _write(tmp_path / "test" / "t.py", 'def shown_nowhere(x):\n    """A test helper that must be skipped."""\n')
    _write(tmp_path / "broken.py", "def (:\n")
    stubs = code_stubs(2, 0, root=tmp_path)
    assert sorted(stubs) == sorted(
        [
            f'def add(a: int, b: int=2) -> int:\n    """{doc}\n    """\n',
            'class Box:\n    def put(self, item, *, where=None):\n        """Put item into the box.\n\n'
            '        Where: an optional slot.\n        """\n',
        ]
    )
    for stub in stubs:
        ast.parse(stub + ("        pass\n" if stub.startswith("class") else "    pass\n"))
    assert code_stubs(2, 0, root=tmp_path) == stubs
    assert {tuple(code_stubs(2, s, root=tmp_path)) for s in range(8)} == {tuple(stubs), tuple(stubs[::-1])}
    assert code_stubs(1, 0, root=tmp_path)[0] in stubs
    with pytest.raises(ValueError, match="3 code stubs asked for.*has 2"):
        code_stubs(3, 0, root=tmp_path)


def _layer_draft(target, layers, head_vocab=VOCAB):
    from specdec.train.draft import init_from_target

    cfg = DraftConfig.from_target_layers(target.config, layers, head_vocab)
    table = target.get_input_embeddings().weight.detach()
    draft = build_draft(cfg, target.config, table, torch.arange(VOCAB)[:head_vocab])
    init_from_target(draft, table, target)
    return cfg, draft.eval()


def test_a_draft_of_all_target_layers_starts_as_the_target():
    """Every layer, in order, with a full head: the draft's first forward is the target's (identity projection,
    copied layers, final norm and output rows); a subset copies exactly the named layers in the given order."""
    target = tiny_llama(3, vocab=VOCAB, hidden=64, layers=3, std=0.1)
    cfg, draft = _layer_draft(target, (0, 1, 2))
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads) == (64, 128, 4, 2)
    x = torch.tensor([[3, 9, 4, 17, 5]])
    with torch.no_grad():
        torch.testing.assert_close(draft(x).logits, target(x).logits, atol=1e-4, rtol=1e-4)
    _, sub = _layer_draft(target, (2, 0))
    for mine, theirs in zip(sub.model.layers, (target.model.layers[2], target.model.layers[0]), strict=True):
        for (k, a), b in zip(mine.state_dict().items(), theirs.state_dict().values(), strict=True):
            assert torch.equal(a, b), k


def test_target_layers_are_checked(target, records):
    for bad in ((), (0, 0), (2,), (-1,)):
        with pytest.raises(ValueError, match="target_layers"):
            DraftConfig.from_target_layers(target.config, bad, 16)
    from specdec.train.draft import init_from_target

    cfg = DraftConfig.from_target_layers(target.config, (1,), 16)
    table = target.get_input_embeddings().weight.detach()
    draft = build_draft(cfg, target.config, table, torch.arange(16))
    with pytest.raises(ValueError, match="pass target"):
        init_from_target(draft, table)
    narrow = DraftConfig(**{**TINY_DRAFT.__dict__, "target_layers": (0,)})
    with pytest.raises(ValueError, match="target's layer shape"):
        init_from_target(build_draft(narrow, target.config, table, torch.arange(48)), table, target)
    with pytest.raises(ValueError, match="target's layer shape"):
        run_distill(None, DistillConfig(draft=narrow), target=target, records=records, progress=False)


def test_retrain_command_of_a_draft_from_target_layers_names_them_and_its_learning_rate(target):
    import shlex

    from specdec.train.assets import retrain_command

    layered = DraftConfig.from_target_layers(target.config, (0, 1), 32).__dict__
    argv = shlex.split(retrain_command({}, {"seed": 0, "steps": 9, "lr": 1e-3, "draft": layered}, "d"))
    assert argv[argv.index("--from-target-layers") + 1] == "0,1"
    assert argv[argv.index("--lr") + 1] == "0.001"
    assert "--layers" not in argv and "--width" not in argv
    plain = shlex.split(
        retrain_command({}, {"seed": 0, "steps": 9, "lr": DistillConfig().lr, "draft": TINY_DRAFT.__dict__}, "d")
    )
    assert "--lr" not in plain and "--from-target-layers" not in plain and "--layers" in plain


def test_train_cli_rejects_bad_target_layers_and_learning_rates(capsys):
    from specdec.train.cli import main

    for argv, msg in (
        (["distill", "--from-target-layers", "0,1", "--layers", "2"], "do not give --layers or --width"),
        (["distill", "--from-target-layers", "0,one"], "comma-separated layer indices"),
        (["distill", "--lr", "0"], "--lr must be a positive finite number"),
        (["distill", "--lr", "nan"], "--lr must be a positive finite number"),
    ):
        with pytest.raises(SystemExit):
            main(argv)
        assert msg in capsys.readouterr().err
