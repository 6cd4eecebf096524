"""Checks of a ParallelConsumer spec that the CRD schema cannot express. Pure: no I/O.

:func:`validate_spec` parses the spec (applying the CRD's defaults, so a spec that bypassed the API
server's defaulting still means the same) into a :class:`ConsumerSpec`, or returns the problems found.
Checks that need I/O (the credentials Secret exists, the topics exist) are done by the handlers with
the results passed in through :func:`check_environment`, so the decision stays pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ConsumerSpec",
    "MetricsSpec",
    "Problem",
    "check_environment",
    "pod_security_problems",
    "validate_spec",
]

ORDERINGS = ("key", "partition", "unordered")
SOURCES = ("kafka", "prometheus")
_PROCESSOR = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_OWNED_CONFIG = ("bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store")


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason the spec cannot be applied. ``reason`` is a CamelCase condition/Event reason."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class MetricsSpec:
    source: str = "kafka"  # one of SOURCES
    prometheus_url: str = ""  # required when source == "prometheus"
    lag_query: str = ""  # "" = the default multilane_consumer_lag query
    rate_query: str = ""


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    """A validated spec. Invariants: ``1 <= min_replicas <= max_replicas``,
    ``1 <= min_factor <= max_factor``, ``replicas`` is None or within ``[min_replicas, max_replicas]``,
    ``topics`` non-empty and unique, ``interval_s >= 1``, ``max_moves >= 1``."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    consumer_group: str
    credentials_secret: str | None
    ordering: str
    min_replicas: int
    max_replicas: int
    replicas: int | None  # spec.scaling.replicas (the scale subresource); None = autoscale
    min_factor: int
    max_factor: int
    target_catchup_s: float
    max_lag: int | None
    target_utilisation: float
    scale_down_delay_s: float
    stabilisation_s: float
    max_moves: int
    interval_s: float
    metrics: MetricsSpec = field(default_factory=MetricsSpec)
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    state_enabled: bool = False  # spec.state.enabled: restore-before-handoff rollouts
    acceptable_recovery_lag: int = 10_000  # spec.state.acceptableRecoveryLag, >= 0
    learner_timeout_s: float = 600.0  # spec.state.learnerTimeoutSeconds, > 0
    max_lanes_per_replica: int = 64  # spec.scaling.maxLanesPerReplica, >= 1: lanes one pod carries


def _int(section: Mapping[str, Any], key: str, default: int | None, problems: list[Problem]) -> int | None:
    value = section.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(Problem("InvalidSpec", f"{key} must be an integer, got {value!r}"))
        return default
    return value


def _num(section: Mapping[str, Any], key: str, default: float, problems: list[Problem]) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        problems.append(Problem("InvalidSpec", f"{key} must be a number, got {value!r}"))
        return default
    return float(value)


