"""``WorkerFleetDouble``: in-memory workers that follow the control protocol (assignment pushes fenced
by generation, learners that catch up after a few status reads, releases answering their committed
offset), for tests and for the control-plane benchmark at sizes no machine runs as processes. No I/O.

Workers are addressed as ``fake://NAME``; :func:`fleet_infos` gives the :class:`WorkerInfo` list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.workers import ReleasedPartition, WorkerFencedError, WorkerUnreachableError

__all__ = ["WorkerFleetDouble", "fleet_infos"]


class WorkerFleetDouble:
    """Engine semantics enough for the executor: whole-assignment pushes fenced by generation, learners
    that catch up after ``learn_ticks`` status reads. Records every call; checks that no partition is
    ever active on two workers."""

    def __init__(self, names: Iterable[str], learn_ticks: int = 1) -> None:
        self.active: dict[str, set[str]] = {n: set() for n in names}
        self.learning: dict[str, dict[str, int]] = {n: {} for n in names}
        self.generation: dict[str, int] = dict.fromkeys(self.active, 0)
        self.dead: set[str] = set()
        self.calls: list[tuple[str, str, tuple[str, ...]]] = []
        # per assignment push: the worker and the progress records it was handed (partition -> record)
        self.progress_received: list[tuple[str, dict[str, str]]] = []
        self.learn_ticks = learn_ticks

    @staticmethod
    def name(url: str) -> str:
        return url.removeprefix("fake://")

    def _check(self, w: str) -> None:
        if w in self.dead:
            raise WorkerUnreachableError(f"{w} is dead")

    async def status(self, base_url: str) -> dict[str, Any]:
        w = self.name(base_url)
        self._check(w)
        learners = []
        for p, left in list(self.learning[w].items()):
            self.learning[w][p] = max(0, left - 1)
            t, i = p.split("/")
            learners.append(
                {"topic": t, "partition": int(i), "phase": "learning", "restore_lag": left * 1000}
            )
        parts = [
            {"topic": p.split("/")[0], "partition": int(p.split("/")[1]), "phase": "active"}
            for p in self.active[w]
        ]
        return {"generation": self.generation[w], "factor": 1, "partitions": parts, "learners": learners}

    async def assign(
        self,
        base_url: str,
        generation: int,
        partitions: Iterable[str],
        release_deadline_s: float,
        progress: Mapping[str, str] | None = None,
    ) -> list[ReleasedPartition]:
        w = self.name(base_url)
        self._check(w)
        if generation < self.generation[w]:
            raise WorkerFencedError(f"{w}: {generation} < {self.generation[w]}")
        self.generation[w] = generation
        want = set(partitions)
        # a release answers its final commit's progress record, as a worker does (issue 22)
        released = [ReleasedPartition(p, 100, f"progress-of-{p}") for p in sorted(self.active[w] - want)]
        self.progress_received.append((w, dict(progress or {})))
        for p in want - self.active[w]:
            others = [o for o, ps in self.active.items() if o != w and o not in self.dead and p in ps]
            assert not others, f"{p} granted to {w} while active on {others}"
            self.learning[w].pop(p, None)
        self.active[w] = want
        self.calls.append(("assign", w, tuple(sorted(want))))
        return released

    async def set_factor(self, base_url: str, factor: int) -> int:
        return factor

    async def learn(self, base_url: str, partitions: Iterable[str]) -> None:
        w = self.name(base_url)
        self._check(w)
        ps = tuple(partitions)
        for p in ps:
            self.learning[w].setdefault(p, self.learn_ticks)
        self.calls.append(("learn", w, ps))

    async def drop(self, base_url: str, partitions: Iterable[str]) -> None:
        for p in partitions:
            self.learning[self.name(base_url)].pop(p, None)

    async def resume(self, base_url: str) -> bool:
        return False


def fleet_infos(fleet: WorkerFleetDouble, names: Iterable[str]) -> list[WorkerInfo]:
    """Alive (not in ``fleet.dead``) workers ``NAME-i`` at ``fake://NAME-i``."""
    return [
        WorkerInfo(n, int(n.rsplit("-", 1)[1]), n not in fleet.dead, f"fake://{n}") for n in sorted(names)
    ]
