"""docs/development.md's layout diagram is the one scripts/layout_diagram.py draws from the imports."""

import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "layout_diagram.py")


def _layout():
    spec = importlib.util.spec_from_file_location("specdec_layout_diagram", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_diagram_equals_the_imports():
    res = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_diagram_shows_every_room_and_the_layering():
    layout = _layout()
    graph = layout.edges()
    assert {"models/", "drafters/", "methods/", "decoder", "train/"} <= set(graph)
    # one way: the models and the drafters never reach the loop, the methods or training
    assert not graph["models/"] & {"drafters/", "methods/", "decoder", "train/"}
    assert not graph["drafters/"] & {"methods/", "decoder", "train/"}
    text = layout.render()
    assert 'models_pkg["models/"]' in text and "decoder --> rounds" in text


def test_a_changed_diagram_is_seen(tmp_path, monkeypatch):
    layout = _layout()
    doc = tmp_path / "development.md"
    doc.write_text(f"intro\n{layout.BEGIN}stale picture\n{layout.END}\nend\n", encoding="utf-8")
    monkeypatch.setattr(layout, "DOC", doc)
    monkeypatch.setattr(sys, "argv", ["layout_diagram.py", "--check"])
    assert layout.main() == 1
    monkeypatch.setattr(sys, "argv", ["layout_diagram.py", "--write"])
    assert layout.main() == 0
    monkeypatch.setattr(sys, "argv", ["layout_diagram.py", "--check"])
    assert layout.main() == 0 and "flowchart TD" in doc.read_text(encoding="utf-8")
