"""OperatorMetrics: what a control-loop pass records, decision rules and directions, fencing seen
through worker calls, forgetting a consumer; and metric snapshots of real HTTP endpoints."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from multilane.operator.controller import EventRecord, TickResult
from multilane.operator.decision.policy import RULES, Decision
from multilane.operator.metrics import (
    MeteredHandoffControl,
    MeteredWorkerControl,
    OperatorMetrics,
    decision_direction,
    decision_rule,
)
from multilane.operator.rollout.handoff import HandoffControl, HandoffRecord
from multilane.operator.rollout.workers import ReleasedPartition, WorkerFencedError
from multilane.testing.broker import free_port
from multilane.testing.prometheus import write_metrics_snapshot


def value(m: OperatorMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def decisions(m: OperatorMetrics, **labels: str) -> float | None:
    return value(m, "multilane_operator_scaling_decisions_total", namespace="ns", consumer="c", **labels)


def decision(
    replicas: int, factor: int, reason: str, changed: bool = True, rule: str = "shortfall"
) -> Decision:
    return Decision(replicas=replicas, factor=factor, reason=reason, inputs={}, changed=changed, rule=rule)


def test_rules_are_the_policy_rules_as_labels() -> None:
    assert decision_rule(decision(2, 1, "scale up 1x1 -> 2x1: lag is rising")) == "shortfall"
    assert decision_rule(decision(2, 4, "factor 2 -> 4", rule="factor-follows")) == "factor_follows"
    assert decision_rule(decision(1, 1, "hold", rule="invalid-observation")) == "invalid_observation"
    # every rule of the policy is a series from the start
    m = OperatorMetrics()
    m.observe_tick("ns", "c", TickResult(status={}))
    for rule in RULES:
        assert decisions(m, rule=rule.replace("-", "_"), direction="up") == 0


def test_directions_compare_lanes() -> None:
    assert decision_direction((1, 2), decision(2, 2, "")) == "up"
    assert decision_direction((2, 2), decision(2, 1, "")) == "down"
    assert decision_direction((2, 2), decision(2, 2, "")) == "none"
    assert decision_direction((2, 2), decision(4, 1, "")) == "up"  # equal lanes, more replicas
    assert decision_direction((4, 1), decision(2, 2, "")) == "down"


def tick_result(**kw: Any) -> TickResult:
    status = {
        "replicas": 2,
        "factor": 4,
        "assignment": {
            "generation": 7,
            "members": [{"worker": "w-0", "partitions": ["t/0", "t/1"]}],
            "pending": {"generation": 8, "members": [{"worker": "w-1", "partitions": ["t/1"]}]},
        },
        "rollout": {"moves": [{"partition": "t/2", "phase": "learning"}, {"phase": "done"}]},
    }
    return TickResult(status=status, **kw)


def test_observe_tick_records_a_pass() -> None:
    m = OperatorMetrics()
    before = {"namespace": "ns", "consumer": "c"}
    # per-consumer series exist at 0 before anything happened
    m.observe_tick("ns", "c", TickResult(status={}))
    assert value(m, "multilane_operator_fencing_events_total", **before, reason="lease_lost") == 0
    assert decisions(m, rule="shortfall", direction="up") == 0
    handoff = HandoffRecord("t/1", "w-0", "w-1", eager=False, learn_s=2.0, pause_s=0.25, final_offset=10)
    result = tick_result(
        decided=True,
        changed=True,
        decision=decision(2, 4, "scale up 1x4 -> 2x4: lag is rising"),
        decided_from=(1, 4),
        decision_s=0.05,
        source_error=None,
        handoffs=[handoff],
        events=[EventRecord("Warning", "LearnerTimeout", "t/3: learner timed out")],
    )
    m.observe_tick("ns", "c", result, max_replicas=3, max_factor=8)
    assert decisions(m, rule="shortfall", direction="up") == 1
    assert value(m, "multilane_operator_decisions_total", changed="true") == 1
    assert value(m, "multilane_operator_decision_duration_seconds_count", **before) == 1
    assert value(m, "multilane_operator_moves_in_flight", **before, phase="learning") == 1
    assert value(m, "multilane_operator_moves_in_flight", **before, phase="eager") == 1
    assert value(m, "multilane_operator_moves_in_flight", **before, phase="releasing") == 0
    assert value(m, "multilane_operator_handoff_pause_seconds_sum", **before, mode="restore") == 0.25
    assert value(m, "multilane_operator_move_duration_seconds_sum", **before, mode="restore") == 2.25
    assert value(m, "multilane_operator_learner_timeouts_total", **before) == 1
    assert value(m, "multilane_operator_replicas", **before) == 2
    assert value(m, "multilane_operator_replicas_max", **before) == 3
    assert value(m, "multilane_operator_factor_max", **before) == 8
    assert value(m, "multilane_operator_assignment_generation", **before) == 7
    # a failed sample; a spec-forced change the policy only held is rule "bounds"
    m.observe_tick("ns", "c", tick_result(source_error="MetricsInvalid"))
    assert value(m, "multilane_operator_metric_source_errors_total", **before, reason="invalid") == 1
    held = tick_result(
        decided=True, changed=False, decision=decision(3, 4, "hold 3x4: ..."), decided_from=(2, 4)
    )
    m.observe_tick("ns", "c", held)
    assert decisions(m, rule="bounds", direction="up") == 1
    # forget removes every series of the consumer
    m.forget("ns", "c")
    assert value(m, "multilane_operator_replicas", **before) is None
    assert value(m, "multilane_operator_fencing_events_total", **before, reason="lease_lost") is None


class FakeControl:
    """A worker control answering from a script (no HTTP)."""

    def __init__(self) -> None:
        self.fenced = False
        self.refuse = False
        self.learned: list[str] = []

    async def status(self, base_url: str) -> dict[str, Any]:
        return {"fenced": self.fenced, "generation": 3}

    async def assign(
        self, base_url: str, generation: int, partitions: Iterable[str], release_deadline_s: float
    ) -> list[ReleasedPartition]:
        if self.refuse:
            raise WorkerFencedError(f"{base_url}: generation {generation} < 9")
        return []

    async def set_factor(self, base_url: str, factor: int) -> int:
        return factor

    async def learn(self, base_url: str, partitions: Iterable[str]) -> None:
        self.learned.extend(partitions)

    async def drop(self, base_url: str, partitions: Iterable[str]) -> None:
        pass

    async def close(self) -> None:
        pass


def test_fencing_seen_through_worker_calls() -> None:
    m = OperatorMetrics()
    inner = FakeControl()
    control = m.control(inner, "ns", "c")
    assert isinstance(control, MeteredHandoffControl) and isinstance(control, HandoffControl)
    labels = {"namespace": "ns", "consumer": "c"}

    async def run() -> None:
        await control.status("http://w-0")
        inner.fenced = True
        await control.status("http://w-0")
        await control.status("http://w-0")  # still fenced: one transition, one event
        inner.refuse = True
        with pytest.raises(WorkerFencedError):
            await control.assign("http://w-0", 4, ["t/0"], 1.0)
        await control.learn("http://w-1", ["t/0"])
        await control.close()  # passed through

    asyncio.run(run())
    assert value(m, "multilane_operator_fencing_events_total", **labels, reason="lease_lost") == 1
    assert value(m, "multilane_operator_fencing_events_total", **labels, reason="generation_refused") == 1
    assert inner.learned == ["t/0"]

    class NoLearner:
        async def status(self, base_url: str) -> dict[str, Any]:
            return {}

    plain = m.control(NoLearner(), "ns", "d")  # type: ignore[arg-type]
    assert type(plain) is MeteredWorkerControl and not isinstance(plain, HandoffControl)


def test_serve_and_stop() -> None:
    import requests

    m = OperatorMetrics()
    port = m.serve(0, addr="127.0.0.1")
    try:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert 'multilane_operator_errors_total{kind="internal"} 0.0' in text
    finally:
        m.stop()
    with pytest.raises(requests.RequestException):
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


# --- snapshots ---------------------------------------------------------------------------------------


def test_snapshot_of_endpoints(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    Counter("demo_records", "records", ["topic"], registry=registry).labels("orders").inc(5)
    Gauge("demo_lag", "lag", ["pod"], registry=registry).labels("self").set(7)
    Histogram("demo_seconds", "latency", registry=registry, buckets=(0.1, 1.0)).observe(0.5)
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        dead = f"http://127.0.0.1:{free_port()}/metrics"
        path = tmp_path / "snapshot.prom"
        written = write_metrics_snapshot(
            path,
            {
                f"http://127.0.0.1:{port}/metrics": {"job": "workers", "pod": "w-0"},
                dead: {"job": "workers", "pod": "w-1"},
            },
            timeout_s=2,
        )
    finally:
        server.shutdown()
        server.server_close()
    text = path.read_text()
    assert text.startswith("# multilane metrics snapshot of 2 endpoint(s)")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert written == sum(len(f.samples) for f in families.values())
    up = {s.labels["pod"]: s.value for s in families["up"].samples}
    assert up == {"w-0": 1.0, "w-1": 0.0}
    (records,) = [s for s in families["demo_records"].samples if s.name == "demo_records_total"]
    assert records.labels == {"topic": "orders", "job": "workers", "pod": "w-0"} and records.value == 5
    (lag,) = families["demo_lag"].samples
    assert lag.labels == {"pod": "w-0", "exported_pod": "self", "job": "workers"}  # target labels win
    assert families["demo_seconds"].type == "histogram"
    if shutil.which("promtool"):
        done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_consumer_conditions_follow_the_status_written_and_go_with_the_consumer() -> None:
    m = OperatorMetrics()

    def cond(type_: str, status: str) -> float | None:
        labels = {"namespace": "ns", "consumer": "c", "type": type_, "status": status}
        return m.registry.get_sample_value("multilane_consumer_condition", labels)

    m.observe_conditions("ns", "c", [
        {"type": "Ready", "status": "False", "reason": "WaitingForWorkers"},
        {"type": "Degraded", "status": "True", "reason": "Unschedulable"},
        {"type": "Paused", "status": "maybe"},  # not a condition status: Unknown
        {"status": "True"},  # no type: ignored
    ])  # fmt: skip
    assert (cond("Ready", "True"), cond("Ready", "False"), cond("Ready", "Unknown")) == (0, 1, 0)
    assert (cond("Degraded", "True"), cond("Degraded", "False")) == (1, 0)
    assert cond("Paused", "Unknown") == 1 and cond("Paused", "True") == 0
    m.observe_conditions("ns", "c", [
        {"type": "Degraded", "status": "False"}, {"type": "Ready", "status": "True"}
    ])
    assert (cond("Degraded", "True"), cond("Degraded", "False"), cond("Ready", "True")) == (0, 1, 1)
    m.forget("ns", "c")
    assert cond("Ready", "True") is None and cond("Degraded", "False") is None


def test_leader_gauge() -> None:
    m = OperatorMetrics()
    assert value(m, "multilane_operator_leader") == 0  # a standby until it leads
    m.set_leader(True)
    assert value(m, "multilane_operator_leader") == 1
    m.set_leader(False)
    assert value(m, "multilane_operator_leader") == 0
