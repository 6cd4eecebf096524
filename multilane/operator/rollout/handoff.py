"""``HandoffExecutor``: carries out restore-before-handoff rollouts against real workers. Does I/O
(through the :class:`HandoffControl` it is given; no platform code here, so the Kubernetes operator and
the local control plane run the same executor).

The executor owns the *assignment* while state is enabled: it replaces the eager release-then-grant
change of :class:`~multilane.operator.assignment.AssignmentCoordinator` by a
:class:`~multilane.operator.rollout.RolloutCoordinator` rollout, and keeps ``status.assignment``
(generation, members) exact after every call, so ``AssignmentCoordinator.sync`` and a restarted
operator see what each worker was last pushed. Both ``status.assignment`` and ``status.rollout`` are
persisted *before* every worker call that takes ownership away (intent first), and together with a
promotion (the write runs beside the push, off the partition's pause: a status that still says
"releasing" keeps the partition out of placement, and the resumed rollout re-sends the promotion), so
an operator killed at any point resumes: every call below is idempotent on the worker.

One :meth:`HandoffExecutor.step` (numbered as in the code):

1. Observe: ``GET /v1/status`` of every alive worker -> :class:`WorkerObservation` (active
   partitions, learners with their restore lag, releases this executor saw complete).
2. Finish an eager change left pending in ``status.assignment`` (written by the eager path before
   state was enabled) with ``AssignmentCoordinator.step``; nothing else happens until it is done.
3. Place unowned partitions (no alive owner and no move under way: new partitions, dead owners,
   moves abandoned after the release): pushed at once to the planner's choice; nobody processes them,
   so there is nothing to wait for (the new owner restores before it starts).
4. Plan a rollout when none runs: the planner's balanced target over the eligible workers; every
   partition whose alive owner differs from its target owner becomes a move (scale-down: the staying
   workers learn the partitions of the leaving ones, which are removed only after the last move).
5. Advance the rollout: ``RolloutCoordinator.step`` and carry out its actions, repeated while they
   make progress (so a release is followed by its promotion in the same step). Up to
   ``max_concurrent_warmups`` moves run at once; each round's actions are batched into one call per
   worker and kind, and the calls to different workers run concurrently:

   - ``LEARN``: ``POST /v1/learn`` on the target (restore from snapshot/changelog as a learner);
   - ``RELEASE``: generation + 1, the source's members without P persisted, then the source is pushed
     that assignment (it stops fetching P, lets the records already running finish within
     ``release_deadline_s``, commits with progress, answers the final committed offset, and closes
     its store afterwards; queued records go to the target through the commit and the progress);
     its answer carries the progress record of that final commit;
   - ``PROMOTE``: P added to the target's members (and removed from a dead source's) and persisted
     with the rollout *while* the target is pushed its assignment with the progress record and the
     changelog end the source released (it need not read the progress topic, and its learner reads
     to that end instead of waiting for a fresh fetch): opening a learning partition is the
     promotion (it applies the last changelog records and processes from the committed offset);
   - ``REMOVE_WORKERS``: the platform is asked for the staying replica count;
   - ``EVENT``: returned to the caller (Kubernetes Event / log line).
6. When the rollout finished: drop it from status and record its handoffs (pause per partition).

Modules, one responsibility each: this one runs the step (the protocol above, and the decisions of
steps 3-5 that call workers); :mod:`~multilane.operator.rollout.handoff_round` carries out one round
of actions (step 5's list); :mod:`~multilane.operator.rollout.handoff_calls` makes the batched worker
calls; :mod:`~multilane.operator.rollout.handoff_memory` (pure) holds what the executor remembers
between calls; :mod:`~multilane.operator.rollout.handoff_model` (pure) the data model and the parts of
a step that need no I/O; :mod:`~multilane.operator.rollout.handoff_control` the worker calls' protocol
and client, the status write and a step's result. Their public names are importable from here too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from multilane.operator.decision.planner import AssignmentPlanner
from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.assignment import AssignmentCoordinator, AssignmentState
from multilane.operator.rollout.handoff_calls import WorkerCalls
from multilane.operator.rollout.handoff_control import (
    HandoffControl,
    HandoffControlClient,
    HandoffStep,
    PersistHandoff,
)
from multilane.operator.rollout.handoff_memory import HandoffMemory
from multilane.operator.rollout.handoff_model import (
    HandoffConfig,
    HandoffRecord,
    drop_orphaned_pending,
    observe_worker,
    place_unowned,
    rebalance_moves,
)
from multilane.operator.rollout.handoff_round import HandoffRound
from multilane.operator.rollout.protocol import Action, ActionKind, MovePhase, Rollout, WorkerObservation
from multilane.operator.rollout.workers import WorkerFencedError, WorkerUnreachableError

__all__ = [
    "HandoffConfig",
    "HandoffControl",
    "HandoffControlClient",
    "HandoffExecutor",
    "HandoffRecord",
    "HandoffStep",
    "PersistHandoff",
    "observe_worker",
]

log = logging.getLogger(__name__)


class HandoffExecutor:
    """Runs the protocol of the module docstring. Keeps in memory only what the workers can tell
    again after a restart: releases seen complete (a re-sent release answers at once) and timings.

    ``clock``: seconds (epoch) for the rollout's phase times (persisted); pauses use ``time.monotonic``.
    """

    def __init__(
        self,
        control: HandoffControl,
        persist: PersistHandoff,
        config: HandoffConfig = HandoffConfig(),
        clock: Callable[[], float] = time.time,
        max_rounds: int = 6,
    ) -> None:
        self.control = control
        self.persist = persist
        self.config = config
        self.coordinator = config.coordinator()
        self.clock = clock
        self.max_rounds = max_rounds
        self.memory = HandoffMemory()  # releases seen, handovers, timings (written by the rounds)
        self.calls = WorkerCalls(control, config.release_deadline_s)
        self.round = HandoffRound(self.calls, self.memory, persist)
        self.completed: list[HandoffRecord] = []  # every move completed by this executor
        # Called before each action is carried out (fault injection in tests; None in production).
        self.on_action: Callable[[Action], Awaitable[None]] | None = None

    # -- step ------------------------------------------------------------------------------------------

    async def step(
        self,
        assignment: AssignmentState,
        rollout: Rollout | None,
        workers: Sequence[WorkerInfo],
        partitions: Sequence[str],
        eligible: Iterable[str],
        replicas: int,
    ) -> HandoffStep:
        """One pass (steps 1-6 of the module docstring). ``eligible``: workers that may receive
        partitions (the staying ones); ``replicas``: the replica count to keep once leaving workers
        have handed everything over."""
        by_name = {w.name: w for w in workers}
        receivers = {w.name for w in workers if w.eligible} & set(eligible)
        result = HandoffStep(assignment=assignment, rollout=rollout)
        # 1. Observe.
        obs = await self._observe(workers)
        result.observations = obs
        # 2. Finish an eager change left pending.
        if assignment.pending is not None:
            eager = AssignmentCoordinator(
                self.control,
                AssignmentPlanner(max_moves=self.config.max_concurrent_warmups),
                lambda s: self.persist(s, rollout),
                release_deadline_s=self.config.release_deadline_s,
            )
            done = await eager.step(assignment, workers, partitions, eligible=receivers)
            result.assignment = done.state
            result.blocked = done.blocked
            return result
        # 3. Place unowned partitions (pending moves whose source died become placements).
        if rollout is not None:
            kept = drop_orphaned_pending(rollout, obs, self.clock)
            if kept != rollout:
                rollout = kept
                await self.persist(assignment, rollout)
        assignment = await self._place(assignment, rollout, by_name, obs, partitions, receivers, result)
        # 4. Plan a rollout when none runs.
        if rollout is None or rollout.finished:
            rollout = await self._plan(assignment, by_name, obs, partitions, receivers, replicas, result)
        # 5. Advance the rollout (moves toward workers no longer eligible are given up first).
        if rollout is not None:
            kept = await self._drop_ineligible(rollout, receivers, by_name, result)
            if kept != rollout:
                rollout = kept
                await self.persist(assignment, rollout)
            for _ in range(self.max_rounds):
                before = rollout
                rollout, actions = self.coordinator.step(rollout, obs, self.clock())
                # a promotion round writes the rollout with its members (one status write in the
                # pause, not two); a round that also learns writes it first, as any other
                kinds = {a.kind for a in actions}
                late = rollout != before and ActionKind.PROMOTE in kinds and ActionKind.LEARN not in kinds
                if rollout != before and not late:
                    await self.persist(assignment, rollout)
                if self.on_action is not None:
                    for a in actions:
                        await self.on_action(a)
                before_round = len(result.handoffs)
                assignment = await self.round.execute(
                    actions, assignment, rollout, by_name, replicas, result, late
                )
                self.completed.extend(result.handoffs[before_round:])
                progressed = rollout != before or any(
                    a.kind in (ActionKind.RELEASE, ActionKind.PROMOTE) for a in actions
                )
                if rollout.finished or not progressed:
                    break
                if any(a.kind is ActionKind.RELEASE for a in actions):
                    # the releases just answered: promote their targets now, from what the executor
                    # knows, instead of waiting for every worker's status (the partition is paused)
                    obs = self.memory.observed(obs)
                else:
                    obs = await self._observe(workers)
                result.observations = obs
        # 6. Finished rollouts leave status.
        if rollout is not None and rollout.finished:
            log.info("rollout of generation %d finished: %s", rollout.generation, rollout.phases())
            rollout = None
            await self.persist(assignment, None)
        result.assignment, result.rollout = assignment, rollout
        return result

    # -- helpers ---------------------------------------------------------------------------------------

    async def _observe(self, workers: Sequence[WorkerInfo]) -> dict[str, WorkerObservation]:
        return self.memory.observed(await self.calls.observe(workers))

    async def _place(
        self,
        assignment: AssignmentState,
        rollout: Rollout | None,
        by_name: Mapping[str, WorkerInfo],
        obs: Mapping[str, WorkerObservation],
        partitions: Sequence[str],
        receivers: set[str],
        result: HandoffStep,
    ) -> AssignmentState:
        """Step 3: push the placements of :func:`place_unowned` (persisted first)."""
        placed = place_unowned(assignment.members, rollout, obs, partitions, receivers)
        if placed is None:
            return assignment
        members, targets = placed
        assignment = AssignmentState(generation=assignment.generation + 1, members=members)
        # intent first, then the pushes
        await self.persist(assignment, rollout)
        for w, ps in sorted(targets.items()):
            try:
                await self.calls.assign(by_name[w], assignment.generation, members[w])
            except (WorkerUnreachableError, WorkerFencedError) as exc:
                result.blocked = f"{w}: {exc}"
                log.warning("placing %s on %s: %s", ps, w, exc)
                continue
            result.events.append(("Normal", "Placed", f"{', '.join(ps)} -> {w} (no live owner)"))
        return assignment

    async def _plan(
        self,
        assignment: AssignmentState,
        by_name: Mapping[str, WorkerInfo],
        obs: Mapping[str, WorkerObservation],
        partitions: Sequence[str],
        receivers: set[str],
        replicas: int,
        result: HandoffStep,
    ) -> Rollout | None:
        """Step 4: start the rollout of :func:`rebalance_moves` (persisted), or remove leaving workers
        that hold nothing."""
        leaving = sorted(w for w in by_name if w not in receivers and by_name[w].alive)
        if not receivers:
            return None
        current, owner_now, moving = rebalance_moves(assignment.members, obs, partitions, receivers)
        holding = [w for w in leaving if current.get(w)]
        if not moving and not holding:
            if leaving and len(by_name) > replicas:
                result.remove_to = replicas  # nothing to hand over: remove at once
            return None
        rollout = self.coordinator.start(
            assignment.generation, owner_now, moving, self.clock(), leaving=tuple(leaving)
        )
        await self.persist(assignment, rollout)
        result.events.append(
            (
                "Normal",
                "RolloutStarted",
                f"{len(rollout.moves)} partition(s) to move with restore-before-handoff"
                + (f"; then remove {', '.join(leaving)}" if leaving else ""),
            )
        )
        return rollout

    async def _drop_ineligible(
        self,
        rollout: Rollout,
        receivers: set[str],
        by_name: Mapping[str, WorkerInfo],
        result: HandoffStep,
    ) -> Rollout:
        """Abandon moves not yet released whose target may no longer receive partitions (the decided
        replica count fell below it): the source keeps the partition; the target's learner is dropped.
        Moves already released go on (the partition has no other owner)."""
        moves = list(rollout.moves)
        changed = False
        for i, m in enumerate(moves):
            if m.phase in (MovePhase.PENDING, MovePhase.LEARNING) and m.target not in receivers:
                moves[i] = m.advance(MovePhase.ABANDONED, self.clock())
                changed = True
                result.events.append(
                    (
                        "Normal",
                        "HandoffCancelled",
                        f"{m.partition}: {m.target} is leaving; {m.source} keeps it",
                    )
                )
                target = by_name.get(m.target)
                if m.phase is MovePhase.LEARNING and target is not None and target.alive:
                    try:
                        await self.control.drop(target.control_url, [m.partition])
                    except (WorkerUnreachableError, WorkerFencedError) as exc:
                        log.info("drop %s on %s: %s", m.partition, m.target, exc)
        if not changed:
            return rollout
        return replace(rollout, moves=tuple(moves))
