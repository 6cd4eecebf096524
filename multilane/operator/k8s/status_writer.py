"""``StatusWriter``: every write of a ParallelConsumer's status, and what the next pass reads of it.
Does I/O (Kubernetes API: the status subresource).

Inputs: the API client, the :class:`~multilane.operator.k8s.leader_gate.LeaderGate` (the control loop's
writes are conditional), the :class:`~multilane.operator.spec.status_memory.StatusMemory` (which
changes a pass writes; the last answer until the watch delivers it) and where the written conditions
go (the metric ``multilane_consumer_condition``). The reconcile handler writes
unconditionally (it decides on the spec, not on a status it read); the control pass writes through
:meth:`StatusWriter.write_pass` (only what changed) and the handoff's persist (intent before calls).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from multilane.operator.k8s.kube import KubeClient
from multilane.operator.k8s.leader_gate import LeaderGate
from multilane.operator.k8s.resource import cr_path, post_event
from multilane.operator.pass_model import EventRecord
from multilane.operator.spec.child_meta import ConsumerRef
from multilane.operator.spec.conditions import condition, now_iso, set_condition
from multilane.operator.spec.status_memory import StatusMemory
from multilane.operator.spec.validation import Problem

__all__ = ["StatusWriter"]

log = logging.getLogger(__name__)


class StatusWriter:
    def __init__(
        self,
        kube: KubeClient,
        gate: LeaderGate,
        memory: StatusMemory,
        conditions_written: Callable[[str, str, Iterable[Any]], None],
    ) -> None:
        self._kube = kube
        self._gate = gate
        self._memory = memory  # what was written last per consumer (its owner: this writer and forget)
        # (namespace, consumer, conditions) after every write: the condition metric follows the status
        self._conditions_written = conditions_written

    async def patch(self, ref: ConsumerRef, status: Mapping[str, Any], *, conditional: bool = False) -> None:
        """Every status write; the answer is what the next pass reads until the watch delivers it.

        ``conditional`` (the control loop's writes: assignment, rollout, scaling): the patch carries the
        resourceVersion this operator last read or wrote (:class:`LeaderGate`), so a write based on a
        stale view gets 409 (:class:`KubeConflictError`; the tick fails and the next one re-reads) and
        never overwrites another writer's status."""
        body: dict[str, Any] = {"status": dict(status)}
        precondition = self._gate.precondition(ref) if conditional else None
        if precondition is not None:
            body["metadata"] = precondition
        answer = await self._kube.patch(cr_path(ref, "status"), body)
        self._gate.seen(ref, answer)
        if answer:
            self._memory.written(ref.uid, answer)
        # the condition metric follows every write (the answer: the whole status as stored)
        written = ((answer or {}).get("status") or {}).get("conditions") or status.get("conditions")
        if written:
            self._conditions_written(ref.namespace, ref.name, written)

    def view(self, ref: ConsumerRef, fresh: Mapping[str, Any]) -> dict[str, Any]:
        """The status a pass starts from: the watched object's, or this writer's newer answer."""
        return self._memory.view(ref.uid, fresh)

    async def write_pass(self, ref: ConsumerRef, body: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        """The status a control pass computed, written (conditionally) only when its significant part
        changed or the volatile part is a heartbeat old (:class:`StatusMemory`)."""
        patch = self._memory.to_write(ref.uid, body, status)
        if patch is not None:
            await self.patch(ref, patch, conditional=True)

    async def degrade(
        self,
        ref: ConsumerRef,
        body: Mapping[str, Any],
        conditions: list[dict[str, Any]],
        problems: list[Problem],
        generation: int,
    ) -> None:
        """Ready=False and Degraded=True naming the problems; a Warning Event per problem when the
        condition changes (a re-run of the same problem posts none)."""
        stamp = now_iso()
        message = "; ".join(p.message for p in problems)[:1000]
        reason = problems[0].reason if problems else "InvalidSpec"
        previous = condition(conditions, "Degraded") or {}
        if previous.get("status") != "True" or previous.get("message") != message:
            for p in problems:
                post_event(body, EventRecord("Warning", p.reason, p.message))
        conditions = set_condition(conditions, "Degraded", True, reason, message, now=stamp)
        conditions = set_condition(conditions, "Ready", False, reason, message, now=stamp)
        await self.patch(ref, {"conditions": conditions})
        log.warning("%s/%s not applied (generation %d): %s", ref.namespace, ref.name, generation, message)
