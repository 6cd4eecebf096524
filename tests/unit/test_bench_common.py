"""The benchmarks' shared ``--json`` contract (benchmarks/_common.py): pure, no broker."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

# benchmarks/ is not an installed package: make the repository root importable under plain `pytest`
# too (``python -m pytest`` already has the working directory on sys.path)
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from benchmarks._common import Column, Report, main, ratio  # noqa: E402


def _body(args: argparse.Namespace, report: Report) -> None:
    table = report.table("t", "A table", [Column("system"), Column("rate", "rec/s", ",.0f"), Column("note")])
    table.add(system="fast", rate=1234.5)
    table.add(system="odd", rate=math.nan)
    table.add_unavailable("engine missing", system="multilane")
    report.goal("fast ÷ slow", ratio(2.0, 1.0), 1.5)
    report.goal("missing ÷ slow", ratio(None, 1.0), 1.5)
    report.params["size"] = 10 if args.quick else 1000


def _run(
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    body: Callable[[argparse.Namespace, Report], None] = _body,
) -> tuple[int, list[str]]:
    code = main("demo", "demo benchmark", body, argv=argv)
    return code, capsys.readouterr().out.splitlines()


def test_json_is_the_last_line_and_holds_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _run(capsys, ["--quick", "--json"])
    assert code == 0
    doc = json.loads(lines[-1])
    assert doc["benchmark"] == "demo"
    assert doc["schema"] == 1
    assert doc["quick"] is True and doc["ok"] is True and doc["errors"] == []
    assert doc["params"] == {"size": 10}
    assert {"cores", "cpu_model", "python", "confluent_kafka", "librdkafka"} <= set(doc["machine"])
    rows = doc["tables"][0]["rows"]
    assert rows[0] == {"system": "fast", "rate": 1234.5, "note": None}
    assert rows[1]["rate"] is None  # NaN is not JSON: it becomes null
    assert rows[2]["rate"] is None and rows[2]["note"] == "not available (engine missing)"
    assert [g["passed"] for g in doc["goals"]] == [True, None]
    # the text report comes first, as a Markdown table
    text = "\n".join(lines[:-1])
    assert "| fast | 1,234 |" in text
    assert "not available (engine missing)" in text
    assert "PASS: fast ÷ slow" in text and "not measured: missing ÷ slow" in text


def test_without_json_no_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _run(capsys, [])
    assert code == 0
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[-1])


def test_a_failing_body_still_prints_json_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    def body(args: argparse.Namespace, report: Report) -> None:
        report.table("t", "T", [Column("x")]).add(x=1)
        raise RuntimeError("broker gone")

    code, lines = _run(capsys, ["--json"], body)
    assert code == 1
    doc = json.loads(lines[-1])
    assert doc["ok"] is False
    assert doc["errors"] == ["RuntimeError: broker gone"]
    assert doc["tables"][0]["rows"] == [{"x": 1}]


def test_unknown_column_is_an_error() -> None:
    report = Report(benchmark="b", quick=False, command="c")
    with pytest.raises(KeyError):
        report.table("t", "T", [Column("x")]).add(y=1)


def test_ratio_handles_missing_and_zero() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(1.0, 0.0) is None
    assert ratio(1.0, None) is None


def test_out_writes_the_same_object(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    code, lines = _run(capsys, ["--json", "--out", str(out)])
    assert code == 0
    written = json.loads(out.read_text())
    printed = json.loads(lines[-1])
    written.pop("elapsed_s")
    printed.pop("elapsed_s")
    assert written == printed


def test_broker_passes_fill_one_table_with_a_broker_column(capsys: pytest.CaptureFixture[str]) -> None:
    """``--broker both``: each pass adds its rows to the same table, stamped with its broker; goals
    name their broker; a note said twice is kept once; the stamp is gone after the passes."""
    from benchmarks._data import broker_passes

    def body(args: argparse.Namespace, report: Report) -> None:
        for kind in broker_passes(report, "both"):
            table = report.table("t", "A table", [Column("system"), Column("rate", "rec/s", ",.0f")])
            table.add(system="multilane", rate=100.0 if kind == "embedded" else 200.0)
            report.goal("multilane ÷ raw", 1.0, 0.5)
            report.note("same note")
        assert report.stamp == {}

    code, lines = _run(capsys, ["--json"], body)
    doc = json.loads(lines[-1])
    assert code == 0
    assert doc["params"]["brokers"] == ["embedded", "apache"]
    [table] = doc["tables"]
    assert [c["key"] for c in table["columns"]] == ["broker", "system", "rate"]
    assert [(r["broker"], r["rate"]) for r in table["rows"]] == [("embedded", 100.0), ("apache", 200.0)]
    assert [g["name"] for g in doc["goals"]] == [
        "[broker embedded] multilane ÷ raw",
        "[broker apache] multilane ÷ raw",
    ]
    assert doc["notes"] == ["same note"]


def test_broker_passes_refuse_an_unknown_broker() -> None:
    from benchmarks._data import broker_passes

    report = Report(benchmark="demo", quick=True, command="x")
    with pytest.raises(ValueError, match="--broker 'tansu'"):
        broker_passes(report, "tansu")
