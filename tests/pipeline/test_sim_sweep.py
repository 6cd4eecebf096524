"""The simulator's parameter sweep as a PySpark job (small: 10 runs of 5 simulated minutes, every
kind of baseline: lane-equipped, references and partition-capped)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from multilane.sim.sweep import run_case, run_sweep, summarise, sweep_grid

pytestmark = pytest.mark.spark


def test_sweep_runs_on_spark_and_matches_local_runs(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    variants: list[tuple[str, dict[str, Any]]] = [
        ("multilane", {}),
        ("keda-hpa", {"lag_threshold": 100.0}),
        ("flink-style", {"factor": 4}),
        ("factor-only", {}),
        ("keda-hpa-serial", {}),
    ]
    cases = sweep_grid(["surge"], [1, 2], 300, variants=variants)
    assert len(cases) == 10
    out = tmp_path / "runs.parquet"
    rows = run_sweep(cases, str(out), master="local[2]")
    assert out.is_dir() and any(out.glob("*.parquet"))
    assert len(rows) == 10
    # the Spark job computes exactly what a local run computes (the simulation is deterministic)
    local = {(r["policy"], r["seed"]): r for r in map(run_case, cases)}
    for r in rows:
        expected = local[(r["policy"], r["seed"])]
        assert r["lag_seconds"] == pytest.approx(expected["lag_seconds"])
        assert r["pod_seconds"] == pytest.approx(expected["pod_seconds"])
        assert r["scaling_actions"] == expected["scaling_actions"]
        assert r["time_above_slo_s"] == pytest.approx(expected["time_above_slo_s"])
    summary = summarise(rows)
    assert {(s["policy"], s["runs"]) for s in summary} == {(name, 2) for name, _ in variants}


def test_simulate_sweep_command_runs_on_local_star(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The documented command, `multilane simulate --sweep`, on Spark's default `local[*]` master:
    every default variant (16) x the three platform variants, one seed, on a 2-minute surge; the
    runs land in Parquet and the summary has one row per (policy, variant, platform)."""
    pytest.importorskip("pyspark")
    import json

    from multilane.cli import main
    from multilane.sim.sweep import DEFAULT_VARIANTS

    out = tmp_path / "sweep"
    args = ["--trace", "surge", "--duration", "120", "--seeds", "1", "--master", "local[*]"]
    code = main(["simulate", "--sweep", *args, "--out", str(out), "--json"])
    assert code == 0
    assert any((out / "runs.parquet").glob("*.parquet"))
    summary = json.loads(capsys.readouterr().out)
    assert len(summary) == len(DEFAULT_VARIANTS) * 3
    assert {s["trace"] for s in summary} == {"surge"}
    assert {s["policy"] for s in summary} == {name for name, _ in DEFAULT_VARIANTS}
    assert all(s["runs"] == 1 for s in summary)
