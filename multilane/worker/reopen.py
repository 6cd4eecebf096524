"""``Reopener``: reopen a partition whose state lost a change (``before_commit`` raised
:class:`StateDurabilityError`) or whose transaction aborted (exactly-once outputs), so that every record
not committed is processed again. Does I/O (through the ownership protocol)."""

from __future__ import annotations

import asyncio
import logging

from multilane.worker.config import TopicPartitionId
from multilane.worker.control_state import ControlState, Lifecycle
from multilane.worker.ownership import Ownership
from multilane.worker.partition import PartitionRuntime
from multilane.worker.partition_set import PartitionSet

__all__ = ["Reopener"]

log = logging.getLogger(__name__)


class Reopener:
    """At most one reopen task per partition at a time."""

    def __init__(self, ownership: Ownership, partitions: PartitionSet, control: ControlState,
                 lifecycle: Lifecycle, control_lock: asyncio.Lock, drain_timeout_s: float) -> None:
        self._ownership = ownership
        self._partitions = partitions
        self._control = control
        self._lifecycle = lifecycle
        self._control_lock = control_lock
        self._drain_timeout_s = drain_timeout_s
        # The reopen tasks by partition (a finished task stays until the next reopen replaces it).
        self._tasks: dict[TopicPartitionId, asyncio.Task[None]] = {}

    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._tasks.values())

    def schedule(self, part: PartitionRuntime) -> None:
        """Start :meth:`_reopen` for ``part`` unless one is already running for it."""
        tp = (part.topic, part.partition)
        task = self._tasks.get(tp)
        if task is not None and not task.done():
            return
        self._tasks[tp] = asyncio.get_running_loop().create_task(self._reopen(part),
                                                                 name=f"multilane-reopen-{tp}")

    def _gone(self, tp: TopicPartitionId) -> bool:
        """Stopped, fenced, or the partition's ownership decided by someone else meanwhile."""
        return self._lifecycle.stopped or self._control.fenced_at is not None \
            or not self._partitions.reopen_pending(tp)

    async def _reopen(self, part: PartitionRuntime) -> None:
        """Reopen ``part`` (steps 1-3, under the control lock).

        1. Still the same runtime (not released or reopened meanwhile)? Otherwise nothing to do.
        2. Release it without committing: drain (up to ``drain_timeout_s``), stop its lanes,
           ``close_partition(clean=False)`` (no checkpoint: the next open wipes the store), unassign.
        3. Add it again: committed offset and progress as on any assignment, ``open_partition``
           (full restore from the changelog), fetching from the committed offset. If that fails,
           retry with backoff (lock released in between) while it is reopen-pending, i.e. until a
           control call or rebalance decides the partition's ownership.
        In standalone mode the partition stays in the group's assignment throughout; only the local
        consumer assignment is dropped and retaken.
        """
        tp = (part.topic, part.partition)
        delay = 0.5
        async with self._control_lock:
            # 1.
            if self._lifecycle.stopped or self._control.fenced_at is not None \
                    or self._partitions.get(tp) is not part:
                return
            log.warning("reopening %s/%d: its state changes are not durable or its transaction aborted; "
                        "records after the last commit will be processed again", tp[0], tp[1])
            # 2.
            await self._ownership.release([part], self._drain_timeout_s, unassign=True, commit=False)
            if self._ownership.fenced(tp):  # exactly-once: another worker took it; never fence it back
                log.error("dropped %s/%d: another worker opened its transaction (this worker was fenced)",
                          tp[0], tp[1])
                return
            self._partitions.mark_reopen_pending(tp)
            # 3.
            if await self._try_add(tp, delay):
                return
        while not self._lifecycle.stopped:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
            async with self._control_lock:
                if self._gone(tp):
                    return
                if await self._try_add(tp, delay):
                    return

    async def _try_add(self, tp: TopicPartitionId, delay: float) -> bool:
        """Step 3 (control lock held): True when done."""
        try:
            await self._ownership.add([tp])
        except Exception as exc:
            log.warning("cannot reopen %s/%d yet (%s); retrying in %.1fs", tp[0], tp[1], exc, delay)
            return False
        self._partitions.settle([tp])
        return True
