"""Why worker pods do not run, as a cluster reports it (``multilane.operator.spec.pod_health``).

Shapes follow the Kubernetes documentation: container states (waiting reasons ErrImagePull /
ImagePullBackOff), https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-states ;
the PodScheduled condition with reason Unschedulable,
https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-conditions ; a ResourceQuota
refusing a pod ("exceeded quota"), https://kubernetes.io/docs/concepts/policy/resource-quotas/ (the
StatefulSet controller records it as a FailedCreate Event).
"""

from __future__ import annotations

from typing import Any

from multilane.operator.spec.pod_health import pod_problems, statefulset_problems


def pod(name: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": status}


def test_image_pull_failures_name_the_pod_and_reason() -> None:
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x:1"'}}
    problems = pod_problems([pod("c-1", containerStatuses=[{"state": waiting}]), pod("c-0")])
    assert problems == [("ImagePullBackOff", 'pod c-1: ImagePullBackOff: Back-off pulling image "x:1"')]


def test_unschedulable_pods() -> None:
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}
    assert pod_problems([pod("c-0", conditions=[cond])]) == [
        ("Unschedulable", "pod c-0: Unschedulable: 0/3 nodes")
    ]


def test_running_and_starting_pods_are_no_problem() -> None:
    creating = {"waiting": {"reason": "ContainerCreating"}}
    assert pod_problems([pod("c-0", containerStatuses=[{"state": creating}], phase="Pending")]) == []


def test_a_quota_refusal_while_pods_are_missing() -> None:
    sts = {"metadata": {"name": "c"}, "spec": {"replicas": 3}}
    event = {
        "reason": "FailedCreate",
        "involvedObject": {"kind": "StatefulSet", "name": "c"},
        "message": 'create Pod c-2 in StatefulSet c failed error: pods "c-2" is forbidden: exceeded quota',
        "lastTimestamp": "2026-01-01T00:00:00Z",
    }
    other = {**event, "involvedObject": {"kind": "StatefulSet", "name": "other"}}
    assert statefulset_problems(sts, 2, [event, other]) == [
        ("FailedCreate", f"statefulset c: {event['message']}")
    ]
    assert statefulset_problems(sts, 3, [event]) == []  # every pod exists: an old Event
    assert statefulset_problems(sts, 2, [other]) == []
