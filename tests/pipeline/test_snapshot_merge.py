"""Merge rules (pure): a snapshot built from any split into offset ranges, plus the changelog tail, equals
the state rebuilt by replaying the whole changelog -- with overwrites, deletes, lone tombstones and
uncommitted changes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilane.pipeline.changes import (
    DELETE,
    PUT,
    TOMBSTONE,
    Change,
    ChangelogFormatError,
    decode_change,
    encode_envelope,
)
from multilane.pipeline.merge import (
    ChangelogReplayer,
    RangeMergeResult,
    combine_ranges,
    merge_range,
    merge_raw_range,
)
from multilane.pipeline.planning import OffsetRangePlanner, PartitionExtent

KEYS = [b"a", b"b", b"c", b"d"]


def oracle(records: list[tuple[bytes, str, int, bytes]], committed: int | None) -> dict[bytes, bytes]:
    """The restore semantics, written out independently of the code under test."""
    state: dict[bytes, bytes] = {}
    prev: tuple[bytes, str] | None = None
    for key, kind, src, payload in records:
        if kind == "T":
            if prev != (key, "D"):
                state.pop(key, None)
        elif committed is None or src < committed:
            if kind == "P":
                state[key] = payload
            else:
                state.pop(key, None)
        prev = (key, kind)
    return state


@st.composite
def changelogs(draw: st.DrawFn) -> list[tuple[bytes, str, int, bytes]]:
    out: list[tuple[bytes, str, int, bytes]] = []
    for i in range(draw(st.integers(0, 40))):
        key = draw(st.sampled_from(KEYS))
        src = draw(st.integers(0, 30))
        kind = draw(st.sampled_from(["P", "P", "P", "D", "T"]))
        if kind == "P":
            out.append((key, "P", src, b"v%d" % i))
        elif kind == "D":
            out.append((key, "D", src, b""))
            if draw(st.booleans()):  # the tombstone that normally follows (sometimes compacted away)
                out.append((key, "T", -1, b""))
        else:
            out.append((key, "T", -1, b""))  # a lone tombstone
    return out


def to_changes(records: list[tuple[bytes, str, int, bytes]]) -> list[Change]:
    return [
        decode_change(key, None if kind == "T" else encode_envelope(kind, src, 7, payload), offset)
        for offset, (key, kind, src, payload) in enumerate(records)
    ]


@settings(max_examples=150, deadline=None)
@given(changelogs(), st.integers(1, 12), st.one_of(st.none(), st.integers(0, 32)), st.integers(0, 8))
def test_snapshot_plus_tail_equals_full_replay(
    records: list[tuple[bytes, str, int, bytes]], max_records: int, bound: int | None, slack: int
) -> None:
    changes = to_changes(records)
    end = len(changes)
    # Restore commits at or above the snapshot's bound (offsets only move forward).
    committed = None if bound is None else bound + slack
    ranges = OffsetRangePlanner(max_records).plan([PartitionExtent("t", "g.t.changelog", 0, 0, end, bound)])
    results = [merge_range(iter(changes[r.start : r.end]), r.source_bound) for r in ranges]
    snap = combine_ranges(results, end)

    assert all(c.op == PUT and c.changelog_offset < snap.changelog_offset for c in snap.live.values())
    if bound is None:  # no bound: the snapshot covers the whole changelog, the tail is empty
        assert snap.changelog_offset == end
    else:  # the tail starts at the first uncommitted envelope; everything before it is in the snapshot
        assert all(c.source_offset < bound for c in snap.live.values())
        first = next(
            (c.changelog_offset for c in changes if c.op != TOMBSTONE and c.source_offset >= bound), end
        )
        assert snap.changelog_offset == first
    restored = ChangelogReplayer(committed, initial={k: c.payload for k, c in snap.live.items()})
    restored.apply_all(changes[snap.changelog_offset :])
    assert restored.state == oracle(records, committed)
    # And the replayer itself agrees with the oracle on the whole changelog.
    assert ChangelogReplayer(committed).apply_all(changes).state == oracle(records, committed)


def test_snapshot_stops_at_first_uncommitted_change() -> None:
    records = [(b"a", "P", 1, b"1"), (b"a", "P", 9, b"2"), (b"b", "P", 2, b"3")]
    result = merge_range(iter(to_changes(records)), source_bound=5)
    assert result.tail_offset == 1 and result.records == 1
    assert {k: c.payload for k, c in result.newest.items()} == {b"a": b"1"}


def test_delete_shadows_older_put_from_an_earlier_range() -> None:
    changes = to_changes([(b"a", "P", 1, b"1"), (b"a", "D", 2, b""), (b"a", "T", -1, b"")])
    results = [merge_range(iter(changes[:1]), None), merge_range(iter(changes[1:]), None)]
    assert combine_ranges(results, 3).live == {}


def test_decode_rejects_foreign_records() -> None:
    assert decode_change(b"k", None, 4).op == TOMBSTONE
    assert decode_change(b"k", encode_envelope(DELETE, 3, 1), 5).op == DELETE
    with pytest.raises(ChangelogFormatError, match="offset 6"):
        decode_change(b"k", b"plain value", 6)
    with pytest.raises(ChangelogFormatError, match="no key"):
        decode_change(None, encode_envelope(PUT, 1, 1, b"v"), 7)


def to_raw(records: list[tuple[bytes, str, int, bytes]]) -> list[tuple[bytes | None, bytes | None, int]]:
    return [
        (key, None if kind == "T" else encode_envelope(kind, src, 7, payload), offset)
        for offset, (key, kind, src, payload) in enumerate(records)
    ]


@settings(max_examples=150, deadline=None)
@given(
    changelogs(),
    st.one_of(st.none(), st.integers(0, 32)),
    st.integers(1, 7),
    st.one_of(st.none(), st.integers(0, 45)),
)
def test_raw_merge_equals_decoded_merge(
    records: list[tuple[bytes, str, int, bytes]], bound: int | None, batch: int, corrupt_at: int | None
) -> None:
    """The Spark task's fast path keeps exactly what ``merge_range`` keeps (same tail, count, errors),
    however the records are cut into batches, with a corrupt record anywhere."""
    raw = to_raw(records)
    if corrupt_at is not None and corrupt_at < len(raw):
        raw[corrupt_at] = (raw[corrupt_at][0], b"garbage, not an ML1 envelope", corrupt_at)
    batches = [raw[i : i + batch] for i in range(0, len(raw), batch)]

    def decoded() -> list[Change]:
        out = []
        for key, value, offset in raw:
            change = decode_change(key, value, offset)
            if change.op != TOMBSTONE and bound is not None and change.source_offset >= bound:
                out.append(change)
                break  # merge_range stops here: the reader decodes nothing after it
            out.append(change)
        return out

    expected: RangeMergeResult | str
    try:
        expected = merge_range(iter(decoded()), bound)
    except ChangelogFormatError as exc:
        expected = str(exc)
    if isinstance(expected, str):
        with pytest.raises(ChangelogFormatError, match=f"offset {corrupt_at}") as info:
            merge_raw_range(batches, bound, "t[0]")
        assert str(info.value) == f"t[0]: {expected}"
        return
    got = merge_raw_range(batches, bound, "t[0]")
    assert got.tail_offset == expected.tail_offset and got.records == expected.records
    assert got.newest == expected.newest
