"""The data model of restore-before-handoff rollouts and the parts of a
:class:`~multilane.operator.handoff.HandoffExecutor` step that need no I/O. No I/O: imports only the
planner and the rollout state machine; the executor does the calls and the persisting. Every function
is pure but :func:`take_done_records`, which takes the entries it records out of the executor's maps.

- :class:`HandoffConfig` (settings) and :class:`HandoffRecord` (one completed move);
- step 1: :func:`observe_worker` (a worker's status as a :class:`WorkerObservation`) and
  :func:`with_released` (plus the releases the executor saw answered);
- step 3: :func:`drop_orphaned_pending` and :func:`place_unowned` (what to place where);
- step 4: :func:`rebalance_moves` (what to move where);
- step 5: :func:`by_worker` (one round's actions batched per worker), :func:`release_members` and
  :func:`promote_members` (``status.assignment.members`` of a round), :func:`take_done_records` and
  :func:`handed_off_event` (moves that reached DONE become records, from the executor's timings).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from multilane.operator.decision.planner import AssignmentPlanner, format_partition
from multilane.operator.rollout.protocol import (
    Action,
    MovePhase,
    Rollout,
    RolloutCoordinator,
    WorkerObservation,
)

__all__ = [
    "HandoffConfig",
    "HandoffRecord",
    "by_worker",
    "drop_orphaned_pending",
    "handed_off_event",
    "observe_worker",
    "place_unowned",
    "promote_members",
    "rebalance_moves",
    "release_members",
    "take_done_records",
    "with_released",
]

_LEARNING_PHASES = ("restoring", "learning")


@dataclass(frozen=True)
class HandoffConfig:
    """From ``spec.state`` and ``spec.scaling``. Invariants: all values > 0."""

    acceptable_recovery_lag: int = 10_000  # spec.state.acceptableRecoveryLag
    learner_timeout_s: float = 600.0  # spec.state.learnerTimeoutSeconds
    max_concurrent_warmups: int = 4  # spec.scaling.maxPartitionsMovedAtOnce
    release_deadline_s: float = 30.0  # drain budget of a releasing worker

    def coordinator(self) -> RolloutCoordinator:
        return RolloutCoordinator(
            acceptable_recovery_lag=self.acceptable_recovery_lag,
            max_concurrent_warmups=self.max_concurrent_warmups,
            learner_timeout_s=self.learner_timeout_s,
        )


@dataclass(frozen=True)
class HandoffRecord:
    """One completed move. ``pause_s``: from the release call to the end of the promotion call (the
    partition is processed by nobody in between); ``learn_s``: warm-up time before the release."""

    partition: str
    source: str | None
    target: str
    eager: bool
    learn_s: float
    pause_s: float
    final_offset: int | None
    release_s: float | None = None  # the release call (drain, final commit, store close on the source)
    promote_s: float | None = None  # the promotion call (tail applied, partition opened on the target)
    released_at: float | None = None  # wall time (epoch) the release call started
    promoted_at: float | None = None  # wall time (epoch) the promotion call returned


def observe_worker(name: str, alive: bool, status: Mapping[str, Any] | None) -> WorkerObservation:
    """A :class:`WorkerObservation` from a worker's ``/v1/status`` answer (None: no answer). Pure."""
    if not alive or status is None:
        return WorkerObservation(name=name, alive=alive)
    active = frozenset(
        format_partition(str(p["topic"]), int(p["partition"]))
        for p in status.get("partitions") or []
        if p.get("phase") == "active"
    )
    learners: dict[str, int | None] = {}
    for entry in status.get("learners") or []:
        if entry.get("phase") in _LEARNING_PHASES:
            # The lag that decides "caught up" is what is still to be *read* from the changelog
            # (``unread``): changes held back because their records are not committed yet
            # (``buffered``) are in memory and applied in milliseconds at promotion, and under load
            # there are always about a commit interval's worth of them.
            lag = entry.get("unread", entry.get("restore_lag"))
            learners[format_partition(str(entry["topic"]), int(entry["partition"]))] = (
                None if lag is None else int(lag)
            )
    return WorkerObservation(name=name, alive=True, active=active, learner_lag=learners)


