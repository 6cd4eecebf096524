"""``WorkerCalls``: the handoff executor's calls to the workers, each batch at once (one call per
worker, the calls to different workers concurrently). Does I/O (through the
:class:`~multilane.operator.rollout.handoff_control.HandoffControl` it is given).

A call that fails is not an error of the step: the worker's state is seen at the next observation
and the rollout re-sends what is missing (every call is idempotent on the worker). Pushes report a
refused generation (409) so that the caller moves to a higher one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from multilane.formats.handover import Handover
from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.assignment import AssignmentState
from multilane.operator.rollout.handoff_control import HandoffControl, HandoffStep
from multilane.operator.rollout.handoff_model import observe_worker
from multilane.operator.rollout.protocol import WorkerObservation
from multilane.operator.rollout.workers import ReleasedPartition, WorkerFencedError, WorkerUnreachableError

__all__ = ["PushAnswers", "WorkerCalls"]

log = logging.getLogger(__name__)

# worker -> (its released partitions, the call's duration (s), when it answered (monotonic))
PushAnswers = dict[str, tuple[list[ReleasedPartition], float, float]]


class WorkerCalls:
    def __init__(self, control: HandoffControl, release_deadline_s: float) -> None:
        self.control = control
        self._release_deadline_s = release_deadline_s  # what a worker may take to release partitions

    async def observe(self, workers: Sequence[WorkerInfo]) -> dict[str, WorkerObservation]:
        """``GET /v1/status`` of every alive worker at once -> its observation (unreachable: none)."""

        async def one(w: WorkerInfo) -> WorkerObservation:
            status: dict[str, Any] | None = None
            if w.alive:
                try:
                    status = await self.control.status(w.control_url)
                except WorkerUnreachableError as exc:
                    log.info("status of %s: %s", w.name, exc)
            return observe_worker(w.name, w.alive, status)

        found = await asyncio.gather(*(one(w) for w in workers))
        return {o.name: o for o in found}

    async def assign(self, worker: WorkerInfo, generation: int, partitions: Iterable[str]) -> None:
        """One push without handovers (a placement)."""
        await self.control.assign(worker.control_url, generation, partitions, self._release_deadline_s)

    async def each(
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

    async def learn(self, calls: Mapping[str, list[str]], by_name: Mapping[str, WorkerInfo]) -> None:
        await self.each(calls, by_name, self.control.learn, "learn")

    async def drop(self, calls: Mapping[str, list[str]], by_name: Mapping[str, WorkerInfo]) -> None:
        await self.each(calls, by_name, self.control.drop, "drop")

    async def push(
        self,
        parts_by_worker: Mapping[str, list[str]],
        assignment: AssignmentState,
        by_name: Mapping[str, WorkerInfo],
        verb: str,
        result: HandoffStep,
        handovers: Mapping[str, Handover] | None = None,
    ) -> tuple[bool, PushAnswers]:
        """Push ``assignment`` to every worker of ``parts_by_worker`` at once. Returns whether one of
        them fenced the push (a higher generation is needed) and, per worker that answered, its
        released partitions, the call's duration (s) and when it answered (monotonic). Failures set
        ``result.blocked``. ``handovers``: partition -> what its source released, sent with the
        worker's partitions."""

        async def one(worker: str) -> tuple[str, list[ReleasedPartition] | None, float, float, bool]:
            t0 = time.monotonic()
            sent = {p: handovers[p] for p in parts_by_worker[worker] if handovers and p in handovers}
            url, members = by_name[worker].control_url, assignment.members.get(worker, ())
            try:
                if sent:
                    released = await self.control.assign(
                        url, assignment.generation, members, self._release_deadline_s, sent
                    )
                else:  # a control may take no handovers
                    released = await self.control.assign(
                        url, assignment.generation, members, self._release_deadline_s
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
