"""Day 2 with the real kopf operator against the stricter API-server double: an immutable StatefulSet
change is held with a Degraded condition while the control loop keeps running, the opt-in annotation
recreates the StatefulSet keeping its pods and volumes, and the volumes' retention follows
``spec.state.pvcRetention``.

Emulated, not real: the API server (ApiServerEmulator: immutable fields, orphan deletion), the
StatefulSet controller (StatefulSetControllerDouble), the workers' control endpoints (WorkerFleet).
"""

from __future__ import annotations

from typing import Any

import pytest

from multilane.operator.k8s.handlers import RECREATE_ANNOTATION
from multilane.operator.k8s.kube import KubeClient, api_path
from multilane.operator.rollout.workers import WorkerControlClient
from multilane.testing.broker import EmbeddedBroker
from tests.operator.conftest import CR_COLLECTION, NS, OperatorScenario, cond, consumer_body, cr_path
from tests.operator.doubles import partitions_of, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="function")

STS = api_path("apps/v1", "statefulsets", NS)
PVCS = api_path("v1", "persistentvolumeclaims", NS)


def stateful_body(scenario: OperatorScenario, name: str, size: str = "1Gi", **scaling: Any) -> dict[str, Any]:
    body = scenario.body(name, **scaling)
    body["spec"]["state"] = {"enabled": True, "storage": {"size": size}}
    return body


async def test_immutable_change_is_held_degraded_and_the_loop_runs_on_then_opt_in_recreates(
    scenario: OperatorScenario,
) -> None:
    """Issue 22 item 1: a storage-size change would change the StatefulSet's volumeClaimTemplates,
    which kube-apiserver refuses (422). The operator holds the StatefulSet, sets Degraded with reason
    ImmutableFieldChange naming the field (one Event), still scales and assigns, and another consumer
    is unaffected. The opt-in annotation then recreates the StatefulSet (orphan delete): the pods and
    the volumes stay, no partition is left unassigned."""
    kube, fleet, partitions = scenario.kube, scenario.fleet, scenario.partitions
    # Plain worker control (the fleet double has no learner API): no restore-before-handoff here.
    await scenario.start_operator(plain_control=True)
    await scenario.create(stateful_body(scenario, "demo", minReplicas=1))
    await scenario.create(scenario.body("other", minReplicas=1))

    def assigned(pods: set[str]) -> bool:
        a = {w: ps for w, ps in fleet.assignment().items() if w.startswith("demo-")}
        return set(a) == pods and partitions_of(a) == partitions

    await wait_for(lambda: assigned({"demo-0"}), timeout=60, what="demo assigned")
    sts = await kube.get(f"{STS}/demo")
    assert sts is not None
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Delete",
        "whenScaled": "Retain",
    }
    old_uid = sts["metadata"]["uid"]
    # The volume the StatefulSet controller made for demo-0 (owned by the StatefulSet: whenDeleted=Delete).
    owner = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "demo",
        "uid": old_uid,
        "controller": True,
    }
    claim = sts["spec"]["volumeClaimTemplates"][0]
    await kube.create(
        PVCS, {"metadata": {"name": "state-demo-0", "ownerReferences": [owner]}, "spec": claim["spec"]}
    )
    pod_uid = (await kube.get(api_path("v1", "pods", NS, "demo-0")) or {})["metadata"]["uid"]

    # 1. The immutable change: held, Degraded names the field.
    await kube.patch(cr_path("demo"), {"spec": {"state": {"storage": {"size": "2Gi"}}}})

    async def degraded() -> dict[str, Any] | None:
        c = await scenario.condition("Degraded")
        return c if c.get("reason") == "ImmutableFieldChange" and c.get("status") == "True" else None

    held = await wait_for(degraded, timeout=30, what="Degraded=ImmutableFieldChange")
    assert "spec.volumeClaimTemplates" in held["message"] and RECREATE_ANNOTATION in held["message"]
    sts = await kube.get(f"{STS}/demo") or {}
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "1Gi"

    # 2. The control loop still runs: a pinned replica count scales the held StatefulSet and the
    #    partitions spread over both workers; the condition stays.
    await kube.patch(cr_path("demo", "scale"), {"spec": {"replicas": 2}})
    await wait_for(lambda: assigned({"demo-0", "demo-1"}), timeout=60, what="demo scaled to 2 and assigned")
    assert (await kube.get(f"{STS}/demo") or {})["spec"]["replicas"] == 2
    assert await degraded() is not None
    assert len(await scenario.events("ImmutableFieldChange")) == 1  # one Event, not one per pass

    # Another consumer is unaffected.
    async def other_ready() -> dict[str, Any] | None:
        status = await scenario.status("other")
        return status if cond(status, "Ready").get("status") == "True" else None

    other = await wait_for(other_ready, timeout=60, what="other consumer Ready")
    assert cond(other, "Degraded").get("status") == "False"

    # 3. Opt in: the StatefulSet is recreated (new uid, new claim size); pods and volumes are kept.
    await kube.patch(cr_path("demo"), {"metadata": {"annotations": {RECREATE_ANNOTATION: "true"}}})

    async def recreated() -> dict[str, Any] | None:
        new = await kube.get(f"{STS}/demo")
        return new if new is not None and new["metadata"]["uid"] != old_uid else None

    new = await wait_for(recreated, timeout=30, what="StatefulSet recreated")
    assert new["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert new["spec"]["replicas"] == 2
    await wait_for(lambda: _not_degraded(scenario), timeout=30, what="Degraded cleared")
    assert (await kube.get(api_path("v1", "pods", NS, "demo-0")) or {})["metadata"]["uid"] == pod_uid
    volume = await kube.get(f"{PVCS}/state-demo-0")
    assert volume is not None and not volume["metadata"].get("ownerReferences")  # orphaned, not deleted
    assert assigned({"demo-0", "demo-1"}) and not fleet.removed_with
    assert await scenario.events("StatefulSetRecreated")


async def _not_degraded(scenario: OperatorScenario) -> bool:
    return (await scenario.condition("Degraded")).get("status") == "False"


async def test_pvc_retention_maps_onto_the_statefulset(scenario: OperatorScenario) -> None:
    """Issue 22 item 4: spec.state.pvcRetention becomes the StatefulSet's
    persistentVolumeClaimRetentionPolicy (a field an update may change: no recreate), and each worker
    gets the consumer's uid to stamp its state directory with."""
    kube = scenario.kube
    await scenario.start_operator(plain_control=True)
    body = stateful_body(scenario, "keep")
    body["spec"]["state"]["pvcRetention"] = {"whenDeleted": "Retain"}
    cr = await scenario.create(body)
    sts = await wait_for(lambda: kube.get(f"{STS}/keep"), what="StatefulSet")
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }
    env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MULTILANE_STATE_OWNER"] == cr["metadata"]["uid"]
    uid = sts["metadata"]["uid"]
    await kube.patch(cr_path("keep"), {"spec": {"state": {"pvcRetention": {"whenScaled": "Delete"}}}})

    async def updated() -> bool:
        now = await kube.get(f"{STS}/keep") or {}
        return (now.get("spec") or {}).get("persistentVolumeClaimRetentionPolicy", {}).get(
            "whenScaled"
        ) == "Delete"

    await wait_for(updated, timeout=30, what="retention updated in place")
    assert (await kube.get(f"{STS}/keep") or {})["metadata"]["uid"] == uid
    assert (await scenario.condition("Degraded", "keep")).get("reason") != "ImmutableFieldChange"