def with_released(
    obs: Mapping[str, WorkerObservation], released: Mapping[tuple[str, str], int | None]
) -> dict[str, WorkerObservation]:
    """``obs`` with the releases the executor saw answered (a re-sent release answers at once).
    ``released``: (source, partition) -> final committed offset."""
    out = dict(obs)
    for name, o in obs.items():
        seen = {p: off for (src, p), off in released.items() if src == name}
        if seen:
            out[name] = replace(o, released={**o.released, **seen})
    return out


def drop_orphaned_pending(
    rollout: Rollout, obs: Mapping[str, WorkerObservation], clock: Callable[[], float]
) -> Rollout:
    """Abandon pending moves whose source is known dead: the partition has no owner, so it is
    placed at once instead of waiting for a warm-up slot. Pure (``clock``: the rollout's phase times)."""
    moves = list(rollout.moves)
    for i, m in enumerate(moves):
        source = obs.get(m.source) if m.source is not None else None
        if m.phase is MovePhase.PENDING and (source is None or not source.alive):
            moves[i] = m.advance(MovePhase.ABANDONED, clock())
    return replace(rollout, moves=tuple(moves)) if moves != list(rollout.moves) else rollout


def place_unowned(
    members: Mapping[str, tuple[str, ...]],
    rollout: Rollout | None,
    obs: Mapping[str, WorkerObservation],
    partitions: Sequence[str],
    receivers: set[str],
) -> tuple[dict[str, tuple[str, ...]], dict[str, list[str]]] | None:
    """Where step 3 places the partitions without an alive owner and outside the rollout's moves:
    the members afterwards and the partitions placed per target (the planner's choice among
    ``receivers``). None when nothing is to be placed or nobody may receive. Pure."""
    moving = set()
    if rollout is not None:
        # The rollout owns every move under way (a learning move whose source died is promoted
        # by it: its target is already warm); only partitions outside them are placed here.
        moving = {
            m.partition
            for m in rollout.moves
            if m.phase in (MovePhase.LEARNING, MovePhase.RELEASING, MovePhase.PROMOTING)
        }
    alive = {w for w, o in obs.items() if o.alive}
    owned = {p for w, ps in members.items() if w in alive for p in ps}
    unowned = [p for p in partitions if p not in owned and p not in moving]
    if not unowned or not receivers:
        return None
    current = {w: ps for w, ps in members.items() if w in alive}
    plan = AssignmentPlanner(max_moves=1).plan(current, receivers, partitions)
    placed = {w: tuple(p for p in ps if p not in unowned) for w, ps in members.items()}
    targets: dict[str, list[str]] = {}
    for m in plan.moves:
        if m.source is None and m.partition in unowned:
            targets.setdefault(m.target, []).append(m.partition)
    for w, ps in targets.items():
        placed[w] = tuple(sorted(set(placed.get(w, ())) | set(ps)))
    return placed, targets


def rebalance_moves(
    members: Mapping[str, tuple[str, ...]],
    obs: Mapping[str, WorkerObservation],
    partitions: Sequence[str],
    receivers: set[str],
) -> tuple[dict[str, tuple[str, ...]], dict[str, str], dict[str, str]]:
    """What step 4 moves: the alive workers' members, the owner of each partition they hold, and the
    partitions whose owner differs from the planner's balanced target over ``receivers``, with that
    target (partition -> worker). Pure."""
    alive = {w for w, o in obs.items() if o.alive}
    current = {w: ps for w, ps in members.items() if w in alive}
    plan = AssignmentPlanner(max_moves=None).plan(current, receivers, partitions)
    owner_now = {p: w for w, ps in current.items() for p in ps}
    owner_next = {p: w for w, ps in plan.assignment.items() for p in ps}
    moving = {p: owner_next[p] for p in owner_next if p in owner_now and owner_now[p] != owner_next[p]}
    return current, owner_now, moving


