"""Lane runners: a processor that waits is seen without stepping it by hand; one that never waits
keeps the lane's cheap wake policy; every record completes once, with one duration each."""

from __future__ import annotations

import asyncio
from typing import Any

from confluent_kafka import Message

from multilane.api import OrderingMode
from multilane.worker.metrics import LatencyHistogram
from tests.support.lane_runtime import runtime, until


def _msgs(n: int) -> list[Message]:
    return [Message(topic="t", partition=0, offset=i, key=b"k%d" % i, value=b"v", timestamp=(1, i))
            for i in range(n)]


def test_records_behind_a_waiting_record_start_at_once() -> None:
    """Five records fit in one runner's share of the wake (yield_every=64), so one runner is woken;
    the first record waits (an event that is set only once all five started). The lane must see the
    wait and wake runners for the other four; stepping runners serially would never set the event."""

    async def main() -> tuple[int, bool, int]:
        started: list[int] = []
        release = asyncio.Event()

        async def proc(rec: Any, ctx: Any) -> None:
            started.append(rec.offset)
            if len(started) == 5:
                release.set()
            await release.wait()

        rt = runtime(proc, OrderingMode.UNORDERED, 8)
        rt.lanes.start()
        await asyncio.sleep(0)
        j, refused = rt.accept_run(_msgs(5), 0, False)
        assert (j, refused) == (5, False)
        await until(lambda: len(started) == 5 and not rt.lanes.running, "five records to finish")
        rt.flush()
        lane = rt.lanes.lanes[0]
        rt.lanes.close()
        return rt.processed, lane.suspends, rt.tracker.committable() or 0

    processed, suspends, committable = asyncio.run(main())
    assert processed == 5
    assert suspends
    assert committable == 5


def test_a_processor_that_never_waits_keeps_the_lane_unsuspended() -> None:
    async def main() -> tuple[int, bool, int, int, set[int]]:
        seen: list[int] = []
        hashes: set[int] = set()

        async def proc(rec: Any, ctx: Any) -> None:
            assert ctx.offset == rec.offset and ctx.attempt == 1
            seen.append(rec.offset)
            hashes.add(rec.key_hash)

        rt = runtime(proc, OrderingMode.UNORDERED, 16)
        rt.lanes.start()
        await asyncio.sleep(0)
        msgs = _msgs(1000)
        i = 0
        while i < len(msgs):
            i, _ = rt.accept_run(msgs, i, False)
            await asyncio.sleep(0)
        await until(lambda: len(seen) == 1000 and not rt.lanes.running, "1000 records")
        rt.flush()
        lane = rt.lanes.lanes[0]
        rt.lanes.close()
        hist = rt._hist
        return rt.processed, lane.suspends, hist.total, len(set(seen)), hashes

    processed, suspends, observed, distinct, hashes = asyncio.run(main())
    assert processed == observed == distinct == 1000
    assert not suspends
    assert hashes == {0}  # unordered mode without a state view: no key hash computed


def test_key_mode_still_hashes_and_routes_by_key() -> None:
    async def main() -> set[tuple[bytes, int]]:
        got: set[tuple[bytes, int]] = set()

        async def proc(rec: Any, ctx: Any) -> None:
            got.add((rec.key, rec.key_hash))

        rt = runtime(proc, OrderingMode.KEY, 4)
        rt.lanes.start()
        await asyncio.sleep(0)
        rt.accept_run(_msgs(50), 0, False)
        await until(lambda: len(got) == 50 and not rt.lanes.running, "50 records")
        rt.lanes.close()
        return got

    from multilane.formats.keyranges import key_hash

    got = asyncio.run(main())
    assert got == {(b"k%d" % i, key_hash(b"k%d" % i)) for i in range(50)}


def test_a_context_kept_by_the_processor_is_never_changed_afterwards() -> None:
    """Runners reuse a Context only when nothing else refers to it: one the processor keeps (every
    other record here) must still describe its own record after later records ran, and every attempt
    sees its own record's fields (state and outputs reset, even after the processor set them)."""

    async def main() -> tuple[list[Any], list[tuple[int, int]], int]:
        kept: list[Any] = []
        checked: list[tuple[int, int]] = []
        reused = 0
        last: dict[int, int] = {}  # lane -> id of the Context of that runner's previous record

        async def proc(rec: Any, ctx: Any) -> None:
            nonlocal reused
            assert (ctx.topic, ctx.partition, ctx.offset, ctx.key, ctx.headers, ctx.attempt) == \
                (rec.topic, rec.partition, rec.offset, rec.key, rec.headers, 1)
            assert ctx.state is None and ctx.outputs is None
            checked.append((rec.offset, ctx.lane))
            if last.get(ctx.lane) == id(ctx):
                reused += 1
            last[ctx.lane] = id(ctx)
            ctx.outputs = object()  # a wrapper's sink: the next attempt must not see it
            if rec.offset % 2 == 0:
                kept.append(ctx)

        rt = runtime(proc, OrderingMode.UNORDERED, 4)
        rt.lanes.start()
        await asyncio.sleep(0)
        msgs = _msgs(400)
        i = 0
        while i < len(msgs):
            i, _ = rt.accept_run(msgs, i, False)
            await asyncio.sleep(0)
        await until(lambda: len(checked) == 400 and not rt.lanes.running, "400 records")
        rt.lanes.close()
        return kept, checked, reused

    kept, checked, reused = asyncio.run(main())
    assert sorted(o for o, _ in checked) == list(range(400))
    assert sorted(c.offset for c in kept) == list(range(0, 400, 2))
    assert len({id(c) for c in kept}) == len(kept) == 200  # each kept one is its own object
    assert reused > 0  # the unkept ones were reused (CPython)


def test_histogram_batches_count_like_single_observations() -> None:
    import random

    rng = random.Random(7)
    bounds = (0.001, 0.01, 0.1, 1.0)
    for n in (0, 1, 5, 300):
        values = [rng.choice([0.0, 0.001, 0.0011, 0.01, 0.5, 1.0, 2.0, rng.random() * 3]) for _ in range(n)]
        one, many = LatencyHistogram(bounds), LatencyHistogram(bounds)
        for v in values:
            one.observe(v)
        many.observe_many(list(values))
        assert many.counts == one.counts and many.total == one.total == n
        assert abs(many.sum - one.sum) < 1e-9
