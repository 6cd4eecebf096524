"""Where progress records live: the progress topic and Kafka commit metadata. Does I/O.

Layout (docs/architecture.md, "Offsets and progress"): topic ``multilane-progress.<group>``, one
partition per input partition index (``index % partitions`` when the topic has fewer), keyed by
``"<topic>/<partition>"``, compacted. Each commit cycle writes the record and waits for its delivery
before the offset is committed; the encoded record also rides along as commit metadata when it fits in
4000 bytes. On assignment the worker prefers commit metadata (Apache Kafka returns it) and falls back
to the newest record for the key in the progress topic (brokers that drop metadata).

A progress record only ever claims that records are complete, which stays true forever, so a record
from any earlier commit cycle is safe to use; the base-offset check below is belt and braces.
Anything undecodable, for another group/topic/partition, or stale (``base_offset`` differs from the
committed offset) is logged as a warning and ignored: the records are then replayed, never skipped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from multilane.worker.progress import (
    ProgressCodec,
    ProgressDecodeError,
    ProgressRecord,
    fits_in_metadata,
)

__all__ = ["ProgressStore", "choose_progress", "progress_key"]

log = logging.getLogger(__name__)


def progress_key(topic: str, partition: int) -> bytes:
    return f"{topic}/{partition}".encode()


def choose_progress(
    candidate: bytes | str | None,
    *,
    source: str,
    group: str,
    topic: str,
    partition: int,
    committed: int | None,
) -> ProgressRecord | None:
    """Decode and vet one candidate progress record; None (with a warning) when it must not be used."""
    if candidate is None or candidate == "" or candidate == b"":
        return None
    where = f"{topic}/{partition} ({source})"
    try:
        rec = (ProgressCodec.decode_text(candidate) if isinstance(candidate, str)
               else ProgressCodec.decode(candidate))
    except ProgressDecodeError as exc:
        log.warning("ignoring undecodable progress record for %s: %s; its records will be replayed",
                    where, exc)
        return None
    if (rec.group, rec.topic, rec.partition) != (group, topic, partition):
        log.warning("ignoring progress record for %s: it names %s/%s/%d (another client)",
                    where, rec.group, rec.topic, rec.partition)
        return None
    if committed is None or rec.base_offset != committed:
        log.warning("ignoring stale progress record for %s: base offset %d != committed offset %s",
                    where, rec.base_offset, committed)
        return None
    return rec


class ProgressStore:
    """Writes progress records (async, on the engine's loop) and reads them back (blocking).

    Invariant: ``_partitions`` is the progress topic's partition count once :meth:`ensure_topic` ran
    (None before); writes go to ``index % _partitions``.
    """

    def __init__(self, bootstrap: str, group: str, topic: str, producer: Any,
                 client_config: dict[str, Any] | None = None) -> None:
        self._bootstrap = bootstrap
        self._group = group
        self.topic = topic
        self._producer = producer
        self._client_config = dict(client_config or {})
        self._partitions: int | None = None

    # -- topic -------------------------------------------------------------------------------------

    def ensure_topic(self, min_partitions: int, timeout: float = 10.0) -> int:
        """Create the progress topic if missing (blocking); return its partition count."""
        admin = AdminClient({"bootstrap.servers": self._bootstrap, **self._client_config})
        md = admin.list_topics(self.topic, timeout=timeout)
        t = md.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            futures = admin.create_topics([NewTopic(
                self.topic, num_partitions=max(1, min_partitions), replication_factor=-1,
                config={"cleanup.policy": "compact"},
            )])
            try:
                futures[self.topic].result(timeout)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
                    raise
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                t = admin.list_topics(self.topic, timeout=timeout).topics.get(self.topic)
                if t is not None and t.error is None and t.partitions:
                    break
                time.sleep(0.05)
        if t is None or not t.partitions:
            raise RuntimeError(f"progress topic {self.topic} did not appear")
        self._partitions = len(t.partitions)
        if self._partitions < min_partitions:
            log.warning("progress topic %s has %d partitions, fewer than %d input partitions; sharing",
                        self.topic, self._partitions, min_partitions)
        return self._partitions

    def _index(self, partition: int) -> int:
        if self._partitions is None:
            raise RuntimeError("ProgressStore.ensure_topic() must run before reads and writes")
        return partition % self._partitions

    # -- writing (event loop) ------------------------------------------------------------------------

    @staticmethod
    def metadata_for(encoded: bytes) -> str | None:
        """The commit-metadata text of an encoded record, or None when it does not fit."""
        import base64

        text = base64.b64encode(encoded).decode("ascii")
        return text if fits_in_metadata(text) else None

    def write(self, topic: str, partition: int, encoded: bytes) -> asyncio.Future[None]:
        """Produce one encoded progress record of ``topic/partition``.

        The returned future resolves when the broker acknowledged it.

        The engine polls the producer on its loop, so the delivery callback runs on the loop thread.
        The future fails with :class:`KafkaException` when the delivery fails.
        """
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def delivered(err: Any, _msg: Any) -> None:
            if fut.done():
                return
            if err is not None:
                fut.set_exception(KafkaException(err))
            else:
                fut.set_result(None)

        try:
            self._producer.produce(
                self.topic, value=encoded, key=progress_key(topic, partition),
                partition=self._index(partition), on_delivery=delivered,
            )
        except (BufferError, KafkaException) as exc:
            fut.set_exception(exc)
        return fut

    # -- reading (blocking; call from a worker thread) ---------------------------------------------

    def read_latest(self, topic: str, partition: int, timeout: float = 15.0,
                    quiet_s: float = 0.3) -> bytes | None:
        """The newest progress value for ``topic/partition`` in the progress topic (blocking).

        1. Read the partition's watermarks; empty -> None.
        2. Consume from the low watermark until the end-of-partition event: it comes when the read
           position reaches the high watermark carried in a fetch response, which is exact even on
           brokers whose watermark API under-reports the end by up to one producer batch. Without
           that event, read until the reported high watermark is passed *and* the broker has been
           quiet for ``quiet_s`` (or the deadline passes).
        3. Keep the last value whose key matches.
        """
        key = progress_key(topic, partition)
        idx = self._index(partition)
        consumer = Consumer({
            "bootstrap.servers": self._bootstrap,
            "group.id": f"{self._group}.progress-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 50,
            **self._client_config,
        })
        try:
            # 1. watermarks
            lo, hi = consumer.get_watermark_offsets(TopicPartition(self.topic, idx), timeout=timeout)
            if hi <= lo:
                return None
            # 2. read
            consumer.assign([TopicPartition(self.topic, idx, lo)])
            newest: bytes | None = None
            deadline = time.monotonic() + timeout
            last_offset = -1
            quiet_since = time.monotonic()
            while time.monotonic() < deadline:
                msgs = consumer.consume(num_messages=1000, timeout=0.05)
                if not msgs:
                    if last_offset >= hi - 1 and time.monotonic() - quiet_since >= quiet_s:
                        break
                    continue
                quiet_since = time.monotonic()
                at_end = False
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        at_end = at_end or err.code() == KafkaError._PARTITION_EOF
                        continue
                    off = m.offset()
                    if off is not None:
                        last_offset = off
                    # 3. newest for our key
                    if m.key() == key:
                        newest = m.value()
                if at_end:
                    break
            else:
                log.warning("reading progress for %s/%d timed out; using what was read", topic, partition)
            return newest
        finally:
            consumer.close()
