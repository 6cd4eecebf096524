"""Where progress records live: the progress topic and Kafka commit metadata. Does I/O.

Layout (docs/architecture.md, "Offsets and progress"): topic ``multilane-progress.<group>``, one
partition per input partition index (``index % partitions`` when the topic has fewer), keyed by
``"<topic>/<partition>"``, compacted. Two writers fill it: each commit cycle writes the record for the
offset it is about to commit and waits for its delivery before committing (the encoded record also
rides along as commit metadata when it fits in 4000 bytes); between commits the progress cycle
(``multilane.worker.commits.ProgressCycle``) writes fresher records every ``progress_interval_ms``,
naming the committed offset (and the offset of a commit still awaiting its answer) as their base.

On assignment the worker reads the progress topic backwards from its end and uses the newest record
whose ``base_offset`` equals the committed offset (:meth:`ProgressStore.read_progress`); commit metadata
is the fallback (it is only as fresh as the last commit).

A progress record only ever claims that records are complete, which stays true forever, so a record
from any earlier cycle is safe to use; the base-offset check is belt and braces (an offset reset to
an older position is not silently undone by the progress of the newer one). Anything undecodable,
for another group/topic/partition, or stale (``base_offset`` differs from the committed offset) is
not used: the records are then replayed, never skipped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from multilane.formats.progress import (
    ProgressCodec,
    ProgressDecodeError,
    ProgressRecord,
    fits_in_metadata,
)

__all__ = ["ProgressStore", "choose_progress", "progress_key", "vet_progress"]

log = logging.getLogger(__name__)


def progress_key(topic: str, partition: int) -> bytes:
    return f"{topic}/{partition}".encode()


def vet_progress(
    candidate: bytes | str | None,
    *,
    group: str,
    topic: str,
    partition: int,
    committed: int | None,
) -> tuple[ProgressRecord | None, str, str]:
    """Decode and vet one candidate: ``(record, "", "")`` when it may be used, else ``(None, fault,
    detail)`` with ``fault`` one of ``empty``, ``undecodable``, ``foreign`` (another group, topic or
    partition) and ``stale`` (``base_offset`` differs from ``committed``)."""
    if candidate is None or candidate == "" or candidate == b"":
        return None, "empty", ""
    try:
        rec = (ProgressCodec.decode_text(candidate) if isinstance(candidate, str)
               else ProgressCodec.decode(candidate))
    except ProgressDecodeError as exc:
        return None, "undecodable", str(exc)
    if (rec.group, rec.topic, rec.partition) != (group, topic, partition):
        return None, "foreign", f"it names {rec.group}/{rec.topic}/{rec.partition}"
    if committed is None or rec.base_offset != committed:
        return None, "stale", f"base offset {rec.base_offset} != committed offset {committed}"
    return rec, "", ""


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
    rec, fault, detail = vet_progress(candidate, group=group, topic=topic, partition=partition,
                                      committed=committed)
    if rec is None and fault != "empty":
        log.warning("ignoring %s progress record for %s/%d (%s): %s; its records will be replayed",
                    fault, topic, partition, source, detail)
    return rec


class ProgressStore:
    """Writes progress records (async, on the engine's loop) and reads them back (blocking).

    Invariant: ``_partitions`` is the progress topic's partition count once :meth:`ensure_topic` ran
    (None before); writes go to ``index % _partitions``.
    """

    def __init__(self, bootstrap: str, group: str, topic: str, producer: Any,
                 client_config: dict[str, Any] | None = None,
                 on_produce: Callable[[], None] | None = None) -> None:
        """``on_produce``: called (on the loop) after each record is produced: whoever serves the
        producer's delivery callbacks is to poll it soon."""
        self._bootstrap = bootstrap
        self._group = group
        self.topic = topic
        self._producer = producer
        self._on_produce = on_produce
        self._client_config = dict(client_config or {})
        self._partitions: int | None = None

    # -- topic -------------------------------------------------------------------------------------

    def ensure_topic(self, min_partitions: int, timeout: float = 10.0) -> int:
        """Create the progress topic if missing (blocking); return its partition count."""
        admin = AdminClient({"bootstrap.servers": self._bootstrap, **self._client_config})
        # All topics, not ``list_topics(self.topic)``: a metadata request naming a missing topic makes
        # brokers with auto-creation enabled create it (default partitions, not compacted).
        md = admin.list_topics(timeout=timeout)
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
                t = admin.list_topics(timeout=timeout).topics.get(self.topic)
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

    def partition_index(self, partition: int) -> int:
        """The progress topic's partition that holds ``partition``'s records."""
        return self._index(partition)

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
        if self._on_produce is not None:
            self._on_produce()
        return fut

    # -- reading (blocking; call from a worker thread) ---------------------------------------------

    def read_latest(self, topic: str, partition: int, timeout: float = 15.0,
                    quiet_s: float = 0.3) -> bytes | None:
        """The newest progress value for ``topic/partition`` in the progress topic (blocking).

        1. Read the partition's watermarks; empty -> None.
        2. Read from the low watermark to the end (see :meth:`_scan`).
        3. Keep the last value whose key matches.
        """
        consumer = self._reader()
        try:
            idx = self._index(partition)
            lo, hi = consumer.get_watermark_offsets(TopicPartition(self.topic, idx), timeout=timeout)
            if hi <= lo:
                return None
            found = self._scan(consumer, idx, progress_key(topic, partition), lo, None, hi,
                               time.monotonic() + timeout, quiet_s)
            return found[-1][1] if found else None
        finally:
            consumer.close()

    def read_progress(self, topic: str, partition: int, committed: int | None, *,
                      timeout: float = 15.0, quiet_s: float = 0.3, chunk: int = 2000,
                      lookback: int = 20_000) -> ProgressRecord | None:
        """The newest usable progress record of ``topic/partition`` for ``committed`` (blocking).

        1. ``committed`` None -> None (a record needs a committed offset to accompany).
        2. Read the last ``chunk`` offsets of the progress partition up to its end (see :meth:`_scan`),
           then, while nothing usable was found, the ``chunk`` offsets before those, and so on.
        3. Within what was read, newest first: the first record with ``base_offset == committed``
           (and our group/topic/partition) is the answer. Stop searching (None) at a record with an
           older base (everything before it is older still: a worker ends every group of records with
           one of the highest base it wrote, ``PartitionRuntime.progress_floor``), when more than two newer
           bases were passed (only a commit still unanswered at a crash leaves newer bases behind), or
           after ``lookback`` offsets.
        """
        # 1.
        if committed is None:
            return None
        key = progress_key(topic, partition)
        consumer = self._reader()
        try:
            idx = self._index(partition)
            lo, hi = consumer.get_watermark_offsets(TopicPartition(self.topic, idx), timeout=timeout)
            if hi <= lo:
                return None
            deadline = time.monotonic() + timeout
            newer_bases: set[int] = set()
            end: int | None = None  # None: to the end of the partition
            start = max(lo, hi - chunk)
            while True:
                # 2.
                found = self._scan(consumer, idx, key, start, end, hi, deadline, quiet_s)
                # 3.
                for off, value in reversed(found):
                    rec, fault, detail = vet_progress(value, group=self._group, topic=topic,
                                                      partition=partition, committed=committed)
                    if rec is not None:
                        return rec
                    if fault == "empty":
                        continue
                    if fault != "stale":
                        log.warning("ignoring %s progress record for %s/%d (progress topic): %s",
                                    fault, topic, partition, detail)
                        continue
                    base = ProgressCodec.decode(value).base_offset
                    if base < committed:
                        log.info("progress of %s/%d: a record of base %d (at %d) is newer than any of the "
                                 "committed offset %d", topic, partition, base, off, committed)
                        return None
                    newer_bases.add(base)
                    if len(newer_bases) > 2:
                        log.info("progress of %s/%d: records of bases %s above the committed offset %d "
                                 "and none of it", topic, partition, sorted(newer_bases), committed)
                        return None
                if start <= lo or hi - start >= lookback or time.monotonic() >= deadline:
                    return None
                end, start = start, max(lo, start - chunk)
        finally:
            consumer.close()

    def _reader(self) -> Any:
        return Consumer({
            "bootstrap.servers": self._bootstrap,
            "group.id": f"{self._group}.progress-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 50,
            **self._client_config,
        })

    def _scan(self, consumer: Any, idx: int, key: bytes, start: int, end: int | None, hi: int,
              deadline: float, quiet_s: float) -> list[tuple[int, bytes]]:
        """``(offset, value)`` of the records with ``key`` at offsets in ``[start, end)`` (blocking).

        ``end`` None: up to the end of the partition, i.e. until the end-of-partition event: it comes
        when the read position reaches the high watermark carried in a fetch response, which is exact
        even on brokers whose watermark API under-reports the end by up to one producer batch. Without
        that event, read until the reported high watermark ``hi`` is passed *and* the broker has been
        quiet for ``quiet_s`` (or the deadline passes). A partition written to all the time (every
        worker's progress records) gives neither: there the read ends once it passed the high watermark
        carried in its first fetch response (everything written before the read started).
        ``end`` given: until an offset >= ``end``.
        """
        tp = TopicPartition(self.topic, idx)
        consumer.assign([TopicPartition(self.topic, idx, start)])
        out: list[tuple[int, bytes]] = []
        last_offset = start - 1
        fetched_end: int | None = None  # the high watermark of the first fetch response
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            msgs = consumer.consume(num_messages=1000, timeout=0.05)
            if not msgs:
                target = hi if end is None else end
                if last_offset >= target - 1 and time.monotonic() - quiet_since >= quiet_s:
                    return out
                continue
            quiet_since = time.monotonic()
            at_end = False
            for m in msgs:
                err = m.error()
                if err is not None:
                    at_end = at_end or err.code() == KafkaError._PARTITION_EOF
                    continue
                off = m.offset()
                if off is None:
                    continue
                if end is not None and off >= end:
                    return out
                last_offset = off
                if m.key() == key:
                    out.append((off, m.value()))
            if at_end:
                return out
            if end is None and fetched_end is None:
                _lo, cached_hi = consumer.get_watermark_offsets(tp, cached=True)
                fetched_end = max(hi, cached_hi) if cached_hi is not None and cached_hi >= 0 else None
            if end is None and fetched_end is not None and last_offset >= fetched_end - 1:
                return out
        log.warning("reading progress from %s[%d] timed out; using what was read", self.topic, idx)
        return out
