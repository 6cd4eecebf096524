"""The simulator is fair to its rivals and to its users' traces (issue 25, items 5 and 6)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from multilane.cli import main
from multilane.operator.decision.policy import Observation
from multilane.sim.engine import make_policy, peak_size, simulate, warning_template
from multilane.sim.model import ScalingMode, SimConfig
from multilane.sim.policies import FlinkStylePolicy, KedaHpaConfig, KedaHpaPolicy
from multilane.sim.report import verdicts
from multilane.sim.traces import TRACE_NAMES, make_trace, parse_csv_trace

SIM = SimConfig()


def _obs(now: float, lag: int, replicas: int = 1) -> Observation:
    return Observation(
        now=now,
        lag_by_partition={p: lag // 12 for p in range(12)},
        input_rate=100.0,
        processing_rate=100.0,
        replicas=replicas,
        factor=16,
    )


def test_keda_reads_fresh_lag_on_every_sync_unless_cached() -> None:
    """KEDA queries the scaler on every HPA sync (15 s); ``useCachedMetrics`` reuses the last poll."""
    fresh = KedaHpaPolicy(12)
    cached = KedaHpaPolicy(12, KedaHpaConfig(use_cached_metrics=True))
    answers = {}
    for name, policy in (("fresh", fresh), ("cached", cached)):
        state = policy.initial_state()
        d, state = policy.decide(_obs(0, 0), state)
        d, state = policy.decide(_obs(15, 60), state)  # 15 s later: a lag of 60 = 6 replicas' worth
        answers[name] = d.replicas
    assert answers == {"fresh": 5, "cached": 1}  # fresh: +4 pods (the HPA's rate limit); cached: lag 0


def test_flink_on_lanes_is_the_flink_policy_on_multilane_workers_without_restarts() -> None:
    policy = make_policy("flink-on-lanes", SIM)
    assert isinstance(policy, FlinkStylePolicy)
    assert policy.mode is ScalingMode.MULTILANE and not policy.serial
    assert policy.factor == 16 and policy.config.restart_s == 0
    trace = make_trace("surge", 1800, 12, 1)
    on_lanes = simulate(trace, policy, SIM, 1).metrics
    restarting = simulate(trace, make_policy("flink-style", SIM), SIM, 1).metrics
    assert on_lanes.lag_seconds < restarting.lag_seconds / 10


def test_lane_and_call_seconds_are_counted() -> None:
    trace = make_trace("surge", 900, 12, 1)
    m = simulate(trace, make_policy("static", SIM, {"replicas": 2, "factor": 8}), SIM, 1).metrics
    assert m.lane_seconds == pytest.approx(900 * 12 * 8)
    # calls in flight: Little's law, the processed records x 50 ms while nothing queues
    assert 0 < m.call_seconds <= m.lane_seconds


def test_csv_trace_service_time_column_and_events() -> None:
    text = "t_seconds,records_per_second,service_factor,event\n0,10,,\n100,50,3,crowd\n200,10,1,0\n"
    trace = parse_csv_trace(text, None, 4)
    assert trace.service_factor[99] == 1 and trace.service_factor[100] == 3 and trace.service_factor[200] == 1
    assert trace.events == (100.0,) and trace.event_time_s == 100.0
    with pytest.raises(ValueError, match="service factor must be > 0"):
        parse_csv_trace("0,10,0\n", None, 4)


def test_duration_never_cuts_a_csv_silently(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="would cut the CSV trace"):
        parse_csv_trace("0,10\n900,50\n", 600, 4)
    assert parse_csv_trace("0,10\n900,50\n", 901, 4).duration_s == 901
    path = tmp_path / "load.csv"
    path.write_text("0,10\n900,50\n")
    assert main(["simulate", "--trace", str(path), "--duration", "600", "--policies", "multilane"]) == 2
    err = capsys.readouterr().err
    assert "would cut the CSV trace" in err and len(err.strip().splitlines()) == 1


def test_warnings_are_grouped_by_template() -> None:
    a = "scale-up 45s ago from 192 to 384 lanes did not raise the processing rate (before 2,389.5 rec/s)"
    b = "scale-up 60s ago from 192 to 768 lanes did not raise the processing rate (before 960.0 rec/s)"
    assert warning_template(a) == warning_template(b)
    assert warning_template(a) != warning_template("CPU: 3 pods needed")
    result = simulate(make_trace("saturated_ramp", 9000, 12, 1), make_policy("multilane", SIM), SIM, 1)
    templates = [warning_template(w) for _, w in result.warnings]
    assert len(templates) == len(set(templates))
    assert sum(result.warning_counts.values()) >= len(result.warnings)


def test_the_four_new_traces_are_seeded_and_shaped() -> None:
    for name in ("square_wave", "saturated_ramp", "crowd", "uneven_partitions"):
        assert name in TRACE_NAMES
    square = make_trace("square_wave", None, 12, 1)
    assert set(np.unique(square.rate)) == {100.0, 700.0} and len(square.events) >= 5
    assert np.diff(square.events).tolist() == [600.0] * (len(square.events) - 1)
    assert not np.array_equal(square.rate, make_trace("square_wave", None, 12, 2).rate)
    ramp = make_trace("saturated_ramp", None, 12, 1)
    assert ramp.rate.max() == pytest.approx(1200) and ramp.duration_s == 9000
    crowd = make_trace("crowd", None, 12, 1)
    assert crowd.rate.max() == 800 and crowd.rate.min() == 80 and (crowd.rate == 800).sum() == 4 * 60
    assert not np.array_equal(crowd.rate, make_trace("crowd", None, 12, 2).rate)
    uneven = make_trace("uneven_partitions", None, 12, 1)
    assert uneven.rate.max() == 2700 and (uneven.service_factor == 0.2).all()


def test_static_is_sized_for_the_busiest_pod() -> None:
    """2,700 rec/s on 12 partitions: the mean needs 10 pods at 70 % CPU, but 10 pods leave two with two
    partitions (450 rec/s, over a pod's 400): the busiest pod's share needs 12."""
    trace = make_trace("uneven_partitions", None, 12, 1)
    assert peak_size(trace, SIM)[0] == 12


def test_verdicts_judge_every_condition_against_every_rival() -> None:
    base = {"trace": "t", "time_above_slo_s": 0.0, "scaling_actions": 1}
    rows = [
        {**base, "policy": "multilane", "lag_seconds": 10.0, "pod_seconds": 100.0, "time_above_slo_s": 5.0},
        {**base, "policy": "keda-hpa", "lag_seconds": 20.0, "pod_seconds": 200.0},
        {**base, "policy": "flink-on-lanes", "lag_seconds": 5.0, "pod_seconds": 90.0, "scaling_actions": 0},
        {**base, "policy": "static", "lag_seconds": 0.0, "pod_seconds": 80.0, "scaling_actions": 0},
    ]
    (line,) = verdicts(rows)
    assert "lag-seconds above flink-on-lanes" in line and "lag-seconds above keda-hpa" not in line
    assert "s > SLO above keda-hpa" in line
    assert "more scaling actions than flink-on-lanes" in line
    assert "pod-seconds above 1.05 x static (the lowest lag)" in line
