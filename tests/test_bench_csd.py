"""The pure parts of benchmarks/bench_csd.py (the CS Drafting table): SWI, the search's choice, the step-limit
matrices of the paper's hyper-parameters, the CSV rows, and their rendering by benchmarks/report.py."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import _timing  # noqa: E402
import bench_csd as bc  # noqa: E402


def _report():
    spec = importlib.util.spec_from_file_location("specdec_report_csd", BENCH / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = _report()


def test_swi() -> None:
    assert bc.swi(40, 40, [], []) == 1.0  # AR: one target forward per token
    # 30 tokens, 10 target forwards, drafters of cost 0.1 and 0.05 with 20 and 40 forwards: 30 / (10 + 2 + 2)
    assert bc.swi(30, 10, [20, 40], [0.1, 0.05]) == pytest.approx(30 / 14)
    assert bc.swi(30, 10, [20], [0.0]) == 3.0  # a free drafter: tokens per target forward
    with pytest.raises(ValueError, match="one cost per drafter"):
        bc.swi(30, 10, [20, 40], [0.1])


def test_tally_accumulates_and_scores() -> None:
    class Stats:
        target_calls, emitted, row_rounds = 5, 12, 5

    t = bc.Tally()
    t.add(12, 0.5, Stats, [7])
    t.add(12, 0.5, Stats, [9])
    assert (t.tokens, t.target_forwards, t.drafter_forwards) == (24, 10, [16])
    assert t.tok_s == 24.0 and t.block_eff == pytest.approx(2.4)
    costs = {"swi_pw": [0.25], "swi_ms": [0.5]}
    assert bc.score(t, "tok_s", costs) == 24.0
    assert bc.score(t, "swi_pw", costs) == pytest.approx(24 / 14)
    assert bc.score(t, "swi_ms", costs) == pytest.approx(24 / 18)


def test_pick_best_takes_the_highest_and_the_earlier_on_ties() -> None:
    assert bc.pick_best(["k=1", "k=2", "k=3"], [1.0, 3.0, 2.0]) == "k=2"
    assert bc.pick_best(["k=1", "k=2", "k=3"], [2.0, 3.0, 3.0]) == "k=2"
    assert bc.pick_best(["k=1", "k=2"], [float("nan"), 0.5]) == "k=2"
    with pytest.raises(ValueError, match="one score per candidate"):
        bc.pick_best(["k=1"], [])


def test_cascade_steps_from_the_paper_hyperparameters() -> None:
    assert bc.cascade_steps(1, 4) == [[4, 0], [0, 1]]
    assert bc.cascade_steps(1, 4, k12=7) == [[4, 3], [0, 1]]
    # the paper's (k11, k21, k12) = (5, 1, 19) for base + small + MaG, one MaG proposal per review of the small one
    assert bc.cascade_steps(2, 5, 1, 19) == [[5, 14, 0], [0, 1, 0], [0, 0, 1]]
    assert bc.cascade_steps(3, 3, 2, 3) == [[3, 0, 0, 0], [0, 2, 0, 0], [0, 0, 2, 0], [0, 0, 0, 1]]
    assert bc.cascade_leniency(1, 2.0) == [1.0]
    assert bc.cascade_leniency(3, 1.5) == [1.5, 1.5, 1.0]
    assert bc.cascade_leniency(2, 1.5, 8) == [1.5, 8.0]
    with pytest.raises(ValueError, match="k11 >= 1"):
        bc.cascade_steps(1, 0)


def test_configurations_and_grids() -> None:
    assert [c.setting for c in bc.sd_configs("d", [1, 3])] == ["k=1", "k=3"]
    assert bc.sd_configs(None, [2])[0].row == "SD MaG" and bc.sd_configs(None, [2])[0].drafters == ()
    assert bc.csd_configs("d", [2])[0].steps == ((2, 0), (0, 1))
    lenient = bc.csd_configs("d", [2, 3], [1, 8], cap=8)
    assert [c.setting for c in lenient] == ["k11=2", "k11=2 lm=8", "k11=3", "k11=3 lm=8"]
    assert lenient[1].leniency == (8.0,) and all(c.k == 8 for c in lenient)
    grid = bc.parse_cascade_grid("2,1,4,1;2,2,4,1.5; 3,1,3,2")
    assert grid == [(2, 1, 4, 1.0, 1.0), (2, 2, 4, 1.5, 1.0), (3, 1, 3, 2.0, 1.0)]
    mag = bc.full_configs(["big", "small"], bc.parse_cascade_grid("2,1,4,1.5,8"), cap=6)
    assert mag[0].setting == "k11=2 k21=1 k12=4 l=1.5 lm=8" and mag[0].leniency == (1.5, 8.0) and mag[0].k == 6
    # one neural drafter: k21 and l drop out, so the first two coincide
    one = bc.full_configs(["d"], grid)
    assert [c.setting for c in one] == ["k11=2 k12=4", "k11=3 k12=3"]
    assert one[0].steps == ((2, 2), (0, 1)) and one[0].leniency == (1.0,)
    two = bc.full_configs(["big", "small"], grid)
    assert [c.setting for c in two] == ["k11=2 k21=1 k12=4 l=1", "k11=2 k21=2 k12=4 l=1.5", "k11=3 k21=1 k12=3 l=2"]
    assert two[1].steps == ((2, 2, 0), (0, 2, 0), (0, 0, 1)) and two[1].leniency == (1.5, 1.0)
    assert len({*one, *two, *bc.csd_configs("d", [2, 2])}) == len(one) + len(two) + 1  # configs are dict keys
    for bad in ("2,1,4", "2,1,4,0.5", "a,1,4,1", ";", "2,1,4,1,0.5", "2,1,4,1,1,1"):
        with pytest.raises(SystemExit):
            bc.parse_cascade_grid(bad)
    assert bc.parse_ints("1,2, 4", "--k-grid") == [1, 2, 4]
    with pytest.raises(SystemExit, match="ints >= 1"):
        bc.parse_ints("0,1", "--k-grid")


def _rows() -> list[dict]:
    class Stats:
        def __init__(self, calls: int, emitted: int) -> None:
            self.target_calls, self.emitted, self.row_rounds = calls, emitted, calls

    run = {"time": "2030-01-01T00:00:00+00:00", "machine": "test machine", "cpu_flags": "avx2", "cpu_isa": "avx2",
           "torch": "9.9", "git": "abc1234", "threads": 1, "clock": "wall", "dtype": "bf16", "load_before": "0.10",
           "load_after": "0.20", "prompts": 2, "tune_prompts": 1, "tokens": 40, "select": "tok_s"}  # fmt: skip
    ar, sd, full = bc.Tally(), bc.Tally(), bc.Tally()
    ar.add(40, 2.0, Stats(40, 40), [])
    sd.add(40, 1.0, Stats(20, 40), [60])
    full.add(40, 0.8, Stats(10, 40), [30])
    full.equal, full.compared, sd.equal, sd.compared, ar.equal, ar.compared = 1, 2, 2, 2, 2, 2
    cfg_sd = bc.sd_configs("d", [3])[0]
    cfg_full = bc.full_configs(["d"], [(2, 1, 4, 1.0)])[0]
    c_ms, c_pw = {"d": 0.03}, {"d": 0.1}
    base = {**run, "dataset": "gsm8k", "temperature": 0.0}
    return [bc.csv_row(base, c, t, ar, c_ms, c_pw, True) for c, t in ((bc.AR, ar), (cfg_sd, sd), (cfg_full, full))]


def test_csv_rows_write_and_render(tmp_path: Path) -> None:
    rows = _rows()
    ar, sd, full = rows
    assert ar["swi_pw"] == 1.0 and ar["ratio_vs_ar"] == 1.0 and ar["drafters"] == ""
    assert sd["swi_pw"] == pytest.approx(40 / (20 + 6), abs=1e-4)
    assert sd["swi_ms"] == pytest.approx(40 / (20 + 1.8), abs=1e-4)
    assert sd["ratio_vs_ar"] == 2.0 and sd["block_eff"] == 2.0 and sd["equal_ar"] == "2/2"
    assert full["steps"] == "[[2, 2], [0, 1]]" and full["setting"] == "k11=2 k12=4" and full["equal_ar"] == "1/2"
    _timing.append_csv(tmp_path / "csd.csv", bc.FIELDS, rows)
    with (tmp_path / "csd.csv").open(newline="") as fh:
        back = list(csv.DictReader(fh))
    assert [r["row"] for r in back] == ["AR", "SD d", "CSD full"] and set(back[0]) == set(bc.FIELDS)
    text = report.block_csd(tmp_path)
    # the paper's layout: one row per set and metric, the searched setting in parentheses, the best in bold
    assert "| GSM8K, SWI-PW | 1.00 | 1.54 (3) | **3.08 (2, 4)** |" in text  # 40 / (10 + 30 x 0.1)
    assert "| GSM8K, tok/s vs AR | 1.00 | 2.00 (3) | **2.50 (2, 4)** |" in text
    assert "| GSM8K | greedy | CSD full | k11=2 k12=4 | 50.0 | 2.50x | 4.00 | 3.67 | 3.08 | 1/2 |" in text
    assert "`d` 0.100 measured, 0.0300 by parameters" in text
    assert "full cascade runs at 1.25x the tokens/s of the fastest single-drafter SD (SD d, k=3)" in text
    assert "test machine" in text and "load average 0.10 before" in text
    assert "abc1234" not in text  # the revision stays in the CSV


def test_an_implausible_speed_is_not_shown(tmp_path: Path) -> None:
    rows = _rows()
    rows[1]["ratio_vs_ar"] = 9.0  # above its block efficiency of 2: machine load
    _timing.append_csv(tmp_path / "csd.csv", bc.FIELDS, rows)
    text = report.block_csd(tmp_path)
    assert "9.00x" not in text and "| GSM8K, tok/s vs AR | 1.00 | - | **2.50 (2, 4)** |" in text
    assert "measured machine load" in text
