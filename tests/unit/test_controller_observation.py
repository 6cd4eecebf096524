"""What the controller feeds the autoscaling policy beyond the metric sample: the busy lanes the workers
measure (so the policy uses the observed per-lane rate) and whether a rebalance is in progress."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from multilane.operator.controller import ConsumerController, TickResult
from multilane.operator.decision.policy import PolicyState
from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.assignment import AssignmentState, PendingChange, ReleasedPartition
from multilane.operator.rollout.workers import WorkerUnreachableError
from multilane.operator.sources import MetricSample, QueryContext
from multilane.operator.spec.children import ConsumerRef
from multilane.operator.spec.validation import ConsumerSpec, validate_spec

REF = ConsumerRef(name="app", namespace="ns", uid="u")
PARTITIONS = [f"t/{i}" for i in range(4)]
NOW = 1_000_000.0


def _spec() -> ConsumerSpec:
    spec, problems = validate_spec({
        "kafka": {"bootstrapServers": "k:9092", "topics": ["t"], "consumerGroup": "g"},
        "workload": {"image": "i", "processor": "m:f"},
        "scaling": {"minReplicas": 1, "maxReplicas": 4, "intervalSeconds": 1, "stabilisationSeconds": 0},
    })
    assert spec is not None and not problems
    return spec


class FakePlatform:
    def __init__(self, workers: list[WorkerInfo]) -> None:
        self.workers = workers

    async def list_workers(self, ref: ConsumerRef) -> list[WorkerInfo]:
        return list(self.workers)

    async def current_workers(self, ref: ConsumerRef) -> int:
        return len(self.workers)

    async def ensure_workers(self, ref: ConsumerRef, replicas: int) -> None:
        return None


class FakeControl:
    """Worker statuses by control URL; a URL without one is unreachable."""

    def __init__(self, statuses: dict[str, dict[str, Any]]) -> None:
        self.statuses = statuses

    async def status(self, base_url: str) -> dict[str, Any]:
        if base_url not in self.statuses:
            raise WorkerUnreachableError(f"{base_url}: connection refused")
        return self.statuses[base_url]

    async def assign(self, base_url: str, generation: int, partitions: Iterable[str],
                     release_deadline_s: float) -> list[ReleasedPartition]:
        return []

    async def set_factor(self, base_url: str, factor: int) -> int:
        return factor


class FakeSource:
    async def sample(self, ctx: QueryContext) -> MetricSample:
        return MetricSample(lag={p: 5000 for p in PARTITIONS}, input_rate=100.0, processing_rate=100.0,
                            time=NOW)


def _workers(alive: int = 2) -> list[WorkerInfo]:
    return [WorkerInfo(f"app-{i}", i, i < alive, f"http://w{i}") for i in range(2)]


def _status(assignment: AssignmentState, **extra: Any) -> dict[str, Any]:
    return {"factor": 1, "lastDecision": {"replicas": 2, "factor": 1},
            "assignment": assignment.to_status(), **extra}


SETTLED = AssignmentState(generation=3, members={"app-0": ("t/0", "t/1"), "app-1": ("t/2", "t/3")})


def _worker_status(busy: float | None, rate: float) -> dict[str, Any]:
    st: dict[str, Any] = {"generation": 3, "factor": 1, "partitions": [], "processing_rate": rate}
    if busy is not None:
        st["busy_lanes"] = busy
    return st


def _tick(workers: list[WorkerInfo], statuses: dict[str, dict[str, Any]],
          status: dict[str, Any]) -> TickResult:
    async def persist(state: AssignmentState) -> None:
        return None

    controller = ConsumerController(FakePlatform(workers), FakeControl(statuses), clock=lambda: NOW)
    return asyncio.run(controller.tick(REF, _spec(), status, PolicyState(), PARTITIONS, FakeSource(),
                                       persist))


def test_busy_lanes_from_the_workers_give_the_observed_lane_rate() -> None:
    # Workers: 150 + 50 rec/s with 3 + 1 lanes busy -> 50 rec/s per busy lane. The source says the
    # group processes 100 rec/s: the policy gets 2 busy lanes, i.e. the same 50 rec/s per lane.
    statuses = {"http://w0": _worker_status(3.0, 150.0), "http://w1": _worker_status(1.0, 50.0)}
    result = _tick(_workers(), statuses, _status(SETTLED))
    inputs = result.status["lastDecision"]["inputs"]
    assert inputs["busy_lanes"] == 2.0
    assert inputs["lane_rate_source"] == "observed" and inputs["lane_rate"] == 50.0
    assert inputs["rebalancing"] is False


def test_busy_lanes_unknown_when_a_worker_does_not_tell() -> None:
    for statuses in (
        {"http://w0": _worker_status(3.0, 150.0)},  # w1 unreachable
        {"http://w0": _worker_status(3.0, 150.0), "http://w1": _worker_status(None, 50.0)},  # old worker
        {"http://w0": _worker_status(0.0, 0.0), "http://w1": _worker_status(0.0, 0.0)},  # nothing measured
    ):
        inputs = _tick(_workers(), statuses, _status(SETTLED)).status["lastDecision"]["inputs"]
        assert inputs["busy_lanes"] is None
        assert inputs["lane_rate_source"] != "observed"


def test_rebalancing_while_a_change_is_pending_a_rollout_runs_or_a_pod_is_not_alive() -> None:
    statuses = {"http://w0": _worker_status(1.0, 50.0), "http://w1": _worker_status(1.0, 50.0)}
    pending = AssignmentState(generation=3, members=SETTLED.members, pending=PendingChange(
        generation=4, target={"app-0": ("t/0",), "app-1": ("t/1", "t/2", "t/3")}))
    cases = [
        (_workers(), _status(SETTLED), False),
        (_workers(), _status(pending), True),
        (_workers(), _status(SETTLED, rollout={"moves": []}), True),
        (_workers(alive=1), _status(SETTLED), True),
    ]
    for workers, status, expected in cases:
        inputs = _tick(workers, statuses, status).status["lastDecision"]["inputs"]
        assert inputs["rebalancing"] is expected, (status, [w.alive for w in workers])
