"""The state of one lane: its queue, parked keys, retry timers and the accounting of runner places
(lent, standing by). No I/O; runs on the event loop. :class:`multilane.worker.lanes.Lane` adds the
runners themselves.

- A failed record waiting for its retry *parks* its key (blocking lanes only): later records of the
  same key hash wait behind it, other keys keep flowing. When the head finishes (success or dead
  letter) the parked records go back to the front of the queue, in order.
- A record whose processor returned but whose outputs still wait for the broker's acknowledgement
  *lends* its runner's place (:meth:`LaneCore.lend`, reached through
  :func:`multilane.worker.lanes.lend_slot` from :mod:`multilane.worker.outputs`): the lane wakes a
  runner standing by (or starts one), so that ``concurrency`` records are being processed while up to
  ``LEND_FACTOR * concurrency`` more only wait for acknowledgements. The record still completes (and
  may be committed) only when its runner's call returns, after the acknowledgements; a blocking lane
  parks the record's key meanwhile, so the next record of that key starts only after it completed.
  Partition mode (one ordering unit) and plain functions do not lend.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

from multilane.api import Context, Record
from multilane.formats.keyranges import KeyRange

__all__ = ["LEND_FACTOR", "LaneCore", "LaneEnv", "LaneHost", "RunSlot", "Work"]


#: How many records per place in flight may wait only for their outputs' acknowledgements (lent
#: places, see Lane.lend): with acknowledgements up to this many times slower than the processing,
#: the lane still processes ``concurrency`` records at once. The process's in-flight bound
#: (``--max-in-flight``) holds regardless.
LEND_FACTOR = 4


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
    def on_failure(self, work: Work, exc: BaseException, lane: LaneCore) -> None: ...


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


class LaneCore:
    """A lane's queue and the accounting of its runners (the runners: :class:`multilane.worker.lanes.Lane`).

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

    def _spawn(self) -> None:
        """Start one runner (the subclass's)."""
        raise NotImplementedError
