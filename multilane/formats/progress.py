"""Progress beyond the committed offset: :class:`ProgressRecord` and its binary/text :class:`ProgressCodec`.

Pure: no I/O (``zlib`` and ``base64`` only). ``multilane.worker.progress_store`` writes what this module
encodes to the progress topic and to commit metadata.

A committed offset says "everything below is done". A progress record says, in addition, which
fetched records *at or above* the committed offset (``base_offset``) are done, so that a restart
replays only the records that really were not finished:

- ``key`` mode: ``ranges`` = ``(range_start, range_end, next_offset)`` triples that tile the hash space;
  a record whose key hash lies in ``[range_start, range_end)`` and whose offset is below
  ``next_offset`` is done.
- ``unordered`` mode: ``done_offsets`` = the done offsets above the base as half-open intervals.
- ``partition`` mode: nothing beyond the committed offset.

Binary format, version 1 (all integers are unsigned LEB128 varints unless stated)::

    magic  b"MLP"  (3 bytes)
    version         (1 byte, = 1)
    flags           (1 byte; bit 0: the body is zlib-compressed; other bits must be 0)
    body            (raw or zlib-compressed, see below)
    crc32           (4 bytes big-endian, zlib.crc32 of every preceding byte)

    body := mode (1 byte: b"K" | b"P" | b"U")
            group, topic, writer   (each: varint length + UTF-8 bytes)
            partition, base_offset
            K: n, then n times: width (= range_end - range_start), next_offset - base_offset
               (ranges are contiguous from 0, so starts are implied; the widths must sum to 2**32)
            U: n, then n times: gap, length -- run-length runs over [base_offset, high): ``gap``
               offsets not done, then ``length`` offsets done (gap >= 1 except for the first run,
               length >= 1), so mostly contiguous completions cost a few bytes
            P: nothing

The encoder compresses the body when that makes it smaller (an even key layout compresses to almost
nothing). The decoder rejects anything malformed -- bad magic, version, flags, CRC, truncation,
trailing bytes, lengths, ranges that do not tile the space, ``next_offset < base_offset`` -- with a
:class:`ProgressDecodeError`, and never raises anything else.

Text form (Kafka commit metadata is a string): standard base64 of the binary form.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import dataclasses
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from multilane.api import OrderingMode
from multilane.formats.keyranges import HASH_SPACE

__all__ = [
    "METADATA_LIMIT",
    "ProgressCodec",
    "ProgressDecodeError",
    "ProgressRecord",
    "fits_in_metadata",
    "intervals_from_offsets",
    "union_progress",
]

MAGIC = b"MLP"
VERSION = 1
FLAG_ZLIB = 0x01
METADATA_LIMIT = 4000  # bytes of commit metadata multilane allows itself (Kafka's default max is 4096)

# Decoder limits: far above anything the engine writes, low enough that a corrupt length cannot make
# the decoder allocate or loop without bound.
MAX_STRING_BYTES = 4096
MAX_ENTRIES = 1 << 22
MAX_BODY_BYTES = 64 << 20
MAX_OFFSET = (1 << 63) - 1

_MODE_BYTES: dict[OrderingMode, int] = {
    OrderingMode.KEY: ord("K"),
    OrderingMode.PARTITION: ord("P"),
    OrderingMode.UNORDERED: ord("U"),
}
_BYTE_MODES = {v: k for k, v in _MODE_BYTES.items()}
_BIG = 1 << 64  # sorts after every real offset / hash in tuple comparisons


class ProgressDecodeError(ValueError):
    """Bytes or text that are not a valid encoded progress record."""


def intervals_from_offsets(offsets: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Sorted, merged half-open intervals ``[start, end)`` covering exactly the given offsets."""
    out: list[tuple[int, int]] = []
    for o in sorted(set(offsets)):
        if out and out[-1][1] == o:
            out[-1] = (out[-1][0], o + 1)
        else:
            out.append((o, o + 1))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ProgressRecord:
    """Which records at or above ``base_offset`` of one partition are done.

    The invariants are written on the fields they govern; construction checks them and raises
    ValueError on a violation, so every ProgressRecord in existence is well-formed.
    """

    group: str
    topic: str
    partition: int  # >= 0
    base_offset: int  # >= 0: the committed offset this record accompanies
    writer: str  # id of the worker that wrote it
    mode: OrderingMode
    # key mode only (empty otherwise): (range_start, range_end, next_offset) triples, sorted, contiguous,
    # covering [0, 2**32) exactly; next_offset >= base_offset.
    ranges: tuple[tuple[int, int, int], ...] = ()
    # unordered mode only (empty otherwise): done offsets as half-open intervals [start, end), sorted,
    # disjoint and non-adjacent (merged), every start >= base_offset, every interval non-empty.
    done_offsets: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        _validate(self)

    def is_done(self, offset: int, key_hash: int) -> bool:
        """Whether the record at ``offset`` with routing hash ``key_hash`` is already done.

        Offsets below ``base_offset`` are committed, hence done. Above it: key mode looks up the range
        that holds ``key_hash``; unordered mode looks up the done intervals; partition mode says no.
        """
        if offset < self.base_offset:
            return True
        if self.mode is OrderingMode.KEY:
            i = bisect.bisect_right(self.ranges, (key_hash, _BIG, _BIG)) - 1
            if i < 0 or key_hash >= self.ranges[i][1]:
                raise ValueError(f"key hash {key_hash} outside [0, 2**32)")
            return offset < self.ranges[i][2]
        if self.mode is OrderingMode.UNORDERED:
            i = bisect.bisect_right(self.done_offsets, (offset, _BIG)) - 1
            return i >= 0 and offset < self.done_offsets[i][1]
        return False

    @property
    def high(self) -> int:
        """One past the highest offset this record says anything about (``base_offset`` if none)."""
        if self.mode is OrderingMode.KEY and self.ranges:
            return max(self.base_offset, max(r[2] for r in self.ranges))
        if self.mode is OrderingMode.UNORDERED and self.done_offsets:
            return self.done_offsets[-1][1]
        return self.base_offset

    def done_count_above_base(self) -> int:
        """Unordered mode: how many offsets at or above the base are done (0 in other modes)."""
        return sum(e - s for s, e in self.done_offsets)


