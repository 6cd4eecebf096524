"""The assignment protocol: hand partitions between workers without two owners at once. Does I/O
(through the :class:`WorkerControl` it is given; no Kubernetes code here, so any platform can use it).

State (:class:`AssignmentState`) lives in ``status.assignment``: the assignment in force
(``generation``, ``members``) and the change in progress (``pending``). Every intermediate result is
persisted before the next call that depends on it, so an operator that is killed at any point resumes
where it stopped.

Protocol of one :meth:`AssignmentCoordinator.step` (numbered as in the code):

1. Observe the workers (alive = may own partitions; eligible = may receive them; absent or not
   alive = known dead) and the partitions of the topics.
2. Resume or plan. A pending change whose targets are all still eligible is resumed. Otherwise (no
   pending change, or a target died) plan from the *effective* ownership: the members in force, minus
   partitions already released, plus the grants already made.
3. Record intent: the pending change (target assignment, a generation higher than any used) is
   persisted before any worker is called.
4. Release: every alive worker that loses partitions is pushed its reduced assignment with the new
   generation; its answer lists each released partition with its final committed offset. The
   partitions of known-dead workers count as released. An alive worker that cannot be reached keeps
   its partitions: nothing of this change is granted, and the step ends here (retried next time; once
   the worker's Lease expires it is known dead and its partitions are released by death).
5. Persist the releases.
6. Grant: each target worker is pushed its full new assignment with the new generation (only after
   every moved partition was released in step 4). Workers already granted are recorded and persisted,
   so a resumed change does not depend on re-granting in the same order.
7. Commit: ``members = target``, ``generation = pending.generation``, ``pending = None``; persist.

Fencing: every push carries the generation; workers refuse lower generations with 409. On a 409 the
coordinator raises its generation above the worker's, drops the pending change (nothing was granted
that was not released) and plans again at the next step.

:meth:`AssignmentCoordinator.sync` (run when no change is pending) re-pushes the assignment in force
to any alive worker that reports a lower generation or a different partition set (it restarted), and
sets the decided factor on workers that report another one. A worker that reports ``fenced`` (it lost
its Lease and stopped; it accepts only a generation above the one it holds) is moved to a new
generation with the same members (:meth:`AssignmentCoordinator._unfence`). It also reports the
workers whose circuit breaker is open (``breaker.open`` in their status: they hold every record);
:meth:`AssignmentCoordinator.open_breakers` reads only that, for a pass with a change pending.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from multilane.formats.handover import Handover
from multilane.operator.decision.planner import (
    AssignmentPlanner,
    format_partition,
    members_from_status,
    members_to_status,
)
from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.workers import ReleasedPartition, WorkerFencedError, WorkerUnreachableError

__all__ = [
    "AssignmentCoordinator",
    "AssignmentState",
    "PendingChange",
    "StepResult",
    "SyncReport",
    "WorkerControl",
    "open_breaker",
]

log = logging.getLogger(__name__)


class WorkerControl(Protocol):
    async def status(self, base_url: str) -> dict[str, Any]: ...

    async def assign(
        self,
        base_url: str,
        generation: int,
        partitions: Iterable[str],
        release_deadline_s: float,
        handovers: Mapping[str, Handover] | None = None,
    ) -> list[ReleasedPartition]:
        """Push the worker's whole assignment (fenced by ``generation``); what it released comes back.
        ``handovers``: partition -> what its last owner released, for a partition the worker adds."""
        ...

    async def set_factor(self, base_url: str, factor: int) -> int: ...


@dataclass
class PendingChange:
    """A change in progress. Invariants: ``generation`` > the state's ``generation``; ``released``
    only names partitions that move; ``granted`` only names workers of ``target``."""

    generation: int
    target: dict[str, tuple[str, ...]]
    # partition -> final committed offset reported by its old owner (None: old owner known dead)
    released: dict[str, int | None] = field(default_factory=dict)
    granted: list[str] = field(default_factory=list)

    def to_status(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "members": members_to_status(self.target),
            "released": [{"partition": p, "committedOffset": o} for p, o in sorted(self.released.items())],
            "granted": sorted(self.granted),
        }

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> PendingChange:
        return cls(
            generation=int(data.get("generation", 0)),
            target=members_from_status(data.get("members") or []),
            released={
                str(r["partition"]): (None if r.get("committedOffset") is None else int(r["committedOffset"]))
                for r in data.get("released") or []
                if isinstance(r, Mapping) and "partition" in r
            },
            granted=[str(w) for w in data.get("granted") or []],
        )


@dataclass
class AssignmentState:
    """``status.assignment``. Invariant: ``members`` is what every listed worker was last pushed (and
    acknowledged) with ``generation``; partitions appear at most once."""

    generation: int = 0
    members: dict[str, tuple[str, ...]] = field(default_factory=dict)
    pending: PendingChange | None = None

    def to_status(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "members": members_to_status(self.members),
            "pending": self.pending.to_status() if self.pending else None,
        }

    @classmethod
    def from_status(cls, data: Mapping[str, Any] | None) -> AssignmentState:
        data = data or {}
        pending = data.get("pending")
        return cls(
            generation=int(data.get("generation") or 0),
            members=members_from_status(data.get("members") or []),
            pending=PendingChange.from_status(pending) if isinstance(pending, Mapping) else None,
        )

    def effective(self) -> dict[str, tuple[str, ...]]:
        """Who may be processing what right now, for planning after an abandoned change."""
        if self.pending is None:
            return dict(self.members)
        out = {w: tuple(p for p in ps if p not in self.pending.released) for w, ps in self.members.items()}
        for w in self.pending.granted:
            out[w] = self.pending.target.get(w, ())
        return out


@dataclass
class StepResult:
    """What a step did. ``in_progress``: a change is pending after the step (condition Rebalancing)."""

    state: AssignmentState
    in_progress: bool = False
    committed: bool = False
    moves: int = 0
    blocked: str = ""  # why the pending change could not finish in this step
    fenced: bool = False


Persist = Callable[[AssignmentState], Awaitable[None]]


def _owners(assignment: Mapping[str, Sequence[str]]) -> dict[str, str]:
    return {p: w for w, ps in assignment.items() for p in ps}


@dataclass(frozen=True)
class SyncReport:
    """What :meth:`AssignmentCoordinator.sync` found: ``problems`` (a worker unreachable, fenced or
    answering a malformed status: "POD: why") and ``breakers`` (a worker whose circuit breaker is
    open: "POD: the breaker's reason"), one entry per worker, in the order of the workers given."""

    problems: list[str] = field(default_factory=list)
    breakers: list[str] = field(default_factory=list)


def open_breaker(status: Mapping[str, Any]) -> str | None:
    """The breaker's reason when a worker's ``/v1/status`` says its circuit breaker is open, else
    None (closed, or a worker without one: an older worker, the local plane's in-process engine)."""
    breaker = status.get("breaker")
    if not isinstance(breaker, Mapping) or breaker.get("open") is not True:
        return None
    return str(breaker.get("reason") or "circuit breaker open")


class AssignmentCoordinator:
    """Runs the protocol above. ``release_deadline_s``: how long a worker may take to finish in-flight
    records of a released partition before it answers."""

    def __init__(
        self,
        control: WorkerControl,
        planner: AssignmentPlanner,
        persist: Persist,
        release_deadline_s: float = 30.0,
    ) -> None:
        self.control = control
        self.planner = planner
        self.persist = persist
        self.release_deadline_s = release_deadline_s

    async def step(
        self,
        state: AssignmentState,
        workers: Sequence[WorkerInfo],
        partitions: Sequence[str],
        eligible: Iterable[str] | None = None,
    ) -> StepResult:
        """One pass of the protocol. ``eligible`` narrows the workers that may receive partitions
        (e.g. ordinals below the decided replica count); default: every eligible worker."""
        # 1. Observe.
        by_name = {w.name: w for w in workers}
        alive = {w.name for w in workers if w.alive}
        receivers = {w.name for w in workers if w.eligible}
        if eligible is not None:
            receivers &= set(eligible)

        # 2. Resume or plan.
        pending = state.pending
        if pending is not None and not set(pending.target) <= receivers:
            log.info("abandoning change to generation %d: a target worker is gone", pending.generation)
            state = AssignmentState(generation=pending.generation, members=state.effective(), pending=None)
            await self.persist(state)
            pending = None
        if pending is None:
            if not receivers:
                return StepResult(state=state, blocked="no eligible workers")
            current = {w: ps for w, ps in state.members.items() if w in alive}
            plan = self.planner.plan(current, receivers, partitions)
            target = {w: ps for w, ps in plan.assignment.items()}
            owned_by_alive = {w: ps for w, ps in state.members.items() if w in alive and ps}
            if target == {w: state.members.get(w, ()) for w in target} and set(owned_by_alive) <= set(target):
                return StepResult(state=state)  # nothing to change
            # 3. Record intent.
            pending = PendingChange(generation=state.generation + 1, target=dict(target))
            state = AssignmentState(generation=state.generation, members=state.members, pending=pending)
            await self.persist(state)
            log.info(
                "assignment change to generation %d planned: %d moves", pending.generation, len(plan.moves)
            )

        # 4. Release.
        old_owner = _owners(state.members)
        new_owner = _owners(pending.target)
        moving = sorted(p for p, w in old_owner.items() if new_owner.get(p) != w)
        blocked = []
        for worker in sorted({old_owner[p] for p in moving if p not in pending.released}):
            losing = [p for p in moving if old_owner[p] == worker and p not in pending.released]
            if worker not in alive:
                for p in losing:  # known dead: released by death
                    pending.released[p] = None
                continue
            keep = [p for p in state.members.get(worker, ()) if new_owner.get(p) == worker]
            try:
                released = await self.control.assign(
                    by_name[worker].control_url, pending.generation, keep, self.release_deadline_s
                )
            except WorkerFencedError:
                return await self._fenced(state, by_name[worker])
            except WorkerUnreachableError as exc:
                blocked.append(f"{worker}: {exc}")
                continue
            reported = {r.partition: r.committed_offset for r in released}
            for p in losing:
                # A worker that did not own a partition any more (e.g. restarted) has nothing to finish.
                pending.released[p] = reported.get(p)
        # 5. Persist the releases.
        await self.persist(state)
        if blocked or any(p not in pending.released for p in moving):
            return StepResult(
                state=state, in_progress=True, blocked="; ".join(blocked) or "waiting for releases"
            )

        # 6. Grant.
        for worker in sorted(pending.target):
            if worker in pending.granted:
                continue
            try:
                await self.control.assign(
                    by_name[worker].control_url,
                    pending.generation,
                    pending.target[worker],
                    self.release_deadline_s,
                )
            except WorkerFencedError:
                return await self._fenced(state, by_name[worker])
            except WorkerUnreachableError as exc:
                await self.persist(state)
                return StepResult(state=state, in_progress=True, blocked=f"{worker}: {exc}")
            pending.granted.append(worker)
            await self.persist(state)

        # 7. Commit.
        state = AssignmentState(generation=pending.generation, members=dict(pending.target), pending=None)
        await self.persist(state)
        log.info("assignment generation %d in force (%d partitions moved)", state.generation, len(moving))
        return StepResult(state=state, committed=True, moves=len(moving))

    async def _fenced(self, state: AssignmentState, worker: WorkerInfo) -> StepResult:
        """A worker saw a higher generation: jump above it, drop the pending change, re-plan later."""
        seen = state.pending.generation if state.pending else state.generation
        try:
            seen = max(seen, int((await self.control.status(worker.control_url)).get("generation", 0)))
        except WorkerUnreachableError:
            pass
        log.warning("worker %s fenced generation; moving to generation above %d", worker.name, seen)
        new_state = AssignmentState(generation=seen, members=state.effective(), pending=None)
        await self.persist(new_state)
        return StepResult(state=new_state, in_progress=True, fenced=True, blocked=f"fenced by {worker.name}")

    async def sync(
        self, state: AssignmentState, workers: Sequence[WorkerInfo], factor: int | None
    ) -> SyncReport:
        """Re-push the assignment in force where a worker disagrees; set the factor. Returns the
        problems and the workers whose circuit breaker is open (from the same status read)."""
        problems: list[str] = []
        breakers: list[str] = []
        if state.pending is not None:
            return SyncReport(problems, breakers)
        fenced: list[tuple[WorkerInfo, int]] = []
        for worker in workers:
            if not worker.alive:
                continue
            want = sorted(state.members.get(worker.name, ()))
            try:
                status = await self.control.status(worker.control_url)
                held = open_breaker(status)
                if held is not None:
                    breakers.append(f"{worker.name}: {held}")
                if status.get("fenced"):
                    fenced.append((worker, int(status.get("generation", 0))))
                    continue
                have = sorted(
                    format_partition(str(p["topic"]), int(p["partition"]))
                    for p in status.get("partitions") or []
                )
                if int(status.get("generation", 0)) < state.generation or have != want:
                    log.info("re-pushing generation %d to %s", state.generation, worker.name)
                    await self.control.assign(
                        worker.control_url, state.generation, want, self.release_deadline_s
                    )
                if factor is not None and int(status.get("factor", factor)) != factor:
                    await self.control.set_factor(worker.control_url, factor)
            except WorkerFencedError:
                problems.append(f"{worker.name}: fenced (it has a higher generation)")
            except WorkerUnreachableError as exc:
                problems.append(f"{worker.name}: {exc}")
            except (KeyError, TypeError, ValueError) as exc:
                problems.append(f"{worker.name}: malformed status: {exc}")
        if fenced:
            problems += await self._unfence(state, fenced)
        return SyncReport(problems, breakers)

    async def open_breakers(self, workers: Sequence[WorkerInfo]) -> list[str]:
        """The alive workers whose circuit breaker is open ("POD: reason"), for a pass in which
        :meth:`sync` does not run (a change is pending). A worker that does not answer is left out:
        the change's own steps report it."""
        breakers: list[str] = []
        for worker in workers:
            if not worker.alive:
                continue
            try:
                held = open_breaker(await self.control.status(worker.control_url))
            except (WorkerUnreachableError, WorkerFencedError) as exc:
                log.info("no breaker state from %s: %s", worker.name, exc)
                continue
            if held is not None:
                breakers.append(f"{worker.name}: {held}")
        return breakers

    async def _unfence(self, state: AssignmentState, fenced: Sequence[tuple[WorkerInfo, int]]) -> list[str]:
        """Give fenced workers (lease lost, then renewed, partitions not moved) a higher generation
        (steps 1-3); ``state`` is updated in place. Returns problems.

        1. New generation: above the state's and every fenced worker's.
        2. Persist it with the same members (no partition moves). The other workers still hold the old
           generation: like restarted workers, the next ``sync`` re-pushes them their same partitions.
        3. Push each fenced worker its partitions with the new generation (it drops its fenced
           partitions without committing and takes them again from their committed offsets).
        """
        # 1.
        generation = max([state.generation, *(g for _, g in fenced)]) + 1
        # 2.
        state.generation = generation
        await self.persist(state)
        problems: list[str] = []
        # 3.
        for worker, _ in fenced:
            log.warning("worker %s is fenced: pushing generation %d", worker.name, generation)
            try:
                await self.control.assign(
                    worker.control_url,
                    generation,
                    sorted(state.members.get(worker.name, ())),
                    self.release_deadline_s,
                )
            except (WorkerFencedError, WorkerUnreachableError) as exc:
                problems.append(f"{worker.name}: fenced, new generation {generation} not taken: {exc}")
        return problems
