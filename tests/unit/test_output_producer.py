"""Outputs tied to commits (``multilane.worker.outputs``) with a fake producer: a processor returns only
after every output of its attempt is acknowledged, a refused output fails the attempt, sync and async."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from multilane.api import Context, Record, needs_state, processor_needs_state
from multilane.worker.outputs import (
    OutputDeliveryError,
    OutputProducer,
    output_producer_config,
    with_outputs,
)


class FakeProducer:
    """A producer double: ``poll`` delivers queued reports once ``open`` is set (errors for topics in
    ``refuse``); ``produce`` raises BufferError while ``full`` is positive (counting down)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: list[tuple[str, bytes | None, bytes | None, Any, Any]] = []
        self.sent: list[tuple[str, bytes | None, bytes | None, Any]] = []
        self.open = threading.Event()
        self.open.set()
        self.refuse: set[str] = set()
        self.full = 0

    def produce(self, topic: str, value: bytes | None, key: bytes | None, headers: Any = None,
                on_delivery: Any = None) -> None:
        with self.lock:
            if self.full > 0:
                self.full -= 1
                raise BufferError("queue full")
            self.queue.append((topic, value, key, headers, on_delivery))

    def poll(self, timeout: float) -> int:
        if not self.open.wait(timeout):
            return 0
        with self.lock:
            batch, self.queue = self.queue, []
        for topic, value, key, headers, cb in batch:
            err = f"refused by {topic}" if topic in self.refuse else None
            if err is None:
                self.sent.append((topic, value, key, headers))
            cb(err, None)
        if not batch:
            time.sleep(min(timeout, 0.005))
        return len(batch)

    def flush(self, timeout: float) -> int:
        self.poll(0)
        return len(self.queue)


def _rec(offset: int = 0, key: bytes = b"k") -> tuple[Record, Context]:
    rec = Record("in", 0, offset, key, b"v", [], 0)
    return rec, Context("in", 0, offset, key, [], 0, 1)


@pytest.fixture(params=[False, True], ids=["thread", "loop"])
def on_loop(request: pytest.FixtureRequest) -> bool:
    """Who serves the delivery reports: a poll thread, or the engine's loop (the worker's default)."""
    return bool(request.param)


async def _started(fake: FakeProducer, on_loop: bool) -> OutputProducer:
    out = OutputProducer(fake, poll_timeout_s=0.01, poll_on_loop=on_loop)
    out.start(asyncio.get_running_loop())
    return out


def test_config_is_idempotent_with_security_and_overrides() -> None:
    conf = output_producer_config("b:9092", "c", 2.0, {"security.protocol": "SSL"}, {"linger.ms": "7"})
    assert conf["enable.idempotence"] is True and conf["acks"] == "all"
    assert conf["security.protocol"] == "SSL" and conf["linger.ms"] == "7"
    plain = output_producer_config("b:9092", "c", idempotent=False)
    assert plain["enable.idempotence"] is False and plain["max.in.flight.requests.per.connection"] == 1


def test_async_processor_returns_only_after_every_output_is_acknowledged(on_loop: bool) -> None:
    async def main() -> None:
        fake = FakeProducer()
        fake.open.clear()  # hold the delivery reports
        out = await _started(fake, on_loop)

        async def proc(record: Record, ctx: Context) -> None:
            for i in range(3):
                ctx.produce("out", f"{record.offset}/{i}", key=record.key)

        run = with_outputs(proc, out)
        task = asyncio.ensure_future(run(*_rec(5)))
        await asyncio.sleep(0.1)
        assert not task.done(), "returned before its outputs were acknowledged"
        fake.open.set()
        await asyncio.wait_for(task, 5)
        assert [v for _, v, _, _ in fake.sent] == [b"5/0", b"5/1", b"5/2"]
        out.close(1)

    asyncio.run(main())


def test_a_refused_output_fails_the_attempt(on_loop: bool) -> None:
    async def main() -> None:
        fake = FakeProducer()
        fake.refuse.add("bad")
        out = await _started(fake, on_loop)

        async def proc(record: Record, ctx: Context) -> None:
            ctx.produce("good", b"1")
            ctx.produce("bad", b"2")

        with pytest.raises(OutputDeliveryError, match="refused by bad"):
            await asyncio.wait_for(with_outputs(proc, out)(*_rec()), 5)
        out.close(1)

    asyncio.run(main())


