"""``StatusMemory``: which status changes a control pass writes to the API server, and what the next
pass reads. Pure: no I/O (the caller writes).

A pass computes the whole status; most of it does not change between passes at steady state, but a
few fields change every pass (``VOLATILE``: lag, rates, the policy's memory, the time and inputs of a
decision that held). Writing them every pass costs one request per consumer per pass, so:

1. :meth:`StatusMemory.view` -- the status the next pass starts from: the stored status (the object
   as the watch delivered it), overlaid with the status the operator last wrote when the watch has
   not delivered that write yet (its ``resourceVersion`` is older), then with the volatile fields
   computed but not written (``pending``).
2. :meth:`StatusMemory.to_write` -- what to write for a newly computed status: nothing when its
   significant part (:func:`significant`) equals the view's and the last write is younger than
   ``heartbeat_s``; otherwise every field. Not written: kept as pending (step 1 reads it back).
3. :meth:`StatusMemory.written` -- after the write: the API server's answer becomes the last written
   status, pending is cleared.

A restarted operator loses at most ``heartbeat_s`` of the volatile fields (the policy's windows fill
again from fresh samples); the significant ones are always written at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["VOLATILE", "StatusMemory", "significant"]

VOLATILE = ("lag", "inputRate", "processingRate", "policy")
# lastDecision fields that change with every decision, also when it holds
_DECISION_VOLATILE = ("time", "inputs", "reason", "warnings")


def significant(status: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a status whose change is written at once: everything but :data:`VOLATILE`, the
    volatile fields of ``lastDecision``, and the conditions' ``lastTransitionTime``; a null is an
    absent field (as a merge-patch writes it)."""
    out = {k: v for k, v in status.items() if k not in VOLATILE}
    if isinstance(out.get("lastDecision"), Mapping):
        out["lastDecision"] = {k: v for k, v in out["lastDecision"].items() if k not in _DECISION_VOLATILE}
    if isinstance(out.get("conditions"), list):
        out["conditions"] = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"}
            for c in out["conditions"]
            if isinstance(c, Mapping)
        ]
    return dict(_without_nulls(out))


def _without_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _version(obj: Mapping[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


@dataclass
class _Entry:
    written_version: int = 0  # resourceVersion of the operator's last status write
    written: dict[str, Any] = field(default_factory=dict)  # the status that write produced
    written_at: float = float("-inf")  # clock() of that write
    pending: dict[str, Any] = field(default_factory=dict)  # computed, not written (volatile fields)


class StatusMemory:
    """Per consumer uid. ``clock``: seconds (monotonic). Keeps the mappings it is given (no copies:
    a pass's computed status is new each pass, the API server's answer belongs to nobody else)."""

    def __init__(self, heartbeat_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        self._entries: dict[str, _Entry] = {}

    def view(self, uid: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Step 1. A new top-level mapping; the values are shared (callers read them, never mutate)."""
        status = dict(body.get("status") or {})
        entry = self._entries.get(uid)
        if entry is None:
            return status
        if _version(body) < entry.written_version:
            status.update(entry.written)
        status.update(entry.pending)
        return status

    def to_write(
        self, uid: str, body: Mapping[str, Any], computed: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """Step 2: the merge-patch of ``status`` to send, or None (kept as pending)."""
        entry = self._entries.setdefault(uid, _Entry())
        before = self.view(uid, body)
        after = {**before, **computed}
        due = self.clock() - entry.written_at >= self.heartbeat_s
        if significant(after) == significant(before) and not due:
            entry.pending.update({k: v for k, v in computed.items() if before.get(k) != v})
            return None
        return {**entry.pending, **computed}

    def written(self, uid: str, answer: Mapping[str, Any]) -> None:
        """Step 3: ``answer`` is the object the API server returned for the status write."""
        entry = self._entries.setdefault(uid, _Entry())
        entry.written_version = _version(answer)
        entry.written = dict(answer.get("status") or {})
        entry.written_at = self.clock()
        entry.pending.clear()

    def forget(self, uid: str) -> None:
        self._entries.pop(uid, None)