def validate_spec(spec: Mapping[str, Any] | None) -> tuple[ConsumerSpec | None, list[Problem]]:
    """Parse and check ``spec``; returns ``(ConsumerSpec, [])`` or ``(None, problems)``."""
    problems: list[Problem] = []
    spec = spec or {}
    kafka = spec.get("kafka") or {}
    workload = spec.get("workload") or {}
    scaling = spec.get("scaling") or {}
    metrics = scaling.get("metrics") or {}

    bootstrap = kafka.get("bootstrapServers") or ""
    if not isinstance(bootstrap, str) or not bootstrap.strip():
        problems.append(Problem("InvalidSpec", "spec.kafka.bootstrapServers is required"))
    topics = kafka.get("topics") or []
    if not isinstance(topics, list) or not topics:
        problems.append(Problem("InvalidSpec", "spec.kafka.topics needs at least one topic"))
        topics = []
    for t in topics:
        if not isinstance(t, str) or not _TOPIC.match(t):
            problems.append(Problem("InvalidSpec", f"spec.kafka.topics: {t!r} is not a valid topic name"))
    if len(set(topics)) != len(topics):
        problems.append(Problem("InvalidSpec", "spec.kafka.topics lists a topic twice"))
    group = kafka.get("consumerGroup") or ""
    if not isinstance(group, str) or not group:
        problems.append(Problem("InvalidSpec", "spec.kafka.consumerGroup is required"))
    config = kafka.get("config") or {}
    owned = sorted(k for k in config if k in _OWNED_CONFIG)
    if owned:
        problems.append(Problem("InvalidSpec", f"spec.kafka.config may not set {', '.join(owned)}"))
    secret = (kafka.get("credentialsSecretRef") or {}).get("name") or None

    if not workload.get("image"):
        problems.append(Problem("InvalidSpec", "spec.workload.image is required"))
    processor = workload.get("processor") or ""
    if not isinstance(processor, str) or not _PROCESSOR.match(processor):
        problems.append(
            Problem("InvalidSpec", f"spec.workload.processor {processor!r} is not module:function")
        )
    ordering = workload.get("ordering", "key")
    if ordering not in ORDERINGS:
        problems.append(
            Problem(
                "UnknownOrdering",
                f"spec.workload.ordering {ordering!r} is not one of {', '.join(ORDERINGS)}",
            )
        )

    min_r = _int(scaling, "minReplicas", 1, problems) or 1
    max_r = _int(scaling, "maxReplicas", 10, problems) or 10
    replicas = _int(scaling, "replicas", None, problems)
    min_f = _int(scaling, "minFactor", 1, problems) or 1
    max_f = _int(scaling, "maxFactor", 64, problems) or 64
    if min_r < 1 or min_f < 1:
        problems.append(Problem("InvalidSpec", "minReplicas and minFactor must be >= 1"))
    if min_r > max_r:
        problems.append(Problem("InvalidScalingBounds", f"minReplicas {min_r} > maxReplicas {max_r}"))
    if min_f > max_f:
        problems.append(Problem("InvalidScalingBounds", f"minFactor {min_f} > maxFactor {max_f}"))
    if replicas is not None and not min_r <= replicas <= max_r:
        problems.append(
            Problem(
                "InvalidScalingBounds",
                f"replicas {replicas} outside [minReplicas {min_r}, maxReplicas {max_r}]",
            )
        )
    utilisation = _num(scaling, "targetUtilisation", 0.7, problems)
    if not 0.0 < utilisation <= 1.0:
        problems.append(Problem("InvalidSpec", f"targetUtilisation {utilisation} must be in (0, 1]"))
    max_lag = _int(scaling, "maxLag", None, problems)
    if max_lag is not None and max_lag < 1:
        problems.append(Problem("InvalidSpec", "maxLag must be >= 1"))
    max_moves = _int(scaling, "maxPartitionsMovedAtOnce", 4, problems) or 4
    lanes_per_replica = _int(scaling, "maxLanesPerReplica", 64, problems) or 64
    if lanes_per_replica < 1:
        problems.append(Problem("InvalidSpec", "maxLanesPerReplica must be >= 1"))
    interval = _num(scaling, "intervalSeconds", 5, problems)
    if max_moves < 1 or interval < 1:
        problems.append(Problem("InvalidSpec", "maxPartitionsMovedAtOnce and intervalSeconds must be >= 1"))

    source = metrics.get("source", "kafka")
    prom = metrics.get("prometheus") or {}
    if source not in SOURCES:
        problems.append(Problem("InvalidSpec", f"scaling.metrics.source {source!r} is not one of {SOURCES}"))
    if source == "prometheus" and not prom.get("url"):
        problems.append(
            Problem("InvalidSpec", "scaling.metrics.prometheus.url is required for source prometheus")
        )

    problems.extend(pod_security_problems(spec.get("podTemplate") or {}))

    state = spec.get("state") or {}
    recovery_lag = _int(state, "acceptableRecoveryLag", 10_000, problems)
    learner_timeout = _num(state, "learnerTimeoutSeconds", 600, problems)
    if recovery_lag is None or recovery_lag < 0 or learner_timeout <= 0:
        problems.append(
            Problem("InvalidSpec", "state.acceptableRecoveryLag must be >= 0 and learnerTimeoutSeconds > 0")
        )

    if problems:
        return None, problems
    return (
        ConsumerSpec(
            bootstrap_servers=bootstrap,
            topics=tuple(topics),
            consumer_group=group,
            credentials_secret=secret,
            ordering=ordering,
            min_replicas=min_r,
            max_replicas=max_r,
            replicas=replicas,
            min_factor=min_f,
            max_factor=max_f,
            target_catchup_s=_num(scaling, "targetCatchUpSeconds", 300, problems),
            max_lag=max_lag,
            target_utilisation=utilisation,
            scale_down_delay_s=_num(scaling, "scaleDownDelaySeconds", 300, problems),
            stabilisation_s=_num(scaling, "stabilisationSeconds", 60, problems),
            max_moves=max_moves,
            interval_s=interval,
            max_lanes_per_replica=max(1, lanes_per_replica),
            metrics=MetricsSpec(
                source=source,
                prometheus_url=prom.get("url", ""),
                lag_query=prom.get("lagQuery", "") or "",
                rate_query=prom.get("rateQuery", "") or "",
            ),
            kafka_config=dict(config),
            state_enabled=bool(state.get("enabled", False)),
            acceptable_recovery_lag=int(recovery_lag or 0),
            learner_timeout_s=learner_timeout,
        ),
        [],
    )


