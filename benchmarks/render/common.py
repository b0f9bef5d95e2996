"""What every block shares: reading the CSVs, the newest run, plausibility, number and table formatting, and the
provenance line under each table."""

from __future__ import annotations

import csv
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RESULTS = ROOT / "benchmarks" / "results"

ASSETS = ROOT / "python_api" / "specdec" / "assets"

#: a speed-up over AR larger than the block efficiency (tokens per target call) times this is not physical: a
#: verification pass costs at least one target step, so such a row measured machine load, not the decoder
PLAUSIBLE_SLACK = 1.05

Rows = list[dict[str, str]]


def read_csv(results: Path, name: str) -> Rows:
    path = results / f"{name}.csv"
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def newest_runs(rows: Rows, keys: tuple[str, ...]) -> dict[tuple[str, ...], Rows]:
    """For each value of ``keys`` (in the order first recorded), the rows of its newest run (its latest timestamp)."""
    newest: dict[tuple[str, ...], str] = {}
    for r in rows:
        key = tuple(r[k] for k in keys)
        newest[key] = max(newest.get(key, ""), r["timestamp"])
    runs: dict[tuple[str, ...], Rows] = {key: [] for key in newest}
    for r in rows:
        key = tuple(r[k] for k in keys)
        if r["timestamp"] == newest[key]:
            runs[key].append(r)
    return runs


def newest_run(rows: Rows, keys: tuple[str, ...]) -> Rows:
    """The rows of the last run in the file: those whose ``keys`` equal the last row's (a run appends a block)."""
    if not rows:
        return []
    last = tuple(rows[-1].get(k, "") for k in keys)
    if "timestamp" in keys or "time" in keys:  # timestamps order runs even when files were merged out of order
        k = "timestamp" if "timestamp" in keys else "time"
        stamp = max(r[k] for r in rows)
        return [r for r in rows if r[k] == stamp]
    return [r for r in rows if tuple(r.get(k, "") for k in keys) == last]


def implausible(row: dict[str, str], speed: str, eff: str) -> bool:
    """True when the row's speed-up over AR exceeds its block efficiency (see PLAUSIBLE_SLACK)."""
    try:
        s, e = float(row[speed]), float(row[eff])
    except (KeyError, ValueError):
        return False
    return not math.isnan(s) and not math.isnan(e) and s > e * PLAUSIBLE_SLACK


def num(value: str | float, digits: int = 3) -> str:
    """``digits`` significant digits, no exponent for the ranges these tables hold."""
    try:
        x = float(value)
    except ValueError:
        return str(value)
    if math.isnan(x):
        return "-"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    return f"{x:.{decimals}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(out)


def provenance(rows: Rows, *, machine: str, torch: str | None, extra: str = "") -> str:
    """One line naming where the rows come from; columns the CSV lacks are named as not recorded. The revision
    each row was measured at stays in the CSV (``git_rev``), not in the docs."""
    if not rows:
        return ""

    def values(col: str | None) -> str | None:
        if col is None or col not in rows[0]:
            return None
        found = ", ".join(dict.fromkeys(r[col] for r in rows if r[col]))
        return found or None  # a column added later is blank in older rows

    parts, missing = [], []
    for label, col in (("machine", machine), ("torch", torch)):
        v = values(col)
        if v is None:
            missing.append(label)
        else:
            parts.append(f"{label} {v}" if label != "machine" else v)
    flags = values("cpu_flags")
    if flags is None:
        missing.append("CPU flags")
    else:
        parts.append(f"CPU flags {flags}")
    line = "Measured on " + "; ".join(parts)
    if extra:
        line += "; " + extra
    line += "."
    if missing:
        line += f" Not recorded in the CSV: {', '.join(missing)}."
    return line


def _variant_cell(isa: str, machine: str, several: bool) -> str:
    """A CPU variant's table cell; with runs of several machines in one table, it names the machine too."""
    return f"{isa} ({machine})" if several else isa
