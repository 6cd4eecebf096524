"""ApplyFilter, PendingChangeBuffer, ChangeApplier: which changes restore applies (pure)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multilane.worker.state.apply import ApplyFilter, ChangeApplier, ChangelogEntry, PendingChangeBuffer


class DoneSet:
    """A stand-in for ProgressRecord: the done (offset, key_hash) pairs above the committed offset."""

    def __init__(self, done: set[tuple[int, int]]) -> None:
        self.done = done

    def is_done(self, offset: int, key_hash: int) -> bool:
        return (offset, key_hash) in self.done


def put(offset: int, key: bytes, value: bytes, src: int, h: int = 7) -> ChangelogEntry:
    return ChangelogEntry(offset, key, src, h, value)


def delete(offset: int, key: bytes, src: int, h: int = 7) -> ChangelogEntry:
    return ChangelogEntry(offset, key, src, h, None)


def test_filter_committed_and_done() -> None:
    f = ApplyFilter(10, DoneSet({(12, 5)}))
    assert f.applicable(9, 0)
    assert not f.applicable(10, 0)
    assert f.applicable(12, 5)
    assert not f.applicable(12, 6)
    assert ApplyFilter(10).applicable(-1, 0)  # unknown source (lone tombstone)
    with pytest.raises(ValueError):
        ApplyFilter(-1)


def test_active_applier_skips_uncommitted_and_keeps_newest_applicable() -> None:
    a = ChangeApplier(ApplyFilter(10, DoneSet({(15, 7)})))
    writes = a.feed(
        [
            put(0, b"k", b"1", 3),
            put(1, b"k", b"2", 11),  # not committed, not done: skipped
            put(2, b"j", b"x", 15),  # done per progress
            delete(3, b"j", 16),  # not done: skipped
        ]
    )
    assert writes == {b"k": b"1", b"j": b"x"}
    assert a.skipped == 2 and a.applied == 2
    assert a.above_commit_sources == {(15, 7)}


def test_buffer_holds_later_changes_of_a_held_key() -> None:
    # unordered mode: record 20 wrote k before record 5 did; only 5 is committed.
    a = ChangeApplier(ApplyFilter(10), PendingChangeBuffer())
    writes = a.feed([put(0, b"k", b"from20", 20), put(1, b"k", b"from5", 5), put(2, b"j", b"j", 1)])
    assert writes == {b"j": b"j"}  # k's committed change waits behind the held one
    assert len(a.buffer or ()) == 2
    a.flt = ApplyFilter(21)
    assert a.release() == [(b"k", b"from20"), (b"k", b"from5")]  # changelog order: from5 wins
    assert len(a.buffer or ()) == 0


def test_release_only_what_became_applicable() -> None:
    a = ChangeApplier(ApplyFilter(0), PendingChangeBuffer())
    assert a.feed([put(0, b"a", b"1", 5), put(1, b"b", b"1", 8), delete(2, b"a", 9)]) == {}
    a.flt = ApplyFilter(6)
    assert a.release() == [(b"a", b"1")]
    a.flt = ApplyFilter(9)
    assert a.release() == [(b"b", b"1")]  # a's delete (source 9) still held
    assert (a.buffer.first_offset if a.buffer else None) == 2


def test_drain_applies_done_and_drops_the_rest() -> None:
    a = ChangeApplier(ApplyFilter(0), PendingChangeBuffer())
    a.feed([put(0, b"a", b"1", 5, h=1), put(1, b"b", b"1", 8, h=2), put(2, b"a", b"2", 9, h=3)])
    a.flt = ApplyFilter(6, DoneSet({(9, 3)}))
    writes, dropped = a.drain()
    assert writes == [(b"a", b"1"), (b"a", b"2")]
    assert dropped == 1
    assert a.above_commit_sources == {(9, 3)}
    assert len(a.buffer or ()) == 0


def test_buffer_rejects_out_of_order_offsets() -> None:
    b = PendingChangeBuffer()
    b.add(put(5, b"a", b"", 1))
    with pytest.raises(ValueError):
        b.add(put(5, b"a", b"", 1))


@given(
    st.lists(
        st.tuples(st.sampled_from([b"a", b"b", b"c"]), st.integers(0, 30), st.booleans()),
        max_size=40,
    ),
    st.integers(0, 31),
    st.integers(0, 31),
)
def test_learner_then_drain_equals_active_restore(
    changes: list[tuple[bytes, int, bool]], c_learn: int, c_final: int
) -> None:
    """Whatever the learner's intermediate committed offset, buffering then draining at the final
    committed offset yields the same store as one restore filtered at the final committed offset."""
    c_learn = min(c_learn, c_final)
    entries = [
        delete(i, k, src) if is_del else put(i, k, b"%d" % i, src)
        for i, (k, src, is_del) in enumerate(changes)
    ]

    def run(writes: Iterable[tuple[bytes, bytes | None]], store: dict[bytes, bytes]) -> None:
        for k, v in writes:
            if v is None:
                store.pop(k, None)
            else:
                store[k] = v

    reference: dict[bytes, bytes] = {}
    run(ChangeApplier(ApplyFilter(c_final)).feed(entries).items(), reference)

    learned: dict[bytes, bytes] = {}
    la = ChangeApplier(ApplyFilter(c_learn), PendingChangeBuffer())
    half = len(entries) // 2
    run(la.feed(entries[:half]).items(), learned)
    la.flt = ApplyFilter((c_learn + c_final) // 2)
    run(la.release(), learned)
    run(la.feed(entries[half:]).items(), learned)
    la.flt = ApplyFilter(c_final)
    writes, _ = la.drain()
    run(writes, learned)
    assert learned == reference
