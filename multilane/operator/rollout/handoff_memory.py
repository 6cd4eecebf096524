"""``HandoffMemory``: what the handoff executor keeps in memory between calls -- only what the workers
can tell again after an operator restart: releases seen complete (a re-sent release answers at once),
the handovers waiting for their promotion, and timings. Pure (no I/O; reads the clocks).

Written by :class:`~multilane.operator.rollout.handoff_round.HandoffRound` as it carries out a round's
actions (each method below is one event of a move), read by the executor's observation
(:meth:`HandoffMemory.observed`) and emptied of a move when it is done or abandoned
(:meth:`HandoffMemory.take_done`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from multilane.formats.handover import Handover
from multilane.operator.rollout.handoff_model import HandoffRecord, take_done_records, with_released
from multilane.operator.rollout.protocol import MovePhase, Rollout, WorkerObservation

__all__ = ["HandoffMemory"]


class HandoffMemory:
    def __init__(self) -> None:
        self._released: dict[tuple[str, str], int | None] = {}  # (source, partition) -> final offset
        # partition -> what its source released (the progress record and changelog end), handed to the
        # promotion: the target need not read the progress topic inside the pause, and its learner
        # reads to that end instead of waiting for a fresh fetch. Dropped once promoted.
        self.handovers: dict[str, Handover] = {}
        self.release_started: dict[str, float] = {}  # partition -> monotonic time of the release
        self._learn_started: dict[str, float] = {}  # partition -> monotonic time of LEARN
        self._pause_end: dict[str, float] = {}  # partition -> monotonic time the promotion returned
        self._call_s: dict[tuple[str, str], float] = {}  # (kind, partition) -> duration of the call
        self._wall: dict[tuple[str, str], float] = {}  # ("released"/"promoted", partition) -> epoch

    def observed(self, obs: Mapping[str, WorkerObservation]) -> dict[str, WorkerObservation]:
        """``obs`` with the releases this executor saw complete (a worker's status may lag them)."""
        return with_released(obs, self._released)

    def learning(self, partitions: Iterable[str]) -> None:
        """LEARN sent for ``partitions`` (the first time counts)."""
        for p in partitions:
            self._learn_started.setdefault(p, time.monotonic())

    def releasing(self, partitions: Iterable[str]) -> None:
        """RELEASE about to be sent for ``partitions`` (the first time counts): the pause starts."""
        for p in partitions:
            self.release_started.setdefault(p, time.monotonic())
            self._wall.setdefault(("released", p), time.time())

    def release_answered(
        self,
        source: str,
        partitions: Iterable[str],
        offsets: Mapping[str, int | None],
        handovers: Mapping[str, Handover],
        took: float,
    ) -> None:
        """``source`` answered the release of ``partitions``: its final committed ``offsets`` (for the
        observation) and ``handovers`` (for the promotion) are remembered."""
        self.handovers.update(handovers)
        for p in partitions:
            self._call_s[("release", p)] = took
            self._released[(source, p)] = offsets.get(p)

    def promoting(self, partitions: Iterable[str]) -> None:
        """PROMOTE about to be sent (a pause whose release this executor did not see starts now)."""
        for p in partitions:
            self.release_started.setdefault(p, time.monotonic())

    def handovers_for(self, partitions: Iterable[str]) -> dict[str, Handover]:
        """The handovers to send with a push of ``partitions``."""
        return {p: self.handovers[p] for p in partitions if p in self.handovers}

    def promoted(self, partitions: Iterable[str], took: float, answered: float) -> None:
        """The target answered the promotion of ``partitions`` at ``answered`` (monotonic): the pause
        ends; the handover and the release seen are forgotten."""
        for p in partitions:
            self._call_s[("promote", p)] = took
            self._wall[("promoted", p)] = time.time()
            self._pause_end[p] = answered
            self._forget_release(p)

    def take_done(self, rollout: Rollout) -> list[HandoffRecord]:
        """The moves of ``rollout`` that reached DONE as records (their timings taken out); what is
        remembered of abandoned moves is forgotten (a later move of the partition starts anew)."""
        for m in rollout.moves:
            if m.phase is MovePhase.ABANDONED:
                self._forget_release(m.partition)
        timings = (self.release_started, self._learn_started, self._pause_end, self._call_s, self._wall)
        return take_done_records(rollout, *timings, time.monotonic)

    def _forget_release(self, partition: str) -> None:
        self.handovers.pop(partition, None)
        for key in [k for k in self._released if k[1] == partition]:
            del self._released[key]
