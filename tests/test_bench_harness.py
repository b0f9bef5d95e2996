"""The benchmark harness's CSV writer and run metadata (benchmarks/_timing.py): rows keep their values when a newer
harness adds columns, and every row names the machine, CPU flags and extension variant it was measured with."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _timing  # noqa: E402

import specdec_kernels as sk  # noqa: E402


def read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    with path.open(newline="") as fh:
        header = next(csv.reader(fh))
    return header, rows


def test_append_creates_then_appends(tmp_path: Path) -> None:
    path = tmp_path / "op.csv"
    _timing.append_csv(path, ["a", "b"], [{"a": 1, "b": 2}])
    _timing.append_csv(path, ["a", "b"], [{"a": 3, "b": 4}])
    header, rows = read(path)
    assert header == ["a", "b"]
    assert rows == [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]


def test_new_columns_rewrite_the_file_keeping_old_rows(tmp_path: Path) -> None:
    path = tmp_path / "op.csv"
    _timing.append_csv(path, ["a", "b"], [{"a": 1, "b": 2}])
    _timing.append_csv(path, ["a", "cpu_flags", "b"], [{"a": 5, "cpu_flags": "avx2", "b": 6}])
    header, rows = read(path)
    assert header == ["a", "cpu_flags", "b"]
    assert rows == [{"a": "1", "cpu_flags": "", "b": "2"}, {"a": "5", "cpu_flags": "avx2", "b": "6"}]


def test_run_meta_names_the_variant_and_flags() -> None:
    meta = _timing.run_meta()
    assert set(meta) == {"machine", "torch", "git_rev", "cpu_flags", "cpu_isa"}
    assert meta["cpu_isa"].split()[0] == sk.cpu_isa()
    assert meta["cpu_flags"]
