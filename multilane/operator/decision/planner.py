"""``AssignmentPlanner``: which worker owns which partition. Pure: no I/O.

A partition is named ``"<topic>/<partition>"`` (the form stored in ``status.assignment``); topic names
cannot contain ``/``. The planner is sticky: it keeps every partition where it is unless the owner is
gone or holds more than its fair share, and it moves as few partitions as possible to reach a
balanced assignment (shares differ by at most one).

Two kinds of change are distinguished:

- *placements*: a partition without a live owner (new partition, owner dead or removed) is given to
  a worker. Placements are never limited: an unowned partition is not being processed.
- *moves*: a partition goes from one live worker to another to restore balance. At most
  ``max_moves`` per plan; the caller re-plans after each change completes, so repeated plans
  converge on a balanced assignment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "AssignmentPlan",
    "AssignmentPlanner",
    "Move",
    "format_partition",
    "members_from_status",
    "members_to_status",
    "parse_partition",
]


def format_partition(topic: str, partition: int) -> str:
    """``("orders", 3)`` -> ``"orders/3"``."""
    return f"{topic}/{partition}"


def parse_partition(name: str) -> tuple[str, int]:
    """``"orders/3"`` -> ``("orders", 3)``; raises ``ValueError`` on anything else."""
    topic, sep, index = name.rpartition("/")
    if not sep or not topic or not index.isdigit():
        raise ValueError(f"not a partition name: {name!r}")
    return topic, int(index)


def _partition_sort_key(name: str) -> tuple[str, int]:
    topic, index = parse_partition(name)
    return topic, index


def _worker_sort_key(name: str) -> tuple[str, int, str]:
    # "app-10" sorts after "app-9": StatefulSet ordinals compare as numbers.
    stem, _, tail = name.rpartition("-")
    if stem and tail.isdigit():
        return stem, int(tail), name
    return name, -1, name


@dataclass(frozen=True, slots=True)
class Move:
    """One partition changing hands. ``source is None`` means a placement (no live owner)."""

    partition: str
    source: str | None
    target: str


@dataclass(frozen=True, slots=True)
class AssignmentPlan:
    """The planner's answer.

    Invariants: every partition given to ``plan`` appears in exactly one member's tuple; every member
    of ``assignment`` is one of the live workers (all of them appear, possibly with no partitions);
    ``moves`` lists exactly the partitions whose owner differs from the current assignment.
    """

    assignment: Mapping[str, tuple[str, ...]]
    moves: tuple[Move, ...] = field(default=())

    @property
    def live_moves(self) -> tuple[Move, ...]:
        """Moves from one live worker to another (the ones limited by ``max_moves``)."""
        return tuple(m for m in self.moves if m.source is not None)

    @property
    def balanced(self) -> bool:
        counts = [len(p) for p in self.assignment.values()]
        return not counts or max(counts) - min(counts) <= 1

    def owner_of(self, partition: str) -> str | None:
        for worker, parts in self.assignment.items():
            if partition in parts:
                return worker
        return None


class AssignmentPlanner:
    """Sticky, balanced, move-limited partition assignment.

    ``max_moves`` (>= 1, or ``None`` for unlimited) bounds the live-to-live moves of one plan.
    """

    def __init__(self, max_moves: int | None = 1) -> None:
        if max_moves is not None and max_moves < 1:
            raise ValueError("max_moves must be >= 1 or None")
        self.max_moves = max_moves

    def plan(
        self,
        current: Mapping[str, Iterable[str]],
        workers: Iterable[str],
        partitions: Iterable[str],
    ) -> AssignmentPlan:
        """Plan the next assignment.

        ``current``: the assignment in force (may name dead workers, stale or duplicated partitions);
        ``workers``: the live workers; ``partitions``: every partition of the subscribed topics.
        """
        live = sorted(set(workers), key=_worker_sort_key)
        wanted = sorted(set(partitions), key=_partition_sort_key)
        if not live:
            # Nobody to own anything: an empty plan; the caller waits for workers.
            return AssignmentPlan(assignment={}, moves=())
        wanted_set = set(wanted)

        # Keep what live workers already own (first claim wins on duplicates), drop stale partitions.
        kept: dict[str, list[str]] = {w: [] for w in live}
        claimed: set[str] = set()
        for worker in sorted(current, key=_worker_sort_key):
            if worker not in kept:
                continue
            for p in sorted(set(current[worker]), key=_partition_sort_key):
                if p in wanted_set and p not in claimed:
                    kept[worker].append(p)
                    claimed.add(p)
        previous_owner = {p: w for w, ps in kept.items() for p in ps}
        orphans = [p for p in wanted if p not in claimed]

        # Quotas: floor(P/W) each; the (P mod W) workers holding the most keep a ceil share, which
        # maximises the partitions that stay where they are (ties broken by worker order).
        base, extra = divmod(len(wanted), len(live))
        by_holding = sorted(live, key=lambda w: (-len(kept[w]), _worker_sort_key(w)))
        quota = {w: base + (1 if i < extra else 0) for i, w in enumerate(by_holding)}

        # Surplus of over-quota workers: candidates for live moves, highest partitions first.
        surplus: list[tuple[str, str]] = []  # (partition, source)
        for w in live:
            over = len(kept[w]) - quota[w]
            if over > 0:
                for p in kept[w][-over:]:
                    surplus.append((p, w))
        budget = len(surplus) if self.max_moves is None else min(self.max_moves, len(surplus))

        def neediest() -> str:
            return min(live, key=lambda w: (len(kept[w]) - quota[w], len(kept[w]), _worker_sort_key(w)))

        moves: list[Move] = []
        # 1. Place orphans on the worker furthest below its quota.
        for p in orphans:
            target = neediest()
            kept[target].append(p)
            moves.append(Move(partition=p, source=None, target=target))
        # 2. Move surplus from over-quota workers to under-quota ones, within the budget.
        for p, source in surplus:
            if budget <= 0:
                break
            if len(kept[source]) <= quota[source]:
                continue  # orphans did not land here, but be safe: never move below quota
            target = neediest()
            if len(kept[target]) >= quota[target]:
                break  # everyone is at quota already
            kept[source].remove(p)
            kept[target].append(p)
            moves.append(Move(partition=p, source=source, target=target))
            budget -= 1

        assignment = {w: tuple(sorted(kept[w], key=_partition_sort_key)) for w in live}
        # A placement of a partition that was kept is impossible; a move's source is its previous owner.
        assert all(m.source is None or previous_owner[m.partition] == m.source for m in moves)
        return AssignmentPlan(assignment=assignment, moves=tuple(moves))


def members_from_status(members: Sequence[Mapping[str, object]]) -> dict[str, tuple[str, ...]]:
    """``status.assignment.members`` (``[{worker, partitions}]``) -> ``{worker: partitions}``."""
    out: dict[str, tuple[str, ...]] = {}
    for m in members:
        worker = m.get("worker")
        parts = m.get("partitions") or []
        if isinstance(worker, str) and isinstance(parts, list):
            out[worker] = tuple(str(p) for p in parts)
    return out


def members_to_status(assignment: Mapping[str, Sequence[str]]) -> list[dict[str, object]]:
    """``{worker: partitions}`` -> ``status.assignment.members``, in worker order."""
    return [
        {"worker": w, "partitions": list(assignment[w])} for w in sorted(assignment, key=_worker_sort_key)
    ]
