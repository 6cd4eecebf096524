"""The engine's background loops: *housekeeping* (commit cycle, watchdog, watermarks, rate, reopening a
partition whose state lost a change), *progress* (progress records between commits) and *producer*
(delivery callbacks). Does I/O."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from multilane.worker.config import TopicPartitionId
from multilane.worker.partition import PartitionRuntime, Phase
from multilane.worker.views import EngineViews

__all__ = ["Housekeeping"]

log = logging.getLogger("multilane.worker.engine")


class Housekeeping(EngineViews):
    """The loops started by ``Engine.start``."""

    def _on_commit(self, err: Any, tps: list[Any]) -> None:
        if self._commits is not None:
            self._commits.on_commit(err, tps, self._parts)

    async def _housekeeping_loop(self) -> None:
        interval = self.config.commit_interval_ms / 1000.0
        assert self._commits is not None
        next_commit = time.monotonic() + interval
        while not self._stopping:
            await asyncio.sleep(min(0.5, interval))
            now = time.monotonic()
            self._watchdog.scan([s for p in self._parts.values() for s in p.lanes.slots()], now)
            self._update_watermarks()
            self._update_rate(now)
            # learner figures: in the background (the hooks' lock may be held by a learn() for a
            # while; commits must not wait for it)
            task = self._learners_refresh
            if self.hooks is not None and (task is None or task.done()):
                self._learners_refresh = asyncio.get_running_loop().create_task(self.refresh_learners())
            if now >= next_commit:
                next_commit = now + interval
                active = [p for p in self._parts.values() if p.phase == Phase.ACTIVE]
                try:
                    lost = await self._commits.run(active)
                except Exception:
                    log.exception("commit cycle failed; retrying next cycle")
                    continue
                for p in lost:
                    self._schedule_reopen(p)

    def _schedule_reopen(self, part: PartitionRuntime) -> None:
        """Start :meth:`_reopen_lost` for ``part`` unless one is already running for it."""
        tp = (part.topic, part.partition)
        task = self._reopens.get(tp)
        if task is not None and not task.done():
            return
        assert self._loop is not None
        self._reopens[tp] = self._loop.create_task(self._reopen_lost(part), name=f"multilane-reopen-{tp}")

    async def _reopen_lost(self, part: PartitionRuntime) -> None:
        """Reopen a partition whose changelog lost a record (``before_commit`` raised
        :class:`StateDurabilityError`), so that every record not committed is processed again
        (steps 1-3, under the control lock).

        1. Still the same runtime (not released or reopened meanwhile)? Otherwise nothing to do.
        2. Release it without committing: drain (up to ``drain_timeout_s``), stop its lanes,
           ``close_partition(clean=False)`` (no checkpoint: the next open wipes the store), unassign.
        3. Add it again: committed offset and progress as on any assignment, ``open_partition``
           (full restore from the changelog), fetching from the committed offset. If that fails,
           retry with backoff (lock released in between) while it is in ``_reopen_pending``, i.e.
           until a control call or rebalance decides the partition's ownership.
        In standalone mode the partition stays in the group's assignment throughout; only the local
        consumer assignment is dropped and retaken.
        """
        tp = (part.topic, part.partition)
        delay = 0.5
        async with self._control_lock:
            # 1.
            if self._stopped or self._fenced_at is not None or self._parts.get(tp) is not part:
                return
            log.warning(
                "reopening %s/%d: its state changes are not durable; records after the last "
                "commit will be processed again",
                tp[0],
                tp[1],
            )
            # 2.
            await self._release_parts([part], self.config.drain_timeout_s, unassign=True, commit=False)
            self._reopen_pending.add(tp)
            # 3.
            if await self._try_reopen_add(tp, delay):
                return
        while not self._stopped:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
            async with self._control_lock:
                if self._stopped or self._fenced_at is not None or tp not in self._reopen_pending:
                    return
                if await self._try_reopen_add(tp, delay):
                    return

    async def _try_reopen_add(self, tp: TopicPartitionId, delay: float) -> bool:
        """Step 3 of :meth:`_reopen_lost` (control lock held): True when done."""
        try:
            await self._add_partitions([tp])
        except Exception as exc:
            log.warning("cannot reopen %s/%d yet (%s); retrying in %.1fs", tp[0], tp[1], exc, delay)
            return False
        self._reopen_pending.discard(tp)
        return True

    def _update_watermarks(self) -> None:
        for p in self._parts.values():
            try:
                _lo, hi = self._consumer.get_watermark_offsets(
                    TopicPartition(p.topic, p.partition), cached=True
                )
            except KafkaException:
                continue
            if hi is not None and hi >= 0:
                p.high_watermark = hi

    def _update_rate(self, now: float) -> None:
        t0, n0 = self._last_rate_sample
        n = self.processed_total()
        if now - t0 >= 1.0:
            rate = (n - n0) / (now - t0)
            prev = self.processing_rate
            self.processing_rate = rate if prev == 0 else 0.5 * prev + 0.5 * rate
            self._last_rate_sample = (now, n)
            busy_s = self._hist.sum
            busy = (busy_s - self._last_busy_sample) / (now - t0)
            self.busy_lanes = busy if self.busy_lanes == 0 else 0.5 * self.busy_lanes + 0.5 * busy
            self._last_busy_sample = busy_s

    async def _progress_loop(self) -> None:
        """Every ``progress_interval_ms``: progress records of the active partitions (between commits)."""
        interval = self.config.progress_interval_ms / 1000.0
        assert self._progress is not None
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._progress.run([p for p in self._parts.values() if p.phase == Phase.ACTIVE])
            except Exception:
                log.exception("progress cycle failed; retrying next cycle")
            await asyncio.sleep(self._progress.next_delay(interval, time.monotonic() - started))

    async def _producer_loop(self) -> None:
        producer = self._producer
        while not self._stopping:
            producer.poll(0)
            await asyncio.sleep(0.005 if len(producer) else 0.05)
