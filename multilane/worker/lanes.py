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
- A failed record waiting for its retry *parks* its key (blocking lanes only): later records of the
  same key hash wait behind it, other keys keep flowing. When the head finishes (success or dead
  letter) the parked records go back to the front of the queue, in order.
- A record whose processor returned but whose outputs still wait for the broker's acknowledgement
  *lends* its runner's place (:func:`lend_slot`, called by :mod:`multilane.worker.outputs`): the lane
  starts one more runner, so that ``concurrency`` records are being processed while up to
  ``LEND_FACTOR * concurrency`` more only wait for acknowledgements. The record still completes (and may be
  committed) only when its runner's call returns, after the acknowledgements; a blocking lane parks
  the record's key meanwhile, so the next record of that key starts only after it completed (as
  before). Partition mode (one ordering unit) and plain functions do not lend.
- The lanes of one partition, the routing to them and the factor change are
  :class:`multilane.worker.lane_group.LaneGroup`'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

from multilane.api import Context, Record
from multilane.formats.keyranges import KeyRange

__all__ = ["Lane", "LaneEnv", "LaneHost", "RunSlot", "Work", "lend_slot"]

log = logging.getLogger(__name__)

#: How many records per place in flight may wait only for their outputs' acknowledgements (lent
#: places, see Lane.lend): with acknowledgements up to this many times slower than the processing,
#: the lane still processes ``concurrency`` records at once. The process's in-flight bound
#: (``--max-in-flight``) holds regardless.
LEND_FACTOR = 4

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


@dataclass(slots=True, eq=False)
class Work(Record):
    """One record on its way through a lane: the :class:`Record` the processor receives, with the
    engine's bookkeeping attached (one object per record instead of two; processors see a Record).

    Compared by identity (``eq=False``): the engine keys dicts by work items.
    """

    # routing hash: key_hash(key), or of the offset for null keys; 0 where nothing reads it (unordered
    # and partition modes without a state view: see PartitionRuntime._hash_keys)
    key_hash: int = 0
    nbytes: int = 0  # what it counts against the byte bound
    attempt: int = 1  # 1-based number of the next attempt

    # identity semantics (Record's dataclass __eq__ would make it unhashable)
    __eq__ = object.__eq__
    __hash__ = object.__hash__


class RunSlot:
    """What one runner is doing now (read by the stall watchdog; written by the runner only)."""

    __slots__ = ("index", "started", "warned", "work")

    def __init__(self, index: int) -> None:
        self.index = index
        self.work: Work | None = None  # the record running now, None when idle
        self.started = 0.0  # time.monotonic() when ``work`` started
        self.warned: Work | None = None  # the record the watchdog last warned about


class LaneHost(Protocol):
    """Receives the outcome of every attempt (the partition runtime).

    Successes of async runners are appended straight to ``done_buf`` / ``durations`` (the host applies
    them in bulk); those lists are never replaced, only cleared.
    """

    done_buf: list[Work]
    durations: list[float]

    def on_success(self, work: Work, seconds: float) -> None: ...
    def on_success_many(self, works: list[Work], durations: list[float]) -> None: ...
    def on_failure(self, work: Work, exc: BaseException, lane: Lane) -> None: ...


@dataclass
class LaneEnv:
    """What every lane of the process shares."""

    processor: Callable[[Record, Context], Any]
    is_async: bool
    executor: Executor | None
    yield_every: int = 64
    sync_batch: int = 64
    # state view factory: (topic, partition, key, key_range, offset, key_hash) -> StateView
    view: Callable[[str, int, bytes | None, KeyRange, int, int], Any] | None = None


@dataclass
class _Parked:
    head: Work  # the failed record whose retry is pending; runs before any other record of its key
    waiting: deque[Work] = field(default_factory=deque)  # later records of the key, in offset order


