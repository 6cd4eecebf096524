"""Prometheus metrics of the state store. Does no I/O itself.

Process-wide singletons that are *not* registered anywhere on creation: the worker's metrics endpoint
registers :data:`COLLECTORS` (via ``StateManager.metrics_collectors()``) into its own registry, and an
application may register them into ``prometheus_client.REGISTRY``. A collector may be registered into
several registries (e.g. several engines in one test process).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge
from prometheus_client.registry import Collector

__all__ = [
    "COLLECTORS",
    "CORRUPT_RECORDS",
    "LEARNER_BUFFERED",
    "RESTORE_RECORDS_PER_SECOND",
    "RESTORE_RECORDS_REMAINING",
    "SLOW_PROMOTIONS",
    "SNAPSHOT_RESTORES",
    "SNAPSHOT_ROWS_LOADED",
]

_LABELS = ("topic", "partition")

RESTORE_RECORDS_REMAINING = Gauge(
    "multilane_restore_records_remaining",
    "Changelog records not yet applied to the local store (unread plus buffered); 0 when caught up",
    _LABELS,
    registry=None,
)
RESTORE_RECORDS_PER_SECOND = Gauge(
    "multilane_restore_records_per_second",
    "Changelog records read per second by the running restore or learner (smoothed)",
    _LABELS,
    registry=None,
)
LEARNER_BUFFERED = Gauge(
    "multilane_learner_buffered_changes",
    "Changes a learner holds back because their input records are not committed yet",
    _LABELS,
    registry=None,
)
CORRUPT_RECORDS = Counter(
    "multilane_state_corrupt_records_total",
    "Changelog records that did not decode and were skipped (on_corrupt='skip')",
    _LABELS,
    registry=None,
)
SLOW_PROMOTIONS = Counter(
    "multilane_state_slow_promotions_total",
    "Promotions that could not use the learner's store and restored from the changelog start",
    _LABELS,
    registry=None,
)

SNAPSHOT_RESTORES = Counter(
    "multilane_state_snapshot_restores_total",
    "Restores and learners that looked for a state snapshot, by outcome: loaded (the restore started "
    "from it), none (no usable snapshot: full changelog replay), failed (unreadable or corrupt: full "
    "changelog replay)",
    (*_LABELS, "outcome"),
    registry=None,
)
SNAPSHOT_ROWS_LOADED = Gauge(
    "multilane_restore_snapshot_rows_loaded",
    "Snapshot rows written into the local store by the running restore or learner",
    _LABELS,
    registry=None,
)

COLLECTORS: tuple[Collector, ...] = (
    RESTORE_RECORDS_REMAINING,
    RESTORE_RECORDS_PER_SECOND,
    LEARNER_BUFFERED,
    CORRUPT_RECORDS,
    SLOW_PROMOTIONS,
    SNAPSHOT_RESTORES,
    SNAPSHOT_ROWS_LOADED,
)


def forget(topic: str, partition: int) -> None:
    """Remove a partition's gauge series (after drop/close) so stale values do not linger."""
    labels = (topic, str(partition))
    for gauge in (
        RESTORE_RECORDS_REMAINING,
        RESTORE_RECORDS_PER_SECOND,
        LEARNER_BUFFERED,
        SNAPSHOT_ROWS_LOADED,
    ):
        try:
            gauge.remove(*labels)
        except KeyError:
            pass
