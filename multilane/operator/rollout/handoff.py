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

Modules: this one drives the calls. :mod:`~multilane.operator.rollout.handoff_model` (pure) holds the data
model and the parts of a step that need no I/O (observation, placement, members, completed-move
records), given the executor's in-memory state (releases seen, timings) as arguments;
:mod:`~multilane.operator.rollout.handoff_control` the worker calls, the status write and a step's result.
Their public names are importable from here too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from multilane.operator.decision.planner import AssignmentPlanner
from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.assignment import AssignmentCoordinator, AssignmentState
from multilane.operator.rollout.handoff_control import (
    HandoffControl,
    HandoffControlClient,
    HandoffStep,
    PersistHandoff,
)
from multilane.operator.rollout.handoff_model import (
    HandoffConfig,
    HandoffRecord,
    by_worker,
    drop_orphaned_pending,
    handed_off_event,
    observe_worker,
    place_unowned,
    promote_members,
    rebalance_moves,
    release_members,
    take_done_records,
    with_released,
)
from multilane.operator.rollout.protocol import Action, ActionKind, MovePhase, Rollout, WorkerObservation
from multilane.operator.rollout.workers import ReleasedPartition, WorkerFencedError, WorkerUnreachableError

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
        self._released: dict[tuple[str, str], int | None] = {}  # (source, partition) -> final offset
        # partition -> the progress record its source released with (handed to the promotion: the
        # target need not read the progress topic inside the pause); dropped once promoted
        self._progress: dict[str, str] = {}
        # partition -> the changelog end that release answered (sent with the progress record: the
        # target's learner reads to it instead of waiting for a fresh fetch); dropped with it
        self._changelog_end: dict[str, int] = {}
        self._release_started: dict[str, float] = {}  # partition -> monotonic time of the release
        self._learn_started: dict[str, float] = {}  # partition -> monotonic time of LEARN
        self._pause_end: dict[str, float] = {}  # partition -> monotonic time the promotion returned
        self._call_s: dict[tuple[str, str], float] = {}  # (kind, partition) -> duration of the call
        self._wall: dict[tuple[str, str], float] = {}  # ("released"/"promoted", partition) -> epoch
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
                assignment = await self._execute(
                    actions, assignment, rollout, by_name, replicas, result, late
                )
                progressed = rollout != before or any(
                    a.kind in (ActionKind.RELEASE, ActionKind.PROMOTE) for a in actions
                )
                if rollout.finished or not progressed:
                    break
                if any(a.kind is ActionKind.RELEASE for a in actions):
                    # the releases just answered: promote their targets now, from what the executor
                    # knows, instead of waiting for every worker's status (the partition is paused)
                    obs = with_released(obs, self._released)
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
        async def one(w: WorkerInfo) -> WorkerObservation:
            status: dict[str, Any] | None = None
            if w.alive:
                try:
                    status = await self.control.status(w.control_url)
                except WorkerUnreachableError as exc:
                    log.info("status of %s: %s", w.name, exc)
            return observe_worker(w.name, w.alive, status)

        found = await asyncio.gather(*(one(w) for w in workers))
        return with_released({o.name: o for o in found}, self._released)

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
                await self.control.assign(
                    by_name[w].control_url, assignment.generation, members[w], self.config.release_deadline_s
                )
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

    async def _execute(
        self,
        actions: Sequence[Action],
        assignment: AssignmentState,
        rollout: Rollout,
        by_name: Mapping[str, WorkerInfo],
        replicas: int,
        result: HandoffStep,
        persist_rollout: bool = False,
    ) -> AssignmentState:
        """Carry out one round of actions, batched (steps 1-5): one call per worker and kind, the
        calls to different workers at once, so that ``max_concurrent_warmups`` moves advance together
        instead of one after the other. ``persist_rollout``: the round's rollout is not written yet
        (step 2 writes it with the promoted members, before any call of the round that changes
        ownership).

        1. ``LEARN``: one ``/v1/learn`` per target with all its partitions.
        2. ``PROMOTE``: the targets' members (persisted first), then one push per target. First: these
           partitions are paused since their release, while a release only starts a pause.
        3. ``RELEASE``: one new generation for every release of the round (persisted first), then one
           assignment push per source.
        4. ``DROP_LEARNER``: one ``/v1/drop`` per worker.
        5. ``REMOVE_WORKERS`` and ``EVENT`` for the caller; moves that reached DONE become handoffs.
        """
        if self.on_action is not None:
            for a in actions:
                await self.on_action(a)
        kinds: dict[ActionKind, list[Action]] = {}
        for a in actions:
            kinds.setdefault(a.kind, []).append(a)
        # 1.
        learn = by_worker(kinds.get(ActionKind.LEARN, ()))
        for ps in learn.values():
            for partition in ps:
                self._learn_started.setdefault(partition, time.monotonic())
        await self._each(learn, by_name, self.control.learn, "learn")
        # 2.
        if ActionKind.PROMOTE in kinds:
            assignment = await self._promote(
                kinds[ActionKind.PROMOTE], assignment, rollout, by_name, result, persist_rollout
            )
        elif persist_rollout:
            await self.persist(assignment, rollout)
        # 3.
        if ActionKind.RELEASE in kinds:
            assignment = await self._release(kinds[ActionKind.RELEASE], assignment, rollout, by_name, result)
        # 4.
        drops = by_worker(kinds.get(ActionKind.DROP_LEARNER, ()))
        await self._each(drops, by_name, self.control.drop, "drop")
        # 5.
        for a in actions:
            if a.kind is ActionKind.REMOVE_WORKERS:
                result.remove_to = replicas
                result.events.append(("Normal", "WorkersRemoved", f"removing {', '.join(a.workers)}"))
            elif a.kind is ActionKind.EVENT:
                kind = "Warning" if a.reason in ("LearnerTimeout", "HandoffTargetLost") else "Normal"
                result.events.append((kind, a.reason, a.message))
        self._record_done(rollout, result)
        return assignment

    async def _each(
        self,
        calls: Mapping[str, list[str]],
        by_name: Mapping[str, WorkerInfo],
        fn: Callable[[str, Iterable[str]], Awaitable[None]],
        verb: str,
    ) -> None:
        """``fn(url, partitions)`` on every worker of ``calls`` at once; failures are logged (the
        rollout sees the worker's state at the next observation and re-sends)."""

        async def one(worker: str, partitions: list[str]) -> None:
            info = by_name.get(worker)
            if info is None:
                return
            try:
                await fn(info.control_url, partitions)
            except (WorkerUnreachableError, WorkerFencedError) as exc:
                # 409: the worker refuses (e.g. it processes P already); the rollout sees its state
                log.warning("%s %s on %s: %s", verb, partitions, worker, exc)

        await asyncio.gather(*(one(w, ps) for w, ps in sorted(calls.items())))

    def _record_done(self, rollout: Rollout, result: HandoffStep) -> None:
        """Moves that reached DONE become :class:`HandoffRecord` s and ``HandedOff`` events; what the
        executor remembers of abandoned moves is forgotten (a later move of the partition starts anew)."""
        for m in rollout.moves:
            if m.phase is MovePhase.ABANDONED:
                self._progress.pop(m.partition, None)
                self._changelog_end.pop(m.partition, None)
                for key in [k for k in self._released if k[1] == m.partition]:
                    del self._released[key]
        timings = (self._release_started, self._learn_started, self._pause_end, self._call_s, self._wall)
        for record in take_done_records(rollout, *timings, time.monotonic):
            self.completed.append(record)
            result.handoffs.append(record)
            result.events.append(handed_off_event(record))

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
        members, bump = release_members(assignment.members, by_source, self._release_started)
        if not by_source:
            return assignment
        if bump:
            # 1. intent: one new generation without the released partitions on their sources
            assignment = AssignmentState(generation=assignment.generation + 1, members=members)
            await self.persist(assignment, rollout)
        for parts in by_source.values():
            for p in parts:
                self._release_started.setdefault(p, time.monotonic())
                self._wall.setdefault(("released", p), time.time())
        # 2. each source stops fetching, lets running records finish, commits, answers
        fenced, answers = await self._push(by_source, assignment, by_name, "release", result)
        for source, (released, took, _answered) in answers.items():
            offsets = {r.partition: r.committed_offset for r in released}
            self._progress.update({r.partition: r.progress for r in released if r.progress is not None})
            self._changelog_end.update(
                {r.partition: r.changelog_end for r in released if r.changelog_end is not None}
            )
            for p in by_source[source]:
                self._call_s[("release", p)] = took
                # 3. remembered for the next observation: the rollout promotes the target
                self._released[(source, p)] = offsets.get(p)
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
        2. Push each target its members: opening a learning partition promotes it (tail applied,
           processing from the commit). The pause of a partition ends when its target answered.
        """
        by_target = by_worker(a for a in actions if a.worker in by_name)
        members = promote_members(assignment.members, by_target)
        write: asyncio.Task[None] | None = None
        if members != assignment.members or persist_rollout:
            # 1.
            assignment = AssignmentState(generation=assignment.generation, members=members)
            write = asyncio.ensure_future(self.persist(assignment, rollout))
        try:
            if not by_target:
                return assignment
            moving = {p for ps in by_target.values() for p in ps}
            for p in moving:
                self._release_started.setdefault(p, time.monotonic())
            # 2.
            fenced, answers = await self._push(
                by_target, assignment, by_name, "promotion", result, self._progress, self._changelog_end
            )
        finally:
            if write is not None:
                await write
        for target, (_released, took, answered) in answers.items():
            for p in by_target[target]:
                self._call_s[("promote", p)] = took
                self._wall[("promoted", p)] = time.time()
                self._pause_end[p] = answered
                self._progress.pop(p, None)
                self._changelog_end.pop(p, None)
                for key in [k for k in self._released if k[1] == p]:
                    del self._released[key]
        return (
            AssignmentState(generation=assignment.generation + 1, members=members) if fenced else assignment
        )

    async def _push(
        self,
        parts_by_worker: Mapping[str, list[str]],
        assignment: AssignmentState,
        by_name: Mapping[str, WorkerInfo],
        verb: str,
        result: HandoffStep,
        progress: Mapping[str, str] | None = None,
        changelog_ends: Mapping[str, int] | None = None,
    ) -> tuple[bool, dict[str, tuple[list[ReleasedPartition], float, float]]]:
        """Push ``assignment`` to every worker of ``parts_by_worker`` at once. Returns whether one of
        them fenced the push (a higher generation is needed) and, per worker that answered, its
        released partitions, the call's duration (s) and when it answered (monotonic). Failures set
        ``result.blocked``.
        ``progress``: partition -> released progress record, sent with the worker's partitions (with
        its ``changelog_ends`` entry)."""

        async def one(worker: str) -> tuple[str, list[ReleasedPartition] | None, float, float, bool]:
            t0 = time.monotonic()
            hints = {p: progress[p] for p in parts_by_worker[worker] if progress and p in progress}
            ends = {p: changelog_ends[p] for p in hints if changelog_ends and p in changelog_ends}
            extra: dict[str, Any] = {"progress": hints} if hints else {}  # a control may take no hints
            if ends:
                extra["changelog_ends"] = ends
            try:
                released = await self.control.assign(
                    by_name[worker].control_url,
                    assignment.generation,
                    assignment.members.get(worker, ()),
                    self.config.release_deadline_s,
                    **extra,
                )
            except WorkerFencedError as exc:
                result.blocked = f"{worker}: {exc}"
                return worker, None, 0.0, 0.0, True
            except WorkerUnreachableError as exc:
                result.blocked = f"{worker}: {exc}"
                log.warning("%s of %s on %s: %s", verb, parts_by_worker[worker], worker, exc)
                return worker, None, 0.0, 0.0, False
            answered = time.monotonic()
            return worker, released, round(answered - t0, 3), answered, False

        found = await asyncio.gather(*(one(w) for w in sorted(parts_by_worker)))
        answers = {w: (released, took, at) for w, released, took, at, _ in found if released is not None}
        return any(f for *_, f in found), answers
