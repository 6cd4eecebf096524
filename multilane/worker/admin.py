"""Small blocking Kafka admin helpers of the worker (call them on a worker thread). Does I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from multilane.worker.config import security_settings

__all__ = ["ensure_topic", "max_partition_count", "security_config"]


def security_config(overrides: Mapping[str, str]) -> dict[str, str]:
    """The settings every client of the worker shares (``security.protocol``, ``sasl.*``, ``ssl.*``);
    the rest of the overrides are the consumer's own."""
    return security_settings(overrides)


def _admin(bootstrap: str, security: Mapping[str, str]) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **security})


def max_partition_count(bootstrap: str, topics: Iterable[str], security: Mapping[str, str],
                        timeout: float = 10.0) -> int:
    """The largest partition count among ``topics`` (1 when none exists yet)."""
    # All topics: a metadata request naming a missing topic would create it (broker auto-creation).
    listed = _admin(bootstrap, security).list_topics(timeout=timeout).topics
    n = 1
    for t in topics:
        md = listed.get(t)
        if md is not None and md.error is None:
            n = max(n, len(md.partitions))
    return n


def ensure_topic(bootstrap: str, topic: str, security: Mapping[str, str], partitions: int = 1,
                 timeout: float = 5.0) -> None:
    """Create ``topic`` unless it exists; an "already exists" race is fine."""
    admin = _admin(bootstrap, security)
    md = admin.list_topics(timeout=timeout).topics.get(topic)  # all topics: naming one would create it
    if md is not None and md.error is None and md.partitions:
        return
    fut = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=-1)])[topic]
    try:
        fut.result(timeout)
    except KafkaException as exc:
        if "already exists" not in str(exc) and "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise
