"""``ChangelogReader``: reads one changelog partition in offset order and decodes it. Does I/O (Kafka).

The end of the partition is where librdkafka reports ``_PARTITION_EOF`` (``enable.partition.eof``):
on the embedded broker ``get_watermark_offsets`` under-reports the end, the EOF event does not. Every
(re)positioning (:meth:`seek`) makes a fresh fetch, so the next EOF event reflects every record written
before the seek -- the learner's promotion relies on that.

Null-value records: a delete is a ``D`` envelope immediately followed by a tombstone of the same key;
that tombstone is redundant and skipped. A tombstone *not* preceded by its envelope (compaction removed
the envelope) is returned as a delete of unknown source (``source_offset == -1``), which is always
applicable. Corrupt records raise :class:`ChangelogCorruptError` naming their offset, or, with
``on_corrupt="skip"``, are logged, counted in ``multilane_state_corrupt_records_total`` and skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from multilane.formats.changelog import (
    HEADER_SIZE,
    HEADER_STRUCT,
    MAGIC,
    ChangelogCodec,
    ChangelogDecodeError,
)
from multilane.worker.state import metrics
from multilane.worker.state.apply import ChangelogEntry
from multilane.worker.state.errors import ChangelogCorruptError, RestoreError

__all__ = ["ChangelogOffsetError", "ChangelogReader", "OnCorrupt", "ReadBatch", "reader_consumer_config"]

log = logging.getLogger(__name__)

OnCorrupt = Literal["fail", "skip"]

_OUT_OF_RANGE = {KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET}


def reader_consumer_config(
    bootstrap_servers: str, topic: str, overrides: Mapping[str, object] | None = None
) -> dict[str, object]:
    """The confluent-kafka settings of a changelog reader of ``topic`` (``overrides`` win, but for
    ``isolation.level``, always ``read_committed``). Pure."""
    return {
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"multilane-state-restore.{topic}",  # never joins, never commits
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        # an idle learner re-fetches this often; also bounds how long a promotion waits for the
        # fresh fetch that proves it has read to the end
        "fetch.wait.max.ms": 50,
        "fetch.queue.backoff.ms": 10,
        **dict(overrides or {}),
        # Always (overrides cannot lower it): restores and learners see only committed changelog
        # records, never those of an aborted or still-open transaction (exactly-once outputs write the
        # changelog in transactions; records of a plain idempotent producer are visible either way).
        "isolation.level": "read_committed",
    }


class ChangelogOffsetError(RestoreError):
    """The requested changelog offset is not in the partition (the topic was recreated or truncated)."""


@dataclass(slots=True)
class ReadBatch:
    entries: list[ChangelogEntry]
    eof: bool  # the reader reached the end of the partition during this read
    records: int  # changelog records consumed (including skipped tombstones and corrupt records)


class ChangelogReader:
    """Reads one changelog partition. Not thread-safe: one thread uses a reader at a time.

    Invariants: ``position`` is the next changelog offset to read; ``_prev`` is the key of the record
    just before ``position`` when that record was a delete envelope (for tombstone pairing), else None
    (also after a seek elsewhere).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        partition: int,
        *,
        input_topic: str,
        consumer_config: Mapping[str, object] | None = None,
        on_corrupt: OnCorrupt = "fail",
    ) -> None:
        if on_corrupt not in ("fail", "skip"):
            raise ValueError(f"on_corrupt must be 'fail' or 'skip', got {on_corrupt!r}")
        config = reader_consumer_config(bootstrap_servers, topic, consumer_config)
        self.topic = topic
        self.partition = partition
        self.on_corrupt: OnCorrupt = on_corrupt
        self._labels = (input_topic, str(partition))
        self._consumer = Consumer(config)
        self.position = 0
        self._prev: bytes | None = None  # key of the previous record if it was a delete envelope
        self.corrupt_skipped = 0

    def seek(self, offset: int) -> None:
        """Position the reader at ``offset`` with a fresh fetch. Seeking to the current position
        continues the stream (a tombstone right after it still pairs with its envelope).

        Offset 0 is assigned as the literal offset 0, not ``OFFSET_BEGINNING`` (whose resolution costs
        ~0.5 s on the embedded broker); if the log no longer starts at 0 the out-of-range error makes
        :meth:`read` fall back to the beginning.
        """
        self._consumer.assign([TopicPartition(self.topic, self.partition, offset)])
        if offset != self.position:  # a continuation keeps the tombstone pairing state
            self._prev = None
        self.position = offset

    def high_watermark(self) -> int | None:
        """The end offset carried by the latest fetch response (None before the first one)."""
        _low, high = self._consumer.get_watermark_offsets(
            TopicPartition(self.topic, self.partition), cached=True
        )
        return None if high is None or high < 0 else int(high)

    def remaining(self) -> int | None:
        high = self.high_watermark()
        return None if high is None else max(0, high - self.position)

    def probe_end(self, timeout_s: float = 30.0) -> int:
        """The partition's true end offset now (steps 1-2). Moves the reader: seek afterwards. Kafka I/O.

        1. Ask the broker for the high watermark (the embedded broker under-reports it by up to one
           producer batch).
        2. Read from there (a fresh fetch) until the end-of-partition event; its offset is the end.
        Raises :class:`RestoreError` when no end-of-partition event arrives within ``timeout_s``.
        """
        # 1.
        _low, high = self._consumer.get_watermark_offsets(
            TopicPartition(self.topic, self.partition), timeout=timeout_s, cached=False
        )
        # 2.
        self.seek(max(0, int(high)))
        deadline = time.monotonic() + timeout_s
        while not self.read(0.05).eof:
            if time.monotonic() > deadline:
                raise RestoreError(f"no end of changelog {self.topic}[{self.partition}] in {timeout_s}s")
        return self.position

    def read(self, timeout_s: float, max_records: int = 10_000) -> ReadBatch:
        """Consume up to ``max_records`` records (waiting at most ``timeout_s``) and decode them.

        The loop is restore's hot path: a well-formed envelope is decoded inline; anything else
        (null tombstones, corrupt records, errors) takes the slow path through :meth:`_decode`.
        """
        msgs = self._consumer.consume(max_records, timeout_s)
        entries: list[ChangelogEntry] = []
        append = entries.append
        new = tuple.__new__  # the C constructor: half the cost of ChangelogEntry(...) per record
        entry_type = ChangelogEntry
        unpack = HEADER_STRUCT.unpack_from
        eof = False
        records = 0
        last = -1
        prev = self._prev
        for m in msgs:
            err = m.error()
            if err is not None:
                self._prev = prev
                if self._handle_error(err, m.offset()):
                    eof = True
                continue
            records += 1
            eof = False  # a record after an EOF event means the end moved
            offset = cast(int, m.offset())  # records (unlike error events) always carry an offset
            last = offset
            key = m.key()
            value = m.value()
            if key is not None and value is not None and len(value) >= HEADER_SIZE:
                magic, op, src, h = unpack(value)
                if magic == MAGIC and src >= 0:
                    if op == b"P":
                        append(new(entry_type, (offset, key, src, h, value[HEADER_SIZE:])))
                        prev = None
                        continue
                    if op == b"D" and len(value) == HEADER_SIZE:
                        append(new(entry_type, (offset, key, src, h, None)))
                        prev = key
                        continue
            self._prev = prev
            entry = self._decode(offset, key, value)
            prev = self._prev
            if entry is not None:
                append(entry)
        self._prev = prev
        if last >= self.position:
            self.position = last + 1
        return ReadBatch(entries, eof, records)

    def _handle_error(self, err: KafkaError, offset: int | None) -> bool:
        """Handle an error event; True when it is the end of the partition."""
        if err.code() == KafkaError._PARTITION_EOF:
            if offset is not None and offset > self.position:
                self.position = offset
            return True
        if err.code() in _OUT_OF_RANGE:
            if self.position == 0:  # the log does not start at 0 any more: read from its start
                log.info(
                    "changelog %s[%d] does not start at 0; reading from its beginning",
                    self.topic,
                    self.partition,
                )
                self._consumer.assign([TopicPartition(self.topic, self.partition, OFFSET_BEGINNING)])
                return False
            raise ChangelogOffsetError(
                f"changelog {self.topic}[{self.partition}] has no offset {self.position}: {err}"
            )
        if err.fatal() or not err.retriable():
            raise RestoreError(f"reading changelog {self.topic}[{self.partition}]: {err}")
        log.warning("transient error reading changelog %s[%d]: %s", self.topic, self.partition, err)
        return False

    def _decode(self, offset: int, key: bytes | None, value: bytes | None) -> ChangelogEntry | None:
        """One record -> entry (None: skipped). Tombstone pairing: ``_prev`` is the key of the record
        just before when it was a delete envelope, else None."""
        try:
            if key is None:
                raise ChangelogDecodeError("record has no key")
            if value is None:  # null tombstone
                paired = self._prev == key
                self._prev = None
                return None if paired else ChangelogEntry(offset, key, -1, 0, None)
            src, h, new_value = ChangelogCodec.decode_fields(value)
        except ChangelogDecodeError as exc:
            self._prev = None
            err = ChangelogCorruptError(exc.reason, topic=self.topic, partition=self.partition, offset=offset)
            if self.on_corrupt == "fail":
                raise err from None
            self.corrupt_skipped += 1
            metrics.CORRUPT_RECORDS.labels(*self._labels).inc()
            log.error("%s; skipped (on_corrupt='skip')", err)
            return None
        self._prev = key if new_value is None else None
        return ChangelogEntry(offset, key, src, h, new_value)

    def close(self) -> None:
        try:
            self._consumer.close()
        except RuntimeError:  # already closed
            pass


class RateMeter:
    """Smoothed records-per-second over reads (pure; time from ``time.monotonic``)."""

    def __init__(self, window_s: float = 1.0) -> None:
        self._window_s = window_s
        self._mark = time.monotonic()
        self._count = 0
        self.rate = 0.0

    def add(self, n: int) -> float:
        self._count += n
        now = time.monotonic()
        elapsed = now - self._mark
        if elapsed >= self._window_s:
            current = self._count / elapsed
            self.rate = current if self.rate == 0.0 else 0.5 * self.rate + 0.5 * current
            self._mark, self._count = now, 0
        return self.rate
