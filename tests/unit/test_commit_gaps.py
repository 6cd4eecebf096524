"""Gaps in offsets never stall a commit (issue 31, item 3).

Transaction markers and compaction leave offsets that no fetch returns. Gaps between records are
covered by the next record; a gap after the newest record (a commit marker at the end of a
transactional input) is covered only by the consumer's position, which the end-of-partition event
carries: the tracker skips to it, and the commit plan, its progress record and a release's final
commit reach the end. Without that the committed offset stays one short for good (KAFKA-6607).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message
from hypothesis import given
from hypothesis import strategies as st

from multilane.api import OrderingMode
from multilane.formats.keyranges import HASH_SPACE
from multilane.formats.progress import ProgressCodec
from multilane.worker.commits import plan_commit, progress_for_base
from multilane.worker.fetch import ErrorLog, FetchLoop
from multilane.worker.flow import FlowController
from multilane.worker.offsets import OffsetError, OffsetTracker
from multilane.worker.partition import Phase
from tests.support.lane_runtime import runtime, until

# -- the tracker ---------------------------------------------------------------------------------------


def test_skip_to_moves_the_committable_offset_past_a_trailing_gap_once_everything_completed() -> None:
    t = OffsetTracker(start=0)
    t.add_many([0, 1, 2, 4])  # 3: a marker between records; 5: the marker after the last one
    assert t.skip_to(6)
    assert t.position == 6
    assert t.committable() == 0  # never past an incomplete record
    t.complete_many([0, 1, 4])
    assert t.committable() == 2
    t.complete(2)
    assert t.committable() == 6
    assert t.is_complete(5) and t.is_complete(3) and not t.is_complete(6)


def test_skip_to_never_moves_back_and_later_records_must_lie_beyond_it() -> None:
    t = OffsetTracker(start=10)
    assert not t.skip_to(10)
    assert not t.skip_to(3)
    t.add(12)
    assert not t.skip_to(12)  # at or below a fetched record: a stale event, ignored
    assert t.skip_to(15)
    assert not t.skip_to(14)
    with pytest.raises(OffsetError):
        t.add(14)  # the position said nothing below 15 is left to fetch
    t.add(17)
    t.complete_many([12, 17])
    assert t.committable() == 18


def test_skip_to_before_anything_is_known() -> None:
    t = OffsetTracker()
    assert t.skip_to(7)  # an empty partition or one of markers only: its end
    assert t.committable() == 7


@given(st.lists(st.integers(1, 4), min_size=1, max_size=40), st.integers(1, 5), st.randoms())
def test_property_with_gaps_the_committable_offset_is_the_first_incomplete_record_or_the_end(
    steps: list[int], tail: int, rnd: Any
) -> None:
    offsets = []
    o = 0
    for s in steps:
        o += s
        offsets.append(o)
    end = offsets[-1] + tail
    t = OffsetTracker(start=0)
    t.add_many(offsets)
    t.skip_to(end)
    order = offsets[:]
    rnd.shuffle(order)
    done: set[int] = set()
    for x in order:
        t.complete(x)
        done.add(x)
        c = t.committable()
        first_open = min((y for y in offsets if y not in done), default=end)
        assert c == first_open
    assert t.committable() == end


# -- one partition: accept, complete, reach the end, plan the commit -------------------------------------


def _msg(offset: int, key: bytes) -> Any:
    return Message(topic="t", partition=0, offset=offset, key=key, value=b"v", timestamp=(1, 1000))


def _eof(offset: int, partition: int = 0) -> Any:
    return Message(topic="t", partition=partition, offset=offset,
                   error=KafkaError(KafkaError._PARTITION_EOF))


@pytest.mark.parametrize("mode", [OrderingMode.KEY, OrderingMode.UNORDERED])
def test_plan_commits_the_end_position_with_a_progress_record_for_it(mode: OrderingMode) -> None:
    """Records at 0-2 and 4-5 (3 and 6 are markers), end of partition at 7: the plan commits 7 and
    its progress record has base 7, the same offset the release's final commit sends."""

    async def proc(rec: Any, ctx: Any) -> None:
        return None

    rt = runtime(proc, mode, 4)  # lanes not started: the test completes the work items itself
    loop = FetchLoop(None, {("t", 0): rt}, rt._flow, 100, ErrorLog(), False)
    msgs = [_msg(0, b"a"), _msg(1, b"b"), _msg(2, b"slow"), _msg(4, b"c"), _msg(5, b"d")]
    assert rt.accept_run(msgs, 0, True) == (5, False)
    loop.end_of_partition(_eof(7))
    works = {w.offset: w for lane in rt.lanes.lanes for w in lane.queue}
    rt.on_success_many([w for o, w in works.items() if o != 2], [0.0] * 4)
    batch = plan_commit([rt], with_progress=True, final=False)
    assert [i.offset for i in batch.items] == [2]  # the slow record holds it
    held = ProgressCodec.decode(batch.items[0].encoded or b"")
    assert held.base_offset == 2
    if mode is OrderingMode.UNORDERED:
        assert held.done_offsets == ((4, 6),)
    else:  # the slow key's range waits at 2; every other range is done up to the end
        assert min(r[2] for r in held.ranges) == 2 and max(r[2] for r in held.ranges) == 7
    rt.on_success(works[2], 0.0)
    batch = plan_commit([rt], with_progress=True, final=True)
    assert [i.offset for i in batch.items] == [7]
    rec = ProgressCodec.decode(batch.items[0].encoded or b"")
    assert rec.base_offset == 7
    if mode is OrderingMode.KEY:
        assert all(r[2] == 7 for r in rec.ranges) and sum(r[1] - r[0] for r in rec.ranges) == HASH_SPACE
    else:
        assert rec.done_offsets == ()
    # a progress cycle's record for an older base (a commit of 2 still unanswered) covers the gap
    older = progress_for_base(rt, 2, 7)
    assert older.base_offset == 2 and all(older.is_done(o, 0) for o in range(2, 7))


