"""Feature-draft pipeline (EAGLE-style) on tiny random models: teacher-forced features and labels, training with
the two-pass unroll (loss decreases, alpha rises, resume is a no-op, same seed -> same weights), the acceptance
metrics of feature_acceptance against a direct computation, save/load round trip, and bad inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from specdec.train.assets import load_draft
from specdec.train.distill import head_index_map
from specdec.train.feature_data import label_with_features
from specdec.train.feature_distill import (
    FeatureDistillConfig,
    exact_head_labels,
    feature_acceptance,
    feature_draft_from_checkpoint,
    run_feature_distill,
    topk_head_labels,
)
from specdec.train.feature_draft import FeatureDraft, FeatureDraftConfig, load_feature_draft, save_feature_draft
from tiny_models import tiny_llama

VOCAB = 64
TINY = FeatureDraftConfig(num_layers=1, intermediate_size=64, num_heads=2, num_kv_heads=1, head_vocab=48)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0, vocab=VOCAB, hidden=32, std=0.4)


@pytest.fixture(scope="module")
def records(target):
    g = torch.Generator().manual_seed(0)
    seqs = [[int(t) for t in torch.randint(3, VOCAB, (n,), generator=g)] for n in (12, 15, 9, 14) * 6]
    recs = label_with_features(target, seqs, top_k=8, batch_size=5)
    for r in recs:
        r["start"] = 4
    return recs


def test_features_and_labels_are_the_targets(target, records):
    r = records[1]
    with torch.no_grad():
        out = target.model(input_ids=r["tokens"][None].long()).last_hidden_state[0]
        logp = torch.log_softmax(target.lm_head(out).float(), dim=-1)
    torch.testing.assert_close(r["feats"].float(), out, atol=2e-2, rtol=2e-2)  # stored in bf16
    assert torch.equal(r["topk_ids"][:, 0].long(), logp.argmax(-1))


def _head_labels_of(target, r, head_ids, *, shift=1):
    """Exact labels of pairs (f_i, x_{i+1}) -> law of x_{i+2}: the state f_{i+shift} (shift 1 is right)."""
    f = r["feats"].float()
    tk_ids, tk_lp = r["topk_ids"][1:].long(), r["topk_logp"][1:].float()
    out_w = target.get_output_embeddings().weight.detach().float()
    return exact_head_labels(f[shift : shift + len(tk_ids)], tk_ids, tk_lp, out_w, head_ids)


def test_exact_head_labels_are_the_targets_law(target, records):
    r = records[1]
    with torch.no_grad():
        # the law from the stored (bf16) state, normalised over the full vocabulary: what the labels must equal
        full = torch.softmax(target.lm_head(r["feats"][1:].to(target.lm_head.weight.dtype)).float(), dim=-1)
    every = torch.arange(VOCAB)
    p = _head_labels_of(target, r, every)
    torch.testing.assert_close(p, full, atol=2e-3, rtol=2e-2)
    torch.testing.assert_close(p.sum(-1), torch.ones(len(p)), atol=5e-3, rtol=0)
    # a reduced head keeps the same probabilities on its columns (not renormalised: the rest is lost mass)
    head = torch.arange(0, VOCAB, 2)
    torch.testing.assert_close(_head_labels_of(target, r, head), full[:, head], atol=2e-3, rtol=2e-2)
    # stored top-k placed on the head columns: equal to the exact law there, 0 elsewhere
    tk = topk_head_labels(r["topk_ids"][1:].long(), r["topk_logp"][1:].float(), head_index_map(every, VOCAB))
    on = tk > 0
    torch.testing.assert_close(tk[on], p[on], atol=3e-3, rtol=3e-2)
    assert int(on.sum(-1).max()) == r["topk_ids"].shape[1]
    # power: the state one position early (the law of x_{i+1}) is not the label
    assert (_head_labels_of(target, r, every, shift=0) - full).abs().max() > 0.05


def test_feature_pipeline_trains_on_exact_head_labels(tmp_path, target, records):
    cfg = FeatureDistillConfig(
        draft=TINY, steps=40, batch_size=6, warmup=4, eval_every=20, ckpt_every=20, lr=1e-2, val_every_nth=8
    )
    head_cfg = FeatureDistillConfig(**{**cfg.__dict__, "labels": "head"})
    info = run_feature_distill(tmp_path, head_cfg, target=target, records=records, progress=False)
    hist = [h for h in torch.load(tmp_path / "feature" / "final.pt", weights_only=False)["history"] if "loss" in h]
    assert hist[-1]["loss"] < 0.8 * hist[0]["loss"]
    assert hist[-1]["alpha_head"] > hist[0]["alpha_head"] and "alpha2_head" in hist[-1]
    topk = run_feature_distill(tmp_path / "topk", cfg, target=target, records=records, progress=False)
    assert topk["weights_sha256"] != info["weights_sha256"]  # the labels reach the training
    with pytest.raises(ValueError, match="labels"):
        run_feature_distill(
            tmp_path / "bad", FeatureDistillConfig(**{**cfg.__dict__, "labels": "full"}), target=target, records=records
        )


def test_feature_pipeline_trains_and_resumes(tmp_path, target, records):
    cfg = FeatureDistillConfig(
        draft=TINY, steps=60, batch_size=6, warmup=4, eval_every=30, ckpt_every=30, lr=1e-2, val_every_nth=8
    )
    info = run_feature_distill(tmp_path, cfg, target=target, records=records, progress=False)
    hist = [h for h in torch.load(tmp_path / "feature" / "final.pt", weights_only=False)["history"] if "loss" in h]
    assert info["steps"] == 60
    assert hist[-1]["loss"] < 0.8 * hist[0]["loss"]
    assert hist[-1]["alpha_topk"] > hist[0]["alpha_topk"]
    assert "alpha2_topk" in hist[-1]  # the second (unrolled) pass trained too
    again = run_feature_distill(tmp_path, cfg, target=target, records=records, progress=False)
    assert again["weights_sha256"] == info["weights_sha256"]
    # same seed, fresh directory -> the same weights
    other = run_feature_distill(tmp_path / "b", cfg, target=target, records=records, progress=False)
    assert other["weights_sha256"] == info["weights_sha256"]

    draft = feature_draft_from_checkpoint(tmp_path / "feature" / "final.pt", target)
    m = feature_acceptance(draft, target, records[:4])
    # direct computation for the first record's first response token: pair (f_{s-2}, x_{s-1}) vs q_s
    r = records[0]
    s = int(r["start"])
    with torch.no_grad():
        f = target.model(input_ids=r["tokens"][None].long()).last_hidden_state
        _, logits = draft(f[:, : s - 1], r["tokens"][None, 1:s].long())
        p = torch.softmax(logits[0, -1].float(), -1)
        q = torch.softmax(target.lm_head(f[0, s - 1]).float(), -1)
    one = float(torch.minimum(p, q).sum())
    assert 0.0 < one <= 1.0
    assert 0.0 < m["alpha"] <= m["head_coverage"] + 1e-6
    assert 0.0 < m["alpha_depth2"] <= 1.0
    assert m["positions"] == sum(len(x["tokens"]) - x["start"] for x in records[:4])


def test_feature_draft_save_load_roundtrip(tmp_path, target):
    draft = FeatureDraft(TINY, target.config, target.get_input_embeddings().weight, torch.arange(48)).eval()
    path = save_feature_draft(draft, tmp_path / "f.safetensors")
    loaded = load_feature_draft(path, target, dtype=torch.float32)
    via_load_draft = load_draft(path, target, dtype=torch.float32)  # load_draft recognises a feature draft
    assert isinstance(via_load_draft, FeatureDraft)
    f = torch.randn(1, 3, 32)
    x = torch.tensor([[3, 9, 4]])
    with torch.no_grad():
        a, b = draft(f, x)[1], loaded(f, x)[1]
    finite = torch.isfinite(a)
    assert torch.equal(finite, torch.isfinite(b))
    torch.testing.assert_close(a[finite], b[finite], atol=3e-2, rtol=3e-2)  # saved in bf16


def test_feature_draft_bad_inputs(tmp_path, target):
    draft = FeatureDraft(TINY, target.config, target.get_input_embeddings().weight, torch.arange(48)).eval()
    path = save_feature_draft(draft, tmp_path / "f.safetensors")
    with pytest.raises(ValueError, match="vocab_size=64, target has vocab_size=72"):
        load_feature_draft(path, tiny_llama(0, vocab=VOCAB + 8, hidden=32))
    with pytest.raises(ValueError, match="input embedding does not match"):
        load_feature_draft(path, tiny_llama(5, vocab=VOCAB, hidden=32, std=0.1))
    with pytest.raises(ValueError, match="embed_table has 10 rows"):
        FeatureDraft(TINY, target.config, target.get_input_embeddings().weight[:10], torch.arange(4))
    with pytest.raises(ValueError, match="no training data"):
        run_feature_distill(Path("/nonexistent-specdec"), FeatureDistillConfig(draft=TINY), target=target, records=[])


def test_feature_pipeline_with_extra_target_layers(tmp_path, target):
    """EAGLE-3-style fusion: the data keeps the inputs of extra target layers, the draft fuses them, the same
    metrics run (the driver side is covered in test_feature_draft.py)."""
    g = torch.Generator().manual_seed(1)
    seqs = [[int(t) for t in torch.randint(3, VOCAB, (n,), generator=g)] for n in (12, 15, 9, 14) * 3]
    recs = label_with_features(target, seqs, top_k=8, batch_size=5, layers=(0, 1))
    assert recs[0]["xfeats"].shape == (12, 64)
    for r in recs:
        r["start"] = 4
    extra = FeatureDraftConfig(**{**TINY.__dict__, "extra_layers": (0, 1)})
    cfg = FeatureDistillConfig(draft=extra, steps=6, batch_size=4, warmup=1, eval_every=6, ckpt_every=6)
    info = run_feature_distill(tmp_path, cfg, target=target, records=recs, progress=False)
    assert info["steps"] == 6
    draft = feature_draft_from_checkpoint(tmp_path / "feature" / "final.pt", target)
    assert draft.decoder.pair.fuse is not None and draft.feature_layers == (0, 1)
    m = feature_acceptance(draft, target, recs[:3])
    assert 0.0 < m["alpha"] <= 1.0
    plain = FeatureDistillConfig(draft=TINY, steps=1)
    with pytest.raises(ValueError, match="no xfeats"):
        run_feature_distill(
            tmp_path / "x",
            FeatureDistillConfig(draft=extra, steps=1),
            target=target,
            records=[{k: v for k, v in r.items() if k != "xfeats"} for r in recs],
        )
    assert plain.draft.extra_layers == ()


def test_records_come_from_the_recorded_shards_only(tmp_path):
    """load_feature_records reads the shards the data stage listed in the manifest, not every file in the folder
    (a shard left by an earlier, larger configuration must not leak into training)."""
    import json

    from specdec.train.feature_data import load_feature_records

    folder = tmp_path / "feature" / "data"
    folder.mkdir(parents=True)
    for name, n in (("magpie_0000.pt", 2), ("magpie_0001.pt", 3), ("gsm8k_0000.pt", 1)):
        recs = [{"tokens": torch.full((4,), n * 10 + j, dtype=torch.int32)} for j in range(n)]
        torch.save({"records": recs}, folder / name)
    assert len(load_feature_records(tmp_path)) == 6  # no manifest: every shard
    (tmp_path / "feature" / "manifest.json").write_text(
        json.dumps({"data": {"shards": ["magpie_0000.pt", "gsm8k_0000.pt"]}})
    )
    recs = load_feature_records(tmp_path)
    assert [int(r["tokens"][0]) for r in recs] == [10, 20, 21]  # sorted names: gsm8k_0000, then magpie_0000
    assert len(load_feature_records(tmp_path, ["magpie_0001.pt"])) == 3
