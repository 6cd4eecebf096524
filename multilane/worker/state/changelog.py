"""Writing the changelog: topic creation and the shared producer. Does I/O (Kafka).

``ChangelogWriter`` owns one idempotent producer for all partitions of a worker. Idempotence keeps the
records of one changelog partition in produce order even across retries, which the write path relies
on (a delete's ``D`` envelope is immediately followed by its tombstone; a key's changes appear in the
order they were applied to the local store).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from multilane.worker.state.errors import StateDurabilityError, StateError

__all__ = ["DEFAULT_CHANGELOG_TOPIC_CONFIG", "ChangelogTopicAdmin", "ChangelogWriter", "changelog_topic_name"]

log = logging.getLogger(__name__)

DEFAULT_CHANGELOG_TOPIC_CONFIG: dict[str, str] = {
    "cleanup.policy": "compact",
    # Compaction keeps only the newest record per key. A change whose input record is not committed
    # yet must not hide the older, committed value it supersedes before the input record commits
    # (or is reprocessed); an hour is far beyond a commit interval or a reassignment.
    "min.compaction.lag.ms": "3600000",
}


def changelog_topic_name(group: str, topic: str) -> str:
    """``<group>.<topic>.changelog`` (pure)."""
    if not group or not topic:
        raise ValueError("group and topic must be non-empty")
    return f"{group}.{topic}.changelog"


class ChangelogTopicAdmin:
    """Creates changelog topics (one partition per input partition) when missing. Does I/O."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic_config: Mapping[str, str] | None = None,
        client_config: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self._admin = AdminClient({"bootstrap.servers": bootstrap_servers, **dict(client_config or {})})
        self._topic_config = {**DEFAULT_CHANGELOG_TOPIC_CONFIG, **dict(topic_config or {})}
        self._timeout_s = timeout_s
        self._known: dict[str, int] = {}
        self._lock = threading.Lock()

    def ensure(self, changelog_topic: str, input_topic: str) -> int:
        """Make sure ``changelog_topic`` exists with at least as many partitions as ``input_topic``
        (steps 1-4); returns its partition count. Raises :class:`StateError` when it cannot.

        1. Look up the input topic's partition count.
        2. If the changelog topic exists, check its partition count and return.
        3. Otherwise create it with the configured topic config (an "already exists" race is fine).
        4. Wait until its metadata shows every partition.
        """
        with self._lock:
            if changelog_topic in self._known:
                return self._known[changelog_topic]
            # 1.
            need = self._partition_count(input_topic)
            if need is None:
                raise StateError(f"input topic {input_topic!r} does not exist")
            # 2.
            have = self._partition_count(changelog_topic)
            if have is None:
                # 3.
                fut = self._admin.create_topics(
                    [
                        NewTopic(
                            changelog_topic,
                            num_partitions=need,
                            replication_factor=-1,
                            config=dict(self._topic_config),
                        )
                    ]
                )[changelog_topic]
                try:
                    fut.result(self._timeout_s)
                    log.info("created changelog topic %s with %d partitions", changelog_topic, need)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise StateError(f"cannot create changelog topic {changelog_topic!r}: {exc}") from exc
                # 4.
                deadline = time.monotonic() + self._timeout_s
                while (have := self._partition_count(changelog_topic)) is None or have < need:
                    if time.monotonic() > deadline:
                        raise StateError(f"changelog topic {changelog_topic!r} did not appear")
                    time.sleep(0.05)
            if have < need:
                raise StateError(
                    f"changelog topic {changelog_topic!r} has {have} partitions, input topic "
                    f"{input_topic!r} has {need}: add changelog partitions first"
                )
            self._known[changelog_topic] = have
            return have

    def _partition_count(self, topic: str) -> int | None:
        # All topics, not ``list_topics(topic)``: a metadata request naming a missing topic makes
        # brokers with auto-creation enabled create it (without the changelog's topic config).
        md = self._admin.list_topics(timeout=self._timeout_s)
        t = md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            return None
        return len(t.partitions)


