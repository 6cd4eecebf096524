"""Which snapshots to keep and which leftovers to delete. Pure: no I/O.

* :class:`RetentionPlanner` keeps the newest ``retain`` visible snapshots (ids sort by creation time).
* :class:`StagingGarbagePlanner` finds what a killed or failed job left behind: data folders without a
  visible manifest and unpublished manifest temp files, older than a grace period (younger ones may
  belong to a job still running).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from multilane.snapshots.layout import SnapshotId

__all__ = ["RetentionPlan", "RetentionPlanner", "StagingGarbagePlanner"]


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    """Invariant: ``keep`` and ``delete`` partition the input ids; both are sorted newest first."""

    keep: tuple[str, ...]
    delete: tuple[str, ...]


class RetentionPlanner:
    """Keep the newest ``retain`` snapshots. Invariant: ``retain >= 1`` (never deletes the newest)."""

    def __init__(self, retain: int) -> None:
        if retain < 1:
            raise ValueError(f"retain must be >= 1, got {retain}")
        self.retain = retain

    def plan(self, visible_ids: Iterable[str], protect: Iterable[str] = ()) -> RetentionPlan:
        """Split ``visible_ids``; ids in ``protect`` (e.g. the one just published) are always kept."""
        ids = sorted(set(visible_ids), key=lambda i: (SnapshotId.created_at(i), i), reverse=True)
        protected = set(protect)
        keep = list(ids[: self.retain])
        delete: list[str] = []
        for i in ids[self.retain :]:
            (keep if i in protected else delete).append(i)
        return RetentionPlan(tuple(keep), tuple(delete))


class StagingGarbagePlanner:
    """Leftovers of jobs that never published. Invariant: ``grace >= 0``."""

    def __init__(self, grace: timedelta) -> None:
        if grace < timedelta(0):
            raise ValueError(f"grace must be >= 0, got {grace}")
        self.grace = grace

    def _old(self, snapshot_id: str, now: datetime) -> bool:
        try:
            return SnapshotId.created_at(snapshot_id) <= now - self.grace
        except ValueError:
            return False  # not ours: never delete what we cannot date

    def data_garbage(self, data_ids: Iterable[str], visible_ids: Iterable[str], now: datetime) -> list[str]:
        """Data folders (by snapshot id) without a visible manifest, created before ``now - grace``."""
        visible = set(visible_ids)
        return sorted(i for i in set(data_ids) if i not in visible and self._old(i, now))

    def tmp_garbage(self, tmp_names: Iterable[tuple[str, str]], now: datetime) -> list[str]:
        """Manifest temp files (``(name, snapshot id)`` pairs) of snapshots created before ``now - grace``."""
        return sorted(name for name, snapshot_id in tmp_names if self._old(snapshot_id, now))
