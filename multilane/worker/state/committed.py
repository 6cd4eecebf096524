"""``CommittedOffsetReader``: the input partitions' committed offsets, as the learner polls them.
Does I/O (Kafka OffsetFetch under the input consumer group; never joins the group, never commits)."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaException, TopicPartition

from multilane.worker.state.errors import StateError

__all__ = ["CommittedOffsetReader"]


class CommittedOffsetReader:
    """Thread-safe (one lock around the consumer)."""

    def __init__(
        self,
        bootstrap_servers: str,
        group: str,
        consumer_config: Mapping[str, object] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": group,
                "enable.auto.commit": False,
                **dict(consumer_config or {}),
                # a pending transactional offset commit is waited for (KIP-447's require_stable),
                # never read before its transaction ends
                "isolation.level": "read_committed",
            }
        )
        self._lock = threading.Lock()
        self._timeout_s = timeout_s

    def committed(self, topic: str, partition: int) -> int:
        """The committed offset of ``topic[partition]``; 0 when the group has committed none."""
        with self._lock:
            try:
                [tp] = self._consumer.committed([TopicPartition(topic, partition)], timeout=self._timeout_s)
            except KafkaException as exc:
                raise StateError(f"cannot read the committed offset of {topic}[{partition}]: {exc}") from exc
        if tp.error is not None:
            raise StateError(f"cannot read the committed offset of {topic}[{partition}]: {tp.error}")
        return max(0, int(tp.offset))

    def close(self) -> None:
        with self._lock:
            try:
                self._consumer.close()
            except RuntimeError:
                pass