def union_progress(own: ProgressRecord, restored: ProgressRecord) -> ProgressRecord:
    """``own`` (base ``B``) extended by what ``restored`` (the record a partition was opened with) says
    is done at or above ``B`` (pure). Both only ever claim completed records, so the union is true;
    a new owner that has not yet fetched past what it restored must not write a record claiming less
    (with exactly-once outputs the records it dropped would run again, and repeat their outputs).
    Key mode: each hash interval of both layouts keeps the larger next offset; unordered mode: the
    done intervals at or above ``B`` of both; otherwise, or with another mode, ``own``."""
    if own.mode is not restored.mode:
        return own
    base = own.base_offset
    if own.mode is OrderingMode.KEY:
        cuts = sorted({r[0] for r in own.ranges} | {r[0] for r in restored.ranges})
        ends = [*cuts[1:], own.ranges[-1][1]]
        ranges: list[tuple[int, int, int]] = []
        for start, end in zip(cuts, ends, strict=True):
            nxt = max(_next_at(own.ranges, start), _next_at(restored.ranges, start), base)
            if ranges and ranges[-1][2] == nxt:
                ranges[-1] = (ranges[-1][0], end, nxt)
            else:
                ranges.append((start, end, nxt))
        return dataclasses.replace(own, ranges=tuple(ranges))
    if own.mode is OrderingMode.UNORDERED:
        clipped = ((max(a, base), b) for a, b in restored.done_offsets if b > base)
        spans = sorted([*own.done_offsets, *clipped])
        merged: list[tuple[int, int]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return dataclasses.replace(own, done_offsets=tuple(merged))
    return own


def _next_at(ranges: tuple[tuple[int, int, int], ...], key_hash: int) -> int:
    i = bisect.bisect_right(ranges, (key_hash, _BIG, _BIG)) - 1
    return ranges[i][2]


def _validate(rec: ProgressRecord) -> None:
    if not isinstance(rec.mode, OrderingMode):
        raise ValueError(f"mode must be an OrderingMode, got {rec.mode!r}")
    for name in ("group", "topic", "writer"):
        v = getattr(rec, name)
        if not isinstance(v, str):
            raise ValueError(f"{name} must be a str, got {type(v).__name__}")
        if len(v.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES:
            raise ValueError(f"{name} longer than {MAX_STRING_BYTES} bytes")
    if not isinstance(rec.partition, int) or rec.partition < 0:
        raise ValueError(f"partition must be an int >= 0, got {rec.partition!r}")
    if not isinstance(rec.base_offset, int) or not 0 <= rec.base_offset <= MAX_OFFSET:
        raise ValueError(f"base_offset must be an int in [0, 2**63), got {rec.base_offset!r}")
    if rec.mode is not OrderingMode.KEY and rec.ranges:
        raise ValueError(f"{rec.mode.value} mode carries no key ranges")
    if rec.mode is not OrderingMode.UNORDERED and rec.done_offsets:
        raise ValueError(f"{rec.mode.value} mode carries no done offsets")
    if rec.mode is OrderingMode.KEY:
        _validate_ranges(rec.ranges, rec.base_offset)
    elif rec.mode is OrderingMode.UNORDERED:
        _validate_intervals(rec.done_offsets, rec.base_offset)


def _validate_ranges(ranges: tuple[tuple[int, int, int], ...], base: int) -> None:
    if not ranges:
        raise ValueError("key mode needs at least one range covering [0, 2**32)")
    expected_start = 0
    for i, r in enumerate(ranges):
        if not (isinstance(r, tuple) and len(r) == 3 and all(isinstance(x, int) for x in r)):
            raise ValueError(f"range {i} must be a (start, end, next_offset) int triple, got {r!r}")
        start, end, nxt = r
        if start != expected_start:
            raise ValueError(f"range {i} starts at {start}, expected {expected_start}: ranges must tile")
        if end <= start:
            raise ValueError(f"range {i} [{start}, {end}) is empty or reversed")
        if end > HASH_SPACE:
            raise ValueError(f"range {i} ends at {end}, beyond 2**32")
        if not base <= nxt <= MAX_OFFSET:
            raise ValueError(f"range {i} next_offset {nxt} is below base_offset {base} (or too large)")
        expected_start = end
    if expected_start != HASH_SPACE:
        raise ValueError(f"ranges end at {expected_start}, must cover up to 2**32")


def _validate_intervals(intervals: tuple[tuple[int, int], ...], base: int) -> None:
    prev_end: int | None = None
    for i, iv in enumerate(intervals):
        if not (isinstance(iv, tuple) and len(iv) == 2 and all(isinstance(x, int) for x in iv)):
            raise ValueError(f"done interval {i} must be a (start, end) int pair, got {iv!r}")
        start, end = iv
        if start < base:
            raise ValueError(f"done interval {i} starts at {start}, below base_offset {base}")
        if end <= start or end > MAX_OFFSET:
            raise ValueError(f"done interval {i} [{start}, {end}) is empty, reversed or too large")
        if prev_end is not None and start <= prev_end:
            raise ValueError(f"done interval {i} starts at {start}: intervals must be sorted and merged")
        prev_end = end


# -- varints ----------------------------------------------------------------------------------------


def _put_varint(out: bytearray, v: int) -> None:
    if v < 0:
        raise ValueError(f"cannot encode negative value {v}")
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


class _Reader:
    """Cursor over a body; every read raises ProgressDecodeError when the data runs out or is invalid."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def byte(self, what: str) -> int:
        if self.pos >= len(self.buf):
            raise ProgressDecodeError(f"truncated: missing {what}")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self, what: str, limit: int = MAX_OFFSET) -> int:
        result = shift = 0
        for _ in range(10):
            b = self.byte(what)
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                if result > limit:
                    raise ProgressDecodeError(f"{what} {result} exceeds {limit}")
                return result
            shift += 7
        raise ProgressDecodeError(f"{what}: varint longer than 10 bytes")

    def string(self, what: str) -> str:
        n = self.varint(f"{what} length", MAX_STRING_BYTES)
        if self.pos + n > len(self.buf):
            raise ProgressDecodeError(f"truncated: {what} needs {n} bytes")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProgressDecodeError(f"{what} is not valid UTF-8") from exc


# -- codec ------------------------------------------------------------------------------------------


def fits_in_metadata(text: str, limit: int = METADATA_LIMIT) -> bool:
    """Whether an encoded text fits in Kafka commit metadata of ``limit`` bytes."""
    return len(text.encode("ascii")) <= limit


class ProgressCodec:
    """Encodes :class:`ProgressRecord` to the versioned binary format (and base64 text) and back."""

    @staticmethod
    def _encode_body(rec: ProgressRecord) -> bytes:
        body = bytearray()
        body.append(_MODE_BYTES[rec.mode])
        for s in (rec.group, rec.topic, rec.writer):
            raw = s.encode("utf-8")
            _put_varint(body, len(raw))
            body += raw
        _put_varint(body, rec.partition)
        _put_varint(body, rec.base_offset)
        if rec.mode is OrderingMode.KEY:
            _put_varint(body, len(rec.ranges))
            for start, end, nxt in rec.ranges:
                _put_varint(body, end - start)
                _put_varint(body, nxt - rec.base_offset)
        elif rec.mode is OrderingMode.UNORDERED:
            _put_varint(body, len(rec.done_offsets))
            prev = rec.base_offset
            for start, end in rec.done_offsets:
                _put_varint(body, start - prev)
                _put_varint(body, end - start)
                prev = end
        return bytes(body)

    @classmethod
    def encode(cls, rec: ProgressRecord) -> bytes:
        """The binary form of ``rec`` (compressed when that is smaller)."""
        if not isinstance(rec, ProgressRecord):
            raise TypeError(f"expected ProgressRecord, got {type(rec).__name__}")
        body = cls._encode_body(rec)
        flags = 0
        if len(body) > 64:
            packed = zlib.compress(body, 6)
            if len(packed) < len(body):
                body, flags = packed, FLAG_ZLIB
        out = bytearray(MAGIC)
        out.append(VERSION)
        out.append(flags)
        out += body
        out += zlib.crc32(out).to_bytes(4, "big")
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes) -> ProgressRecord:
        """Parse the binary form; :class:`ProgressDecodeError` on any malformed input.

        1. Check the frame: length, magic, version, flags, CRC.
        2. Decompress the body if flagged (bounded output size).
        3. Parse the header and the mode-specific entries; reject trailing bytes.
        4. Build the record, turning any invariant violation into a ProgressDecodeError.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ProgressDecodeError(f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
        # 1. frame
        if len(data) < len(MAGIC) + 2 + 4:
            raise ProgressDecodeError(f"truncated: {len(data)} bytes is shorter than the frame")
        if data[:3] != MAGIC:
            raise ProgressDecodeError(f"bad magic {data[:3]!r}, expected {MAGIC!r}")
        if data[3] != VERSION:
            raise ProgressDecodeError(f"unsupported progress format version {data[3]} (this reads {VERSION})")
        flags = data[4]
        if flags & ~FLAG_ZLIB:
            raise ProgressDecodeError(f"unknown flags 0x{flags:02x}")
        if zlib.crc32(data[:-4]) != int.from_bytes(data[-4:], "big"):
            raise ProgressDecodeError("CRC mismatch: the record is truncated or corrupt")
        body = data[5:-4]
        # 2. decompress
        if flags & FLAG_ZLIB:
            try:
                d = zlib.decompressobj()
                body = d.decompress(body, MAX_BODY_BYTES)
                if d.unconsumed_tail or not d.eof or d.unused_data:
                    raise ProgressDecodeError("compressed body is truncated, oversized or has trailing data")
            except zlib.error as exc:
                raise ProgressDecodeError(f"compressed body is corrupt: {exc}") from exc
        # 3. parse
        r = _Reader(body)
        mode_byte = r.byte("mode")
        mode = _BYTE_MODES.get(mode_byte)
        if mode is None:
            raise ProgressDecodeError(f"unknown mode byte {mode_byte!r}")
        group = r.string("group")
        topic = r.string("topic")
        writer = r.string("writer")
        partition = r.varint("partition", (1 << 31) - 1)
        base = r.varint("base_offset")
        ranges: list[tuple[int, int, int]] = []
        intervals: list[tuple[int, int]] = []
        if mode is OrderingMode.KEY:
            n = r.varint("range count", MAX_ENTRIES)
            start = 0
            for i in range(n):
                width = r.varint(f"range {i} width", HASH_SPACE)
                delta = r.varint(f"range {i} next_offset", MAX_OFFSET - base)
                ranges.append((start, start + width, base + delta))
                start += width
                if start > HASH_SPACE:
                    raise ProgressDecodeError(f"range {i} ends beyond 2**32")
        elif mode is OrderingMode.UNORDERED:
            n = r.varint("done run count", MAX_ENTRIES)
            prev = base
            for i in range(n):
                gap = r.varint(f"done run {i} gap")
                length = r.varint(f"done run {i} length")
                start = prev + gap
                prev = start + length
                if prev > MAX_OFFSET:
                    raise ProgressDecodeError(f"done run {i} ends beyond 2**63")
                intervals.append((start, prev))
        if r.pos != len(body):
            raise ProgressDecodeError(f"{len(body) - r.pos} trailing bytes after the record")
        # 4. build
        try:
            return ProgressRecord(
                group=group,
                topic=topic,
                partition=partition,
                base_offset=base,
                writer=writer,
                mode=mode,
                ranges=tuple(ranges),
                done_offsets=tuple(intervals),
            )
        except ValueError as exc:
            raise ProgressDecodeError(f"invalid progress record: {exc}") from exc

    @classmethod
    def encode_text(cls, rec: ProgressRecord) -> str:
        """Base64 text of the binary form, for Kafka commit metadata."""
        return base64.b64encode(cls.encode(rec)).decode("ascii")

    @classmethod
    def decode_text(cls, text: str) -> ProgressRecord:
        """Inverse of :meth:`encode_text`; :class:`ProgressDecodeError` on any malformed input."""
        if not isinstance(text, str):
            raise ProgressDecodeError(f"expected str, got {type(text).__name__}")
        try:
            raw = base64.b64decode(text.encode("ascii"), validate=True)
        except (UnicodeEncodeError, binascii.Error, ValueError) as exc:
            raise ProgressDecodeError(f"progress text is not valid base64: {exc}") from exc
        return cls.decode(raw)

    @staticmethod
    def fits_in_metadata(text: str, limit: int = METADATA_LIMIT) -> bool:
        """Whether ``text`` (from :meth:`encode_text`) fits in commit metadata of ``limit`` bytes."""
        return fits_in_metadata(text, limit)