def pod_security_problems(pod_template: Mapping[str, Any]) -> list[Problem]:
    """``spec.podTemplate.securityContext`` (the CRD checks the same; this catches a spec that
    bypassed it): ids are integers (``runAsUser`` >= 1: never root; the groups >= 0), and
    ``platformAssignsIds`` comes with none of ``runAsUser``, ``runAsGroup``, ``fsGroup``."""
    field = "spec.podTemplate.securityContext"
    asked = pod_template.get("securityContext") or {}
    if not isinstance(asked, Mapping):
        return [Problem("InvalidSpec", f"{field} must be an object")]
    problems: list[Problem] = []

    def bad_id(value: Any, lowest: int) -> bool:
        return isinstance(value, bool) or not isinstance(value, int) or value < lowest

    for key, lowest in (("runAsUser", 1), ("runAsGroup", 0), ("fsGroup", 0)):
        if asked.get(key) is not None and bad_id(asked[key], lowest):
            problems.append(Problem("InvalidSpec", f"{field}.{key} must be an integer >= {lowest}"))
    groups = asked.get("supplementalGroups") or []
    if not isinstance(groups, list) or any(bad_id(g, 0) for g in groups):
        problems.append(Problem("InvalidSpec", f"{field}.supplementalGroups must be gids >= 0"))
    policy = asked.get("fsGroupChangePolicy")
    if policy is not None and policy not in ("OnRootMismatch", "Always"):
        problems.append(Problem("InvalidSpec", f"{field}.fsGroupChangePolicy {policy!r} is unknown"))
    platform = asked.get("platformAssignsIds", False)
    if not isinstance(platform, bool):
        problems.append(Problem("InvalidSpec", f"{field}.platformAssignsIds must be a boolean"))
    elif platform and any(asked.get(k) is not None for k in ("runAsUser", "runAsGroup", "fsGroup")):
        problems.append(
            Problem(
                "InvalidSpec",
                f"{field}: platformAssignsIds leaves runAsUser, runAsGroup and fsGroup to the platform; "
                "set none of them with it",
            )
        )
    return problems


def check_environment(
    spec: ConsumerSpec,
    *,
    secret_exists: bool | None,
    topic_partitions: Mapping[str, int] | None,
    kafka_error: str | None = None,
) -> list[Problem]:
    """Judge the results of the I/O checks.

    ``secret_exists``: None when no Secret is referenced. ``topic_partitions``: partitions per existing
    topic as the Kafka admin API reported them, or None when the broker could not be asked (then
    ``kafka_error`` says why).
    """
    problems: list[Problem] = []
    if spec.credentials_secret and secret_exists is False:
        problems.append(
            Problem(
                "CredentialsSecretMissing",
                f"Secret {spec.credentials_secret!r} (credentialsSecretRef) not found",
            )
        )
    if topic_partitions is None:
        problems.append(Problem("KafkaUnreachable", f"cannot reach Kafka: {kafka_error or 'unknown error'}"))
        return problems
    missing: Sequence[str] = [t for t in spec.topics if t not in topic_partitions]
    if missing:
        problems.append(Problem("TopicNotFound", f"topic(s) not found: {', '.join(missing)}"))
    return problems
