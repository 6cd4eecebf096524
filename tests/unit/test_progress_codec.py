"""Unit tests of multilane.formats.progress: record semantics, codec round trips, fuzzing, sizes."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilane.api import OrderingMode
from multilane.formats.keyranges import HASH_SPACE, KeyRangeMap
from multilane.formats.progress import (
    METADATA_LIMIT,
    ProgressCodec,
    ProgressDecodeError,
    ProgressRecord,
    fits_in_metadata,
    intervals_from_offsets,
)

HEADER_BOUND = 3 + 1 + 1 + 4 + 1 + 3 * (1 + 40) + 5 + 9 + 3  # frame + mode + 3 short strings + ints


def key_rec(base: int, ranges: list[tuple[int, int, int]], **kw: object) -> ProgressRecord:
    return ProgressRecord(
        group=str(kw.get("group", "g")),
        topic=str(kw.get("topic", "orders")),
        partition=int(kw.get("partition", 3)),  # type: ignore[call-overload]
        base_offset=base,
        writer="w-1",
        mode=OrderingMode.KEY,
        ranges=tuple(ranges),
    )


def unordered_rec(base: int, done: list[int]) -> ProgressRecord:
    return ProgressRecord(
        group="g",
        topic="orders",
        partition=0,
        base_offset=base,
        writer="w-1",
        mode=OrderingMode.UNORDERED,
        done_offsets=intervals_from_offsets(done),
    )


# -- strategies -------------------------------------------------------------------------------------

names = st.text(min_size=0, max_size=40)
offsets = st.integers(0, 2**62)


@st.composite
def key_records(draw: st.DrawFn) -> ProgressRecord:
    base = draw(offsets)
    cuts = sorted(set(draw(st.lists(st.integers(1, HASH_SPACE - 1), max_size=50))))
    bounds = [0, *cuts, HASH_SPACE]
    ranges = [(a, b, base + draw(st.integers(0, 2**20))) for a, b in itertools.pairwise(bounds)]
    return ProgressRecord(
        group=draw(names),
        topic=draw(names),
        partition=draw(st.integers(0, 2**31 - 1)),
        base_offset=base,
        writer=draw(names),
        mode=OrderingMode.KEY,
        ranges=tuple(ranges),
    )


@st.composite
def unordered_records(draw: st.DrawFn) -> ProgressRecord:
    base = draw(offsets)
    done = draw(st.lists(st.integers(0, 5000), max_size=300))
    return ProgressRecord(
        group=draw(names),
        topic=draw(names),
        partition=draw(st.integers(0, 1000)),
        base_offset=base,
        writer=draw(names),
        mode=OrderingMode.UNORDERED,
        done_offsets=intervals_from_offsets(base + d for d in done),
    )


@st.composite
def partition_records(draw: st.DrawFn) -> ProgressRecord:
    return ProgressRecord(
        group=draw(names),
        topic=draw(names),
        partition=draw(st.integers(0, 1000)),
        base_offset=draw(offsets),
        writer=draw(names),
        mode=OrderingMode.PARTITION,
    )


any_records = st.one_of(key_records(), unordered_records(), partition_records())


# -- semantics --------------------------------------------------------------------------------------


def test_is_done_key_mode() -> None:
    half = HASH_SPACE // 2
    rec = key_rec(100, [(0, half, 105), (half, HASH_SPACE, 100)])
    assert rec.is_done(99, HASH_SPACE - 1)  # below base: committed
    assert rec.is_done(104, 0)
    assert not rec.is_done(105, 0)
    assert rec.is_done(104, half - 1)
    assert not rec.is_done(100, half)
    assert not rec.is_done(104, HASH_SPACE - 1)
    assert rec.high == 105
    with pytest.raises(ValueError):
        rec.is_done(100, HASH_SPACE)


def test_is_done_unordered_mode() -> None:
    rec = unordered_rec(10, [11, 12, 13, 20])
    assert rec.done_offsets == ((11, 14), (20, 21))
    assert rec.is_done(9, 0)
    assert not rec.is_done(10, 0)
    assert rec.is_done(11, 0)
    assert rec.is_done(13, 0)
    assert not rec.is_done(14, 0)
    assert rec.is_done(20, 12345)
    assert not rec.is_done(21, 0)
    assert rec.high == 21
    assert rec.done_count_above_base() == 4


def test_is_done_partition_mode() -> None:
    rec = ProgressRecord("g", "t", 0, 50, "w", OrderingMode.PARTITION)
    assert rec.is_done(49, 0)
    assert not rec.is_done(50, 0)
    assert not rec.is_done(51, 0)


@given(unordered_records(), st.integers(0, 6000))
def test_is_done_unordered_agrees_with_set(rec: ProgressRecord, probe: int) -> None:
    done = {o for s, e in rec.done_offsets for o in range(s, e)}
    offset = rec.base_offset + probe - 500
    assert rec.is_done(offset, 0) == (offset < rec.base_offset or offset in done)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ranges": ((0, HASH_SPACE, 5),)}, "below base_offset"),
        ({"ranges": ((0, 10, 20), (11, HASH_SPACE, 20))}, "tile"),
        ({"ranges": ((0, 10, 20),)}, "cover"),
        ({"ranges": ()}, "at least one range"),
        ({"ranges": ((0, HASH_SPACE + 1, 20),)}, "beyond"),
        ({"ranges": ((0, HASH_SPACE, 20),), "done_offsets": ((20, 21),)}, "no done offsets"),
        ({"ranges": ((0, HASH_SPACE, 20),), "partition": -1}, "partition"),
        ({"ranges": ((0, HASH_SPACE, 20),), "base_offset": -1}, "base_offset"),
    ],
)
def test_record_invariants_key_mode(kwargs: dict[str, object], match: str) -> None:
    fields: dict[str, object] = {
        "group": "g",
        "topic": "t",
        "partition": 0,
        "base_offset": 10,
        "writer": "w",
        "mode": OrderingMode.KEY,
    }
    fields.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ProgressRecord(**fields)  # type: ignore[arg-type]


def test_record_invariants_unordered_mode() -> None:
    def make(done: tuple[tuple[int, int], ...]) -> ProgressRecord:
        return ProgressRecord("g", "t", 0, 10, "w", OrderingMode.UNORDERED, done_offsets=done)

    make(((10, 12), (13, 14)))
    with pytest.raises(ValueError, match="below base_offset"):
        make(((9, 12),))
    with pytest.raises(ValueError, match="sorted and merged"):
        make(((10, 12), (12, 14)))  # adjacent: must be merged
    with pytest.raises(ValueError, match="sorted and merged"):
        make(((13, 14), (10, 12)))
    with pytest.raises(ValueError, match="empty"):
        make(((12, 12),))
    with pytest.raises(ValueError, match="no key ranges"):
        ProgressRecord("g", "t", 0, 10, "w", OrderingMode.UNORDERED, ranges=((0, HASH_SPACE, 10),))
    with pytest.raises(ValueError, match="mode"):
        ProgressRecord("g", "t", 0, 10, "w", "key")  # type: ignore[arg-type]


# -- round trips ------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(any_records)
def test_binary_round_trip(rec: ProgressRecord) -> None:
    assert ProgressCodec.decode(ProgressCodec.encode(rec)) == rec


@settings(max_examples=200, deadline=None)
@given(any_records)
def test_text_round_trip(rec: ProgressRecord) -> None:
    text = ProgressCodec.encode_text(rec)
    assert text.isascii()
    assert ProgressCodec.decode_text(text) == rec


def test_even_layout_round_trip_and_fits_metadata() -> None:
    m = KeyRangeMap.even(64)
    rec = key_rec(1000, [(r.start, r.end, 1000 + i) for i, r in enumerate(m.ranges)])
    text = ProgressCodec.encode_text(rec)
    assert ProgressCodec.decode_text(text) == rec
    assert fits_in_metadata(text)
    assert ProgressCodec.fits_in_metadata(text)
    assert not ProgressCodec.fits_in_metadata("A" * (METADATA_LIMIT + 1))


# -- malformed input --------------------------------------------------------------------------------


def _valid_blobs() -> list[bytes]:
    rng = random.Random(7)
    recs = [
        key_rec(5, [(0, HASH_SPACE // 3, 9), (HASH_SPACE // 3, HASH_SPACE, 5)]),
        key_rec(7, [(r.start, r.end, 7 + rng.randrange(100)) for r in KeyRangeMap.even(300).ranges]),
        unordered_rec(0, [1, 2, 3, 10]),
        unordered_rec(50, [o for o in range(51, 3000) if rng.random() < 0.7]),
        ProgressRecord("g", "t", 1, 2, "w", OrderingMode.PARTITION),
    ]
    return [ProgressCodec.encode(r) for r in recs]


def test_every_truncation_is_rejected_cleanly() -> None:
    for blob in _valid_blobs():
        for n in range(len(blob)):
            with pytest.raises(ProgressDecodeError):
                ProgressCodec.decode(blob[:n])
        with pytest.raises(ProgressDecodeError, match=r"CRC|trailing"):
            ProgressCodec.decode(blob + b"\x00")


def test_every_single_bit_flip_is_rejected_cleanly() -> None:
    for blob in _valid_blobs()[:3] + _valid_blobs()[4:]:
        for i in range(len(blob)):
            for bit in range(8):
                bad = bytearray(blob)
                bad[i] ^= 1 << bit
                with pytest.raises(ProgressDecodeError):
                    ProgressCodec.decode(bytes(bad))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_decode_error(data: bytes) -> None:
    try:
        ProgressCodec.decode(data)
    except ProgressDecodeError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=120), st.sampled_from([0, 1]))
def test_random_bodies_with_valid_frame_raise_only_decode_error(body: bytes, flags: int) -> None:
    # Random bodies inside a valid frame (right magic, version and CRC) reach the parser itself.
    import zlib

    if flags:
        body = zlib.compress(body)
    head = b"MLP\x01" + bytes([flags]) + body
    data = head + zlib.crc32(head).to_bytes(4, "big")
    try:
        rec = ProgressCodec.decode(data)
    except ProgressDecodeError:
        return
    assert ProgressCodec.decode(ProgressCodec.encode(rec)) == rec


def _framed(body: bytes, flags: int = 0) -> bytes:
    import zlib

    head = b"MLP\x01" + bytes([flags]) + body
    return head + zlib.crc32(head).to_bytes(4, "big")


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _header(mode: bytes, base: int) -> bytes:
    return mode + b"\x01g\x01t\x01w" + _varint(0) + _varint(base)


def test_specific_malformed_inputs_have_clear_messages() -> None:
    good = ProgressCodec.encode(ProgressRecord("g", "t", 0, 1, "w", OrderingMode.PARTITION))
    cases: list[tuple[bytes, str]] = [
        (b"XYZ" + good[3:], "bad magic"),
        (good[:3] + b"\x02" + good[4:], "version"),
        (good[:4] + b"\x80" + good[5:], "flags"),
        (b"", "truncated"),
        # ranges not covering the space: one range of width 10
        (_framed(_header(b"K", 5) + _varint(1) + _varint(10) + _varint(0)), "cover"),
        # zero-width range
        (_framed(_header(b"K", 5) + _varint(1) + _varint(0) + _varint(0)), "empty"),
        # widths beyond 2**32
        (
            _framed(
                _header(b"K", 5) + _varint(2) + _varint(HASH_SPACE) + _varint(0) + _varint(1) + _varint(0)
            ),
            "beyond",
        ),
        # next_offset below base cannot be encoded (deltas are unsigned); absurd count is rejected
        (_framed(_header(b"K", 5) + _varint(1 << 40)), "range count"),
        # unordered: zero-length run
        (_framed(_header(b"U", 5) + _varint(1) + _varint(0) + _varint(0)), "empty"),
        # unordered: second run adjacent to the first (gap 0)
        (
            _framed(_header(b"U", 5) + _varint(2) + _varint(1) + _varint(2) + _varint(0) + _varint(1)),
            "sorted and merged",
        ),
        (_framed(b"Z" + _header(b"K", 5)[1:]), "mode"),
        (_framed(_header(b"P", 5) + b"\x00"), "trailing"),
        (_framed(b"P\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"), "varint"),
        (_framed(b"P\x02\xff\xfe\x01t\x01w\x00\x00"), "UTF-8"),
        (_framed(b"not zlib", flags=1), "corrupt"),
    ]
    for data, match in cases:
        with pytest.raises(ProgressDecodeError, match=match):
            ProgressCodec.decode(data)


def test_decompression_bomb_is_bounded() -> None:
    import zlib

    bomb = zlib.compress(b"\x00" * (80 << 20))
    with pytest.raises(ProgressDecodeError, match=r"oversized|truncated"):
        ProgressCodec.decode(_framed(bomb, flags=1))


def test_bad_text_inputs() -> None:
    for text in ("not base64!", "é", "QUJD"):  # the last one is valid base64 of b"ABC"
        with pytest.raises(ProgressDecodeError):
            ProgressCodec.decode_text(text)
    with pytest.raises(ProgressDecodeError):
        ProgressCodec.decode_text(b"abc")  # type: ignore[arg-type]
    with pytest.raises(ProgressDecodeError):
        ProgressCodec.decode("abc")  # type: ignore[arg-type]


# -- sizes ------------------------------------------------------------------------------------------


def test_size_1000_random_ranges() -> None:
    # Uncompressed, each range costs a width varint (< 2**32 -> <= 5 bytes) and a next_offset delta
    # varint (< 2**20 -> <= 3 bytes): at most 8 bytes per range plus the header.
    rng = random.Random(1)
    cuts = sorted(rng.sample(range(1, HASH_SPACE), 999))
    bounds = [0, *cuts, HASH_SPACE]
    rec = key_rec(10**9, [(a, b, 10**9 + rng.randrange(2**20)) for a, b in itertools.pairwise(bounds)])
    size = len(ProgressCodec.encode(rec))
    assert size <= 8 * 1000 + HEADER_BOUND, size


def test_size_1000_even_ranges_fits_commit_metadata() -> None:
    # An even layout's widths repeat; with per-range deltas < 128 (1 byte) the raw body is ~6 bytes a
    # range, and compression removes the repetition of the widths: at least 2x smaller.
    rng = random.Random(2)
    rec = key_rec(5000, [(r.start, r.end, 5000 + rng.randrange(100)) for r in KeyRangeMap.even(1000).ranges])
    size = len(ProgressCodec.encode(rec))
    assert size <= 3 * 1000, size
    assert fits_in_metadata(ProgressCodec.encode_text(rec))


def test_size_10k_done_offsets() -> None:
    # Contiguous completions: one run -> a handful of bytes beyond the header.
    contiguous = unordered_rec(1000, list(range(1001, 11001)))
    assert len(ProgressCodec.encode(contiguous)) <= HEADER_BOUND + 8

    # 10k done offsets with 100 random holes: at most 101 runs of (gap, length) with gap < 128 and
    # length < 16384: <= 3 bytes a run, before compression.
    rng = random.Random(3)
    holes = set(rng.sample(range(2001, 12101), 100))
    done = [o for o in range(2001, 12101) if o not in holes]
    assert len(done) == 10_000
    rec = unordered_rec(2000, done)
    assert len(rec.done_offsets) <= 101
    size = len(ProgressCodec.encode(rec))
    assert size <= HEADER_BOUND + 3 * 101 + 3, size
    assert fits_in_metadata(ProgressCodec.encode_text(rec))

    # Worst case, every other offset done (10k runs of (1, 1)): 2 bytes a run raw, and compressible.
    alternating = unordered_rec(0, list(range(1, 20001, 2)))
    assert len(alternating.done_offsets) == 10_000
    assert len(ProgressCodec.encode(alternating)) <= 2 * 10_000 + HEADER_BOUND


@given(st.lists(st.integers(0, 300), max_size=100))
def test_intervals_from_offsets(offs: list[int]) -> None:
    iv = intervals_from_offsets(offs)
    assert {o for s, e in iv for o in range(s, e)} == set(offs)
    for (_, e1), (s2, _) in itertools.pairwise(iv):
        assert s2 > e1


def test_union_progress_never_claims_less_than_either_record() -> None:
    """A new owner's record (own) joined with the one it restored: every offset either calls done is
    done in the union, and nothing else (key mode across two layouts; unordered intervals)."""
    from multilane.formats.progress import union_progress

    half = 2**31
    own = ProgressRecord("g", "t", 0, 100, "new", OrderingMode.KEY,
                         ranges=((0, 2**30, 105), (2**30, 2**32, 100)))
    restored = ProgressRecord("g", "t", 0, 100, "old", OrderingMode.KEY,
                              ranges=((0, half, 100), (half, 2**32, 140)))
    u = union_progress(own, restored)
    for kh in (0, 2**30 - 1, 2**30, half - 1, half, 2**32 - 1):
        for off in range(95, 150):
            assert u.is_done(off, kh) == (own.is_done(off, kh) or restored.is_done(off, kh)), (kh, off)
    own_u = ProgressRecord("g", "t", 0, 100, "new", OrderingMode.UNORDERED, done_offsets=((101, 103),))
    restored_u = ProgressRecord("g", "t", 0, 90, "old", OrderingMode.UNORDERED,
                                done_offsets=((95, 101), (110, 112)))
    u = union_progress(own_u, restored_u)
    assert u.done_offsets == ((100, 103), (110, 112)) and u.base_offset == 100
