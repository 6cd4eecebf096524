"""The small children of a ParallelConsumer: Service, PDB, RBAC, token Secret, Leases, CronJob. Pure.

Split out of :mod:`multilane.operator.spec.children` (which re-exports every name here and renders
the StatefulSet); see its docstring for what each child is for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from multilane.operator.spec.child_meta import (
    API_VERSION,
    CONTROL_PORT,
    KIND,
    LEASE_DURATION_S,
    METRICS_PORT,
    ConsumerRef,
    _labels,
    _meta,
    owner_reference,
    pod_security_context,
    selector_labels,
)
from multilane.pipeline import k8s as snapshot_k8s

__all__ = [
    "control_token_secret",
    "lease_manifest",
    "pod_disruption_budget",
    "role",
    "role_binding",
    "service",
    "service_account",
    "snapshot_cronjob",
    "snapshot_cronjob_name",
]


def service(ref: ConsumerRef) -> dict[str, Any]:
    """Headless Service giving each worker pod a stable DNS name for its control endpoint."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(ref, ref.workers_service, "worker"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(ref),
            "ports": [
                {"name": "control", "port": CONTROL_PORT, "targetPort": "control"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"},
            ],
        },
    }


def pod_disruption_budget(ref: ConsumerRef) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(ref, ref.name, "worker"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(ref)}},
    }


def service_account(ref: ConsumerRef) -> dict[str, Any]:
    meta = _meta(ref, ref.service_account, "worker")
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}


def role(ref: ConsumerRef, max_replicas: int) -> dict[str, Any]:
    """get/update of the Leases named after the worker pods ``NAME-0 .. NAME-(max_replicas-1)``."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(ref, ref.service_account, "worker"),
        "rules": [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [ref.pod_name(i) for i in range(max_replicas)],
                "verbs": ["get", "update"],
            }
        ],
    }


def role_binding(ref: ConsumerRef) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(ref, ref.service_account, "worker"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ref.service_account},
        "subjects": [{"kind": "ServiceAccount", "name": ref.service_account, "namespace": ref.namespace}],
    }


def control_token_secret(ref: ConsumerRef, token: str) -> dict[str, Any]:
    """The control-token Secret. Created once; the operator never replaces an existing one."""
    if len(token) < 32:
        raise ValueError("control token must be at least 32 characters")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _meta(ref, ref.token_secret, "control"),
        "stringData": {"token": token},
    }


def lease_manifest(ref: ConsumerRef, pod: str) -> dict[str, Any]:
    """The Lease of one worker pod, created by the operator, renewed by the worker (``LeaseKeeper``).

    No ``renewTime``: a worker counts as live only after it renewed the Lease itself.
    """
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": _meta(ref, pod, "lease"),
        "spec": {"holderIdentity": pod, "leaseDurationSeconds": LEASE_DURATION_S},
    }


def snapshot_cronjob_name(ref: ConsumerRef) -> str:
    """``NAME-snapshot`` (cut with a hash to fit the CronJob name limit, as the renderer does)."""
    return snapshot_k8s._dns_name(ref.name, "snapshot", 52)


def snapshot_cronjob(ref: ConsumerRef, spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """The scheduled-snapshot CronJob, or None when state is disabled or no uri/schedule is set.

    ``spec.suspend`` is always False here, so that setting a schedule again resumes a CronJob the
    operator suspended when the schedule was removed. Removal suspends instead of deleting: the
    operator already needs ``patch`` on cronjobs, so it needs no ``delete`` (least privilege); the
    suspended CronJob goes with its owner through the garbage collector.
    """
    state = spec.get("state") or {}
    snapshot = state.get("snapshot") or {}
    if not state.get("enabled") or not snapshot.get("uri") or not str(snapshot.get("schedule") or "").strip():
        return None
    pc = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
        "spec": dict(spec),
    }
    cronjob = snapshot_k8s.render_snapshot_cronjob(pc)
    if cronjob is None:
        return None
    cronjob["metadata"]["labels"] = {**cronjob["metadata"]["labels"], **_labels(ref, "snapshot")}
    cronjob["metadata"]["ownerReferences"] = [owner_reference(ref)]
    cronjob["spec"]["suspend"] = False
    # the same identity as the workers (spec.podTemplate.securityContext: OpenShift's assigned ids)
    job_pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    job_pod["securityContext"] = pod_security_context(spec.get("podTemplate") or {})
    return cronjob
