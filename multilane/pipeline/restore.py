"""Restore of one partition's state from the newest snapshot plus the changelog tail. Does I/O.

The library form of what a learner does (the state engineer's restore uses the same reader API), used
by tests and the benchmark: the result is an in-memory ``dict`` of the final state.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from multilane.pipeline.kafka_io import ChangelogRangeReader, consumer_config
from multilane.pipeline.merge import ChangelogReplayer
from multilane.pipeline.planning import changelog_topic_name
from multilane.snapshots.reader import SnapshotGoneError, SnapshotPartition, SnapshotReader

__all__ = ["RestoreResult", "replay_changelog", "restore_from_snapshot_and_tail"]


@dataclass
class RestoreResult:
    """The restored state and how it was obtained.

    Invariants: ``tail_from <= end_offset``; ``snapshot_id`` is None when no snapshot was used
    (then ``snapshot_rows == 0`` and the whole changelog was replayed).
    """

    state: dict[bytes, bytes]
    snapshot_id: str | None
    snapshot_rows: int
    tail_from: int
    end_offset: int
    tail_records: int
    timings: dict[str, float] = field(default_factory=dict)


def restore_from_snapshot_and_tail(
    snapshot_uri: str | SnapshotReader | None,
    *,
    bootstrap: str,
    group: str,
    topic: str,
    partition: int,
    committed_offset: int | None = None,
    end_offset: int | None = None,
    kafka_config: Mapping[str, Any] | None = None,
    idle_timeout_s: float = 60.0,
) -> RestoreResult:
    """Rebuild ``topic``'s ``partition`` state from the newest snapshot and the changelog tail.

    1. Pick the newest snapshot covering the partition (none, or ``snapshot_uri=None``: start empty,
       replay from offset 0).
    2. Load its items (each file's checksum is verified first).
    3. Replay the changelog ``<group>.<topic>.changelog`` from the snapshot's ``changelog_offset`` to
       ``end_offset`` (default: the end at the time the replay gets there), skipping changes whose
       source offset is at or above ``committed_offset`` (when given).
    A snapshot retired by retention while it is read is replaced by the next newest (once).
    """
    t0 = time.perf_counter()
    reader: SnapshotReader | None
    reader = SnapshotReader(snapshot_uri) if isinstance(snapshot_uri, str) else snapshot_uri
    timings: dict[str, float] = {}
    part: SnapshotPartition | None = None
    state: dict[bytes, bytes] = {}
    for attempt in range(2):
        # 1.
        part = reader.latest_covering(topic, partition, committed_offset=committed_offset) if reader else None
        # 2.
        try:
            state = dict(part.iter_items()) if part is not None else {}
            break
        except SnapshotGoneError:
            if attempt == 1:
                raise
    timings["snapshot"] = time.perf_counter() - t0
    # 3.
    t1 = time.perf_counter()
    tail_from = part.changelog_offset if part is not None else 0
    replayer = ChangelogReplayer(committed_offset, initial=state)
    cfg = consumer_config(bootstrap, kafka_config)
    changelog_reader = ChangelogRangeReader(cfg, idle_timeout_s=idle_timeout_s)
    replayer.apply_all(
        changelog_reader.read(changelog_topic_name(group, topic), partition, tail_from, end_offset)
    )
    timings["tail"] = time.perf_counter() - t1
    timings["total"] = time.perf_counter() - t0
    end = changelog_reader.end_reached if changelog_reader.end_reached is not None else tail_from
    return RestoreResult(
        state=replayer.state,
        snapshot_id=part.snapshot_id if part is not None else None,
        snapshot_rows=part.rows if part is not None else 0,
        tail_from=tail_from,
        end_offset=end,
        tail_records=changelog_reader.records,
        timings=timings,
    )


def replay_changelog(
    *,
    bootstrap: str,
    group: str,
    topic: str,
    partition: int,
    committed_offset: int | None = None,
    end_offset: int | None = None,
    kafka_config: Mapping[str, Any] | None = None,
    idle_timeout_s: float = 60.0,
) -> RestoreResult:
    """Rebuild the state by replaying the whole changelog (the baseline a snapshot must beat)."""
    return restore_from_snapshot_and_tail(
        None,
        bootstrap=bootstrap,
        group=group,
        topic=topic,
        partition=partition,
        committed_offset=committed_offset,
        end_offset=end_offset,
        kafka_config=kafka_config,
        idle_timeout_s=idle_timeout_s,
    )
