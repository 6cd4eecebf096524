"""Why worker pods do not run, read from the pods, the StatefulSet and its Events. Pure: no I/O.

What a cluster says when it cannot run a worker, and what the operator reports (condition Degraded,
reason = the first problem's, message naming each pod or the StatefulSet and its reason):

- a container waiting with ``ErrImagePull``, ``ImagePullBackOff`` or ``InvalidImageName`` (a private
  registry without ``spec.podTemplate.imagePullSecrets``, a wrong image), ``CreateContainerConfigError``
  (a missing Secret or ConfigMap key), ``CrashLoopBackOff``;
- a pod not scheduled (``PodScheduled=False``, reason ``Unschedulable``: no node fits its
  nodeSelector, affinity, tolerations or requests);
- pods missing from the StatefulSet: the newest ``FailedCreate`` Event of the StatefulSet (a
  ResourceQuota refused the pod, or an admission webhook did), or a StatefulSet condition whose
  reason is ``FailedCreate``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["WAITING_REASONS", "pod_problems", "statefulset_problems"]

# Container waiting reasons that do not clear by themselves.
WAITING_REASONS = (
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
)


def pod_problems(pods: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """``(reason, message)`` per failing pod, in pod-name order."""
    out: list[tuple[str, str]] = []
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        name = str((pod.get("metadata") or {}).get("name", ""))
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                reason = str(cond.get("reason") or "Unschedulable")
                out.append((reason, f"pod {name}: {reason}: {cond.get('message') or 'not scheduled'}"))
        for container in status.get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = str(waiting.get("reason") or "")
            if reason in WAITING_REASONS:
                detail = f": {waiting['message']}" if waiting.get("message") else ""
                out.append((reason, f"pod {name}: {reason}{detail}"))
    return out


def statefulset_problems(
    sts: Mapping[str, Any] | None, pods: int, events: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str]]:
    """``(reason, message)`` when the StatefulSet has fewer pods than replicas and says why (its
    newest ``FailedCreate`` Event or condition)."""
    if sts is None:
        return []
    name = str((sts.get("metadata") or {}).get("name", ""))
    for cond in (sts.get("status") or {}).get("conditions") or []:
        if cond.get("reason") == "FailedCreate" and cond.get("status") == "True":
            return [("FailedCreate", f"statefulset {name}: {cond.get('message') or 'FailedCreate'}")]
    wanted = int((sts.get("spec") or {}).get("replicas") or 0)
    if pods >= wanted:
        return []
    failed = [
        e
        for e in events
        if e.get("reason") == "FailedCreate" and (e.get("involvedObject") or {}).get("name") == name
    ]
    if not failed:
        return []
    newest = max(failed, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return [("FailedCreate", f"statefulset {name}: {newest.get('message') or 'FailedCreate'}")]
