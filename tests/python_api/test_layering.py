"""Import layering, read from the source with ``ast`` (nothing is imported to check it):

* ``specdec_kernels`` never imports ``specdec``: the dependency is one-way, driver -> kernels;
* the driver uses the kernels' public API only (``specdec_kernels.__all__``), no private or inner module;
* the method modules (``specdec.methods``, the tree builders among them) sit below the loop and the CLI: they never
  import ``specdec.decoder`` or ``specdec.cli``; ``specdec.models`` sits below the drafters, and neither imports the
  methods, the loop, the CLI or the training package;
* nothing outside ``specdec.train`` imports ``specdec.train`` (training is never needed at run time);
* the benchmarks use no private module of ``specdec_kernels``;
* neither package has an import cycle in the static graph: imports inside functions and under
  ``if TYPE_CHECKING:`` count, and so does a module's import of a name from its own parent package (whose
  ``__init__`` imports the module back); ``from pkg import sub`` of a submodule counts as an import of ``sub``;
* every module imports in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import specdec_kernels

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"specdec": ROOT / "python_api" / "specdec", "specdec_kernels": ROOT / "specdec_kernels"}


@dataclass(frozen=True)
class Import:
    module: str  # absolute name of the imported module (or of the package a name is imported from)
    names: tuple[str, ...]  # names of a ``from`` import, () for ``import x``
    runtime: bool  # False inside ``if TYPE_CHECKING:``
    line: int


def module_files(package: str) -> dict[str, Path]:
    root = SOURCES[package]
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(module: str, path: Path) -> list[Import]:
    """Every import statement of ``path`` (module level, in functions, under TYPE_CHECKING), names made absolute."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, runtime: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), False)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), runtime)
                continue
            if isinstance(child, ast.Import):
                found.extend(Import(a.name, (), runtime, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                found.append(Import(target, tuple(a.name for a in child.names), runtime, child.lineno))
            visit(child, runtime)

    visit(ast.parse(path.read_text(encoding="utf-8")), True)
    return found


def targets(imp: Import, known: dict[str, Path]) -> set[str]:
    """The modules an import loads: ``from pkg import sub`` loads ``pkg.sub`` when that is a module."""
    subs = {f"{imp.module}.{n}" for n in imp.names if f"{imp.module}.{n}" in known}
    if imp.names and len(subs) == len(imp.names):  # only submodules: the package's __init__ merely runs first
        return subs
    return subs | {imp.module}


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def all_imports(package: str) -> list[tuple[str, Import]]:
    return [(m, imp) for m, path in module_files(package).items() for imp in imports(m, path)]


def test_the_kernels_never_import_the_driver() -> None:
    bad = [
        f"{m}:{imp.line} imports {imp.module}"
        for m, imp in all_imports("specdec_kernels")
        if within(imp.module, "specdec")
    ]
    assert not bad, bad


def test_the_driver_uses_the_public_kernel_api_only() -> None:
    public = set(specdec_kernels.__all__)
    bad = []
    for m, imp in all_imports("specdec"):
        if not within(imp.module, "specdec_kernels"):
            continue
        if imp.module != "specdec_kernels" or not set(imp.names) <= public:
            bad.append(f"{m}:{imp.line} imports {imp.module} {list(imp.names)}")
    assert not bad, bad
    # attribute use through the package: sk.<name> must be public too
    for m, path in module_files("specdec").items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        aliases = {a for a in aliases if a in ("sk", "specdec_kernels")}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                assert node.attr in public, f"{m}:{node.lineno} uses specdec_kernels.{node.attr}, not in __all__"


@pytest.mark.parametrize(
    ("layer", "above"),
    [
        ("specdec.methods", ("specdec.decoder", "specdec.cli")),
        ("specdec.sampling", ("specdec.methods", "specdec.decoder", "specdec.cli")),
        ("specdec.methods.spec", ("specdec.methods.builders",)),
        ("specdec.models", ("specdec.drafters", "specdec.methods", "specdec.decoder", "specdec.cli", "specdec.train")),
        ("specdec.drafters", ("specdec.methods", "specdec.decoder", "specdec.cli", "specdec.train")),
    ],
    ids=["methods", "sampling", "spec", "models", "drafters"],
)
def test_lower_layers_do_not_import_the_loop_or_the_cli(layer: str, above: tuple[str, ...]) -> None:
    known = module_files("specdec")
    bad = [
        f"{m}:{imp.line} imports {t}"
        for m, imp in all_imports("specdec")
        if within(m, layer)
        for t in targets(imp, known)
        if any(within(t, a) for a in above)
    ]
    assert not bad, bad


def test_nothing_at_run_time_imports_the_training_package() -> None:
    known = module_files("specdec")
    bad = [
        f"{m}:{imp.line} imports {t}"
        for m, imp in all_imports("specdec")
        if not within(m, "specdec.train")
        for t in targets(imp, known)
        if within(t, "specdec.train")
    ]
    assert not bad, bad


def test_the_benchmarks_use_no_private_kernel_module() -> None:
    bad = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for imp in imports(path.stem, path):
            if not within(imp.module, "specdec_kernels"):
                continue
            private = [p for p in imp.module.split(".") + list(imp.names) if p.startswith("_") and p != "__version__"]
            if private:
                bad.append(f"benchmarks/{path.name}:{imp.line} imports {imp.module} {list(imp.names)}")
    assert not bad, bad


def cycles(package: str) -> list[list[str]]:
    """Strongly connected components (more than one module) of the static import graph of ``package``."""
    known = module_files(package)
    graph: dict[str, set[str]] = {}
    for m, path in known.items():
        graph[m] = {t for imp in imports(m, path) for t in targets(imp, known) if t in known} - {m}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


@pytest.mark.parametrize("package", sorted(SOURCES))
def test_no_import_cycle(package: str) -> None:
    assert cycles(package) == []


def test_the_cycle_finder_sees_a_cycle(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nfrom . import a\nif TYPE_CHECKING:\n    from . import c\n"
    )
    (pkg / "c.py").write_text("from .b import x\n")
    monkeypatch.setitem(SOURCES, "pkg", pkg)
    # a <-> b in a function, b <-> c under TYPE_CHECKING: both count
    assert cycles("pkg") == [["pkg.a", "pkg.b", "pkg.c"]]
    (pkg / "c.py").write_text("")
    assert cycles("pkg") == [["pkg.a", "pkg.b"]]
    # the parent-package pattern: the package's __init__ imports d, d takes a name from the package
    (pkg / "__init__.py").write_text("from .d import h\nNAME = 1\n")
    (pkg / "d.py").write_text("from . import NAME\n")
    (pkg / "e.py").write_text("from . import c\n")  # a submodule only: no edge to the package
    assert cycles("pkg") == [["pkg", "pkg.d"], ["pkg.a", "pkg.b"]]


def test_every_module_imports_in_a_fresh_interpreter() -> None:
    names = sorted(n for p in SOURCES for n in module_files(p) if not n.endswith("__main__"))
    script = textwrap.dedent(
        f"""
        import importlib, sys
        sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "python_api")!r}]
        for name in {names!r}:
            importlib.import_module(name)
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


def test_moved_names_keep_working_with_a_deprecation_warning() -> None:
    script = textwrap.dedent(
        f"""
        import sys, warnings
        sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "python_api")!r}]
        import specdec, specdec.methods, specdec.sampling
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from specdec.config import MethodConfig, RunContext, SamplingConfig, make_method
        assert any(issubclass(w.category, DeprecationWarning) and "specdec.sampling" in str(w.message)
                   for w in caught), [str(w.message) for w in caught]
        assert make_method is specdec.make_method is specdec.methods.make_method
        assert SamplingConfig is specdec.SamplingConfig is specdec.sampling.SamplingConfig
        assert MethodConfig is specdec.MethodConfig and RunContext is specdec.sampling.RunContext
        for old, new in (
            ("drafting", "specdec.drafters"),
            ("cascade", "specdec.drafters.cascade"),
            ("train.store", "specdec.drafters.store"),
        ):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                __import__("specdec." + old)
            assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught), old
        import specdec.drafting, specdec.cascade, specdec.drafters, specdec.train
        assert specdec.drafting.ModelDrafter is specdec.ModelDrafter is specdec.drafters.ModelDrafter
        assert specdec.cascade.CascadeDrafter is specdec.CascadeDrafter
        assert specdec.train.load_draft is specdec.drafters.load_draft
        assert specdec.train.load_head is specdec.drafters.load_head
        assert specdec.train.FeatureDraft is specdec.drafters.networks.FeatureDraft
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
