"""Where the shipped assets live and how an asset name or a file path resolves to a file: shared by every loader
(drafts, feature drafts, acceptance heads) and by the demo's flag checks."""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"


def resolve_asset(name_or_path: str | Path, suffix: str = ".safetensors") -> Path:
    """The file of a shipped asset name (``smollm2-distill``) or an existing ``suffix`` file path; raises
    FileNotFoundError listing the shipped names otherwise."""
    p = Path(name_or_path)
    if p.suffix == suffix and p.is_file():
        return p
    cand = ASSETS_DIR / f"{name_or_path}{suffix}"
    if cand.is_file():
        return cand
    known = sorted(f.stem for f in ASSETS_DIR.glob(f"*{suffix}")) if ASSETS_DIR.is_dir() else []
    raise FileNotFoundError(f"no draft asset {name_or_path!r}: not a {suffix} file and not one of {known}")
