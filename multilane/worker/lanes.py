"""Lanes: per-partition queues of records and the long-lived runner coroutines that process them.

Does no network I/O itself; runs user processors (on the event loop or on a thread pool).

- A :class:`Lane` is a deque of :class:`Work` items plus ``concurrency`` runner coroutines.
  ``key`` mode: F lanes of concurrency 1, one per key range (records of a key run one at a time, in
  offset order). ``partition`` mode: 1 lane of concurrency 1. ``unordered`` mode: 1 lane of
  concurrency F.
- Runners are long-lived: no asyncio Task per record. An ``async def`` processor is awaited directly
  (a processor that never suspends costs no scheduling; the runner yields every ``yield_every``
  records), and its runner hands it the previous record's :class:`Context` again, every field set
  anew, when nothing else refers to that object any more (``sys.getrefcount``; a Context the
  processor kept is never touched again). A plain function runs on a thread pool in per-lane
  batches (one submission per batch).
- The queue, parking of failed records' keys and lending of places while outputs wait for their
  acknowledgements are :class:`multilane.worker.lane_core.LaneCore`'s; :func:`lend_slot` is how a
  processor wrapper reaches its own runner's lane.
- The lanes of one partition, the routing to them and the factor change are
  :class:`multilane.worker.lane_group.LaneGroup`'s.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import sys
import time
from collections.abc import Callable

from multilane.api import Context, Record
from multilane.worker.lane_core import LEND_FACTOR, LaneCore, LaneEnv, LaneHost, RunSlot, Work

__all__ = ["LEND_FACTOR", "Lane", "LaneEnv", "LaneHost", "RunSlot", "Work", "lend_slot"]

log = logging.getLogger(__name__)


# The lane and slot of the async runner whose task is running (set once per runner task: a task's
# context is its own), read by lend_slot().
_RUNNER: contextvars.ContextVar[tuple[Lane, RunSlot]] = contextvars.ContextVar("multilane_lane_runner")


def lend_slot() -> Lane | None:
    """Called by a processor wrapper (in the processor's call) when the record only waits for its
    outputs' acknowledgements: lends the runner's place (:meth:`Lane.lend`). Returns the lane, whose
    :meth:`Lane.unlend` the caller calls when the wait ended; None outside a lane runner, or when the
    lane does not lend (nothing to undo)."""
    current = _RUNNER.get(None)
    if current is None:
        return None
    lane, slot = current
    return lane if lane.lend(slot) else None


class Lane(LaneCore):
    """A lane's runners (on :class:`LaneCore`'s state): started, resized, closed, and their loops."""

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        for _ in range(self.concurrency):
            self._spawn()

    def _spawn(self) -> None:
        if self._free:
            slot = self._free.pop()
        else:
            slot = RunSlot(len(self.slots))
            self.slots.append(slot)
        runner = self._run_async(slot) if self.env.is_async else self._run_sync(slot)
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        task = loop.create_task(runner)
        task.add_done_callback(self._runner_done)
        self._tasks.add(task)
        self.live += 1

    def _runner_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or self.closed:
            return
        exc = task.exception()
        if exc is not None:  # a bug: say so loudly; the lane would otherwise stall silently
            log.error("lane %d runner died: %r", self.index, exc, exc_info=exc)

    def set_concurrency(self, n: int) -> None:
        """Unordered mode: run ``n`` runners (extra ones exit after their current record)."""
        self.concurrency = n
        self._call_reserve(len(self._reserve))
        while self.live - self.lent < n:
            self._spawn()
        self._wake_all()

    def close(self) -> None:
        """Stop the runners (cancelling running async records) and the retry timers."""
        self.closed = True
        for h in self._timers.values():
            h.cancel()
        self._timers.clear()
        for t in self._tasks:
            t.cancel()
        self._wake_all()

    # -- runners -------------------------------------------------------------------------------------

    def _ctx(self, work: Work, slot: RunSlot) -> tuple[Record, Context]:
        rec = work
        lane = self.index if self.concurrency == 1 else slot.index
        ctx = Context(rec.topic, rec.partition, rec.offset, rec.key, rec.headers, lane, work.attempt)
        view = self.env.view
        if view is not None:
            ctx.state = view(rec.topic, rec.partition, rec.key, self.key_range, rec.offset, work.key_hash)
        return rec, ctx

    def _exit_now(self) -> bool:
        """At the loop head of a runner that takes no record now: True when it must exit (closed, or
        an excess runner that cannot stand by)."""
        return self.closed or (self._excess() and (not self.env.is_async
                                                   or self.live > (1 + LEND_FACTOR) * self.concurrency))

    async def _run_async(self, slot: RunSlot) -> None:
        # The hot loop: locals for everything touched per record; no Task per record. The processor's
        # coroutine is awaited directly (no wrapper frame, no StopIteration to catch when it returns
        # at once); whether processors wait is seen between steps of the loop (see _check_wait()).
        q = self.queue
        popleft = q.popleft
        proc = self.env.processor
        view = self.env.view
        host = self.host
        done_append = host.done_buf.append
        dur_append = host.durations.append
        monotonic = time.monotonic
        yield_every = self.env.yield_every
        blocked = self.blocked
        lane_no = self.index if self.concurrency == 1 else slot.index
        # The clock read when the last record ended; 0.0 once the runner waited for anything else. A
        # record that starts right after the previous one ended starts at that reading (one clock read
        # per record instead of two; the gap is the runner's own few instructions).
        now = 0.0
        n = 0
        call_soon = asyncio.get_running_loop().call_soon
        check_wait = self._check_wait
        # Context reuse (CPython): ``sole`` is getrefcount(ctx) while only this frame holds ``ctx``.
        reuse = hasattr(sys, "getrefcount")
        getrefcount: Callable[[object], int] = sys.getrefcount if reuse else _no_count
        ctx: Context | None = None
        sole = -1  # never equal to a reference count until measured
        _RUNNER.set((self, slot))
        if not self.suspends:
            call_soon(check_wait)
        while True:
            # (the last test is _excess(), inlined: it runs once per record)
            if not q or self.holding or self.live - self.lent - self.reserved > self.concurrency:
                if self._exit_now():
                    self._retire(slot)
                    return
                if self._excess():
                    await self._stand_by()
                else:
                    await self._idle()
                now = 0.0
                if not self.suspends:
                    call_soon(check_wait)
                continue
            work = popleft()
            if blocked and self._parks(work):
                continue
            # The attempt's Context: the previous one again when nothing but this frame refers to it
            # any more (getrefcount() as right after it was made), with every field set anew -- nobody
            # can tell it from a fresh one (Context has no __weakref__ slot); else a new one.
            if ctx is not None and getrefcount(ctx) == sole:
                ctx.topic = work.topic
                ctx.partition = work.partition
                ctx.offset = work.offset
                ctx.key = work.key
                ctx.headers = work.headers
                ctx.lane = lane_no
                ctx.attempt = work.attempt
                ctx.state = None
                ctx.outputs = None
            else:
                ctx = Context(work.topic, work.partition, work.offset, work.key, work.headers, lane_no,
                              work.attempt)
                if reuse:
                    sole = getrefcount(ctx)
            if view is not None:
                ctx.state = view(work.topic, work.partition, work.key, self.key_range, work.offset,
                                 work.key_hash)
            slot.work = work
            t0 = slot.started = now or monotonic()
            self.running += 1
            try:
                await proc(work, ctx)
            except asyncio.CancelledError as exc:
                self.running -= 1
                slot.work = None
                now = 0.0
                if self.closed:
                    raise  # the lane is being stopped
                # the processor's own cancellation (not ours): a failed attempt like any other
                host.on_failure(work, exc, self)
            except Exception as exc:
                self.running -= 1
                slot.work = None
                now = 0.0
                host.on_failure(work, exc, self)
            else:
                self.running -= 1
                slot.work = None
                done_append(work)
                now = monotonic()
                dur_append(now - t0)
                if blocked:
                    self.key_done(work)
            n += 1
            if n >= yield_every:
                n = 0
                await asyncio.sleep(0)
                now = 0.0
                if not self.suspends:
                    call_soon(check_wait)

    async def _run_sync(self, slot: RunSlot) -> None:
        q = self.queue
        host = self.host
        loop = asyncio.get_running_loop()
        env = self.env
        while True:
            if not q or self.holding or self._excess():
                if self._exit_now():
                    self._retire(slot)
                    return
                await self._idle()
                continue
            limit = env.sync_batch
            if self.concurrency > 1:
                limit = max(1, min(limit, len(q) // self.concurrency))
            batch: list[Work] = []
            while q and len(batch) < limit:
                work = q.popleft()
                if self.blocked and self._parks(work):
                    continue
                batch.append(work)
            if not batch:
                continue
            self.running += len(batch)
            executor = env.executor
            assert executor is not None
            cfut = executor.submit(self._run_batch, batch, slot)
            self.batches.add(cfut)
            try:
                done, exc, durations = await asyncio.wrap_future(cfut, loop=loop)
            finally:
                self.running -= len(batch)
                if cfut.done():  # when cancelled, the thread may still run: keep it visible
                    self.batches.discard(cfut)
            host.on_success_many(batch[:done], durations)
            if self.blocked:
                for i in range(done):
                    self.key_done(batch[i])
            if exc is not None:
                rest = batch[done + 1:]
                if rest:
                    q.extendleft(reversed(rest))
                host.on_failure(batch[done], exc, self)

    def _run_batch(self, batch: list[Work], slot: RunSlot) -> tuple[int, BaseException | None, list[float]]:
        """Thread-pool side: run a batch in order; stop at the first failure."""
        proc = self.env.processor
        monotonic = time.monotonic
        durations: list[float] = []
        for i, work in enumerate(batch):
            if self.closed:
                slot.work = None
                return i, _AbandonedError(), durations
            rec, ctx = self._ctx(work, slot)
            slot.work = work
            t0 = slot.started = monotonic()
            try:
                result = proc(rec, ctx)
                if result is not None and inspect.isawaitable(result):
                    close = getattr(result, "close", None)
                    if close is not None:
                        close()  # no "never awaited" warning
                    raise TypeError("the processor returned an awaitable from a plain function: "
                                    "declare it 'async def' so that the engine awaits it")
            except BaseException as exc:  # even SystemExit from user code fails only this attempt
                slot.work = None
                return i, exc, durations
            durations.append(monotonic() - t0)
        slot.work = None
        return len(batch), None, durations


def _no_count(obj: object) -> int:
    """Without ``sys.getrefcount`` (not CPython): a count no measured ``sole`` ever equals."""
    return 0


class _AbandonedError(Exception):
    """The lane closed while a batch was running; the rest of the batch was not run."""
