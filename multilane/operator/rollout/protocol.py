"""Restore-before-handoff rollouts as a pure state machine (no I/O).

A rollout moves partitions between workers so that each partition pauses only for a drain, never
for a restore. The caller (the operator, or the local control plane) owns the I/O: it observes the
workers, feeds a :class:`WorkerObservation` per worker into :meth:`RolloutCoordinator.step`, carries
out the :class:`Action` list it gets back, and persists :meth:`Rollout.to_dict` in the resource's
status, so a restarted operator resumes exactly where it stopped.

The protocol, for each partition P moving from worker A (the source, may be absent) to worker B:

1. **Learn.** B is told to become a learner for P and restores P's state (snapshot + changelog tail
   when a snapshot exists, the changelog otherwise) while A keeps processing P.
2. **Release.** When B's restore lag is at most ``acceptable_recovery_lag``, A is told to release P:
   stop fetching, drain in-flight records up to a deadline, commit, close its store.
3. **Promote.** When A reports the release with its final committed offset, or A is known dead, B is
   promoted: it applies the last changelog records and starts processing P from the committed offset.
4. **Done.** When B reports P active, the move is complete.

At most ``max_concurrent_warmups`` moves are past step 0 (pending) and before step 3 at once.
Scale-down: the leaving workers are removed only after every move off them is done.

Fallback rule (documented for users): a learner that does not reach the acceptable lag within
``learner_timeout_s`` is reported (a ``LearnerTimeout`` event), and the move proceeds as an eager
handoff: A releases, B is promoted and finishes its restore before processing. The partition pauses
longer, but the rollout never stalls. A target that dies is replaced by re-planning: the move goes
back to pending with the fallback target chosen by the caller (``retarget``), or is abandoned if the
source still owns the partition.

A LEARN is sent again while the target reports neither learning nor processing P (the first call
was lost, or the target restarted); a RELEASE is sent again until the source's release is observed.

Every action is idempotent on the worker side (learning a partition already learning, releasing one
already released, promoting one already active are no-ops that answer the current state), because
the operator may crash after sending an action and before persisting the new phase.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

__all__ = [
    "Action",
    "ActionKind",
    "MovePhase",
    "PartitionMove",
    "Rollout",
    "RolloutCoordinator",
    "WorkerObservation",
]


class MovePhase(StrEnum):
    PENDING = "pending"  # planned; waits for a warm-up slot
    LEARNING = "learning"  # step 1: target restores as a learner
    RELEASING = "releasing"  # step 2: source drains and commits
    PROMOTING = "promoting"  # step 3: target applies the tail and starts processing
    DONE = "done"  # step 4
    ABANDONED = "abandoned"  # the move no longer applies (e.g. target died, source kept P)


_ACTIVE_PHASES = (MovePhase.LEARNING, MovePhase.RELEASING, MovePhase.PROMOTING)


class ActionKind(StrEnum):
    LEARN = "learn"
    RELEASE = "release"
    PROMOTE = "promote"
    DROP_LEARNER = "drop_learner"
    REMOVE_WORKERS = "remove_workers"
    EVENT = "event"


@dataclass(frozen=True)
class Action:
    """One thing the caller must do. ``worker``/``partition`` are empty for events and removals."""

    kind: ActionKind
    worker: str = ""
    partition: str = ""
    final_offset: int | None = None  # PROMOTE: the released offset, None when the source was dead
    workers: tuple[str, ...] = ()  # REMOVE_WORKERS
    reason: str = ""  # EVENT: a CamelCase reason
    message: str = ""  # EVENT: human-readable text


@dataclass(frozen=True)
class WorkerObservation:
    """What the caller saw of one worker this tick.

    ``learner_lag`` maps partitions the worker is learning to their restore lag in records (None when
    the restore has not reported yet). ``released`` maps partitions the worker has released to their
    final committed offset (None when the release is known but its offset is not, e.g. a release
    re-sent after an operator restart to a worker that no longer owned the partition). ``active``
    lists partitions the worker is processing.
    """

    name: str
    alive: bool
    active: frozenset[str] = frozenset()
    learner_lag: Mapping[str, int | None] = field(default_factory=dict)
    released: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionMove:
    """One partition's move. Invariant: ``phase_since`` is the time the move entered ``phase``."""

    partition: str  # "topic/partition"
    source: str | None  # None: nobody owns it yet (new partition or dead owner already gone)
    target: str
    phase: MovePhase = MovePhase.PENDING
    phase_since: float = 0.0
    final_offset: int | None = None  # set when the source reported its release
    eager: bool = False  # True once the learner timed out and the fallback rule applied
    orphaned: bool = False  # ABANDONED after the source released: nobody owns it, re-plan at once

    def advance(self, phase: MovePhase, now: float, **changes: Any) -> PartitionMove:
        return replace(self, phase=phase, phase_since=now, **changes)


