"""The driver's layout as a Mermaid flowchart, drawn from the code's own imports.

    python scripts/layout_diagram.py            # print the diagram
    python scripts/layout_diagram.py --write    # put it into docs/development.md (between its layout markers)
    python scripts/layout_diagram.py --check    # exit 1 when docs/development.md holds another diagram

Rooms are the top-level modules and subpackages of ``python_api/specdec`` (a subpackage is one room); an arrow
A --> B says that some module of A imports some module of B (imports inside functions and under ``TYPE_CHECKING``
count). The package's ``__init__`` and ``__main__`` and the deprecated modules that only hand names on are left out,
and so is an arrow that a longer path of arrows already implies. tests/test_docs_layout.py runs the check.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python_api" / "specdec"
DOC = ROOT / "docs" / "development.md"
BEGIN, END = "<!-- layout:begin -->\n", "<!-- layout:end -->"
#: modules that only re-export names under an older path (each warns on import)
DEPRECATED = {"config", "drafting", "cascade"}


def _room(parts: tuple[str, ...]) -> str | None:
    """The room of module ``specdec.<parts>``: its subpackage, or the module itself; None for the left-out ones."""
    if not parts or parts[0] in ("__init__", "__main__") or (len(parts) == 1 and parts[0] in DEPRECATED):
        return None
    return parts[0] + ("/" if (PACKAGE / parts[0]).is_dir() else "")


def _imported(path: Path) -> set[tuple[str, ...]]:
    """The ``specdec`` modules (as parts after ``specdec``) that the file imports, relative imports resolved."""
    rel = path.relative_to(PACKAGE).with_suffix("").parts
    package = rel[:-1]  # the file's own package, as parts after specdec
    found: set[tuple[str, ...]] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name.split(".") for a in node.names]
            found |= {tuple(n[1:]) for n in names if n[0] == "specdec"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                parts = (*base, *(node.module.split(".") if node.module else ()))
            elif node.module and node.module.split(".")[0] == "specdec":
                parts = tuple(node.module.split(".")[1:])
            else:
                continue
            found.add(parts)
            found |= {(*parts, a.name) for a in node.names}  # ``from pkg import sub`` loads pkg.sub
    return found


def edges() -> dict[str, set[str]]:
    """{room: the rooms it imports}, every room present as a key."""
    files = {path: _room(path.relative_to(PACKAGE).with_suffix("").parts) for path in sorted(PACKAGE.rglob("*.py"))}
    out: dict[str, set[str]] = {room: set() for room in files.values() if room is not None}
    for path, src in files.items():
        if src is None:
            continue
        out[src] |= {dst for dst in map(_room, _imported(path)) if dst in out and dst != src}
    return out


def _reduce(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The arrows that no longer path implies (the graph has no cycle: tests/python_api/test_layering.py)."""

    def reach(start: str, skip: str) -> set[str]:
        seen: set[str] = set()
        todo = [n for n in graph[start] if n != skip]
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(graph.get(n, ()))
        return seen

    return {a: {b for b in bs if b not in reach(a, b)} for a, bs in graph.items()}


def _node(room: str) -> str:
    return room.rstrip("/").replace(".", "_") + ("_pkg" if room.endswith("/") else "")


def render() -> str:
    graph = _reduce(edges())
    lines = ["```mermaid", "flowchart TD"]
    for room in sorted(graph):
        label = room if room.endswith("/") else f"{room}.py"
        lines.append(f'    {_node(room)}["{label}"]')
    for a in sorted(graph):
        lines += [f"    {_node(a)} --> {_node(b)}" for b in sorted(graph[a])]
    lines.append("```")
    return "\n".join(lines) + "\n"


def _replace(doc: str, diagram: str) -> str:
    head, sep, rest = doc.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{DOC}: no {BEGIN.strip()} ... {END} block")
    return head + BEGIN + diagram + END + tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="put the diagram into docs/development.md")
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/development.md holds another diagram")
    args = ap.parse_args()
    if not (args.write or args.check):
        print(render(), end="")
        return 0
    doc = DOC.read_text(encoding="utf-8")
    new = _replace(doc, render())
    if args.check and new != doc:
        print(f"docs/development.md: the layout diagram differs from the imports; run {Path(__file__).name} --write")
        return 1
    if args.write:
        DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
