"""Fit to a cluster: pods that cannot run surface in the Degraded condition within a pass, naming the
pod (or the StatefulSet) and the reason. The real kopf operator against the emulated API server and
``multilane/testing/pods.py`` (a real ``multilane worker`` per pod that can start).

What the cluster says follows the Kubernetes documentation: a container waiting with ErrImagePull /
ImagePullBackOff (https://kubernetes.io/docs/concepts/containers/images/#imagepullbackoff), a pod with
PodScheduled=False reason Unschedulable
(https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-conditions), a ResourceQuota
refusing a pod (https://kubernetes.io/docs/concepts/policy/resource-quotas/), which the StatefulSet
controller records as a FailedCreate Event.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from multilane.operator.k8s.kube import api_path
from multilane.operator.metrics import OperatorMetrics
from tests.operator.conftest import NS, cr_path
from tests.operator.k8s_harness import NAME, K8sHarness, k8s, wait_until

__all__ = ["k8s"]

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="function")]

TICK_S = 0.5
# The condition follows the pod's status within a pass; the slack covers the watch's delivery and
# a loaded machine (2 cores shared with other suites).
SURFACE_S = 4 * TICK_S + 2.0


async def degraded(h: K8sHarness) -> dict[str, Any] | None:
    for c in (await h.status()).get("conditions") or []:
        if c.get("type") == "Degraded" and c.get("status") == "True":
            return dict(c)
    return None


async def pod_status(h: K8sHarness, pod: str) -> dict[str, Any]:
    return dict(((await h.kube.get(api_path("v1", "pods", NS, pod))) or {}).get("status") or {})


async def surfaced_after(h: K8sHarness, seen: Any, reason: str) -> dict[str, Any]:
    """Wait for the cluster to report the problem (``seen``), then for Degraded with ``reason``;
    returns the condition, asserting it came within :data:`SURFACE_S` of the report."""
    await wait_until(seen, 90, f"the cluster reports {reason}", h)
    reported = time.monotonic()
    cond = await wait_until(lambda: degraded(h), 30, f"Degraded ({reason})", h)
    assert time.monotonic() - reported < SURFACE_S, cond
    assert cond["reason"] == reason, cond
    return cond


async def test_image_pull_failure_is_degraded_and_an_image_fix_replaces_the_pod(k8s: K8sHarness) -> None:
    h = k8s
    h.double.unpullable_images = {"registry.example/private:1"}
    runner = h.operator()
    await runner.start()
    body = h.body(replicas=1)
    body["spec"]["workload"]["image"] = "registry.example/private:1"
    await h.create(body)

    async def pulling() -> bool:
        waiting = [
            (s.get("state") or {}).get("waiting") or {}
            for s in (await pod_status(h, f"{NAME}-0")).get("containerStatuses") or []
        ]
        return any(w.get("reason") in ("ErrImagePull", "ImagePullBackOff") for w in waiting)

    await wait_until(pulling, 90, "the pull failure on the pod", h)
    cond = await wait_until(lambda: degraded(h), 30, "Degraded", h)
    assert cond["reason"] in ("ErrImagePull", "ImagePullBackOff") and f"pod {NAME}-0" in cond["message"], cond
    # the fix: a pullable image; the stuck pod (outdated, not alive) is replaced at once
    await h.kube.patch(cr_path(NAME), {"spec": {"workload": {"image": "local"}}})
    await wait_until(lambda: h.balanced(1), 120, "the partitions on the new pod", h)
    assert await degraded(h) is None
    assert f"{NAME}-0" in h.double.removed


async def test_unschedulable_pod_is_degraded(k8s: K8sHarness) -> None:
    h = k8s
    metrics = OperatorMetrics()
    runner = h.operator(metrics=metrics)
    await runner.start()
    body = h.body(replicas=1)
    # and OpenShift's way with ids: none set, the platform assigns them (the CRD's CEL rules admit it)
    body["spec"]["podTemplate"] = {
        "nodeSelector": {"pool": "gpu"},
        "securityContext": {"platformAssignsIds": True},
    }
    await h.create(body)

    async def unscheduled() -> bool:
        conds = (await pod_status(h, f"{NAME}-0")).get("conditions") or []
        return any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds)

    cond = await surfaced_after(h, unscheduled, "Unschedulable")
    assert f"pod {NAME}-0" in cond["message"] and "node(s) didn't match" in cond["message"], cond

    sts = await h.kube.get(api_path("apps/v1", "statefulsets", NS, NAME))
    pod_security = sts["spec"]["template"]["spec"]["securityContext"]
    assert pod_security == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}, pod_security

    # the condition metric the alerts read follows the status write
    def sample(type_: str, status: str) -> float | None:
        labels = {"namespace": NS, "consumer": NAME, "type": type_, "status": status}
        return metrics.registry.get_sample_value("multilane_consumer_condition", labels)

    degraded_now = (sample("Degraded", "True"), sample("Degraded", "False"), sample("Degraded", "Unknown"))
    assert degraded_now == (1, 0, 0)
    ready = (await h.status())["conditions"]
    ready_status = next(c["status"] for c in ready if c["type"] == "Ready")
    assert ready_status != "True" and sample("Ready", ready_status) == 1 and sample("Ready", "True") == 0


async def test_quota_refusing_a_pod_is_degraded(k8s: K8sHarness) -> None:
    h = k8s
    h.double.pod_quota = 1
    runner = h.operator()
    await runner.start()
    await h.create(h.body(replicas=2, maxReplicas=2))

    async def refused() -> bool:
        events = await h.kube.list(api_path("v1", "events", NS))
        return any(e.get("reason") == "FailedCreate" for e in events)

    cond = await surfaced_after(h, refused, "FailedCreate")
    assert f"statefulset {NAME}" in cond["message"] and "exceeded quota" in cond["message"], cond
