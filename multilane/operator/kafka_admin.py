"""``KafkaAdminClient``: the few Kafka admin reads the operator needs. Does I/O (Kafka protocol).

Every call runs librdkafka's blocking API on a thread (``asyncio.to_thread``) with a short timeout, and
raises :class:`KafkaUnavailableError` when the cluster cannot be asked, so a handler can turn that
into a condition instead of crashing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["KafkaAdminClient", "KafkaUnavailableError", "PartitionOffsets"]


class KafkaUnavailableError(RuntimeError):
    """The brokers could not be reached or did not answer in time."""


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """Offsets of one partition. ``committed`` is None when the group never committed it."""

    partition: str  # "topic/index"
    low: int
    high: int
    committed: int | None

    @property
    def lag(self) -> int:
        start = self.committed if self.committed is not None and self.committed >= 0 else self.low
        return max(0, self.high - start)


class KafkaAdminClient:
    """``config``: librdkafka settings (bootstrap servers, plus credentials read from the referenced
    Secret when there is one; held in memory only)."""

    def __init__(self, config: Mapping[str, str], timeout_s: float = 5.0) -> None:
        self.config = dict(config)
        self.timeout_s = timeout_s
        self._admin: Any = None  # one librdkafka client, reused: creating/destroying one costs seconds
        self._consumer: Any = None
        self._consumer_group = ""
        self._lock = threading.Lock()  # librdkafka handles are thread-safe; creation is guarded

    def _client_defaults(self) -> dict[str, Any]:
        # librdkafka's log lines go to Python logging (not stderr), and an unreachable cluster is
        # retried at most every 10 s rather than every 50 ms.
        return {
            "socket.timeout.ms": int(self.timeout_s * 1000),
            "reconnect.backoff.max.ms": 10_000,
            "logger": logging.getLogger("multilane.operator.kafka"),
        }

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
            self._consumer = None
            self._admin = None

    async def topic_partitions(self, topics: Sequence[str]) -> dict[str, int]:
        """Partition counts of those ``topics`` that exist (missing topics are left out)."""
        return await asyncio.to_thread(self._topic_partitions, list(topics))

    def _topic_partitions(self, topics: list[str]) -> dict[str, int]:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        with self._lock:
            if self._admin is None:
                self._admin = AdminClient({**self.config, **self._client_defaults()})
            admin = self._admin
        try:
            metadata = admin.list_topics(timeout=self.timeout_s)
        except KafkaException as exc:
            raise KafkaUnavailableError(str(exc)) from exc
        out = {}
        for t in topics:
            tm = metadata.topics.get(t)
            if tm is not None and tm.error is None and tm.partitions:
                out[t] = len(tm.partitions)
        return out

    async def offsets(self, group: str, topic_partitions: Mapping[str, int]) -> list[PartitionOffsets]:
        """Watermarks and the group's committed offsets for every partition of the given topics."""
        return await asyncio.to_thread(self._offsets, group, dict(topic_partitions))

    def _offsets(self, group: str, topic_partitions: dict[str, int]) -> list[PartitionOffsets]:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        with self._lock:
            if self._consumer is None or self._consumer_group != group:
                if self._consumer is not None:
                    self._consumer.close()
                self._consumer = Consumer(
                    {**self.config, **self._client_defaults(), "group.id": group, "enable.auto.commit": False}
                )
                self._consumer_group = group
            consumer = self._consumer
        tps = [TopicPartition(t, i) for t, n in sorted(topic_partitions.items()) for i in range(n)]
        try:
            committed = consumer.committed(tps, timeout=self.timeout_s)
            out = []
            for tp in committed:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=self.timeout_s, cached=False
                )
                out.append(
                    PartitionOffsets(
                        partition=f"{tp.topic}/{tp.partition}",
                        low=int(low),
                        high=int(high),
                        committed=int(tp.offset) if tp.offset >= 0 else None,
                    )
                )
            return out
        except KafkaException as exc:
            raise KafkaUnavailableError(str(exc)) from exc
