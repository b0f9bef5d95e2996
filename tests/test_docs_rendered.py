"""The measured figures in README.md and docs/*.md are what benchmarks/report.py renders from the recorded data.

Rendering is done in memory (no file is written, no plot is drawn): a figure edited by hand, or a results CSV changed
without re-running ``python benchmarks/report.py``, fails here.
"""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _report():
    spec = importlib.util.spec_from_file_location("specdec_report", os.path.join(ROOT, "benchmarks", "report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = _report()


@pytest.mark.parametrize("doc", report.DOCS)
def test_committed_doc_equals_its_rendering(doc):
    committed, rendered = report.render_all()[doc]
    assert committed == rendered, f"{doc} is stale: run python benchmarks/report.py and commit the result"


@pytest.mark.parametrize("doc", report.DOCS)
def test_doc_has_generated_blocks(doc):
    with open(os.path.join(ROOT, doc), encoding="utf-8") as fh:
        assert report.BLOCK.search(fh.read()), f"{doc} has no generated block"


def test_rendering_replaces_hand_edited_figures():
    name = next(iter(report.BLOCKS))
    text = f"intro\n<!-- report:begin {name} -->\n| a hand-typed figure | 9.99x |\n<!-- report:end -->\nend\n"
    out = report.render_text(text)
    assert "9.99x" not in out and out.startswith("intro\n") and out.endswith("<!-- report:end -->\nend\n")
    assert report.render_text(out) == out


def test_unknown_block_is_an_error():
    with pytest.raises(KeyError, match="unknown report block"):
        report.render_text("<!-- report:begin no-such-block -->\n<!-- report:end -->\n")


@pytest.mark.parametrize(
    ("name", "speed", "eff"),
    [
        ("end_to_end", "ratio_vs_ar", "block_eff"),
        ("specdec_pp", "speedup_vs_ar", "block_efficiency"),
        ("bench_draft_e2e", "speedup", "block_efficiency"),
        ("block_verification", "vs_ar", "block_efficiency"),
    ],
)
def test_no_recorded_speedup_exceeds_block_efficiency(name, speed, eff):
    # Each round costs at least one target forward, so tokens/s over AR cannot beat tokens per target forward.
    bad = [r for r in report.read_csv(report.RESULTS, name) if report.implausible(r, speed, eff)]
    assert not bad, f"benchmarks/results/{name}.csv holds implausible rows: {bad}"


def test_docs_stay_inside_the_repository():
    for doc in (*report.DOCS, "docs/kernels.md", "docs/development.md", "docs/exactness.md"):
        with open(os.path.join(ROOT, doc), encoding="utf-8") as fh:
            assert "../shared" not in fh.read(), doc


def test_the_script_checks_and_fails_on_a_stale_doc(monkeypatch, capsys):
    import subprocess
    import sys

    script = os.path.join(ROOT, "benchmarks", "report.py")
    res = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "--check" in res.stdout  # the script runs its main
    res = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    monkeypatch.setattr(report, "render_all", lambda: {"docs/x.md": ("old\n", "new\n")})
    monkeypatch.setattr(sys, "argv", ["report.py", "--check"])
    assert report.main() == 1
    assert "docs/x.md" in capsys.readouterr().out
