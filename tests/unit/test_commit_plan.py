"""The one commit path: ``plan_commit`` decides, the async and the blocking drivers of ``CommitCycle``
only send, and both record what they sent (``commit_sent``, ``last_progress``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from multilane.api import OrderingMode
from multilane.formats.progress import ProgressCodec, ProgressRecord
from multilane.worker.commits import CommitCycle, plan_commit
from multilane.worker.state.errors import StateDurabilityError


@dataclass
class FakeTracker:
    offset: int | None

    def committable(self) -> int | None:
        return self.offset


@dataclass(eq=False)
class FakePart:
    """The parts of a PartitionRuntime the commit path reads and writes."""

    topic: str
    partition: int
    tracker: FakeTracker
    mode: OrderingMode = OrderingMode.KEY
    commit_sent: int | None = None
    last_progress: bytes | None = None
    committed: int | None = None
    flushes: int = 0
    progress_floor: int | None = None

    def flush(self) -> None:
        self.flushes += 1

    def progress(self, base: int) -> ProgressRecord:
        return ProgressRecord("g", self.topic, self.partition, base, "w", OrderingMode.PARTITION)


@dataclass
class FakeTp:
    topic: str
    partition: int
    offset: int
    error: Any = None


@dataclass
class FakeConsumer:
    commits: list[tuple[list[Any], bool]] = field(default_factory=list)

    def commit(self, offsets: list[Any], asynchronous: bool) -> list[FakeTp] | None:
        self.commits.append((offsets, asynchronous))
        return None if asynchronous else [FakeTp(t.topic, t.partition, t.offset) for t in offsets]


class FakeStore:
    """Progress records are acknowledged at once."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.written: list[tuple[str, int, bytes]] = []

    def write(self, topic: str, partition: int, encoded: bytes) -> asyncio.Future[None]:
        self.written.append((topic, partition, encoded))
        fut: asyncio.Future[None] = self.loop.create_future()
        fut.set_result(None)
        return fut


class FakeHooks:
    def __init__(self, lose: set[int]) -> None:
        self.lose = lose
        self.calls: list[tuple[str, int, int]] = []

    def before_commit(self, topic: str, partition: int, offset: int) -> None:
        self.calls.append((topic, partition, offset))
        if partition in self.lose:
            raise StateDurabilityError("lost")


def test_plan_leaves_out_unchanged_partitions_unless_final() -> None:
    a = FakePart("t", 0, FakeTracker(10))
    b = FakePart("t", 1, FakeTracker(None))  # nothing committable yet
    c = FakePart("t", 2, FakeTracker(5), mode=OrderingMode.PARTITION, commit_sent=5)  # unchanged
    plan = plan_commit([a, b, c], with_progress=True, final=False)  # type: ignore[list-item]
    assert [(i.part, i.offset) for i in plan.items] == [(a, 10)]
    assert plan.items[0].encoded == ProgressCodec.encode(a.progress(10))
    assert plan.largest_progress_bytes == len(plan.items[0].encoded or b"")
    assert a.flushes == b.flushes == c.flushes == 1
    final = plan_commit([a, b, c], with_progress=False, final=True)  # type: ignore[list-item]
    assert [(i.part, i.offset, i.encoded) for i in final.items] == [(a, 10, None), (c, 5, None)]


def test_plan_skips_a_partition_whose_offset_and_progress_were_sent() -> None:
    a = FakePart("t", 0, FakeTracker(10))
    a.commit_sent, a.last_progress = 10, ProgressCodec.encode(a.progress(10))
    assert plan_commit([a], with_progress=True, final=False).items == ()  # type: ignore[list-item]
    a.tracker.offset = 11
    assert len(plan_commit([a], with_progress=True, final=False).items) == 1  # type: ignore[list-item]


def test_both_drivers_send_the_plan_and_record_what_they_sent() -> None:
    loop = asyncio.new_event_loop()
    try:
        for blocking in (False, True):
            consumer, store, hooks = FakeConsumer(), FakeStore(loop), FakeHooks(lose={1})
            cycle = CommitCycle(consumer, store, hooks)  # type: ignore[arg-type]
            a, lost = FakePart("t", 0, FakeTracker(7)), FakePart("t", 1, FakeTracker(3))
            if blocking:
                out = cycle.run_blocking([a, lost], producer=FlushOnly())  # type: ignore[list-item]
            else:
                out = loop.run_until_complete(cycle.run([a, lost], final=True))  # type: ignore[list-item]
            assert out == [lost], blocking  # before_commit raised: not committed, handed back
            assert hooks.calls == [("t", 0, 7), ("t", 1, 3)]
            assert [(t, p) for t, p, _ in store.written] == [("t", 0)]
            [(offsets, asynchronous)] = consumer.commits
            assert not asynchronous and [(o.topic, o.partition, o.offset) for o in offsets] == [("t", 0, 7)]
            assert a.commit_sent == 7 and a.last_progress == store.written[0][2], blocking
            assert a.committed == 7  # the synchronous answer is applied at once
            assert lost.commit_sent is None and lost.committed is None
    finally:
        loop.close()


def test_fenced_cycles_send_nothing() -> None:
    consumer = FakeConsumer()
    cycle = CommitCycle(consumer, None, None)
    cycle.fenced = True
    a = FakePart("t", 0, FakeTracker(7))
    assert cycle.run_blocking([a], producer=FlushOnly()) == []  # type: ignore[list-item]
    assert asyncio.run(cycle.run([a], final=True)) == []  # type: ignore[list-item]
    assert consumer.commits == [] and a.commit_sent is None


class FlushOnly:
    def flush(self, timeout: float) -> int:
        return 0
