"""A record waiting only for its outputs' acknowledgements lends its runner's place
(``multilane.worker.lanes.lend_slot``): in unordered and key mode the next records are processed
meanwhile, up to ``concurrency`` more records in hand; nothing completes (so nothing is committed)
before its acknowledgements; in key mode the next record of the same key still starts only after
the previous one completed; partition mode does not lend."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from confluent_kafka import Message

from multilane.api import Context, OrderingMode, Record
from multilane.worker.lanes import LEND_FACTOR
from multilane.worker.outputs import OutputProducer, with_outputs
from tests.support.lane_runtime import runtime, until


class GatedProducer:
    """A producer double whose delivery reports are held until ``gate`` is set."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.queue: list[Any] = []

    def produce(self, topic: str, value: bytes | None, key: bytes | None, headers: Any = None,
                on_delivery: Any = None) -> None:
        self.queue.append(on_delivery)

    def poll(self, timeout: float) -> int:
        if not self.gate.is_set():
            return 0
        batch, self.queue = self.queue, []
        for cb in batch:
            cb(None, None)
        return len(batch)

    def flush(self, timeout: float) -> int:
        return self.poll(0)

    def __len__(self) -> int:
        return len(self.queue)


def _msgs(keys: list[bytes]) -> list[Message]:
    return [Message(topic="t", partition=0, offset=i, key=k, value=b"v", timestamp=(1, i))
            for i, k in enumerate(keys)]


async def _settle(ticks: int = 50) -> None:
    for _ in range(ticks):
        await asyncio.sleep(0)


Outcome = tuple[list[tuple[str, int]], list[int], int, int]


def _run(mode: OrderingMode, factor: int, keys: list[bytes]) -> Outcome:
    """Feed ``keys`` with acknowledgements held; returns (events, started while held, committable
    while held, committable at the end)."""

    async def main() -> Outcome:
        events: list[tuple[str, int]] = []
        fake = GatedProducer()
        out = OutputProducer(fake, loop_idle_s=0.001)
        out.start(asyncio.get_running_loop())

        async def transform(rec: Record, ctx: Context) -> None:
            events.append(("start", rec.offset))
            await asyncio.sleep(0)
            ctx.produce("out", rec.value, key=rec.key)

        inner: Any = with_outputs(transform, out)

        async def proc(rec: Record, ctx: Context) -> None:
            await inner(rec, ctx)
            events.append(("done", rec.offset))

        rt = runtime(proc, mode, factor)
        rt.lanes.start()
        await asyncio.sleep(0)
        j, refused = rt.accept_run(_msgs(keys), 0, False)
        assert (j, refused) == (len(keys), False)
        await _settle()
        held_started = [o for e, o in events if e == "start"]
        rt.flush()
        held_commit = rt.tracker.committable() or 0
        # utilisation counts records being processed, not those lent while waiting (at most 1)
        lane0 = rt.lanes.lanes[0]
        assert rt.lanes.busy_fraction == (lane0.running - lane0.lent) / lane0.concurrency <= 1.0
        assert not any(e == "done" for e, _ in events), "a record completed before its acknowledgement"
        fake.gate.set()
        await until(lambda: sum(1 for e, _ in events if e == "done") == len(keys), "every record")
        rt.flush()
        end_commit = rt.tracker.committable() or 0
        lane = rt.lanes.lanes[0]
        assert lane.lent == 0
        rt.lanes.close()
        out.close(1.0)
        return events, held_started, held_commit, end_commit

    return asyncio.run(main())


def test_unordered_processes_the_next_records_while_outputs_wait() -> None:
    # F=2: two records processed; each then waits for its acknowledgement and lends its place, until
    # LEND_FACTOR * F places are lent; the next two are processed and wait holding their places; the
    # rest wait in the queue.
    in_hand = 2 * (1 + LEND_FACTOR)
    keys = [b"k%d" % i for i in range(in_hand + 3)]
    events, held_started, held_commit, end_commit = _run(OrderingMode.UNORDERED, 2, keys)
    assert sorted(held_started) == list(range(in_hand))
    assert in_hand > 2  # more records in hand than places, yet utilisation stays at most 1 (in _run)
    assert held_commit == 0
    assert end_commit == len(keys)
    assert sorted(o for e, o in events if e == "done") == list(range(len(keys)))


def test_key_mode_runs_other_keys_but_never_the_same_key_early() -> None:
    # One lane (factor 1): record 0 (key a) waits for its acknowledgement and lends the place; record 1
    # (key a again) must wait until record 0 completed; record 2 (key b) runs meanwhile.
    events, held_started, held_commit, end_commit = _run(OrderingMode.KEY, 1, [b"a", b"a", b"b"])
    assert held_started == [0, 2]
    assert held_commit == 0
    assert end_commit == 3
    assert events.index(("done", 0)) < events.index(("start", 1))


def test_partition_mode_does_not_lend() -> None:
    events, held_started, held_commit, end_commit = _run(OrderingMode.PARTITION, 1, [b"a", b"b", b"c"])
    assert held_started == [0]
    assert held_commit == 0
    assert end_commit == 3
    assert [o for e, o in events if e == "start"] == [0, 1, 2]
