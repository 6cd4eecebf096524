"""The NetworkPolicy child of a ParallelConsumer: only the operator reaches the workers' control port,
only a configurable monitoring selector their metrics port, nothing else reaches the worker pods.
Pure (builds a manifest; no I/O).

One policy per consumer (``NAME-workers``, in the consumer's namespace, owned by the
ParallelConsumer), so that a consumer in any namespace is covered without listing namespaces in the
chart. The operator's own namespace and pod labels come from :class:`NetworkPolicySettings` (the
chart passes them: ``multilane operator --operator-namespace``, ``--operator-pod-labels``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from multilane.operator.spec.children import (
    CONTROL_PORT,
    METRICS_PORT,
    ConsumerRef,
    _meta,
    selector_labels,
)

__all__ = ["NetworkPolicySettings", "network_policy", "network_policy_name", "parse_labels"]

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by Kubernetes


def parse_labels(text: str) -> dict[str, str]:
    """``"a=b,c=d"`` -> ``{"a": "b", "c": "d"}``; one-line ``ValueError`` on a malformed pair."""
    out: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"not a label KEY=VALUE: {pair!r}")
        out[key.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class NetworkPolicySettings:
    """Who may reach the workers. Invariant: ``operator_pod_labels`` is not empty (an empty pod
    selector would admit every pod of the operator's namespace to the control port)."""

    operator_namespace: str | None = None  # None: any namespace (with the operator's pod labels)
    operator_pod_labels: Mapping[str, str] = field(
        default_factory=lambda: {
            "app.kubernetes.io/component": "operator",
            "app.kubernetes.io/part-of": "multilane",
        }
    )
    monitoring_namespace_labels: Mapping[str, str] = field(
        default_factory=lambda: {NAMESPACE_NAME_LABEL: "monitoring"}
    )
    monitoring_pod_labels: Mapping[str, str] = field(default_factory=dict)  # empty: every pod there

    def __post_init__(self) -> None:
        if not self.operator_pod_labels:
            raise ValueError("the operator's pod labels must not be empty")


def network_policy_name(ref: ConsumerRef) -> str:
    return f"{ref.name}-workers"


def network_policy(ref: ConsumerRef, settings: NetworkPolicySettings) -> dict[str, Any]:
    """Ingress to the consumer's worker pods: the control port from the operator pods, the metrics port
    from the monitoring selector; every other ingress denied (the policy selects the pods)."""
    operator_peer: dict[str, Any] = {"podSelector": {"matchLabels": dict(settings.operator_pod_labels)}}
    operator_peer["namespaceSelector"] = (
        {"matchLabels": {NAMESPACE_NAME_LABEL: settings.operator_namespace}}
        if settings.operator_namespace
        else {}
    )
    monitoring_peer: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": dict(settings.monitoring_namespace_labels)}
    }
    if settings.monitoring_pod_labels:
        monitoring_peer["podSelector"] = {"matchLabels": dict(settings.monitoring_pod_labels)}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(ref, network_policy_name(ref), "worker"),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(ref)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [operator_peer], "ports": [{"protocol": "TCP", "port": CONTROL_PORT}]},
                {"from": [monitoring_peer], "ports": [{"protocol": "TCP", "port": METRICS_PORT}]},
            ],
        },
    }
