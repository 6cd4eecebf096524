"""The simulator's parameter sweep as a PySpark job (small: 10 runs of 5 simulated minutes, every
kind of baseline: lane-equipped, references and partition-capped)."""

from __future__ import annotations

from pathlib import Path

import pytest

from multilane.sim.sweep import run_case, run_sweep, summarise, sweep_grid

pytestmark = pytest.mark.spark


def test_sweep_runs_on_spark_and_matches_local_runs(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    variants = [
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
