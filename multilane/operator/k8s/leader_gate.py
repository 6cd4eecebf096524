"""``LeaderGate``: the control loop writes only on the view it decided on. Pure (it remembers
resourceVersions; the writes are :class:`~multilane.operator.k8s.status_writer.StatusWriter`'s).

One operator replica leads (``multilane operator --leader-election``, :mod:`~multilane.operator.k8s.leader`);
a deposed leader may still finish a pass it started on an old view. The gate keeps, per consumer, the
``resourceVersion`` of the object as this replica last read it (a pass's start) or wrote it (the
answer of its own status write). A gated write carries it as a precondition:

1. the pass reads the object and :meth:`LeaderGate.seen` records its resourceVersion;
2. every control-loop status write (assignment, rollout, scaling) asks :meth:`LeaderGate.precondition`
   and sends it; the API server answers 409 when anyone wrote the object since (another leader);
3. the answer of a write that went through is :meth:`LeaderGate.seen` again (the next write is based
   on it); after a 409 the pass fails and the next pass reads afresh (step 1).

So a stale view never overwrites another writer's status (``tests/operator/test_leader.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from multilane.operator.k8s.memory import Slot
from multilane.operator.spec.child_meta import ConsumerRef

__all__ = ["LeaderGate"]


class LeaderGate:
    def __init__(self, seen: Slot[str]) -> None:
        # uid -> resourceVersion of the object as this replica last read (a pass) or wrote it
        self._seen = seen

    def seen(self, ref: ConsumerRef, obj: Mapping[str, Any] | None) -> None:
        """Steps 1 and 3: ``obj`` (a read or a write's answer) is the view the next writes are based on."""
        rv = ((obj or {}).get("metadata") or {}).get("resourceVersion")
        if rv:
            self._seen.set(ref.uid, str(rv))

    def precondition(self, ref: ConsumerRef) -> dict[str, Any] | None:
        """Step 2: the ``metadata`` a gated write carries (None before any view of the consumer)."""
        rv = self._seen.get(ref.uid)
        return None if rv is None else {"resourceVersion": rv}
