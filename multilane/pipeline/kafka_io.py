"""Reading changelog partitions with confluent-kafka: extents, offset ranges, committed offsets. Does I/O.

Works against Apache Kafka and against the embedded broker, whose admin API under-reports end offsets
by up to one producer batch: the *true* end of a partition is found by reading from the reported end
until ``enable.partition.eof`` fires (at most one batch is read), and readers of a range stop at the
first record at or beyond the range end, or at an end-of-partition event at or beyond it (null
records, which the embedded broker never delivers, may be the last of a range).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping, Sequence
from typing import Any

from multilane.pipeline.changes import Change, ChangelogFormatError, decode_change

RawRecord = tuple[bytes | None, bytes | None, int]
"""An undecoded changelog record: ``(key, value, changelog offset)``."""

__all__ = [
    "ChangelogExtentProber",
    "ChangelogRangeReader",
    "ChangelogReadError",
    "committed_offsets",
    "consumer_config",
    "partitions_of",
]

_BATCH = 10_000
_POLL_S = 0.05  # consume() waits this long for a full batch; short, so small reads end promptly


class ChangelogReadError(RuntimeError):
    """A changelog partition could not be read to the expected offset."""


def consumer_config(
    bootstrap: str, extra: Mapping[str, str] | None = None, **overrides: Any
) -> dict[str, Any]:
    """A consumer configuration for reading by ``assign`` (no group membership, no commits)."""
    cfg: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": "multilane-snapshot-reader",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        # librdkafka's default (1000 ms) stalls the next fetch once the local queue fills up.
        "fetch.queue.backoff.ms": 10,
        # A fetch at the end of the partition answers after this long; the end is found sooner.
        "fetch.wait.max.ms": 100,
    }
    cfg.update(extra or {})
    cfg.update(overrides)
    return cfg


def partitions_of(config: Mapping[str, Any], topic: str, timeout_s: float = 10.0) -> list[int]:
    """The partition ids of ``topic`` (ChangelogReadError when it does not exist)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({k: v for k, v in config.items() if not _consumer_only(k)})
    md = admin.list_topics(topic, timeout=timeout_s)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        raise ChangelogReadError(f"topic {topic!r} not found: {None if t is None else t.error}")
    return sorted(t.partitions)


def _known(value: int | None) -> int:
    """A message's offset or partition (always set on consumed messages and end-of-partition events)."""
    if value is None:
        raise ChangelogReadError("the client returned a message without offset or partition")
    return value


def _consumer_only(key: str) -> bool:
    return key in {
        "group.id",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "enable.partition.eof",
        "auto.offset.reset",
        "fetch.queue.backoff.ms",
        "fetch.wait.max.ms",
    }