def release_members(
    members: Mapping[str, tuple[str, ...]],
    by_source: Mapping[str, list[str]],
    release_started: Mapping[str, float],
) -> tuple[dict[str, tuple[str, ...]], bool]:
    """The members of a RELEASE round: without the released partitions on their sources, and whether
    that needs a new generation (a source loses a partition, or a release the executor has not started
    yet: ``release_started`` is keyed by partition). Pure."""
    out = dict(members)
    bump = False
    for source, parts in by_source.items():
        keep = tuple(p for p in out.get(source, ()) if p not in parts)
        if keep != out.get(source, ()) or any(p not in release_started for p in parts):
            bump = True
        out[source] = keep
    return out, bump


def promote_members(
    members: Mapping[str, tuple[str, ...]], by_target: Mapping[str, list[str]]
) -> dict[str, tuple[str, ...]]:
    """The members of a PROMOTE round: the promoted partitions belong to their targets (and no longer
    to anyone else, e.g. dead sources). Pure."""
    moving = {p for ps in by_target.values() for p in ps}
    out = {w: tuple(p for p in ps if p not in moving) for w, ps in members.items()}
    for target, parts in by_target.items():
        out[target] = tuple(sorted(set(members.get(target, ())) | set(parts)))
    return out


def by_worker(actions: Iterable[Action]) -> dict[str, list[str]]:
    """Partitions of ``actions`` per worker, in order, without repeats."""
    out: dict[str, list[str]] = {}
    for a in actions:
        ps = out.setdefault(a.worker, [])
        if a.partition not in ps:
            ps.append(a.partition)
    return out


def take_done_records(
    rollout: Rollout,
    release_started: dict[str, float],
    learn_started: dict[str, float],
    pause_end: dict[str, float],
    call_s: dict[tuple[str, str], float],
    wall: dict[tuple[str, str], float],
    monotonic: Callable[[], float],
) -> list[HandoffRecord]:
    """Moves of ``rollout`` that reached DONE (and whose release the executor timed) as
    :class:`HandoffRecord` s. No I/O; the maps are the executor's timings (keyed by partition, or by
    (kind, partition)), and the entries of the recorded moves are taken out of them. ``monotonic``:
    the end of a pause whose promotion was not timed. The entries of abandoned moves are dropped."""
    records = []
    for m in rollout.moves:
        if m.phase is MovePhase.ABANDONED:
            # its timings must not start the pause of a later move of the partition
            for timing in (release_started, learn_started, pause_end):
                timing.pop(m.partition, None)
            for key in [k for k in (*call_s, *wall) if k[1] == m.partition]:
                call_s.pop(key, None)
                wall.pop(key, None)
        if m.phase is MovePhase.DONE and m.partition in release_started:
            started = release_started.pop(m.partition)
            learned = learn_started.pop(m.partition, started)
            records.append(
                HandoffRecord(
                    m.partition,
                    m.source,
                    m.target,
                    m.eager,
                    round(started - learned, 3),
                    round(pause_end.pop(m.partition, monotonic()) - started, 3),
                    m.final_offset,
                    call_s.pop(("release", m.partition), None),
                    call_s.pop(("promote", m.partition), None),
                    wall.pop(("released", m.partition), None),
                    wall.pop(("promoted", m.partition), None),
                )
            )
    return records


def handed_off_event(record: HandoffRecord) -> tuple[str, str, str]:
    """The ``HandedOff`` event (type, reason, message) of a completed move."""
    return (
        "Normal",
        "HandedOff",
        f"{record.partition}: {record.source} -> {record.target} paused {record.pause_s:.3f}s"
        + (" (eager fallback)" if record.eager else ""),
    )
