"""Scaling through the real kopf operator: spec changes, autoscaling decisions, held decisions, pause.

Same setup as test_lifecycle.py (emulated API server, StatefulSet-controller double, worker-fleet
double for the workers' HTTP control interface, real embedded broker for topic checks). The metric
source is the StaticSource double (test_prometheus.py covers the real Prometheus source).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from multilane.operator.k8s.kube import KubeClient, api_path
from tests.operator.conftest import NS, OperatorScenario, cond, cr_path, get_status
from tests.operator.doubles import WorkerFleet, partitions_of, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def sts_replicas(kube: KubeClient, name: str = "demo") -> int | None:
    sts = await kube.get(api_path("apps/v1", "statefulsets", NS, name))
    return None if sts is None else int(sts["spec"]["replicas"])


def balanced_over(fleet: WorkerFleet, n: int, partitions: list[str]) -> bool:
    a = fleet.assignment()
    counts = sorted(len(ps) for ps in a.values())
    return len(a) == n and partitions_of(a) == sorted(partitions) and counts[-1] - counts[0] <= 1


async def test_spec_replicas_and_factor_changes_reach_statefulset_and_workers(
    scenario: OperatorScenario,
) -> None:
    kube, fleet, parts = scenario.kube, scenario.fleet, scenario.partitions
    await scenario.start_operator()
    await scenario.create(scenario.body(replicas=2, maxReplicas=4))
    await wait_for(lambda: balanced_over(fleet, 2, parts), timeout=60, what="2 workers")

    # Scale up through the spec (what the scale subresource writes): StatefulSet first, then handoff.
    await kube.patch(cr_path("demo"), {"spec": {"scaling": {"replicas": 3}}})
    await wait_for(lambda: _eq(sts_replicas(kube), 3), what="sts replicas 3")
    await wait_for(lambda: balanced_over(fleet, 3, parts), timeout=60, what="3 workers balanced")

    # Scale down: partitions leave demo-1 and demo-2 before their pods are removed.
    await kube.patch(cr_path("demo"), {"spec": {"scaling": {"replicas": 1}}})
    await wait_for(lambda: _eq(sts_replicas(kube), 1), timeout=60, what="sts replicas 1")
    await wait_for(lambda: set(fleet.workers) == {"demo-0"}, what="pods removed")
    assert fleet.removed_with.get("demo-1") == set() and fleet.removed_with.get("demo-2") == set()
    await wait_for(lambda: fleet.assignment().get("demo-0") == set(parts), timeout=60, what="all on demo-0")

    # Factor bounds from the spec reach every worker through /v1/factor.
    await kube.patch(cr_path("demo"), {"spec": {"scaling": {"minFactor": 6}}})
    await wait_for(lambda: all(w.factor == 6 for w in fleet.workers.values()), timeout=30, what="factor 6")
    assert any(c.path == "/v1/factor" and c.body == {"factor": 6} for c in fleet.calls)
    status = await wait_for(lambda: _status_with(kube, factor=6), what="status.factor 6")
    assert status["observedGeneration"] == 4
    assert status["replicas"] == 1


async def test_autoscaling_decision_scales_and_is_recorded(scenario: OperatorScenario) -> None:
    kube, fleet, source = scenario.kube, scenario.fleet, scenario.source
    # A big backlog growing faster than it is processed: the policy must add lanes (and pods to hold them).
    source.lag = dict.fromkeys(scenario.partitions, 250_000)
    source.input_rate, source.processing_rate = 1000.0, 100.0
    await scenario.start_operator()
    await scenario.create(scenario.body(maxReplicas=4))

    async def scaled() -> dict[str, Any] | None:
        status = await scenario.status()
        last = status.get("lastDecision") or {}
        return status if last.get("factor", 1) > 1 else None

    status = await wait_for(scaled, timeout=60, what="a scale-up decision")
    last = status["lastDecision"]
    assert last["reason"] and last["time"] and "totalLag" in last["inputs"]
    assert last["inputs"]["totalLag"] == 1_000_000
    assert status["lag"] == 1_000_000 and status["inputRate"] == 1000.0
    assert await wait_for(lambda: scenario.events("ScalingDecision"), what="decision event")
    await wait_for(lambda: _eq(sts_replicas(kube), last["replicas"]), what="sts follows the decision")
    await wait_for(
        lambda: (
            len(fleet.workers) == last["replicas"]
            and all(w.factor == last["factor"] for w in fleet.workers.values())
        ),
        timeout=60,
        what="workers run the decided factor",
    )
    obj = await kube.get(cr_path("demo"))
    # the policy's memory is in status (written with the decision), not in an annotation patch
    assert obj is not None and "multilane.dev/policy-state" not in obj["metadata"].get("annotations", {})
    assert obj["status"]["policy"], obj["status"]


async def test_unreachable_metric_source_holds_and_sets_condition(scenario: OperatorScenario) -> None:
    kube, source = scenario.kube, scenario.source
    await scenario.start_operator()
    await scenario.create(scenario.body(minReplicas=2, maxReplicas=4))
    await wait_for(lambda: _ready(kube), timeout=60, what="Ready")
    before = await scenario.status()

    source.fail(unavailable=True)
    source.lag = dict.fromkeys(scenario.partitions, 10_000_000)  # would scale up if it were believed

    async def degraded() -> dict[str, Any] | None:
        c = await scenario.condition("Degraded")
        return c if c.get("reason") == "MetricsUnavailable" else None

    await wait_for(degraded, timeout=30, what="Degraded=MetricsUnavailable")
    assert await wait_for(lambda: scenario.events("MetricsUnavailable"), what="Warning event")
    samples = source.samples
    # still trying: it samples again (a condition, not a fixed 3 s: a loaded machine's tick is late)
    await wait_for(lambda: source.samples > samples + 1, timeout=30, what="the source sampled again")
    after = await scenario.status()
    assert after.get("lastDecision") == before.get("lastDecision")  # held
    assert await sts_replicas(kube) == 2

    source.error = None  # recovered, with a normal lag
    source.lag = None

    async def recovered() -> bool:
        return (await scenario.condition("Degraded")).get("status") == "False"

    await wait_for(recovered, timeout=30, what="Degraded=False")


async def test_pause_annotation_holds_everything(scenario: OperatorScenario) -> None:
    kube = scenario.kube
    await scenario.start_operator()
    await scenario.create(scenario.body(replicas=2, maxReplicas=4))
    await wait_for(lambda: _eq(sts_replicas(kube), 2), what="sts 2")
    await kube.patch(cr_path("demo"), {"metadata": {"annotations": {"multilane.dev/paused": "true"}}})

    async def paused() -> bool:
        return (await scenario.condition("Paused")).get("status") == "True"

    await wait_for(paused, what="Paused=True")
    await kube.patch(cr_path("demo"), {"spec": {"scaling": {"replicas": 3}}})
    await asyncio.sleep(3)
    assert await sts_replicas(kube) == 2  # held
    assert await wait_for(lambda: scenario.events("Paused"), what="Paused event")

    await kube.patch(cr_path("demo"), {"metadata": {"annotations": {"multilane.dev/paused": None}}})
    await wait_for(lambda: _eq(sts_replicas(kube), 3), timeout=30, what="applied after unpause")
    await wait_for(lambda: _not(paused()), what="Paused=False")


async def _eq(value: Any, expected: Any) -> bool:
    return (await value) == expected


async def _not(value: Any) -> bool:
    return not await value


async def _ready(kube: KubeClient) -> bool:
    return cond(await get_status(kube), "Ready").get("status") == "True"


async def _status_with(kube: KubeClient, **fields: Any) -> dict[str, Any] | None:
    status = await get_status(kube)
    return status if all(status.get(k) == v for k, v in fields.items()) else None
