"""The NetworkPolicy child of a ParallelConsumer (multilane/operator/spec/network.py): it selects the
consumer's worker pods, admits the operator pods (and nobody else) to the control port and the
monitoring selector (and nobody else) to the metrics port."""

from __future__ import annotations

from typing import Any

import pytest

from multilane.operator.spec import children as ch
from multilane.operator.spec.network import NetworkPolicySettings, network_policy, parse_labels

REF = ch.ConsumerRef(name="orders", namespace="apps", uid="u-1")
SPEC: dict[str, Any] = {
    "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "consumerGroup": "g"},
    "workload": {"image": "app:1", "processor": "app:process"},
}


def test_selects_exactly_the_consumers_worker_pods() -> None:
    policy = network_policy(REF, NetworkPolicySettings(operator_namespace="ops"))
    pod_labels = ch.stateful_set(REF, SPEC, 1)["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items() and selector == {ch.CONSUMER_LABEL: "orders"}
    assert policy["metadata"]["namespace"] == "apps"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert policy["spec"]["policyTypes"] == ["Ingress"]


def test_control_port_only_from_the_operator_metrics_only_from_monitoring() -> None:
    settings = NetworkPolicySettings(
        operator_namespace="ops",
        operator_pod_labels={"app.kubernetes.io/component": "operator"},
        monitoring_namespace_labels={"team": "obs"},
        monitoring_pod_labels={"app": "prometheus"},
    )
    control, metrics = network_policy(REF, settings)["spec"]["ingress"]
    assert control["ports"] == [{"protocol": "TCP", "port": ch.CONTROL_PORT}]
    assert control["from"] == [
        {
            "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
        }
    ]
    assert metrics["ports"] == [{"protocol": "TCP", "port": ch.METRICS_PORT}]
    assert metrics["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"team": "obs"}},
            "podSelector": {"matchLabels": {"app": "prometheus"}},
        }
    ]


def test_empty_operator_labels_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        NetworkPolicySettings(operator_pod_labels={})


def test_parse_labels() -> None:
    assert parse_labels("a=b, c=d") == {"a": "b", "c": "d"}
    assert parse_labels("") == {}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_labels("novalue")
