"""What the :class:`~multilane.operator.handoff.HandoffExecutor` exchanges with its surroundings:
the worker calls it makes (:class:`HandoffControl`; :class:`HandoffControlClient` over the workers'
control endpoints), the status write it is given (:data:`PersistHandoff`) and what a step returns
for its caller to write (:class:`HandoffStep`). Does I/O (HTTP, in :class:`HandoffControlClient`);
the rest are types. The pure data model is in :mod:`multilane.operator.rollout.handoff_model`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from multilane.operator.rollout.assignment import AssignmentState, WorkerControl
from multilane.operator.rollout.handoff_model import HandoffRecord
from multilane.operator.rollout.protocol import Rollout, WorkerObservation
from multilane.operator.rollout.workers import WorkerControlClient, _partitions_body

__all__ = ["HandoffControl", "HandoffControlClient", "HandoffStep", "PersistHandoff"]


@runtime_checkable
class HandoffControl(WorkerControl, Protocol):
    """The worker control calls the executor needs (the assignment calls plus the learner calls)."""

    async def learn(self, base_url: str, partitions: Iterable[str]) -> None: ...

    async def drop(self, base_url: str, partitions: Iterable[str]) -> None: ...


class HandoffControlClient(WorkerControlClient):
    """:class:`WorkerControlClient` plus ``/v1/learn`` and ``/v1/drop`` (HTTP I/O)."""

    async def learn(self, base_url: str, partitions: Iterable[str]) -> None:
        await self._call("POST", f"{base_url}/v1/learn", {"partitions": _partitions_body(partitions)})

    async def drop(self, base_url: str, partitions: Iterable[str]) -> None:
        await self._call("POST", f"{base_url}/v1/drop", {"partitions": _partitions_body(partitions)})


@dataclass
class HandoffStep:
    """What a step did and what the caller must write."""

    assignment: AssignmentState
    rollout: Rollout | None
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    handoffs: list[HandoffRecord] = field(default_factory=list)  # moves completed in this step
    remove_to: int | None = None  # REMOVE_WORKERS: the replica count to scale the platform down to
    blocked: str = ""
    observations: dict[str, WorkerObservation] = field(default_factory=dict)

    @property
    def in_progress(self) -> bool:
        return self.rollout is not None or self.assignment.pending is not None


PersistHandoff = Callable[[AssignmentState, Rollout | None], Awaitable[None]]
