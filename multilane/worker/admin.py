"""Small blocking Kafka admin helpers of the worker (call them on a worker thread). Does I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

__all__ = ["SECURITY_KEYS", "ensure_topic", "max_partition_count", "security_config"]

# Client settings that every client of the worker shares (the rest of --consumer-config is the
# consumer's own).
SECURITY_KEYS = ("security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username",
                 "sasl.password", "ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
                 "ssl.key.password")


def security_config(overrides: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in overrides.items() if k in SECURITY_KEYS}


def _admin(bootstrap: str, security: Mapping[str, str]) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **security})


def max_partition_count(bootstrap: str, topics: Iterable[str], security: Mapping[str, str],
                        timeout: float = 10.0) -> int:
    """The largest partition count among ``topics`` (1 when none exists yet)."""
    admin = _admin(bootstrap, security)
    n = 1
    for t in topics:
        md = admin.list_topics(t, timeout=timeout).topics.get(t)
        if md is not None and md.error is None:
            n = max(n, len(md.partitions))
    return n


def ensure_topic(bootstrap: str, topic: str, security: Mapping[str, str], partitions: int = 1,
                 timeout: float = 5.0) -> None:
    """Create ``topic`` unless it exists; an "already exists" race is fine."""
    admin = _admin(bootstrap, security)
    md = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if md is not None and md.error is None and md.partitions:
        return
    fut = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=-1)])[topic]
    try:
        fut.result(timeout)
    except KafkaException as exc:
        if "already exists" not in str(exc) and "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise
