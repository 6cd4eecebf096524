"""Readiness of a worker as a pure function of facts (``/readyz``). Pure: no I/O.

One function decides, so that every caller (the control endpoint's ``/readyz``, a pod-restart check)
agrees: :func:`readiness` takes :class:`ReadinessFacts` (gathered by the caller) and answers ready or
not, with every reason that holds. Liveness (``/healthz``) is separate: the event loop answers at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Readiness", "ReadinessFacts", "readiness"]


@dataclass(frozen=True)
class ReadinessFacts:
    """What readiness depends on (each field owned by whoever gathers the facts)."""

    started: bool  # the engine started (clients created, initial assignment or subscription made)
    stopping: bool  # a stop was requested
    broker_reachable: bool  # the last broker probe answered (metadata request)
    broker_unreachable_s: float  # seconds since the broker last answered (0 while reachable)
    partitions: int  # partitions owned and active
    # True when partitions are expected at once (a static ``--assign``); in group mode and in operator
    # mode without one, a member waiting for partitions is ready to receive them (a group may have more
    # members than partitions; the operator assigns only to workers that answer)
    expects_partitions: bool
    restoring: tuple[str, ...] = ()  # partitions whose state is being restored ("topic/partition")
    breaker_open: bool = False
    breaker_reason: str = ""
    fenced: bool = False
    missing_topics: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reasons: tuple[str, ...]  # why not ready (empty when ready)

    def to_dict(self) -> dict[str, object]:
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
        reasons.append(f"restoring state of {', '.join(f.restoring)}")
    if f.breaker_open:
        reasons.append(f"circuit breaker open: {f.breaker_reason}")
    if f.fenced:
        reasons.append("fenced (lease lost)")
    return Readiness(not reasons, tuple(reasons))
