"""In-memory workers that follow the control protocol, for tests and for the control-plane benchmark at
sizes no machine runs as processes. No I/O.

- :class:`FleetWorker`: what one worker's engine holds for the control protocol (generation, active
  partitions, learners, factor) and the protocol's rules: assignment pushes fenced by generation that
  answer the released partitions' committed offsets, learners that catch up after a few status reads,
  the ``/v1/status`` document. The one implementation of those rules; both fleet doubles use it.
- :class:`WorkerFleetDouble`: the operator's :class:`~multilane.operator.rollout.assignment.WorkerControl`
  (and handoff) interface over many of them, called in-process; workers are addressed as
  ``fake://NAME`` (:func:`fleet_infos` gives the :class:`WorkerInfo` list). Records every call; checks
  that no partition is ever active on two workers. The operator tests' HTTP double
  (``tests/operator/doubles.py``, ``WorkerFleet``) serves the same workers over the worker control
  HTTP API.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from multilane.formats.handover import Handover
from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.workers import ReleasedPartition, WorkerFencedError, WorkerUnreachableError

__all__ = ["FleetWorker", "WorkerFleetDouble", "fleet_infos"]

COMMITTED_OFFSET = 100  # what every released partition answers as its committed offset
CHANGELOG_END = 250  # ... and as the end of its changelog


def _split(partition: str) -> tuple[str, int]:
    topic, _, index = partition.rpartition("/")
    return topic, int(index)


@dataclass
class FleetWorker:
    """One worker's side of the control protocol (see the module docstring)."""

    name: str
    generation: int = 0  # invariant: only grows (a push with a lower one is fenced)
    partitions: set[str] = field(default_factory=set)  # active partitions, "topic/index"
    learning: dict[str, int] = field(default_factory=dict)  # partition -> status reads until caught up
    factor: int = 1

    def push(self, generation: int, partitions: Iterable[str]) -> list[ReleasedPartition]:
        """An assignment push: fenced by generation; the partitions it takes away answer their
        committed offset; a partition granted stops learning."""
        if generation < self.generation:
            raise WorkerFencedError(f"{self.name}: {generation} < {self.generation}")
        self.generation = generation
        want = set(partitions)
        # a release answers its final commit's progress record and changelog end, as a worker does
        released = [
            ReleasedPartition(p, COMMITTED_OFFSET, f"progress-of-{p}", CHANGELOG_END)
            for p in sorted(self.partitions - want)
        ]
        for p in want - self.partitions:
            self.learning.pop(p, None)
        self.partitions = want
        return released

    def learn(self, partitions: Iterable[str], ticks: int) -> None:
        for p in partitions:
            self.learning.setdefault(p, ticks)

    def status(self) -> dict[str, Any]:
        """The ``/v1/status`` document; each read brings every learner one step closer."""
        learners = []
        for p, left in list(self.learning.items()):
            self.learning[p] = max(0, left - 1)
            topic, index = _split(p)
            learners.append(
                {"topic": topic, "partition": index, "phase": "learning", "restore_lag": left * 1000}
            )
        return {
            "worker_id": self.name,
            "generation": self.generation,
            "factor": self.factor,
            "mode": "key",
            "paused": False,
            "partitions": [
                {
                    "topic": _split(p)[0],
                    "partition": _split(p)[1],
                    "phase": "active",
                    "committed": COMMITTED_OFFSET,
                    "position": COMMITTED_OFFSET,
                    "high_watermark": COMMITTED_OFFSET,
                    "lag": 0,
                    "in_flight": 0,
                    "restore_lag": 0,
                }
                for p in sorted(self.partitions)
            ],
            "learners": learners,
            "processed_total": 0,
            "processing_rate": 0.0,
        }


class WorkerFleetDouble:
    """Engine semantics enough for the executor: whole-assignment pushes fenced by generation, learners
    that catch up after ``learn_ticks`` status reads. Records every call; checks that no partition is
    ever active on two workers."""

    def __init__(self, names: Iterable[str], learn_ticks: int = 1) -> None:
        self.workers: dict[str, FleetWorker] = {n: FleetWorker(n) for n in names}
        self.dead: set[str] = set()
        self.calls: list[tuple[str, str, tuple[str, ...]]] = []
        # per assignment push: the worker and the handovers it was handed (partition -> handover)
        self.handovers_received: list[tuple[str, dict[str, Handover]]] = []
        self.learn_ticks = learn_ticks

    @property
    def active(self) -> dict[str, set[str]]:
        """Worker -> its active partitions (read-only view)."""
        return {n: w.partitions for n, w in self.workers.items()}

    @staticmethod
    def name(url: str) -> str:
        return url.removeprefix("fake://")

    def _worker(self, url: str) -> FleetWorker:
        w = self.name(url)
        if w in self.dead:
            raise WorkerUnreachableError(f"{w} is dead")
        return self.workers[w]

    async def status(self, base_url: str) -> dict[str, Any]:
        return self._worker(base_url).status()

    async def assign(
        self,
        base_url: str,
        generation: int,
        partitions: Iterable[str],
        release_deadline_s: float,
        handovers: Mapping[str, Handover] | None = None,
    ) -> list[ReleasedPartition]:
        worker = self._worker(base_url)
        want = set(partitions)
        if generation >= worker.generation:
            for p in want - worker.partitions:
                others = [
                    o
                    for o, ow in self.workers.items()
                    if o != worker.name and o not in self.dead and p in ow.partitions
                ]
                assert not others, f"{p} granted to {worker.name} while active on {others}"
        released = worker.push(generation, want)
        self.handovers_received.append((worker.name, dict(handovers or {})))
        self.calls.append(("assign", worker.name, tuple(sorted(want))))
        return released

    async def set_factor(self, base_url: str, factor: int) -> int:
        return factor

    async def learn(self, base_url: str, partitions: Iterable[str]) -> None:
        worker = self._worker(base_url)
        ps = tuple(partitions)
        worker.learn(ps, self.learn_ticks)
        self.calls.append(("learn", worker.name, ps))

    async def drop(self, base_url: str, partitions: Iterable[str]) -> None:
        for p in partitions:
            self.workers[self.name(base_url)].learning.pop(p, None)

    async def resume(self, base_url: str) -> bool:
        return False


def fleet_infos(fleet: WorkerFleetDouble, names: Iterable[str]) -> list[WorkerInfo]:
    """Alive (not in ``fleet.dead``) workers ``NAME-i`` at ``fake://NAME-i``."""
    return [
        WorkerInfo(n, int(n.rsplit("-", 1)[1]), n not in fleet.dead, f"fake://{n}") for n in sorted(names)
    ]