def test_the_end_event_is_ignored_while_records_may_be_unseen() -> None:
    """Paused for back-pressure (later records were ignored and will be fetched again after the
    resume's seek), released, or not ours: the position in the event is not used."""

    async def go() -> None:
        async def proc(rec: Any, ctx: Any) -> None:
            return None

        rt = runtime(proc, OrderingMode.KEY, 1)
        loop = FetchLoop(None, {("t", 0): rt}, FlowController(10, 1 << 20), 100, ErrorLog(), False)
        rt.accept_run([_msg(0, b"a")], 0, True)
        rt.flow_counters.paused = True
        loop.end_of_partition(_eof(9))
        assert rt.tracker.position == 1
        rt.flow_counters.paused = False
        rt.phase = Phase.RELEASING
        loop.end_of_partition(_eof(9))
        assert rt.tracker.position == 1
        rt.phase = Phase.ACTIVE
        loop.end_of_partition(_eof(9, partition=5))  # another partition, not assigned here
        loop.end_of_partition(_eof(-1001))  # an event without an offset
        assert rt.tracker.position == 1
        loop.end_of_partition(_eof(9))
        assert rt.tracker.position == 9

    asyncio.run(go())


def test_the_fetch_loop_skips_to_the_end_event_it_consumes() -> None:
    """Through ``FetchLoop.run``: records and the end event come back from one ``consume()``."""

    class Consumer:
        def __init__(self, batches: list[list[Any]]) -> None:
            self.batches = batches

        def consume(self, num_messages: int, timeout: float) -> list[Any]:
            return self.batches.pop(0) if self.batches else []

        def resume(self, tps: Any) -> None: ...
        def pause(self, tps: Any) -> None: ...
        def seek(self, tp: Any) -> None: ...

    async def go() -> None:
        async def proc(rec: Any, ctx: Any) -> None:
            return None

        rt = runtime(proc, OrderingMode.KEY, 2)
        rt.lanes.start()
        consumer = Consumer([[_msg(0, b"a"), _msg(1, b"b"), _eof(3)]])
        flow = rt._flow
        loop = FetchLoop(consumer, {("t", 0): rt}, flow, 100, ErrorLog(), False)
        task = asyncio.create_task(loop.run())
        await until(lambda: (rt.flush(), rt.tracker.committable())[1] == 3, "committable at the end")
        loop.stopping = True
        await task
        rt.close()

    asyncio.run(go())
