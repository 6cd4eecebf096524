"""Readiness of a worker as a pure function of facts (``/readyz``). Pure: no I/O.

One module decides, so that every caller (the control endpoint's ``/readyz``, a pod-restart check)
agrees: :func:`readiness` takes :class:`ReadinessFacts` and answers ready or not, with every reason
that holds. The facts come in two parts, gathered by their owners:

1. the engine's (:meth:`ReadinessFacts.of_engine`, from its status: started, fenced, partitions
   active and being restored); the control endpoint gathers them;
2. the worker's (``multilane.worker.supervision.WorkerSupervisor.facts``, laid over the engine's:
   stopping, the broker probe, missing topics, the circuit breaker); only ``multilane worker`` has them,
   so their defaults are those of a worker without a supervisor.

Liveness (``/healthz``) is separate: the event loop answers at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Readiness", "ReadinessFacts", "readiness"]

# At most this many restoring partitions are named in a reason (the rest are counted).
MAX_NAMED = 5


@dataclass(frozen=True)
class ReadinessFacts:
    """What readiness depends on. The engine's facts are set by :meth:`of_engine`; the worker's by
    the supervisor (``dataclasses.replace`` over the engine's)."""

    # -- the engine's facts ---------------------------------------------------------------------------
    started: bool  # the engine started (clients created, initial assignment or subscription made)
    partitions: int = 0  # partitions owned and active
    restoring: tuple[str, ...] = ()  # partitions whose state is being restored ("topic/partition")
    fenced: bool = False  # the engine was fenced (its lease lost)
    # -- the worker's facts (defaults: no supervisor, nothing known against readiness) ----------------
    stopping: bool = False  # a stop was requested
    broker_reachable: bool = True  # the last broker probe answered (metadata request)
    broker_unreachable_s: float = 0.0  # seconds since the broker last answered (0 while reachable)
    # True when partitions are expected at once (a static ``--assign``); in group mode and in operator
    # mode without one, a member waiting for partitions is ready to receive them (a group may have more
    # members than partitions; the operator assigns only to workers that answer)
    expects_partitions: bool = False
    breaker_open: bool = False
    breaker_reason: str = ""
    missing_topics: tuple[str, ...] = ()

    @classmethod
    def of_engine(cls, started: bool, status: Mapping[str, Any]) -> ReadinessFacts:
        """The engine's facts from its status (``GET /v1/status``; read only once ``started``)."""
        parts = (status.get("partitions") or []) if started else []
        return cls(
            started=started,
            partitions=sum(1 for p in parts if p.get("phase") == "active"),
            restoring=tuple(f"{p['topic']}/{p['partition']}" for p in parts if p.get("phase") == "promoting"),
            fenced=started and bool(status.get("fenced")),
        )


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reasons: tuple[str, ...]  # why not ready (empty when ready)

    def to_dict(self) -> dict[str, object]:
        """The ``/readyz`` body."""
        return {"ready": self.ready, "reasons": list(self.reasons)}


def readiness(f: ReadinessFacts) -> Readiness:
    """Ready when started, not stopping, the broker reachable, the input topics present, the expected
    partitions assigned, no state being restored, the breaker closed and not fenced. Every failing
    condition is named."""
    reasons: list[str] = []
    if not f.started:
        reasons.append("starting")
    if f.stopping:
        reasons.append("stopping")
    if not f.broker_reachable:
        reasons.append(f"broker unreachable for {f.broker_unreachable_s:.0f}s")
    if f.missing_topics:
        reasons.append(f"topic(s) missing: {', '.join(f.missing_topics)}")
    if f.started and f.expects_partitions and f.partitions == 0:
        reasons.append("no partitions assigned yet (--assign)")
    if f.restoring:
        more = len(f.restoring) - MAX_NAMED
        named = ", ".join(f.restoring[:MAX_NAMED]) + (f" (+{more} more)" if more > 0 else "")
        reasons.append(f"restoring state of {named}")
    if f.breaker_open:
        reasons.append(f"circuit breaker open: {f.breaker_reason}")
    if f.fenced:
        reasons.append("fenced (lease lost)")
    return Readiness(not reasons, tuple(reasons))
