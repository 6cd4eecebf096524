"""The engine's background loops, each an object with narrow inputs: :class:`HousekeepingLoop` (commit
cycle, watchdog, watermarks, rate, learner figures, reopening a partition whose state lost a change),
:class:`ProgressLoop` (progress records between commits) and :class:`ProducerLoop` (delivery
callbacks); with :class:`RateMeter` and :class:`LearnerStatusCache`, the figures they keep. Does I/O."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from multilane.worker.commits import CommitCycle, ProgressCycle
from multilane.worker.control_state import Lifecycle
from multilane.worker.hooks import StateStatusHooks
from multilane.worker.metrics import LatencyHistogram
from multilane.worker.partition_set import PartitionSet
from multilane.worker.reopen import Reopener
from multilane.worker.watchdog import StallWatchdog

__all__ = ["HousekeepingLoop", "LearnerStatusCache", "ProducerLoop", "ProgressLoop", "RateMeter"]

log = logging.getLogger(__name__)


class RateMeter:
    """The processing rate and the busy lanes, smoothed over samples at least a second apart."""

    def __init__(self, partitions: PartitionSet, hist: LatencyHistogram) -> None:
        self._partitions = partitions
        self._hist = hist
        self.processing_rate = 0.0
        # Average number of records being processed at once (busy lanes), smoothed like
        # processing_rate over the same samples: processing seconds completed per second (Little's
        # law), so processing_rate / busy_lanes is the service rate of one busy lane.
        self.busy_lanes = 0.0
        self._last_sample: tuple[float, int] = (time.monotonic(), 0)
        self._last_busy = 0.0  # the latency histogram's sum at the last sample

    def update(self, now: float) -> None:
        t0, n0 = self._last_sample
        n = self._partitions.processed_total()
        if now - t0 >= 1.0:
            rate = (n - n0) / (now - t0)
            prev = self.processing_rate
            self.processing_rate = rate if prev == 0 else 0.5 * prev + 0.5 * rate
            self._last_sample = (now, n)
            busy_s = self._hist.sum
            busy = (busy_s - self._last_busy) / (now - t0)
            self.busy_lanes = busy if self.busy_lanes == 0 else 0.5 * self.busy_lanes + 0.5 * busy
            self._last_busy = busy_s


class LearnerStatusCache:
    """The state hooks' ``learner_status()`` as last read on its own thread (never on the loop: the
    hooks may hold their lock during network calls)."""

    def __init__(self, hooks: StateStatusHooks | None, pool: ThreadPoolExecutor,
                 lifecycle: Lifecycle) -> None:
        self._hooks = hooks
        self._pool = pool
        self._lifecycle = lifecycle
        self.learners: list[dict[str, Any]] = []  # written by refresh() only
        self._task: asyncio.Task[None] | None = None  # the background refresh, if running

    def tasks(self) -> list[asyncio.Task[None]]:
        return [self._task] if self._task is not None else []

    async def refresh(self) -> None:
        """Re-read ``learner_status()`` on the status thread."""
        if self._hooks is not None and not self._lifecycle.stopping:
            self.learners = await asyncio.get_running_loop().run_in_executor(self._pool, self._read)

    def refresh_in_background(self) -> None:
        """Start a :meth:`refresh` unless one runs (a learn() may hold the hooks' lock for a while;
        commits must not wait for it)."""
        if self._hooks is not None and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self.refresh())

    def _read(self) -> list[dict[str, Any]]:
        """``learner_status()`` ([] when it fails; blocking)."""
        assert self._hooks is not None
        try:
            return list(self._hooks.learner_status())
        except Exception:
            log.exception("learner_status() failed")
            return []


class HousekeepingLoop:
    """Every half second: watchdog, watermarks, rate, learner figures; every commit interval, the
    commit cycle over the active partitions (a partition whose state lost a change is reopened)."""

    def __init__(self, commit_interval_s: float, partitions: PartitionSet, commits: CommitCycle,
                 consumer: Any, watchdog: StallWatchdog, rate: RateMeter, learners: LearnerStatusCache,
                 reopener: Reopener, lifecycle: Lifecycle, commit_due: asyncio.Event | None = None) -> None:
        """``commit_due``: set when a commit is due before the interval (exactly-once outputs: a
        partition's open transaction has ``--transaction-max-records`` records)."""
        self._interval = commit_interval_s
        self._commit_due = commit_due
        self._partitions = partitions
        self._commits = commits
        self._consumer = consumer
        self._watchdog = watchdog
        self._rate = rate
        self._learners = learners
        self._reopener = reopener
        self._lifecycle = lifecycle

    async def run(self) -> None:
        interval = self._interval
        next_commit = time.monotonic() + interval
        due = self._commit_due
        while not self._lifecycle.stopping:
            if due is None:
                await asyncio.sleep(min(0.5, interval))
            else:
                try:
                    await asyncio.wait_for(due.wait(), min(0.5, interval))
                except TimeoutError:
                    pass
                if due.is_set():
                    due.clear()
                    next_commit = 0.0
            now = time.monotonic()
            self._watchdog.scan([s for p in self._partitions for s in p.lanes.slots()], now)
            self._update_watermarks()
            self._rate.update(now)
            self._learners.refresh_in_background()
            if now >= next_commit:
                next_commit = now + interval
                try:
                    lost = await self._commits.run(self._partitions.active())
                except Exception:
                    log.exception("commit cycle failed; retrying next cycle")
                    continue
                for p in lost:
                    self._reopener.schedule(p)

    def _update_watermarks(self) -> None:
        for p in self._partitions:
            try:
                _lo, hi = self._consumer.get_watermark_offsets(TopicPartition(p.topic, p.partition),
                                                               cached=True)
            except KafkaException:
                continue
            if hi is not None and hi >= 0:
                p.high_watermark = hi


class ProgressLoop:
    """Every ``progress_interval_ms``: progress records of the active partitions (between commits)."""

    def __init__(self, interval_s: float, partitions: PartitionSet, progress: ProgressCycle,
                 lifecycle: Lifecycle) -> None:
        self._interval = interval_s
        self._partitions = partitions
        self._progress = progress
        self._lifecycle = lifecycle

    async def run(self) -> None:
        while not self._lifecycle.stopping:
            started = time.monotonic()
            try:
                await self._progress.run(self._partitions.active())
            except Exception:
                log.exception("progress cycle failed; retrying next cycle")
            await asyncio.sleep(self._progress.next_delay(self._interval, time.monotonic() - started))


class ProducerLoop:
    """Serves the producer's delivery callbacks (dead letters, progress records) on the loop: every
    5 ms while records await their acknowledgement, else every 50 ms or at once when :meth:`wake` is
    called (a record was just produced: a release's final progress record waits for its
    acknowledgement inside the handoff's pause, so it must not wait out an idle 50 ms sleep)."""

    def __init__(self, producer: Any, lifecycle: Lifecycle) -> None:
        self._producer = producer
        self._lifecycle = lifecycle
        self._wake: asyncio.Event | None = None  # made on the loop, in run()

    def wake(self) -> None:
        """A record was produced (call on the loop thread)."""
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        producer = self._producer
        wake = self._wake = asyncio.Event()
        while not self._lifecycle.stopping:
            producer.poll(0)
            if len(producer):
                await asyncio.sleep(0.005)
                continue
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), 0.05)
            except TimeoutError:
                pass
