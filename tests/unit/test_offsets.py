"""OffsetTracker: the committable offset never passes an incomplete offset (Decaton-style window)."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilane.worker.offsets import OffsetError, OffsetTracker


def test_unknown_position_until_first_add() -> None:
    t = OffsetTracker()
    assert t.committable() is None
    assert t.position is None
    t.add(5)
    assert t.committable() == 5
    t.complete(5)
    assert t.committable() == 6


def test_start_position_is_committable_when_nothing_fetched() -> None:
    t = OffsetTracker(start=42)
    assert t.committable() == 42
    with pytest.raises(OffsetError):
        t.add(41)


def test_out_of_order_completion_waits_for_head() -> None:
    t = OffsetTracker()
    for o in range(10):
        t.add(o)
    for o in (9, 8, 3, 1, 2):
        t.complete(o)
    assert t.committable() == 0
    t.complete(0)
    assert t.committable() == 4
    assert t.pending == 10 - 6
    for o in (4, 5, 6, 7):
        t.complete(o)
    assert t.committable() == 10
    assert t.pending == 0


def test_gaps_are_skipped() -> None:
    t = OffsetTracker()
    for o in (3, 7, 20):
        t.add(o)
    t.complete(7)
    assert t.committable() == 3
    t.complete(3)
    assert t.committable() == 20
    t.complete(20)
    assert t.committable() == 21


def test_add_completed_and_is_complete() -> None:
    t = OffsetTracker()
    t.add_completed(0)
    t.add(1)
    t.add_completed(2)
    assert t.committable() == 1
    assert t.is_complete(0) and t.is_complete(2) and not t.is_complete(1)
    assert t.completed_above(1) == [2]


def test_bad_input_is_refused() -> None:
    t = OffsetTracker()
    t.add(10)
    with pytest.raises(OffsetError):
        t.add(10)
    with pytest.raises(OffsetError):
        t.complete(11)
    t.complete(10)
    assert t.committable() == 11
    t.complete(10)  # twice: harmless
    assert t.committable() == 11


def test_reset_forgets_window() -> None:
    t = OffsetTracker()
    t.add(1)
    t.reset(100)
    assert t.committable() == 100
    assert t.pending == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=200),
    st.randoms(use_true_random=False),
)
def test_property_committable_never_passes_incomplete(steps: list[int], rnd: object) -> None:
    import random

    assert isinstance(rnd, random.Random)
    offsets: list[int] = []
    o = rnd.randint(0, 1000)
    for s in steps:
        o += s  # gaps of 0..4 offsets between fetched ones
        offsets.append(o)
    t = OffsetTracker()
    for x in offsets:
        t.add(x)
    order = offsets[:]
    rnd.shuffle(order)
    incomplete = list(offsets)  # sorted
    last = t.committable()
    for x in order:
        t.complete(x)
        del incomplete[bisect.bisect_left(incomplete, x)]
        c = t.committable()
        assert c is not None and last is not None
        # monotonic
        assert c >= last
        last = c
        # never beyond an incomplete fetched offset, and exactly the first incomplete one
        if incomplete:
            assert c == incomplete[0]
        assert t.pending == len(incomplete)
    assert t.committable() == offsets[-1] + 1


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_property_interleaved_add_and_complete(data: st.DataObject) -> None:
    t = OffsetTracker()
    fetched: list[int] = []
    done: set[int] = set()
    nxt = 0
    for _ in range(data.draw(st.integers(1, 80))):
        if not fetched or len(done) == len(fetched) or data.draw(st.booleans()):
            nxt += data.draw(st.integers(0, 3))
            t.add(nxt)
            fetched.append(nxt)
            nxt += 1
        else:
            choice = data.draw(st.sampled_from([x for x in fetched if x not in done]))
            t.complete(choice)
            done.add(choice)
        c = t.committable()
        incomplete = [y for y in fetched if y not in done]
        assert c == (min(incomplete) if incomplete else fetched[-1] + 1)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_property_bulk_forms_match_one_at_a_time(data: st.DataObject) -> None:
    """add_many / complete_many (with repeats and offsets that slid out already) and the bulk slide in
    committable() agree with a model, and with a tracker fed one offset at a time."""
    bulk, single = OffsetTracker(), OffsetTracker()
    fetched: list[int] = []
    done: set[int] = set()
    nxt = data.draw(st.integers(0, 50))
    for _ in range(data.draw(st.integers(1, 30))):
        if not fetched or len(done) == len(fetched) or data.draw(st.booleans()):
            run = []
            for _ in range(data.draw(st.integers(1, 20))):
                nxt += data.draw(st.integers(0, 2))
                run.append(nxt)
                nxt += 1
            bulk.add_many(run)
            for o in run:
                single.add(o)
            fetched.extend(run)
        else:
            batch = data.draw(st.lists(st.sampled_from(fetched), min_size=1, max_size=25))
            bulk.complete_many(batch)
            for o in batch:
                single.complete(o)
            done.update(batch)
        incomplete = [y for y in fetched if y not in done]
        want = min(incomplete) if incomplete else fetched[-1] + 1
        if data.draw(st.booleans()):
            assert bulk.committable() == single.committable() == want
            assert bulk.pending == single.pending == len(incomplete)
    assert bulk.committable() == single.committable()
    with pytest.raises(OffsetError):
        bulk.complete_many([nxt + 5])  # never added


def test_completed_above_below_at_and_inside_the_window() -> None:
    t = OffsetTracker(100)
    t.add_many([100, 101, 102, 105, 106, 107])
    t.complete_many([101, 105, 107])
    assert t.committable() == 100
    assert t.completed_above(0) == [101, 105, 107]  # base below the head: every completed offset
    assert t.completed_above(100) == [101, 105, 107]
    assert t.completed_above(102) == [105, 107]  # base inside the window: only those above it
    assert t.completed_above(108) == []
    t.complete_many([100, 102])
    assert t.committable() == 106  # the slide popped 100, 101, 102, 105 and kept 106, 107
    assert t.pending == 1 and t.completed_above(106) == [107]
    t.complete(106)
    assert t.committable() == 108 and t.pending == 0