def committed_offsets(
    config: Mapping[str, Any], group: str, topic: str, partitions: Sequence[int], timeout_s: float = 10.0
) -> dict[int, int | None]:
    """The consumer group's committed offset per input partition (None where nothing is committed)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**config, "group.id": group, "enable.auto.commit": False})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout_s)
    finally:
        consumer.close()
    out: dict[int, int | None] = {}
    for tp in tps:
        if tp.error is not None:
            raise ChangelogReadError(f"committed offset of {topic}[{tp.partition}] for {group}: {tp.error}")
        out[tp.partition] = tp.offset if tp.offset >= 0 else None
    return out


class ChangelogExtentProber:
    """Finds each changelog partition's ``[start, true end)`` at this moment.

    1. ``start`` = the low watermark; a first guess of the end = the high watermark.
    2. Assign every partition at its guessed end and read until each reports end-of-partition; the
       end-of-partition offset (never below the guess) is the true end.
    """

    def __init__(self, config: Mapping[str, Any], timeout_s: float = 60.0) -> None:
        self.config = dict(config)
        self.timeout_s = timeout_s

    def probe(self, topic: str, partitions: Sequence[int]) -> dict[int, tuple[int, int]]:
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        consumer = Consumer(self.config)
        try:
            # 1.
            marks: dict[int, tuple[int, int]] = {}
            for p in partitions:
                lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=self.timeout_s)
                marks[p] = (max(lo, 0), max(hi, 0))
            if not marks:
                return {}
            # 2.
            ends = {p: hi for p, (_lo, hi) in marks.items()}
            pending = set(marks)
            consumer.assign([TopicPartition(topic, p, hi) for p, (_lo, hi) in marks.items()])
            deadline = time.monotonic() + self.timeout_s
            while pending:
                if time.monotonic() > deadline:
                    raise ChangelogReadError(
                        f"no end-of-partition from {topic} partitions {sorted(pending)} in {self.timeout_s}s"
                    )
                for msg in consumer.consume(num_messages=_BATCH, timeout=_POLL_S):
                    err = msg.error()
                    p = _known(msg.partition())
                    if err is None:
                        ends[p] = max(ends[p], _known(msg.offset()) + 1)
                    elif err.code() == KafkaError._PARTITION_EOF:
                        ends[p] = max(ends[p], _known(msg.offset()))
                        pending.discard(p)
                    elif not err.retriable():
                        raise ChangelogReadError(f"reading {topic}[{p}]: {err}")
            return {p: (marks[p][0], ends[p]) for p in marks}
        finally:
            consumer.close()


class ChangelogRangeReader:
    """Reads one changelog partition's offsets ``[start, end)`` in order, decoded.

    ``end=None`` reads to the end of the partition as it is when the reader gets there (the first
    end-of-partition event); :attr:`end_reached` then holds that offset. Raises
    :class:`ChangelogReadError` when nothing arrives for ``idle_timeout_s`` before the end.
    """

    def __init__(self, config: Mapping[str, Any], idle_timeout_s: float = 60.0) -> None:
        self.config = dict(config)
        self.idle_timeout_s = idle_timeout_s
        self.end_reached: int | None = None
        self.records = 0

    def read(self, topic: str, partition: int, start: int, end: int | None) -> Generator[Change, None, None]:
        """The records of ``[start, end)``, decoded one by one (:class:`ChangelogFormatError` at the
        first record that is not a changelog record)."""
        batches = self.read_raw(topic, partition, start, end)
        try:
            for batch in batches:
                for key, value, offset in batch:
                    try:
                        change = decode_change(key, value, offset)
                    except ChangelogFormatError as exc:
                        raise ChangelogFormatError(f"{topic}[{partition}]: {exc}") from exc
                    yield change
        finally:
            batches.close()

    def read_raw(
        self, topic: str, partition: int, start: int, end: int | None
    ) -> Generator[list[RawRecord], None, None]:
        """The records of ``[start, end)`` undecoded, as lists of ``(key, value, offset)`` (one per
        consumed batch; the Spark read task's fast path). Closing the generator closes the consumer.

        1. ``assign`` at ``start``; consume batches of up to 10,000 records.
        2. Stop at the first record at or beyond ``end``, or at an end-of-partition event at or beyond
           it (``end=None``: at the first end-of-partition event; :attr:`end_reached` records where).
        3. :class:`ChangelogReadError` when nothing arrives for ``idle_timeout_s`` before the end.
        """
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        if end is not None and start >= end:
            self.end_reached = end
            return
        consumer = Consumer(self.config)
        try:
            # 1.
            consumer.assign([TopicPartition(topic, partition, start)])
            last_progress = time.monotonic()
            position = start
            eof_code = KafkaError._PARTITION_EOF
            while True:
                msgs = consumer.consume(num_messages=_BATCH, timeout=_POLL_S)
                if not msgs:
                    # 3.
                    if time.monotonic() - last_progress > self.idle_timeout_s:
                        raise ChangelogReadError(
                            f"{topic}[{partition}]: nothing after offset {position} "
                            f"for {self.idle_timeout_s}s (reading [{start}, {end}))"
                        )
                    continue
                last_progress = time.monotonic()
                batch: list[RawRecord] = []
                append = batch.append
                done = False
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        # 2.
                        if err.code() == eof_code:
                            eof = _known(msg.offset())
                            if end is None or eof >= end:
                                self.end_reached = eof if end is None else end
                                done = True
                                break
                            continue
                        if err.retriable():
                            continue
                        raise ChangelogReadError(f"reading {topic}[{partition}]: {err}")
                    offset = _known(msg.offset())
                    if end is not None and offset >= end:
                        self.end_reached = end
                        done = True
                        break
                    position = offset + 1
                    append((msg.key(), msg.value(), offset))
                    if end is not None and position >= end:
                        self.end_reached = end
                        done = True
                        break
                self.records += len(batch)
                if batch:
                    yield batch
                if done:
                    return
        finally:
            consumer.close()
