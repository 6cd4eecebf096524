"""The benchmarks' statistics and alternation helpers (benchmarks/_common.py, engine_rows.RowResult):
pure, no broker."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from benchmarks._common import (  # noqa: E402
    Column,
    Report,
    Spread,
    alternate,
    json_safe,
    paired_ratios,
    spread,
)
from benchmarks.engine_rows import RowResult  # noqa: E402


def test_spread_is_the_median_and_the_range() -> None:
    s = spread([3.0, 1.0, 2.0, 10.0, 4.0])
    assert s == Spread(median=3.0, lo=1.0, hi=10.0, n=5)
    assert s.relative == pytest.approx(3.0)
    even = spread([1.0, 2.0, 3.0, 4.0])
    assert even is not None and even.median == 2.5


def test_spread_drops_missing_values_and_is_none_when_nothing_is_left() -> None:
    s = spread([None, 2.0, math.nan, 4.0, math.inf])
    assert s == Spread(median=3.0, lo=2.0, hi=4.0, n=2)
    assert spread([]) is None
    assert spread([None, math.nan]) is None


def test_spread_renders_median_and_range_and_becomes_json() -> None:
    s = Spread(median=1234.5, lo=1000.0, hi=2000.0, n=3)
    assert s.render(",.0f") == "1,234 (1,000..2,000)"
    assert Spread(2.0, 2.0, 2.0, 1).render(".1f") == "2.0"  # one run: no range
    assert Column("rate", fmt=",.0f").render(s) == "1,234 (1,000..2,000)"
    assert json_safe({"rate": s}) == {"rate": {"median": 1234.5, "min": 1000.0, "max": 2000.0, "n": 3}}


def test_paired_ratios_pair_by_round_not_by_position() -> None:
    a = {0: 10.0, 1: 20.0, 3: 40.0}
    b = {0: 5.0, 2: 7.0, 3: 8.0}  # round 1 missing on b, round 2 on a
    assert paired_ratios(a, b) == [2.0, 5.0]
    assert paired_ratios({0: 1.0}, {0: 0.0}) == []  # a zero denominator is no ratio
    assert paired_ratios({0: None}, {0: 1.0}) == []


def test_alternate_runs_round_by_round() -> None:
    seen: list[tuple[str, int]] = []

    def run(label: str, r: int) -> float:
        seen.append((label, r))
        return float(r)

    alt = alternate(["A", "B"], 3, run)
    assert seen == [("A", 0), ("B", 0), ("A", 1), ("B", 1), ("A", 2), ("B", 2)]
    assert alt.order == [(0, "A"), (0, "B"), (1, "A"), (1, "B"), (2, "A"), (2, "B")]
    assert alt.runs == {"A": {0: 0.0, 1: 1.0, 2: 2.0}, "B": {0: 0.0, 1: 1.0, 2: 2.0}}
    assert alt.errors == {}


def test_alternate_drops_a_failing_label_and_keeps_the_others() -> None:
    def run(label: str, r: int) -> int:
        if label == "B" and r == 1:
            raise RuntimeError("child crashed\nlong traceback")
        return r

    alt = alternate(["A", "B", "C"], 3, run)
    assert alt.errors == {"B": "child crashed"}
    assert alt.runs["B"] == {0: 0}  # round 0 kept; never run after the failure
    assert alt.runs["A"] == alt.runs["C"] == {0: 0, 1: 1, 2: 2}
    assert (2, "B") not in alt.order


def test_row_result_ratios_are_taken_round_by_round() -> None:
    def run(rate: float, cpu: float, **extra: float) -> dict[str, float]:
        return {"rate": rate, "cpu_us_per_record": cpu, **extra}

    ml = RowResult({0: run(90.0, 20.0), 1: run(50.0, 30.0), 2: run(80.0, 20.0, peak_running=7)})
    bare = RowResult({0: run(100.0, 10.0), 1: run(50.0, 10.0), 2: run(100.0, 10.0)})
    assert ml.rate == Spread(80.0, 50.0, 90.0, 3)
    assert ml.median_rate == 80.0
    assert ml.vs(bare) == Spread(0.9, 0.8, 1.0, 3)  # a slow round slowed both: its ratio is 1.0
    assert ml.vs(bare, "cpu_us_per_record") == Spread(2.0, 2.0, 3.0, 3)
    assert ml.vs("failed") is None
    assert ml.get("peak_running") == 7


def test_goal_on_a_spread_is_judged_on_the_median_and_shows_the_range() -> None:
    report = Report(benchmark="demo", quick=True, command="x")
    g = report.goal("ml ÷ bare", Spread(0.96, 0.90, 1.02, 5), 0.95)
    assert g.passed is True and g.value == 0.96
    assert "0.96 (runs 0.9..1.02, n=5)" in g.render()
    doc = report.to_json()
    assert doc["goals"][0]["spread"] == {"median": 0.96, "min": 0.90, "max": 1.02, "n": 5}
    json.dumps(doc)


def test_compared_build_holds_refs_multilane_beside_this_trees_benchmarks() -> None:
    import shutil
    import subprocess

    from benchmarks.engine_rows import build_env, compared_build, this_tree

    if shutil.which("git") is None or subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=this_tree(), capture_output=True
    ).returncode != 0:
        pytest.skip("not a git checkout")
    with compared_build("HEAD") as build:
        root = Path(build.pythonpath or "")
        assert (root / "multilane" / "worker" / "engine.py").is_file()
        assert (root / "benchmarks").resolve() == Path(this_tree(), "benchmarks").resolve()
        env, cwd = build_env(build)
        assert env == {"PYTHONPATH": str(root)} and cwd == str(root)  # python -m puts cwd first
    assert not root.exists()  # removed afterwards
    with pytest.raises(ValueError, match="not a commit"), compared_build("no-such-ref-26"):
        pass


def _check(tmp_path: Path, log: list[int], ordering: str, keys: list[bytes]) -> list[str]:
    import argparse
    import marshal

    from benchmarks.engine_child import EventRecorder, check_run

    path = tmp_path / "keys"
    path.write_bytes(marshal.dumps(keys))
    args = argparse.Namespace(
        keys_file=str(path), first_offset=100, records=len(keys), topic="t", partition=0, ordering=ordering
    )
    recorder = EventRecorder()
    recorder.log.extend(log)
    return check_run(args, recorder)


def test_engine_child_checkers_pass_a_clean_run_and_catch_a_lost_record(tmp_path: Path) -> None:
    keys = [b"a", b"b", b"a"]
    clean = [100, -101, 101, 102, -102, -103]  # start 100, end 100, start 101, start 102, end 101, end 102
    assert _check(tmp_path, clean, "key", keys) == []
    lost = [100, -101, 101, -102]  # offset 102 never ran
    failures = _check(tmp_path, lost, "unordered", keys)
    assert len(failures) == 1 and failures[0].startswith("at-least-once: FAILED")
    assert "t/0@102" in failures[0]


def test_engine_child_checkers_catch_two_records_of_a_key_at_once_in_key_mode(tmp_path: Path) -> None:
    keys = [b"a", b"b", b"a"]
    overlap = [100, 102, -101, -103, 101, -102]  # key a: 100 and 102 open together
    assert _check(tmp_path, overlap, "unordered", keys) == []  # allowed when unordered
    failures = _check(tmp_path, overlap, "key", keys)  # not in key mode
    assert len(failures) == 1 and failures[0].startswith("exclusive-key: FAILED")
