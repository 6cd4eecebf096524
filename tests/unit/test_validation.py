"""Unit tests of the pure spec validation (multilane.operator.spec.validation)."""

from __future__ import annotations

from typing import Any

from multilane.operator.spec.validation import check_environment, validate_spec


def spec(**scaling: Any) -> dict[str, Any]:
    return {
        "kafka": {"bootstrapServers": "k:9092", "topics": ["orders", "audit"], "consumerGroup": "g"},
        "workload": {"image": "img", "processor": "app.handlers:process"},
        "scaling": scaling,
    }


def reasons(s: dict[str, Any]) -> list[str]:
    parsed, problems = validate_spec(s)
    assert (parsed is None) == bool(problems)
    return [p.reason for p in problems]


def test_defaults_match_the_crd() -> None:
    parsed, problems = validate_spec(spec())
    assert problems == [] and parsed is not None
    assert (parsed.min_replicas, parsed.max_replicas, parsed.min_factor, parsed.max_factor) == (1, 10, 1, 64)
    assert parsed.ordering == "key" and parsed.replicas is None and parsed.max_moves == 4
    assert parsed.interval_s == 5 and parsed.metrics.source == "kafka"


def test_bounds_ordering_and_owned_config_are_refused() -> None:
    assert reasons(spec(minReplicas=5, maxReplicas=2)) == ["InvalidScalingBounds"]
    assert reasons(spec(minFactor=9, maxFactor=4)) == ["InvalidScalingBounds"]
    assert reasons(spec(replicas=20, maxReplicas=4)) == ["InvalidScalingBounds"]
    bad_order = spec()
    bad_order["workload"]["ordering"] = "random"
    assert reasons(bad_order) == ["UnknownOrdering"]
    owned = spec()
    owned["kafka"]["config"] = {"group.id": "x"}
    assert reasons(owned) == ["InvalidSpec"]
    prom = spec(metrics={"source": "prometheus"})
    assert reasons(prom) == ["InvalidSpec"]
    assert "InvalidSpec" in reasons({"kafka": {}, "workload": {}})


def test_environment_problems() -> None:
    parsed, _ = validate_spec({**spec(), "kafka": {**spec()["kafka"], "credentialsSecretRef": {"name": "s"}}})
    assert parsed is not None
    missing = check_environment(parsed, secret_exists=False, topic_partitions={"orders": 3, "audit": 1})
    assert [p.reason for p in missing] == ["CredentialsSecretMissing"]
    topics = check_environment(parsed, secret_exists=True, topic_partitions={"orders": 3})
    assert [p.reason for p in topics] == ["TopicNotFound"] and "audit" in topics[0].message
    down = check_environment(parsed, secret_exists=True, topic_partitions=None, kafka_error="timed out")
    assert [p.reason for p in down] == ["KafkaUnreachable"] and "timed out" in down[0].message
    assert check_environment(parsed, secret_exists=True, topic_partitions={"orders": 3, "audit": 1}) == []


def test_pod_security_context_is_checked() -> None:
    def with_security(context: Any) -> dict[str, Any]:
        s = spec()
        s["podTemplate"] = {"securityContext": context}
        return s

    assert reasons(with_security({"platformAssignsIds": True})) == []
    assert reasons(with_security({"runAsUser": 1000, "runAsGroup": 0, "fsGroup": 0})) == []
    for bad in (
        {"runAsUser": 0},  # root
        {"runAsUser": "1000"},
        {"fsGroup": -1},
        {"runAsGroup": True},
        {"supplementalGroups": [-5]},
        {"fsGroupChangePolicy": "Never"},
        {"platformAssignsIds": "yes"},
        {"platformAssignsIds": True, "runAsUser": 1000},
        {"platformAssignsIds": True, "fsGroup": 0},
        "restricted",
    ):
        assert reasons(with_security(bad)) == ["InvalidSpec"], bad
    _, problems = validate_spec(with_security({"platformAssignsIds": True, "runAsUser": 1000}))
    assert "set none of them with it" in problems[0].message
