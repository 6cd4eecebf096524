"""``LearnerCalls``: the engine's learner verbs (``learn``, ``promote``, ``demote``, ``drop``; docs/state.md,
"Learner protocol") over the learner hooks, under the engine's control lock. Does I/O (the hooks, on
the I/O threads; ``demote`` releases through the ownership protocol)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from multilane.worker.config import TopicPartitionId
from multilane.worker.hooks import LearnerHooks
from multilane.worker.ownership import EngineError, Ownership, ReleaseResult
from multilane.worker.partition_set import PartitionSet

__all__ = ["LearnerCalls"]


class LearnerCalls:
    """The learner verbs of one engine. Without learner hooks every verb raises :class:`EngineError`
    (HTTP 404)."""

    def __init__(self, learner: LearnerHooks | None, partitions: PartitionSet, control_lock: asyncio.Lock,
                 run_io: Callable[..., Awaitable[Any]], operator_mode: bool) -> None:
        self._learner = learner
        self._partitions = partitions
        self._control_lock = control_lock
        self._run_io = run_io
        self._operator_mode = operator_mode

    def hooks(self, verb: str) -> LearnerHooks:
        if self._learner is None:
            raise EngineError(f"{verb} needs a worker with a state store")
        return self._learner

    async def promote(self, tps: list[TopicPartitionId]) -> list[TopicPartitionId]:
        """A readiness check only (``hooks.promote`` raises ``StatePhaseError`` when not ready)."""
        fn = self.hooks("promote").promote
        for tp in tps:
            await self._run_io(fn, tp[0], tp[1])
        return tps

    async def demote(self, ownership: Ownership, tps: list[TopicPartitionId],
                     deadline_s: float) -> list[ReleaseResult]:
        """Active -> learner (steps 1-2).

        1. Release the partitions this engine owns like ``Engine.release`` (drain, final commit, close
           the state cleanly when nothing was abandoned): no lane may still use the store.
        2. ``hooks.demote``: learn from the checkpoint just written (or from scratch after an unclean
           close). Partitions not owned here just start learning.
        """
        fn = self.hooks("demote").demote
        async with self._control_lock:
            # 1. release
            self._partitions.settle(tps)
            released = await ownership.release(self._partitions.owned(tps), deadline_s,
                                               unassign=self._operator_mode)
            # 2. learn (after any background close of an earlier release)
            await ownership.wait_for_closes(tps)
            for tp in tps:
                await self._run_io(fn, tp[0], tp[1])
        return released

    async def each(self, ownership: Ownership, fn: Callable[[str, int], None],
                   tps: list[TopicPartitionId]) -> list[TopicPartitionId]:
        """``fn`` (the verb ``learn`` or ``drop``) on each partition, under the control lock, after any
        background close."""
        async with self._control_lock:
            await ownership.wait_for_closes(tps)
            for tp in tps:
                await self._run_io(fn, tp[0], tp[1])
        return tps
