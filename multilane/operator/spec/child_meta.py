"""Whose child a manifest is: ``ConsumerRef``, the labels, the owner reference and the metadata. Pure.

Split out of :mod:`multilane.operator.spec.children` (which re-exports every name here): every
child of a ParallelConsumer carries this metadata, so that Kubernetes' garbage collector deletes it
with its owner. Also the ports and the Lease duration that the worker pods and the small children
(:mod:`multilane.operator.spec.small_children`) both name, and the pods' security context.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["API_GROUP", "API_VERSION", "CONSUMER_LABEL", "CONTROL_PORT", "KIND", "LEASE_DURATION_S",
           "METRICS_PORT", "SECURITY_ID_FIELDS", "WORKER_ID", "ConsumerRef", "owner_reference",
           "pod_security_context", "selector_labels"]

API_GROUP = "multilane.dev"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "ParallelConsumer"
CONSUMER_LABEL = "multilane.dev/consumer"
CONTROL_PORT = 8471
METRICS_PORT = 9464
LEASE_DURATION_S = 15
#: The uid, gid and fsGroup of the pods of a ParallelConsumer (workers, snapshot Jobs) unless
#: spec.podTemplate.securityContext sets them or leaves them to the platform (``platformAssignsIds``).
WORKER_ID = 65532
SECURITY_ID_FIELDS = ("runAsUser", "runAsGroup", "fsGroup")


@dataclass(frozen=True, slots=True)
class ConsumerRef:
    """Identity of one ParallelConsumer. ``uid`` is the owner-reference target (never empty)."""

    name: str
    namespace: str
    uid: str

    @property
    def workers_service(self) -> str:
        return f"{self.name}-workers"

    @property
    def service_account(self) -> str:
        return f"{self.name}-worker"

    @property
    def token_secret(self) -> str:
        return f"{self.name}-control-token"

    def pod_name(self, ordinal: int) -> str:
        return f"{self.name}-{ordinal}"


def selector_labels(ref: ConsumerRef) -> dict[str, str]:
    return {CONSUMER_LABEL: ref.name}


def _labels(ref: ConsumerRef, component: str) -> dict[str, str]:
    return {
        CONSUMER_LABEL: ref.name,
        "app.kubernetes.io/name": "multilane",
        "app.kubernetes.io/instance": ref.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "multilane-operator",
    }


def owner_reference(ref: ConsumerRef) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": ref.name,
        "uid": ref.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(ref: ConsumerRef, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": ref.namespace,
        "labels": _labels(ref, component),
        "ownerReferences": [owner_reference(ref)],
    }


def pod_security_context(fit: Mapping[str, Any]) -> dict[str, Any]:
    """The pods' ``securityContext`` (workers, snapshot Jobs) from ``spec.podTemplate.securityContext``
    (``fit``: ``spec.podTemplate``): always non-root with seccomp ``RuntimeDefault``; uid, gid and
    fsGroup :data:`WORKER_ID` unless set there, or all three unset with ``platformAssignsIds``
    (OpenShift's restricted SCCs assign them from the namespace's range and refuse others);
    ``fsGroupChangePolicy`` and ``supplementalGroups`` as given.
    The CRD and :func:`~multilane.operator.spec.validation.validate_spec` checked the values."""
    asked = dict(fit.get("securityContext") or {})
    context: dict[str, Any] = {"runAsNonRoot": True}
    if not asked.get("platformAssignsIds"):
        for key in SECURITY_ID_FIELDS:
            context[key] = int(asked.get(key, WORKER_ID))
    for key in ("fsGroupChangePolicy", "supplementalGroups"):
        if asked.get(key):
            context[key] = copy.deepcopy(asked[key])
    context["seccompProfile"] = {"type": "RuntimeDefault"}
    return context
