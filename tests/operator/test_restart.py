"""The real kopf operator is killed (task cancelled) in the middle of an assignment change and a new
one resumes the change from status.assignment.pending, with the same generation.

Emulated: API server, StatefulSet controller, workers' HTTP control interface (see test_lifecycle.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.operator.conftest import OperatorScenario, cond, cr_path
from tests.operator.doubles import partitions_of, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_operator_killed_mid_change_resumes_from_status(scenario: OperatorScenario) -> None:
    kube, fleet, parts = scenario.kube, scenario.fleet, scenario.partitions
    first = await scenario.start_operator()
    await scenario.create(scenario.body(replicas=2, maxReplicas=4))

    async def ready() -> dict[str, Any] | None:
        status = await scenario.status()
        return status if cond(status, "Ready").get("status") == "True" else None

    before = await wait_for(ready, timeout=60, what="Ready")
    generation = before["assignment"]["generation"]

    # The current owners stop answering (alive: their Leases are still renewed), then a third worker
    # is asked for: the change is planned and persisted, but no release can complete.
    for name in ("demo-0", "demo-1"):
        fleet.workers[name].reachable = False
    await kube.patch(cr_path("demo"), {"spec": {"scaling": {"replicas": 3}}})

    async def pending() -> dict[str, Any] | None:
        assignment = (await scenario.status()).get("assignment") or {}
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

    second = await scenario.start_operator()

    async def finished() -> dict[str, Any] | None:
        assignment = (await scenario.status()).get("assignment") or {}
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
