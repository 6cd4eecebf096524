"""What the :class:`~multilane.operator.handoff.HandoffExecutor` exchanges with its surroundings:
the worker calls it makes (:class:`HandoffControl`; :class:`HandoffControlClient` over the workers'
control endpoints), the status write it is given (:data:`PersistHandoff`) and what a step returns
for its caller to write (:class:`HandoffStep`). Does I/O (HTTP, in :class:`HandoffControlClient`);
the rest are types. The pure data model is in :mod:`multilane.operator.rollout.handoff_model`."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import aiohttp.abc

from multilane.formats.handover import Handover
from multilane.operator.rollout.assignment import AssignmentState, WorkerControl
from multilane.operator.rollout.handoff_model import HandoffRecord
from multilane.operator.rollout.protocol import Rollout, WorkerObservation
from multilane.operator.rollout.workers import ReleasedPartition, WorkerControlClient, _partitions_body

__all__ = ["HandoffControl", "HandoffControlClient", "HandoffStep", "PersistHandoff"]


@runtime_checkable
class HandoffControl(WorkerControl, Protocol):
    """The worker control calls the executor needs (the assignment calls plus the learner calls)."""

    async def learn(self, base_url: str, partitions: Iterable[str]) -> None: ...

    async def drop(self, base_url: str, partitions: Iterable[str]) -> None: ...


class HandoffControlClient:
    """The worker calls of a handoff over HTTP: a :class:`WorkerControlClient` (``client``: status,
    assignment, factor, pause, resume, TLS; one session) and ``/v1/learn``, ``/v1/drop`` through it."""

    def __init__(
        self,
        token: str,
        timeout_s: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        resolver: aiohttp.abc.AbstractResolver | None = None,
    ) -> None:
        self.client = WorkerControlClient(token, timeout_s, ssl_context, resolver)

    async def status(self, base_url: str) -> dict[str, Any]:
        return await self.client.status(base_url)

    async def assign(
        self,
        base_url: str,
        generation: int,
        partitions: Iterable[str],
        release_deadline_s: float,
        handovers: Mapping[str, Handover] | None = None,
    ) -> list[ReleasedPartition]:
        return await self.client.assign(base_url, generation, partitions, release_deadline_s, handovers)

    async def set_factor(self, base_url: str, factor: int) -> int:
        return await self.client.set_factor(base_url, factor)

    async def pause(self, base_url: str) -> bool:
        return await self.client.pause(base_url)

    async def resume(self, base_url: str) -> bool:
        return await self.client.resume(base_url)

    async def learn(self, base_url: str, partitions: Iterable[str]) -> None:
        await self.client.call("POST", f"{base_url}/v1/learn", {"partitions": _partitions_body(partitions)})

    async def drop(self, base_url: str, partitions: Iterable[str]) -> None:
        await self.client.call("POST", f"{base_url}/v1/drop", {"partitions": _partitions_body(partitions)})

    def use_tls(self, ssl_context: ssl.SSLContext) -> None:
        """:meth:`WorkerControlClient.use_tls` (the certificate manager wires the consumer's context)."""
        self.client.use_tls(ssl_context)

    async def close(self) -> None:
        await self.client.close()


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