class Lane:
    """A queue and its runners.

    Invariants: ``queue`` holds records not yet started (and retries that are due); ``running`` counts
    records handed to the processor and not yet returned; a record is in exactly one of: ``queue``, a
    ``_Parked.waiting`` deque, ``_timers`` (retry pending), a runner (running). Records of one key
    hash leave this lane to the processor in offset order when the lane is blocking.
    """

    def __init__(self, index: int, key_range: KeyRange, host: LaneHost, env: LaneEnv,
                 concurrency: int, blocking: bool, block_all: bool = False) -> None:
        self.index = index
        self.key_range = key_range
        self.host = host
        self.env = env
        self.blocking = blocking
        # partition mode: a failed record parks *every* later record (one ordering unit), not only
        # those of its key hash
        self.block_all = block_all
        self.queue: deque[Work] = deque()
        self.running = 0
        self.holding = False  # True while the group re-routes: runners take nothing
        self.closed = False
        self.concurrency = concurrency
        # Set once an attempt waited (suspended) instead of finishing in one step; never reset.
        self.suspends = False
        self.slots: list[RunSlot] = []  # every slot ever made (the watchdog scans them); reused
        self._free: list[RunSlot] = []  # slots of runners that exited, for the next runner
        # Runner tasks alive. Invariant: live - lent - reserved == concurrency once the runners
        # reached their loop heads (a runner that finds more takes no record: it stands by, or exits
        # when more than (1 + LEND_FACTOR) * concurrency are alive).
        self.live = 0
        # Runners whose record only waits for its outputs' acknowledgements (each let one more runner
        # take records: see lend()); 0 <= lent <= LEND_FACTOR * concurrency.
        self.lent = 0
        # Runners standing by (async lanes): woken by lend() instead of starting a task per record.
        self.reserved = 0
        self._reserve: deque[asyncio.Future[None]] = deque()
        # block key (key hash, or 0 when block_all) -> parked unit (blocking lanes only)
        self.blocked: dict[int, _Parked] = {}
        self._timers: dict[Work, asyncio.TimerHandle] = {}
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        # The loop the runners run on (set by the first _spawn): asyncio.get_running_loop() checks the
        # process id, a system call, on every call.
        self._loop: asyncio.AbstractEventLoop | None = None
        self.processed = 0
        # Thread-pool batches submitted and not yet awaited back. A closed lane's batch stops after its
        # current record; callers that must not overlap a new owner wait for these (see
        # LaneGroup.batches_running).
        self.batches: set[concurrent.futures.Future[Any]] = set()

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

    def _excess(self) -> bool:
        """More runners than ``concurrency`` take records (after a shrink, or a lent place returned)."""
        return self.live - self.lent - self.reserved > self.concurrency

    async def _stand_by(self) -> None:
        """Wait in the reserve until lend() (or a factor change, or close) needs this runner."""
        assert self._loop is not None  # a runner runs: _spawn set it
        fut: asyncio.Future[None] = self._loop.create_future()
        self._reserve.append(fut)
        self.reserved += 1
        await fut  # the waker took it off the count

    def _call_reserve(self, n: int) -> int:
        """Wake up to ``n`` standing-by runners; returns how many."""
        woken = 0
        while woken < n and self._reserve:
            fut = self._reserve.popleft()
            self.reserved -= 1
            if not fut.done():
                fut.set_result(None)
            woken += 1
        return woken

    def _retire(self, slot: RunSlot) -> None:
        """The runner of ``slot`` exits (it returns right after this)."""
        self.live -= 1
        slot.work = None
        self._free.append(slot)

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

    # -- lending a runner's place while a record waits for acknowledgements --------------------------

    def lend(self, slot: RunSlot) -> bool:
        """The record of ``slot``'s runner returned from the user's processor and now only waits for
        its outputs' acknowledgements: let one more runner take records meanwhile (steps 1-3). Returns
        False (nothing done) when this lane does not lend; else the caller calls :meth:`unlend` once
        the wait ended, before its runner goes on.

        1. Refuse in partition mode (one ordering unit), for plain functions (their batches run on a
           thread) and while ``LEND_FACTOR * concurrency`` places are lent already (the bound on
           records in hand).
        2. A blocking lane parks the record's key: the next record of the key waits until this one
           completed, exactly as if the runner still held its place.
        3. Start a runner if fewer than ``concurrency`` take records now.
        """
        # 1.
        work = slot.work
        if self.block_all or self.closed or not self.env.is_async or work is None \
                or self.lent >= LEND_FACTOR * self.concurrency:
            return False
        self.lent += 1
        # 2.
        if self.blocking and work.key_hash not in self.blocked:
            self.blocked[work.key_hash] = _Parked(work)
        # 3.
        if self.live - self.lent - self.reserved < self.concurrency and not self._call_reserve(1):
            self._spawn()
        return True

    def unlend(self) -> None:
        """The lent wait ended; the runner finishes its record (an extra runner exits at its loop head)."""
        self.lent -= 1

    def close(self) -> None:
        """Stop the runners (cancelling running async records) and the retry timers."""
        self.closed = True
        for h in self._timers.values():
            h.cancel()
        self._timers.clear()
        for t in self._tasks:
            t.cancel()
        self._wake_all()

    # -- feeding -----------------------------------------------------------------------------------

    def push(self, work: Work) -> None:
        self.queue.append(work)
        if self._waiters and not self.holding:
            self._wake_one()

    def _wake_one(self) -> None:
        waiters = self._waiters
        while waiters:
            f = waiters.popleft()
            if not f.done():
                f.set_result(None)
                return

    def _wake_all(self) -> None:
        waiters, self._waiters = self._waiters, deque()
        for f in waiters:
            if not f.done():
                f.set_result(None)

    def wake(self) -> None:
        """Wake idle runners for the queued records (after appending to ``queue`` directly, as the
        fetch path does in bulk): one per record once processors are known to wait (``suspends``);
        before that, one per ``yield_every`` records -- a processor that never waits runs that many
        records in a row, and waking hundreds of runners per batch for it is pure overhead."""
        if self._waiters and not self.holding:
            if self.running and not self.suspends and self.env.is_async:
                self.suspends = True  # a record is running between two steps of the loop: it waits
            n = len(self.queue)
            self._wake_n(n if self.suspends else -(-n // self.env.yield_every))

    def _check_wait(self) -> None:
        """Between two steps of the loop: a record of this lane running now has waited (a record whose
        processor never waits runs from start to end inside its runner's step). Once one has, wake one
        runner per queued record from now on (``suspends``, never undone).

        Async runners schedule this once per resumption of their own while ``suspends`` is unset (after
        idling, after yielding; not per record); :meth:`wake` makes the same test when records arrive.
        The runner itself awaits the processor directly: no step by hand, no wrapper frame.
        """
        if self.running and not self.suspends:
            self.suspends = True
            self.wake()

    def _wake_n(self, n: int) -> None:
        for _ in range(min(n, len(self._waiters))):
            self._wake_one()

    async def _idle(self) -> None:
        assert self._loop is not None  # a runner runs: _spawn set it
        fut: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append(fut)
        await fut

    # -- retries and parking -----------------------------------------------------------------------

    def retry_later(self, work: Work, delay: float) -> None:
        """Run ``work`` again after ``delay`` s; a blocking lane parks its key meanwhile."""
        if self.blocking:
            bk = 0 if self.block_all else work.key_hash
            if bk not in self.blocked:
                self.blocked[bk] = _Parked(work)
        loop = asyncio.get_running_loop()
        self._timers[work] = loop.call_later(delay, self._retry_due, work)

    def _retry_due(self, work: Work) -> None:
        self._timers.pop(work, None)
        if self.closed:
            return
        self.queue.appendleft(work)
        if not self.holding:
            self._wake_one()

    def key_done(self, work: Work) -> None:
        """``work`` finished for good (success or dead letter): release its parked key."""
        blocked = self.blocked
        if blocked:
            bk = 0 if self.block_all else work.key_hash
            p = blocked.get(bk)
            if p is not None and p.head is work:
                del blocked[bk]
                if p.waiting:
                    self.queue.extendleft(reversed(p.waiting))
                    if not self.holding:
                        self._wake_n(len(p.waiting))

    def _parks(self, work: Work) -> bool:
        """True when ``work`` must wait behind a failed record of its key (and was parked)."""
        p = self.blocked.get(0 if self.block_all else work.key_hash)
        if p is None or p.head is work:
            return False
        p.waiting.append(work)
        return True

    def drain_items(self) -> tuple[list[Work], list[tuple[Work, float]]]:
        """Take every record not running: (queued and parked, retry-pending with remaining delay).

        Only while ``holding`` and nothing runs (the group's resize).
        """
        items = list(self.queue)
        self.queue.clear()
        for p in self.blocked.values():
            items.extend(p.waiting)
        self.blocked.clear()
        loop = asyncio.get_running_loop()
        pending = [(w, max(0.0, h.when() - loop.time())) for w, h in self._timers.items()]
        for h in self._timers.values():
            h.cancel()
        self._timers.clear()
        return items, pending

    def incomplete_offsets(self) -> list[int]:
        """Offsets of every record of this lane that is not finished (for diagnostics)."""
        out = [w.offset for w in self.queue]
        for p in self.blocked.values():
            out.extend(w.offset for w in p.waiting)
        out.extend(w.offset for w in self._timers)
        out.extend(s.work.offset for s in self.slots if s.work is not None)
        return out

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