async def test_finalizer_holds_a_deletion_without_operator_and_the_runbook_step_releases_it(
    kube: KubeClient, broker: EmbeddedBroker, topic: str, operator_factory: Any
) -> None:
    """Issue 22 item 6: kopf puts the finalizer multilane.dev/finalizer on each ParallelConsumer. With
    the operator gone (``helm uninstall`` first), a deletion -- and so a namespace deletion -- waits
    for it; docs/runbook.md "A ParallelConsumer (or namespace) stuck deleting" removes it, and the
    children then go through owner references. With the operator running (the documented order:
    delete the ParallelConsumers, then uninstall) the deletion completes on its own, on the real
    cluster: tests/cluster/test_helm_chart.py::test_zz_uninstall_then_namespace_deletion_both_finish."""
    # No StatefulSet or worker double here: nothing but the finalizer is under test.
    runner = operator_factory(control_factory=lambda token: WorkerControlClient(token))
    await runner.start()
    await kube.create(CR_COLLECTION, consumer_body("fin", broker.bootstrap, topic))

    async def finalized() -> bool:
        obj = await kube.get(cr_path("fin")) or {}
        return "multilane.dev/finalizer" in ((obj.get("metadata") or {}).get("finalizers") or [])

    await wait_for(finalized, timeout=30, what="kopf's finalizer")
    await wait_for(lambda: kube.get(f"{STS}/fin"), timeout=30, what="StatefulSet")
    await runner.stop()
    await kube.delete(cr_path("fin"))
    stuck = await kube.get(cr_path("fin"))
    assert stuck is not None and stuck["metadata"].get("deletionTimestamp")  # waits for the finalizer
    # The runbook step: kubectl patch pcon NAME --type=merge -p '{"metadata":{"finalizers":null}}'
    await kube.patch(cr_path("fin"), {"metadata": {"finalizers": None}})
    assert await kube.get(cr_path("fin")) is None
    assert await kube.get(f"{STS}/fin") is None  # collected through its owner reference
