"""The real kopf operator is killed (task cancelled) in the middle of an assignment change and a new
one resumes the change from status.assignment.pending, with the same generation.

Emulated: API server, StatefulSet controller, workers' HTTP control interface (see test_lifecycle.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from multilane.operator.k8s.kube import KubeClient
from multilane.testing.broker import EmbeddedBroker
from tests.operator.conftest import CR_COLLECTION, consumer_body, cr_path
from tests.operator.doubles import StatefulSetControllerDouble, WorkerFleet, partitions_of, wait_for
from tests.operator.test_lifecycle import cond, get_status

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_operator_killed_mid_change_resumes_from_status(
    kube: KubeClient,
    broker: EmbeddedBroker,
    topic: str,
    fleet: WorkerFleet,
    sts_controller: StatefulSetControllerDouble,
    operator_factory: Any,
) -> None:
    parts = [f"{topic}/{i}" for i in range(4)]
    first = operator_factory()
    await first.start()
    await kube.create(
        CR_COLLECTION, consumer_body("demo", broker.bootstrap, topic, replicas=2, maxReplicas=4)
    )

    async def ready() -> dict[str, Any] | None:
        status = await get_status(kube)
        return status if cond(status, "Ready").get("status") == "True" else None

    before = await wait_for(ready, timeout=60, what="Ready")
    generation = before["assignment"]["generation"]

    # The current owners stop answering (alive: their Leases are still renewed), then a third worker
    # is asked for: the change is planned and persisted, but no release can complete.
    for name in ("demo-0", "demo-1"):
        fleet.workers[name].reachable = False
    await kube.patch(cr_path("demo"), {"spec": {"scaling": {"replicas": 3}}})

    async def pending() -> dict[str, Any] | None:
        assignment = (await get_status(kube)).get("assignment") or {}
        return assignment.get("pending")

    change = await wait_for(pending, timeout=60, what="a pending change in status")
    assert change["generation"] == generation + 1
    assert "demo-2" in {m["worker"] for m in change["members"]}
    assert fleet.assignment()["demo-2"] == set()  # nothing granted: releases did not complete

    # Kill the operator mid-change; the workers recover while no operator runs.
    await first.stop()
    for name in ("demo-0", "demo-1"):
        fleet.workers[name].reachable = True
    fleet.calls.clear()

    second = operator_factory()
    await second.start()

    async def finished() -> dict[str, Any] | None:
        assignment = (await get_status(kube)).get("assignment") or {}
        return (
            assignment
            if assignment.get("generation") == change["generation"] and not assignment.get("pending")
            else None
        )

    done = await wait_for(finished, timeout=60, what="the resumed change committed")
    assert done["generation"] == generation + 1  # resumed, not re-planned under a new generation
    a = fleet.assignment()
    assert partitions_of(a) == sorted(parts) and len(a) == 3 and all(len(ps) >= 1 for ps in a.values())
    pushes = [c for c in fleet.calls if c.path == "/v1/assignment" and c.status == 200]
    assert pushes and pushes[0].body["generation"] == generation + 1
    assert {w.generation for w in fleet.workers.values()} == {generation + 1}
    assert second.starts == 1 and not first.running and second.running
