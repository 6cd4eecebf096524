"""``AssignmentControl``: the engine's control verbs over its partitions (``assign``, ``release``,
``set_factor``, ``pause``, ``resume``, ``fence``, ``lease_renewed``) and the fencing rules they keep,
under the engine's control lock. Does I/O (through the ownership protocol: commits, the consumer).

The only writer of :class:`~multilane.worker.control_state.ControlState` besides ``Engine.__init__``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from multilane.worker.config import EngineConfig, TopicPartitionId
from multilane.worker.control_state import ControlState
from multilane.worker.ownership import EngineError, FencingError, Ownership, ReleaseResult
from multilane.worker.partition import Phase
from multilane.worker.partition_set import PartitionSet

__all__ = ["AssignmentControl", "normalise_partitions"]

log = logging.getLogger(__name__)


class AssignmentControl:
    """The assignment verbs of one engine (call on the engine's loop).

    Invariants: ``control.generation`` never decreases; while ``control.fenced_at`` is set nothing is
    fetched, processed or committed (see :meth:`fence`).
    """

    def __init__(self, config: EngineConfig, control: ControlState, partitions: PartitionSet,
                 control_lock: asyncio.Lock, started: Callable[[], Ownership],
                 ownership: Callable[[], Ownership | None]) -> None:
        self.config = config
        self.control = control
        self.partitions = partitions
        self._control_lock = control_lock
        self._started = started  # the ownership protocol of a running engine, else EngineError
        self._ownership = ownership  # the ownership protocol once started (None before)

    async def assign(self, partitions: Iterable[TopicPartitionId], generation: int,
                     release_deadline_s: float = 30.0,
                     progress: Mapping[TopicPartitionId, bytes] | None = None,
                     changelog_ends: Mapping[TopicPartitionId, int] | None = None) -> list[ReleaseResult]:
        """Make the assignment exactly ``partitions`` (operator mode); fenced by ``generation``.

        1. Refuse (FencingError) a generation below the current one, or, while fenced
           (:meth:`fence`), one not above the generation held when fenced; adopt the new generation.
        2. Release partitions no longer wanted (drain up to the deadline, final commit). After a
           fence: drop every fenced partition without committing, then lift the fence.
        3. Add new partitions at their committed offset, skipping what their progress says is done
           (``progress``: records their last owners released, used when they fit the committed offset;
           ``changelog_ends``: the changelog ends those releases answered, handed to the state open).
        """
        if not self.config.operator_mode:
            raise EngineError("assign() is for operator mode; standalone mode uses group rebalances")
        wanted = normalise_partitions(partitions)
        ownership = self._started()
        control = self.control
        t0 = time.monotonic()
        async with self._control_lock:
            locked = time.monotonic()
            # 1. fencing
            if generation < control.generation:
                raise FencingError(f"assignment generation {generation} is older than current "
                                   f"generation {control.generation}")
            if control.fenced_at is not None and generation <= control.fenced_at:
                raise FencingError(f"fenced (lease lost) at generation {control.fenced_at}: waiting for "
                                   f"a higher generation than {generation}")
            if control.fenced_at is not None and control.lease_lost:
                # the operator may not see the Lease as expired yet; processing resumes only once it
                # is held again (else a new owner could start while this worker still runs)
                raise FencingError(f"fenced (lease lost) at generation {control.fenced_at}: the lease is "
                                   "not renewed yet")
            control.generation = generation
            self.partitions.settle()  # this assignment decides every partition
            # 2. release (fenced partitions: dropped uncommitted, re-added fresh if still wanted)
            if control.fenced_at is not None:
                fenced = [p for p in self.partitions if p.phase == Phase.FENCED]
                await ownership.release(fenced, 0.0, unassign=True, commit=False)
                control.fenced_at = None
                ownership.commits.fenced = False
                log.info("fence lifted by generation %d", generation)
            gone = [p for p in self.partitions if (p.topic, p.partition) not in wanted]
            released = await ownership.release(gone, release_deadline_s, unassign=True, close_after=True)
            # 3. add
            new = [tp for tp in wanted if tp not in self.partitions]
            if new:
                await ownership.add(new, progress, changelog_ends)
            if new or released:  # where a handoff's call went (the steps log their own parts)
                log.info("assignment %d: %d released, %d added in %.3fs (waited %.3fs for the control lock)",
                         generation, len(released), len(new), time.monotonic() - t0, locked - t0)
            return released

    async def release(self, partitions: Iterable[TopicPartitionId],
                      deadline_s: float = 30.0) -> list[ReleaseResult]:
        """Drain and hand back partitions; returns their final committed offsets."""
        tps = normalise_partitions(partitions)
        ownership = self._started()
        async with self._control_lock:
            self.partitions.settle(tps)
            unknown = [tp for tp in tps if tp not in self.partitions]
            if unknown:
                log.info("release of partitions not owned: %s", unknown)
            return await ownership.release(self.partitions.owned(tps), deadline_s,
                                           unassign=self.config.operator_mode,
                                           close_after=self.config.operator_mode)

    async def set_factor(self, factor: int) -> int:
        """Change lanes per partition at run time (quiesce + re-route; see LaneGroup.resize)."""
        if not isinstance(factor, int) or isinstance(factor, bool) or not 1 <= factor <= 65536:
            raise EngineError(f"factor must be an int in [1, 65536], got {factor!r}")
        async with self._control_lock:
            self.control.factor = factor
            await asyncio.gather(*(p.lanes.resize(factor) for p in self.partitions
                                   if p.phase != Phase.FENCED))
        return factor

    def pause(self) -> bool:
        """Stop fetching every partition (records in flight still finish)."""
        self.control.user_paused = True
        parts = self.partitions.owned()
        for p in parts:
            p.user_paused = True
        ownership = self._ownership()
        if ownership is not None:
            ownership.fetch.pause_fetch(parts)
        return True

    def resume(self) -> bool:
        """Undo :meth:`pause` (partitions paused by back-pressure stay paused until drained)."""
        self.control.user_paused = False
        for p in self.partitions:
            p.user_paused = False
            if not p.flow_counters.paused and p.phase == Phase.ACTIVE:
                ownership = self._ownership()
                if ownership is None:
                    raise EngineError("the engine has not started")
                ownership.fetch.resume_fetch(p)
        return False

    def lease_renewed(self) -> None:
        """The Lease is held again (``LeaseKeeper``'s ``on_renewed``): a fenced engine may now accept
        an assignment with a higher generation (it stays fenced until one arrives)."""
        self.control.lease_lost = False

    def fence(self) -> None:
        """Stop processing and committing at once: the worker's Lease was lost (``LeaseKeeper``'s
        ``on_lost``), so the operator may hand its partitions to another worker (steps 1-4).
        Synchronous, on the loop thread, without awaiting; idempotent; operator mode only.

        1. Commits stop: the commit cycle sends no further commit request (also one already running),
           and no release or stop commits a fenced partition.
        2. Every owned partition goes to phase ``fenced``: its fetching is paused, and messages
           already fetched for it are ignored by the fetch loop.
        3. Its lanes are closed: queued records are dropped, running async records cancelled, a
           thread-pool batch stops after its current record; outcomes arriving later are ignored.
        4. :meth:`assign` refuses every generation up to the current one, and every generation while
           the Lease is not renewed (:meth:`lease_renewed`); then an assignment with a higher
           generation drops the fenced partitions without committing and adds the wanted ones from
           their committed offsets (the next owner may have committed meanwhile). Until then the
           reopen of a partition whose state lost a change does not run.
        """
        if not self.config.operator_mode:
            raise EngineError("fence() is for operator mode (the Lease belongs to the operator)")
        control = self.control
        control.lease_lost = True
        if control.fenced_at is not None:
            return
        # 1. no more commits
        control.fenced_at = control.generation
        ownership = self._ownership()
        if ownership is not None:
            ownership.commits.fenced = True
        # 2. stop fetching
        parts = self.partitions.owned()
        for p in parts:
            p.phase = Phase.FENCED
        if ownership is not None:
            ownership.fetch.pause_fetch(parts)
        # 3. stop processing
        for p in parts:
            p.close()
        # 4. (assign) wait for a higher generation
        log.error("fenced at generation %d: stopped processing and committing %s", control.generation,
                  [(p.topic, p.partition) for p in parts])


def normalise_partitions(partitions: Iterable[Any]) -> list[TopicPartitionId]:
    """``(topic, partition)`` pairs or ``{"topic", "partition"}`` dicts, checked, without repeats."""
    out: list[TopicPartitionId] = []
    for tp in partitions:
        if isinstance(tp, dict):
            topic, part = tp.get("topic"), tp.get("partition")
        else:
            try:
                topic, part = tp
            except (TypeError, ValueError) as exc:
                raise EngineError(f"a partition must be (topic, partition), got {tp!r}") from exc
        if not isinstance(topic, str) or not topic or not isinstance(part, int) or isinstance(part, bool) \
                or part < 0:
            raise EngineError(f"a partition must be (topic: str, partition: int >= 0), got {tp!r}")
        if (topic, part) not in out:
            out.append((topic, part))
    return out
