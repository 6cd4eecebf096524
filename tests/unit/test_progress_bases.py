"""The progress cycle's bases (issue 31, item 4): what a restart after a kill -9 can find.

``ProgressStore.read_progress`` reads newest first and stops at a record of a lower base than the
committed offset. Two ways a kill -9 left no usable record, each seen in one run in three of a test
with three kills, and each made the restart replay every record completed above the committed offset:

- the progress cycle wrote a record of the previous committed offset after the commit cycle had
  written the one of the offset it was about to commit (the commit landed; the reader met the lower
  base first);
- a fresh partition (no committed offset) had no base for a record until the commit interval's first
  commit, so everything completed before it ran again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from confluent_kafka import Message

from multilane.api import OrderingMode
from multilane.formats.progress import ProgressCodec
from multilane.worker.commits import CommitCycle, ProgressCycle
from multilane.worker.hooks import EngineHooks
from multilane.worker.offsets import OffsetTracker
from tests.support.lane_runtime import runtime


class Store:
    """Progress records, acknowledged at once; their bases in production order."""

    def __init__(self) -> None:
        self.bases: list[int] = []

    def write(self, topic: str, partition: int, encoded: bytes) -> asyncio.Future[None]:
        self.bases.append(ProgressCodec.decode(encoded).base_offset)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


class Consumer:
    """Asynchronous commits, answered when the test says so."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        self.sent += [o.offset for o in offsets]


def _part(committed: int | None) -> Any:
    async def proc(rec: Any, ctx: Any) -> None:
        return None

    rt = runtime(proc, OrderingMode.KEY, 4)
    rt.committed = committed
    rt.tracker = OffsetTracker(committed)
    return rt


def _take(rt: Any, offsets: range) -> None:
    msgs = [Message(topic="t", partition=0, offset=o, key=b"k%d" % (o % 7), value=b"v") for o in offsets]
    rt.accept_run(msgs, 0, True)


def _complete(rt: Any, upto: int) -> None:
    works = [w for lane in rt.lanes.lanes for w in list(lane.queue) if w.offset < upto]
    for lane in rt.lanes.lanes:
        for w in works:
            if w in lane.queue:
                lane.queue.remove(w)
    rt.on_success_many(works, [0.0] * len(works))


def test_no_record_of_a_lower_base_follows_a_commits_own_record() -> None:
    """Committed 10, a commit of 20 on its way: the commit cycle wrote the record of 20 before
    sending; while its answer is due, each progress cycle writes a fresh record of 10 (what a restart
    uses if the commit never lands) and then one of 20 (so the newest record has the highest base:
    a reader after the commit landed finds 20 first); once it is answered, records of 20 only."""

    async def go() -> None:
        rt, store, consumer = _part(10), Store(), Consumer()
        _take(rt, range(10, 40))
        _complete(rt, 20)
        commits = CommitCycle(consumer, store, None)  # type: ignore[arg-type]
        progress = ProgressCycle(store, EngineHooks.of(None), commits)  # type: ignore[arg-type]
        await progress.run([rt])
        assert store.bases == [10]
        await commits.run([rt])  # writes records of 10 and 20, then sends the commit of 20
        assert consumer.sent == [20] and store.bases == [10, 10, 20]
        _complete(rt, 30)
        await progress.run([rt])  # the answer is still due: committed 10, sent 20
        assert store.bases == [10, 10, 20, 10, 20], "the newest record must have the highest base"
        rt.committed = 20  # the answer
        _complete(rt, 35)
        await progress.run([rt])
        assert store.bases == [10, 10, 20, 10, 20, 20]

    asyncio.run(go())


def test_a_fresh_partition_is_committed_by_the_first_progress_cycle() -> None:
    """No committed offset: the first progress cycle after records were taken commits (through the
    commit cycle, with its progress record), so later cycles have a base."""

    async def go() -> None:
        rt, store, consumer = _part(None), Store(), Consumer()
        commits = CommitCycle(consumer, store, None)  # type: ignore[arg-type]
        progress = ProgressCycle(store, EngineHooks.of(None), commits)  # type: ignore[arg-type]
        await progress.run([rt])
        assert consumer.sent == [] and store.bases == []  # nothing fetched: no position yet
        _take(rt, range(5, 25))
        _complete(rt, 9)
        await progress.run([rt])
        assert consumer.sent == [9] and store.bases == [9] and rt.commit_sent == 9
        _complete(rt, 15)
        await progress.run([rt])  # now the cycle's own record, for the commit on its way
        assert consumer.sent == [9] and store.bases == [9, 9]

    asyncio.run(go())


def test_the_committed_base_keeps_a_fresh_record_while_a_commits_record_awaits_its_ack() -> None:
    """The commit cycle raised the floor to 20 (its record of 20 produced, its acknowledgement and the
    commit still due; a kill now leaves the broker at 10): the progress cycle still writes a record of
    10 with what completed since, then one of 20. Skipping 10 there (issue 31) made a restart use the
    record of 10 from before the commit cycle started, and replay what completed since."""

    async def go() -> None:
        rt, store, consumer = _part(10), Store(), Consumer()
        _take(rt, range(10, 40))
        _complete(rt, 20)
        commits = CommitCycle(consumer, store, None)  # type: ignore[arg-type]
        progress = ProgressCycle(store, EngineHooks.of(None), commits)  # type: ignore[arg-type]
        await progress.run([rt])
        rt.progress_floor = 20  # commits.py ``_write``: the commit's record of 20 is on its way
        _complete(rt, 30)
        await progress.run([rt])
        assert store.bases == [10, 10, 20]
        assert rt.commit_sent is None and consumer.sent == []

    asyncio.run(go())


def test_a_commit_writes_the_committed_bases_record_before_its_own() -> None:
    """Committed 10, a commit of 30: the commit cycle writes a record of 10 as fresh as its own record
    of 30, then that one (the newest record has the highest base). A kill before the commit lands
    then finds a record of 10 from the commit's snapshot, not one from before the commit cycle."""

    async def go() -> None:
        rt, store, consumer = _part(10), Store(), Consumer()
        _take(rt, range(10, 40))
        _complete(rt, 30)
        commits = CommitCycle(consumer, store, None)  # type: ignore[arg-type]
        await commits.run([rt])
        assert store.bases == [10, 30] and consumer.sent == [30]
        assert rt.progress_floor == 30

    asyncio.run(go())