def test_sync_processor_waits_on_its_thread(on_loop: bool) -> None:
    async def main() -> None:
        fake = FakeProducer()
        fake.open.clear()
        out = await _started(fake, on_loop)

        def proc(record: Record, ctx: Context) -> None:
            ctx.produce("out", b"x", headers=[("h", b"1")])

        run = with_outputs(proc, out)
        assert not asyncio.iscoroutinefunction(run)
        fut = asyncio.get_running_loop().run_in_executor(None, run, *_rec())
        await asyncio.sleep(0.1)
        assert not fut.done()
        fake.open.set()
        await asyncio.wait_for(fut, 5)
        assert fake.sent == [("out", b"x", None, [("h", b"1")])]
        fake.refuse.add("out")

        with pytest.raises(OutputDeliveryError):
            await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, run, *_rec(1)), 5)
        out.close(1)

    asyncio.run(main())


def test_no_outputs_no_wait_and_marks_kept(on_loop: bool) -> None:
    async def main() -> None:
        fake = FakeProducer()
        fake.open.clear()  # nothing would ever be acknowledged
        out = await _started(fake, on_loop)

        @needs_state
        async def proc(record: Record, ctx: Context) -> None:
            return None

        run = with_outputs(proc, out)
        assert processor_needs_state(run)
        await asyncio.wait_for(run(*_rec()), 1)
        fake.open.set()
        out.close(1)

    asyncio.run(main())


def test_a_full_queue_waits_then_sends(on_loop: bool) -> None:
    async def main() -> None:
        fake = FakeProducer()
        fake.full = 3
        out = await _started(fake, on_loop)

        async def proc(record: Record, ctx: Context) -> None:
            ctx.produce("out", b"x")

        await asyncio.wait_for(with_outputs(proc, out)(*_rec()), 5)
        assert len(fake.sent) == 1
        out.close(1)

    asyncio.run(main())


def test_many_concurrent_attempts_each_wait_for_their_own_outputs(on_loop: bool) -> None:
    async def main() -> None:
        fake = FakeProducer()
        out = await _started(fake, on_loop)
        done: list[int] = []

        async def proc(record: Record, ctx: Context) -> None:
            await asyncio.sleep(0.001 * (record.offset % 5))
            for i in range(record.offset % 4):
                ctx.produce("out", f"{record.offset}/{i}")

        run = with_outputs(proc, out)

        async def one(i: int) -> None:
            await run(*_rec(i))
            done.append(i)

        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(300))), 10)
        assert sorted(done) == list(range(300))
        assert len(fake.sent) == sum(i % 4 for i in range(300))
        out.close(1)

    asyncio.run(main())


class CountingProducer(FakeProducer):
    """A fake that, like the real client, tells how many outputs are not yet reported (``len``), and
    counts its polls."""

    def __init__(self) -> None:
        super().__init__()
        self.polls = 0

    def __len__(self) -> int:
        with self.lock:
            return len(self.queue)

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return super().poll(timeout)


def test_the_loop_polls_only_while_outputs_are_out() -> None:
    """Loop mode: no thread; polls run while an output waits for its report and stop once none is out
    (an idle worker does not poll); a send from a processor thread arms the loop's poller again."""

    async def main() -> None:
        fake = CountingProducer()
        before = threading.active_count()
        out = await _started(fake, True)

        async def proc(record: Record, ctx: Context) -> None:
            ctx.produce("out", b"x")

        fake.open.clear()
        task = asyncio.ensure_future(with_outputs(proc, out)(*_rec()))
        await asyncio.sleep(0.05)
        assert not task.done() and out.polling and fake.polls > 3  # polled while the report is held
        assert threading.active_count() == before  # no poll thread
        fake.open.set()
        await asyncio.wait_for(task, 5)
        await asyncio.sleep(0.02)
        polls = fake.polls
        await asyncio.sleep(0.05)
        assert not out.polling and fake.polls == polls, "polled with nothing out"

        def sync_proc(record: Record, ctx: Context) -> None:
            ctx.produce("out", b"y")

        await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(
            None, with_outputs(sync_proc, out), *_rec(1)), 5)
        assert [v for _, v, _, _ in fake.sent] == [b"x", b"y"] and fake.polls > polls
        out.close(1)

    asyncio.run(main())


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_a_producer_never_started_serves_its_first_and_only_output(sync: bool) -> None:
    """Without ``start``: the first send picks who serves reports (the caller's loop, or a thread for a
    sync processor's thread) and serves that very output: an attempt with one output completes."""

    async def main() -> None:
        fake = CountingProducer()
        out = OutputProducer(fake, poll_timeout_s=0.01)

        async def proc(record: Record, ctx: Context) -> None:
            ctx.produce("out", b"only")

        def sync_proc(record: Record, ctx: Context) -> None:
            ctx.produce("out", b"only")

        if sync:
            run = with_outputs(sync_proc, out)
            await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, run, *_rec()), 5)
        else:
            await asyncio.wait_for(with_outputs(proc, out)(*_rec()), 5)
        assert [v for _, v, _, _ in fake.sent] == [b"only"]
        out.close(1)

    asyncio.run(main())
