"""``HandoffRound``: carries out one round of a rollout's actions, batched, against the workers. Does
I/O (through :class:`~multilane.operator.rollout.handoff_calls.WorkerCalls` and the status write).

Inputs: the worker calls, the executor's :class:`~multilane.operator.rollout.handoff_memory.HandoffMemory`
(written here: releases answered, handovers, timings) and the status write (``persist``: intent
before every call that takes ownership away). The numbered steps are :meth:`HandoffRound.execute`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.assignment import AssignmentState
from multilane.operator.rollout.handoff_calls import WorkerCalls
from multilane.operator.rollout.handoff_control import HandoffStep, PersistHandoff
from multilane.operator.rollout.handoff_memory import HandoffMemory
from multilane.operator.rollout.handoff_model import (
    by_worker,
    handed_off_event,
    promote_members,
    release_members,
)
from multilane.operator.rollout.protocol import Action, ActionKind, Rollout

__all__ = ["HandoffRound"]


class HandoffRound:
    def __init__(self, calls: WorkerCalls, memory: HandoffMemory, persist: PersistHandoff) -> None:
        self._calls = calls
        self._memory = memory
        self._persist = persist

    async def execute(
        self,
        actions: Sequence[Action],
        assignment: AssignmentState,
        rollout: Rollout,
        by_name: Mapping[str, WorkerInfo],
        replicas: int,
        result: HandoffStep,
        persist_rollout: bool = False,
    ) -> AssignmentState:
        """Carry out one round of actions, batched: one call per worker and kind, the calls to
        different workers at once, so that ``max_concurrent_warmups`` moves advance together instead
        of one after the other. ``persist_rollout``: the round's rollout is not written yet (step 2
        writes it with the promoted members, before any call of the round that changes ownership).

        1. ``LEARN``: one ``/v1/learn`` per target with all its partitions.
        2. ``PROMOTE``: the targets' members (persisted first), then one push per target. First: these
           partitions are paused since their release, while a release only starts a pause.
        3. ``RELEASE``: one new generation for every release of the round (persisted first), then one
           assignment push per source.
        4. ``DROP_LEARNER``: one ``/v1/drop`` per worker.
        5. ``REMOVE_WORKERS`` and ``EVENT`` for the caller; moves that reached DONE become handoffs.
        """
        kinds: dict[ActionKind, list[Action]] = {}
        for a in actions:
            kinds.setdefault(a.kind, []).append(a)
        # 1.
        learn = by_worker(kinds.get(ActionKind.LEARN, ()))
        for ps in learn.values():
            self._memory.learning(ps)
        await self._calls.learn(learn, by_name)
        # 2.
        if ActionKind.PROMOTE in kinds:
            assignment = await self._promote(
                kinds[ActionKind.PROMOTE], assignment, rollout, by_name, result, persist_rollout
            )
        elif persist_rollout:
            await self._persist(assignment, rollout)
        # 3.
        if ActionKind.RELEASE in kinds:
            assignment = await self._release(kinds[ActionKind.RELEASE], assignment, rollout, by_name, result)
        # 4.
        await self._calls.drop(by_worker(kinds.get(ActionKind.DROP_LEARNER, ())), by_name)
        # 5.
        for a in actions:
            if a.kind is ActionKind.REMOVE_WORKERS:
                result.remove_to = replicas
                result.events.append(("Normal", "WorkersRemoved", f"removing {', '.join(a.workers)}"))
            elif a.kind is ActionKind.EVENT:
                kind = "Warning" if a.reason in ("LearnerTimeout", "HandoffTargetLost") else "Normal"
                result.events.append((kind, a.reason, a.message))
        for record in self._memory.take_done(rollout):
            result.handoffs.append(record)
            result.events.append(handed_off_event(record))
        return assignment

    async def _release(
        self,
        actions: Sequence[Action],
        assignment: AssignmentState,
        rollout: Rollout,
        by_name: Mapping[str, WorkerInfo],
        result: HandoffStep,
    ) -> AssignmentState:
        """Release every partition of ``actions`` on its source (steps 1-3)."""
        by_source = by_worker(a for a in actions if a.worker in by_name)
        members, bump = release_members(assignment.members, by_source, self._memory.release_started)
        if not by_source:
            return assignment
        if bump:
            # 1. intent: one new generation without the released partitions on their sources
            assignment = AssignmentState(generation=assignment.generation + 1, members=members)
            await self._persist(assignment, rollout)
        for parts in by_source.values():
            self._memory.releasing(parts)
        # 2. each source stops fetching, lets running records finish, commits, answers
        fenced, answers = await self._calls.push(by_source, assignment, by_name, "release", result)
        for source, (released, took, _answered) in answers.items():
            # 3. remembered for the next observation: the rollout promotes the target
            offsets = {r.partition: r.committed_offset for r in released}
            handovers = {r.partition: r.handover for r in released if r.handover is not None}
            self._memory.release_answered(source, by_source[source], offsets, handovers, took)
        return (
            AssignmentState(generation=assignment.generation + 1, members=members) if fenced else assignment
        )

    async def _promote(
        self,
        actions: Sequence[Action],
        assignment: AssignmentState,
        rollout: Rollout,
        by_name: Mapping[str, WorkerInfo],
        result: HandoffStep,
        persist_rollout: bool = False,
    ) -> AssignmentState:
        """Promote every partition of ``actions`` on its target (steps 1-2, at once). ``persist_rollout``:
        write ``rollout`` in step 1 even when no member changes.

        1. Write the members (the partitions belong to their targets, no longer to dead sources) with
           the round's rollout, *while* step 2 runs: the write is off the pause. An operator that dies
           with the push made and the write not is the crash every action already survives (the
           worker acted, its new phase is not persisted): the status still holds the move as
           releasing, which keeps the partition out of placement; the resumed rollout re-sends the
           release (a no-op on the source) and this same promotion (a no-op on the target). The next
           round's write (the move done) starts only after this one finished.
        2. Push each target its members with the handovers their sources released: opening a learning
           partition promotes it (tail applied, processing from the commit). The pause of a partition
           ends when its target answered.
        """
        by_target = by_worker(a for a in actions if a.worker in by_name)
        members = promote_members(assignment.members, by_target)
        write: asyncio.Task[None] | None = None
        if members != assignment.members or persist_rollout:
            # 1.
            assignment = AssignmentState(generation=assignment.generation, members=members)
            write = asyncio.ensure_future(self._persist(assignment, rollout))
        try:
            if not by_target:
                return assignment
            moving = [p for ps in by_target.values() for p in ps]
            self._memory.promoting(moving)
            # 2.
            handovers = self._memory.handovers_for(moving)
            fenced, answers = await self._calls.push(
                by_target, assignment, by_name, "promotion", result, handovers
            )
        finally:
            if write is not None:
                await write
        for target, (_released, took, answered) in answers.items():
            self._memory.promoted(by_target[target], took, answered)
        return (
            AssignmentState(generation=assignment.generation + 1, members=members) if fenced else assignment
        )
