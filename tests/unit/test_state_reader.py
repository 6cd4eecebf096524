"""ChangelogReader decoding without a broker: the inline fast path, tombstone pairing, corrupt
records (fail / skip), EOF and position tracking. The Kafka consumer is replaced by a fake."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from multilane.formats.changelog import ChangelogCodec
from multilane.worker.state.apply import ChangelogEntry
from multilane.worker.state.errors import ChangelogCorruptError
from multilane.worker.state.reader import ChangelogReader


class FakeMessage:
    def __init__(self, offset: int, key: bytes | None, value: bytes | None, error: KafkaError | None = None):
        self._offset, self._key, self._value, self._error = offset, key, value, error

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> KafkaError | None:
        return self._error


class FakeConsumer:
    def __init__(self, batches: list[list[FakeMessage]]) -> None:
        self.batches = batches

    def consume(self, n: int, timeout: float) -> list[FakeMessage]:
        return self.batches.pop(0) if self.batches else []


def reader(batches: list[list[FakeMessage]], on_corrupt: str = "fail") -> ChangelogReader:
    r = ChangelogReader.__new__(ChangelogReader)
    r.topic, r.partition, r.on_corrupt = "g.t.changelog", 0, on_corrupt  # type: ignore[assignment]
    r._labels = ("t", "0")
    r._consumer = FakeConsumer(batches)
    r.position, r._prev, r.corrupt_skipped = 0, None, 0
    return r


def eof(offset: int) -> FakeMessage:
    return FakeMessage(offset, None, None, KafkaError(KafkaError._PARTITION_EOF))


P = ChangelogCodec.encode_put
D = ChangelogCodec.encode_delete


def test_puts_deletes_paired_and_lone_tombstones() -> None:
    r = reader([[
        FakeMessage(0, b"a", P(b"1", 10, 1)),
        FakeMessage(1, b"a", D(11, 1)),
        FakeMessage(2, b"a", None),  # paired with its envelope: skipped
        FakeMessage(3, b"b", None),  # lone (its envelope was compacted away): delete of unknown source
        FakeMessage(4, b"c", D(12, 3)),
        FakeMessage(5, b"d", None),  # follows c's envelope, but another key: lone
        eof(6),
    ]])  # fmt: skip
    batch = r.read(0.1)
    assert batch.eof and batch.records == 6 and r.position == 6
    assert batch.entries == [
        ChangelogEntry(0, b"a", 10, 1, b"1"),
        ChangelogEntry(1, b"a", 11, 1, None),
        ChangelogEntry(3, b"b", -1, 0, None),
        ChangelogEntry(4, b"c", 12, 3, None),
        ChangelogEntry(5, b"d", -1, 0, None),
    ]


def test_pairing_survives_a_batch_boundary() -> None:
    r = reader([[FakeMessage(0, b"a", D(1, 1))], [FakeMessage(1, b"a", None), eof(2)]])
    assert r.read(0.1).entries == [ChangelogEntry(0, b"a", 1, 1, None)]
    batch = r.read(0.1)
    assert batch.entries == [] and batch.eof and r.position == 2


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (b"k", b"short", "bytes"),
        (b"k", b"XXXP" + bytes(12), "magic"),
        (b"k", b"ML1Z" + bytes(12), "unknown op"),
        (b"k", D(1, 1) + b"x", "payload"),
        (None, P(b"v", 1, 1), "no key"),
    ],
)
def test_corrupt_records_fail_with_their_offset(key: bytes | None, value: bytes, reason: str) -> None:
    r = reader([[FakeMessage(0, b"a", P(b"1", 0, 1)), FakeMessage(7, key, value)]])
    with pytest.raises(ChangelogCorruptError, match=rf"g\.t\.changelog\[0\]@7: .*{reason}") as info:
        r.read(0.1)
    assert info.value.offset == 7


def test_corrupt_records_are_skipped_and_counted() -> None:
    msgs = [FakeMessage(0, b"k", b"garbage-garbage-garbage"), FakeMessage(1, b"k", P(b"ok", 0, 1)), eof(2)]
    r = reader([msgs], on_corrupt="skip")
    batch = r.read(0.1)
    assert batch.entries == [ChangelogEntry(1, b"k", 0, 1, b"ok")]
    assert r.corrupt_skipped == 1 and r.position == 2 and batch.eof


def test_records_after_an_eof_event_clear_it() -> None:
    r = reader([[eof(0), FakeMessage(0, b"a", P(b"1", 0, 1))]])
    batch = r.read(0.1)
    assert not batch.eof and r.position == 1


def test_on_corrupt_is_validated() -> None:
    with pytest.raises(ValueError, match="on_corrupt"):
        ChangelogReader("127.0.0.1:1", "x", 0, input_topic="t", on_corrupt="ignore")  # type: ignore[arg-type]