class ChangelogWriter:
    """The changelog producer shared by every partition of the worker. Does I/O.

    Invariants (guarded by ``_lock``): ``_ends[tp]`` is one past the highest changelog offset
    acknowledged for changelog partition ``tp``; ``_produced[tp]`` counts records queued for it and
    ``_acked[tp] <= _produced[tp]`` those whose delivery report (success or failure) arrived;
    ``_failures[tp]`` holds the first delivery error of ``tp`` and stays until :meth:`reset` (a lost
    change makes every later commit of the partition unsafe).
    """

    _POLL_EVERY = 256

    def __init__(
        self,
        bootstrap_servers: str,
        producer_config: Mapping[str, object] | None = None,
        buffer_full_timeout_s: float = 30.0,
    ) -> None:
        config: dict[str, object] = {
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
            **dict(producer_config or {}),
        }
        config["on_delivery"] = self._on_delivery
        self._producer = Producer(config)
        self._lock = threading.Lock()
        self._ends: dict[tuple[str, int], int] = {}
        self._failures: dict[tuple[str, int], str] = {}
        self._produced: dict[tuple[str, int], int] = {}
        self._acked: dict[tuple[str, int], int] = {}
        self._produced_total = 0
        self._closed = False
        self._buffer_full_timeout_s = buffer_full_timeout_s

    def _on_delivery(self, err: KafkaError | None, msg: object) -> None:
        tp = (msg.topic(), msg.partition())  # type: ignore[attr-defined]
        with self._lock:
            self._acked[tp] = self._acked.get(tp, 0) + 1
            if err is not None:
                if tp not in self._failures:  # the first loss decides; later ones only repeat it
                    self._failures[tp] = str(err)
                    log.error("changelog record for %s[%d] lost: %s", tp[0], tp[1], err)
            else:
                end = msg.offset() + 1  # type: ignore[attr-defined]
                if end > self._ends.get(tp, 0):
                    self._ends[tp] = end

    def produce(self, topic: str, partition: int, key: bytes, value: bytes | None) -> None:
        """Queue one changelog record; waits (polling) while the local queue is full.

        Raises :class:`StateDurabilityError` when the queue stays full or the producer rejects it.
        """
        deadline = 0.0
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, partition=partition)
                break
            except BufferError:
                now = time.monotonic()
                if deadline == 0.0:
                    deadline = now + self._buffer_full_timeout_s
                elif now > deadline:
                    raise StateDurabilityError(
                        f"changelog producer queue full for {self._buffer_full_timeout_s}s"
                    ) from None
                self._producer.poll(0.05)
            except KafkaException as exc:
                raise StateDurabilityError(
                    f"cannot produce to changelog {topic}[{partition}]: {exc}"
                ) from exc
        tp = (topic, partition)
        with self._lock:
            self._produced[tp] = self._produced.get(tp, 0) + 1
            self._produced_total += 1
            poll = self._produced_total % self._POLL_EVERY == 0
        if poll:
            self._producer.poll(0)

    def flush_partition(self, topic: str, partition: int, timeout_s: float = 60.0) -> None:
        """Wait until every record queued for ``topic[partition]`` *before this call* has its delivery
        report (records other lanes queue meanwhile are not waited for). Blocking.

        Raises :class:`StateDurabilityError` at the deadline or when a record of the partition was lost.
        """
        tp = (topic, partition)
        with self._lock:
            target = self._produced.get(tp, 0)
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                done = self._acked.get(tp, 0) >= target
            if done:
                break
            if time.monotonic() > deadline:
                raise StateDurabilityError(
                    f"changelog records for {topic}[{partition}] unacknowledged after {timeout_s}s"
                )
            self._producer.poll(0.01)
        self.check(topic, partition)

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait until every queued record is acknowledged or failed. Blocking.

        Raises :class:`StateDurabilityError` when records are still queued at the deadline.
        """
        remaining = self._producer.flush(timeout_s)
        if remaining:
            raise StateDurabilityError(f"{remaining} changelog records unacknowledged after {timeout_s}s")

    def check(self, topic: str, partition: int) -> None:
        """Raise :class:`StateDurabilityError` if a change of this changelog partition was lost."""
        with self._lock:
            failure = self._failures.get((topic, partition))
        if failure is not None:
            raise StateDurabilityError(f"a change for {topic}[{partition}] was not written: {failure}")

    def end_offset(self, topic: str, partition: int) -> int:
        """One past the highest acknowledged offset of this worker's writes (0 when none)."""
        with self._lock:
            return self._ends.get((topic, partition), 0)

    def reset(self, topic: str, partition: int) -> None:
        """Forget the partition's recorded loss (when the partition is closed; a reopened partition
        restores from the changelog, so an old loss no longer matters). The produced/acknowledged
        counters stay: acknowledgements of records still in flight at an unclean close must not
        count for the records of the next session."""
        with self._lock:
            self._failures.pop((topic, partition), None)

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush (up to ``timeout_s``), drop what is still queued (its records are not committed, so
        they are processed again) and destroy the producer. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._producer.flush(timeout_s):
            log.warning("closing the changelog producer with %d records undelivered", len(self._producer))
            self._producer.purge()
            self._producer.poll(0)
        self._producer.close()