@dataclass(frozen=True)
class Rollout:
    """A set of moves carried out together; serialisable to the resource's status.

    Invariants: at most one move per partition; ``leaving`` workers receive no move as target.
    """

    generation: int
    moves: tuple[PartitionMove, ...]
    leaving: tuple[str, ...] = ()  # workers to remove once no move involves them
    started_at: float = 0.0
    removed: bool = False  # REMOVE_WORKERS has been issued for ``leaving``

    @property
    def finished(self) -> bool:
        moves_done = all(m.phase in (MovePhase.DONE, MovePhase.ABANDONED) for m in self.moves)
        return moves_done and (not self.leaving or self.removed)

    def orphaned(self) -> list[str]:
        """Partitions whose move was abandoned after their source released them (nobody owns them)."""
        return [m.partition for m in self.moves if m.orphaned]

    def phases(self) -> dict[str, str]:
        return {m.partition: m.phase.value for m in self.moves}

    def to_dict(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "startedAt": self.started_at,
            "leaving": list(self.leaving),
            "removed": self.removed,
            "moves": [
                {
                    "partition": m.partition,
                    "source": m.source,
                    "target": m.target,
                    "phase": m.phase.value,
                    "phaseSince": m.phase_since,
                    "finalOffset": m.final_offset,
                    "eager": m.eager,
                    "orphaned": m.orphaned,
                }
                for m in self.moves
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rollout:
        """Rebuild a rollout from status; raises ValueError with the offending field on bad input."""
        try:
            moves = tuple(
                PartitionMove(
                    partition=str(m["partition"]),
                    source=None if m.get("source") is None else str(m["source"]),
                    target=str(m["target"]),
                    phase=MovePhase(m.get("phase", "pending")),
                    phase_since=float(m.get("phaseSince", 0.0)),
                    final_offset=None if m.get("finalOffset") is None else int(m["finalOffset"]),
                    eager=bool(m.get("eager", False)),
                    orphaned=bool(m.get("orphaned", False)),
                )
                for m in data.get("moves", [])
            )
            return cls(
                generation=int(data["generation"]),
                moves=moves,
                leaving=tuple(str(w) for w in data.get("leaving", [])),
                started_at=float(data.get("startedAt", 0.0)),
                removed=bool(data.get("removed", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"invalid rollout in status: {exc!r}") from exc


@dataclass(frozen=True)
class RolloutCoordinator:
    """Advances a :class:`Rollout` one tick at a time (pure)."""

    acceptable_recovery_lag: int = 10_000
    max_concurrent_warmups: int = 1
    learner_timeout_s: float = 600.0

    def start(
        self,
        generation: int,
        current: Mapping[str, str],
        target: Mapping[str, str],
        now: float,
        leaving: Sequence[str] = (),
    ) -> Rollout:
        """Plan the moves that turn ``current`` (partition -> owner) into ``target``."""
        moves = tuple(
            PartitionMove(partition=p, source=current.get(p), target=owner, phase_since=now)
            for p, owner in sorted(target.items())
            if current.get(p) != owner
        )
        if any(m.target in leaving for m in moves):
            raise ValueError("a leaving worker cannot be the target of a move")
        return Rollout(generation=generation, moves=moves, leaving=tuple(leaving), started_at=now)

    def step(
        self, rollout: Rollout, workers: Mapping[str, WorkerObservation], now: float
    ) -> tuple[Rollout, list[Action]]:
        """Advance every move as far as the observations allow; return the new rollout and actions.

        Steps per tick:
        1. Advance moves already under way (learning -> releasing -> promoting -> done).
        2. Start pending moves while warm-up slots are free.
        3. When every move is settled, remove the leaving workers.
        """
        actions: list[Action] = []
        moves = list(rollout.moves)
        # 1. moves under way
        for i, move in enumerate(moves):
            if move.phase in _ACTIVE_PHASES:
                moves[i] = self._advance(move, workers, now, actions)
        # 2. pending moves into free slots
        busy = sum(1 for m in moves if m.phase in (MovePhase.LEARNING, MovePhase.RELEASING))
        for i, move in enumerate(moves):
            if move.phase is not MovePhase.PENDING or busy >= self.max_concurrent_warmups:
                continue
            target = workers.get(move.target)
            if target is None or not target.alive:
                continue  # the platform is still starting it; scale-up adds pods first
            moves[i] = move.advance(MovePhase.LEARNING, now)
            actions.append(Action(ActionKind.LEARN, worker=move.target, partition=move.partition))
            busy += 1
        new = replace(rollout, moves=tuple(moves))
        # 3. remove leaving workers once nothing depends on them
        settled = all(m.phase in (MovePhase.DONE, MovePhase.ABANDONED) for m in moves)
        if settled and rollout.leaving and not rollout.removed:
            actions.append(Action(ActionKind.REMOVE_WORKERS, workers=rollout.leaving))
            new = replace(new, removed=True)
        return new, actions

    def _advance(
        self,
        move: PartitionMove,
        workers: Mapping[str, WorkerObservation],
        now: float,
        actions: list[Action],
    ) -> PartitionMove:
        target = workers.get(move.target)
        source = workers.get(move.source) if move.source is not None else None
        source_gone = move.source is None or source is None or not source.alive
        if target is None or not target.alive:
            return self._target_lost(move, source_gone, now, actions)
        if move.phase is MovePhase.LEARNING and move.partition in target.active:
            # the target processes P already (placed there after its source died): nothing to hand off
            return move.advance(MovePhase.DONE, now)
        if move.phase is MovePhase.LEARNING:
            lag = target.learner_lag.get(move.partition)
            caught_up = lag is not None and lag <= self.acceptable_recovery_lag
            timed_out = now - move.phase_since >= self.learner_timeout_s
            if not caught_up and not timed_out:
                if move.partition not in target.learner_lag and move.partition not in target.active:
                    # 1. (again) the target is not learning P: the first call was lost, or the target
                    # restarted; learning is idempotent on the worker
                    actions.append(Action(ActionKind.LEARN, worker=move.target, partition=move.partition))
                return move
            if timed_out and not caught_up:
                actions.append(
                    Action(
                        ActionKind.EVENT,
                        reason="LearnerTimeout",
                        message=(
                            f"{move.target} did not catch up on {move.partition} within "
                            f"{self.learner_timeout_s:.0f}s (lag {lag}); handing off eagerly"
                        ),
                    )
                )
                move = replace(move, eager=True)
            # 2. release on the source (or skip straight to promotion when there is none)
            if source_gone:
                actions.append(Action(ActionKind.PROMOTE, worker=move.target, partition=move.partition))
                return move.advance(MovePhase.PROMOTING, now)
            assert move.source is not None
            actions.append(Action(ActionKind.RELEASE, worker=move.source, partition=move.partition))
            return move.advance(MovePhase.RELEASING, now)
        if move.phase is MovePhase.RELEASING:
            # 3. promote once the source reported the release, or is known dead
            known = source is not None and move.partition in source.released
            released = source.released.get(move.partition) if source is not None else None
            if not known and not source_gone:
                # re-send: the release call is idempotent and the first one may have been lost
                assert move.source is not None
                actions.append(Action(ActionKind.RELEASE, worker=move.source, partition=move.partition))
                return move
            actions.append(
                Action(
                    ActionKind.PROMOTE,
                    worker=move.target,
                    partition=move.partition,
                    final_offset=released,
                )
            )
            return move.advance(MovePhase.PROMOTING, now, final_offset=released)
        if move.phase is MovePhase.PROMOTING:
            # 4. done when the target processes the partition
            if move.partition in target.active:
                return move.advance(MovePhase.DONE, now)
            actions.append(
                Action(
                    ActionKind.PROMOTE,
                    worker=move.target,
                    partition=move.partition,
                    final_offset=move.final_offset,
                )
            )
            return move
        return move

    def _target_lost(
        self, move: PartitionMove, source_gone: bool, now: float, actions: list[Action]
    ) -> PartitionMove:
        """The target died mid-move: give up the move; the caller re-plans the partition.

        Before the release the source still owns the partition, so nothing is lost by abandoning.
        After the release nobody processes it: the event tells the caller to re-plan it at once.
        """
        released = move.phase in (MovePhase.RELEASING, MovePhase.PROMOTING) or source_gone
        actions.append(
            Action(
                ActionKind.EVENT,
                reason="HandoffTargetLost",
                message=(
                    f"{move.target} is gone while {move.phase.value} {move.partition}; "
                    + ("partition is unowned, re-planning" if released else f"{move.source} keeps it")
                ),
            )
        )
        return move.advance(MovePhase.ABANDONED, now, orphaned=released)
