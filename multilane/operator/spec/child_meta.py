"""Whose child a manifest is: ``ConsumerRef``, the labels, the owner reference and the metadata. Pure.

Split out of :mod:`multilane.operator.spec.children` (which re-exports every name here): every
child of a ParallelConsumer carries this metadata, so that Kubernetes' garbage collector deletes it
with its owner. Also the ports and the Lease duration that the worker pods and the small children
(:mod:`multilane.operator.spec.small_children`) both name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["API_GROUP", "API_VERSION", "CONSUMER_LABEL", "CONTROL_PORT", "KIND", "LEASE_DURATION_S",
           "METRICS_PORT", "ConsumerRef", "owner_reference", "selector_labels"]

API_GROUP = "multilane.dev"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "ParallelConsumer"
CONSUMER_LABEL = "multilane.dev/consumer"
CONTROL_PORT = 8471
METRICS_PORT = 9464
LEASE_DURATION_S = 15


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
