"""Loading a published state snapshot into an empty partition store: the fast start of a full restore
and of a learner. Does I/O (the snapshot URI through pyarrow, RocksDB).

The snapshot side (job, layout, manifest, verification) is :mod:`multilane.pipeline`; this module
only reads it, through :class:`multilane.snapshots.reader.SnapshotReader`, which is imported on first
use so that importing the state package never imports pyarrow (nor Spark, which the reader never
needs). A worker given a snapshot URI checks at start-up that pyarrow is installed
(:func:`require_snapshot_support`).

Why snapshot + tail equals a full replay: a snapshot bounded at source offset ``B`` holds, per key,
the newest change of the changelog prefix ``[0, changelog_offset)``, and every change in that prefix
comes from an input record below ``B``. A restore that uses it has a committed offset ``C >= B``
(snapshots bounded above ``C`` are passed over), so a full replay would apply every change of the
prefix too; the changes from ``changelog_offset`` on are read from the changelog with the restore's
usual filter. Snapshots without a source bound are never used (they may hold uncommitted changes).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from multilane.extras import MissingExtraError, require
from multilane.worker.state import metrics
from multilane.worker.state.errors import RestoreError, StateError
from multilane.worker.state.restore import RestoreStatus
from multilane.worker.state.store import PartitionStore

if TYPE_CHECKING:
    from multilane.snapshots.reader import SnapshotPartition

__all__ = [
    "SnapshotLoad",
    "SnapshotLoader",
    "SnapshotMismatchError",
    "SnapshotStoppedError",
    "SnapshotSupportError",
    "require_snapshot_support",
]

log = logging.getLogger(__name__)

OUTCOME_LOADED = "loaded"
OUTCOME_NONE = "none"
OUTCOME_FAILED = "failed"


class SnapshotSupportError(StateError):
    """A snapshot URI is configured but the snapshot reader's dependency (pyarrow) is missing."""


class SnapshotMismatchError(RestoreError):
    """The snapshot does not fit the changelog (its offset is past the changelog's end)."""


class SnapshotStoppedError(RestoreError):
    """The load was stopped (the learner was stopped or promoted) before it finished; the store is
    partial and must not be used."""


def require_snapshot_support() -> None:
    """Raise :class:`SnapshotSupportError` unless pyarrow (which reads snapshots) can be imported.
    Imports pyarrow (no other I/O)."""
    try:
        require("snapshots", for_what="a state snapshot URI")
    except MissingExtraError as exc:
        raise SnapshotSupportError(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class SnapshotLoad:
    """A snapshot loaded into a store. Invariant: the store holds exactly the snapshot's ``rows``
    items; restore continues with the changelog from ``changelog_offset``."""

    snapshot_id: str
    changelog_offset: int
    rows: int
    seconds: float


class SnapshotLoader:
    """Finds the newest usable snapshot of a partition and writes its items into an empty store.

    Stateless between calls and safe to share between threads (each call opens its own reader).
    """

    def __init__(
        self,
        uri: str,
        changelog_topic_of: Callable[[str], str],
        *,
        batch_rows: int = 10_000,
        sort_rows: int = 262_144,
    ) -> None:
        """``batch_rows``: rows per write batch. Into a store in bulk mode the rows are written file by
        file in key order (each file's table sorted by pyarrow; the files are in key-hash order, and
        sorted inserts into RocksDB's memtable cost about a third less CPU than random ones)."""
        if not uri:
            raise ValueError("snapshot uri must be non-empty")
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
        require_snapshot_support()
        self.uri = uri
        self.batch_rows = batch_rows
        self._changelog_topic_of = changelog_topic_of

    def load(
        self,
        topic: str,
        partition: int,
        committed_offset: int,
        store: PartitionStore,
        status: RestoreStatus,
        stop: threading.Event | None = None,
        changelog_end: Callable[[], int] | None = None,
    ) -> SnapshotLoad | None:
        """Load the newest usable snapshot into ``store`` (open and empty); None when there is none
        or it cannot be used (steps 1-4). Raises :class:`SnapshotStoppedError` when ``stop`` is set.

        1. Find ``latest_covering(topic, partition, committed_offset=...)`` of this changelog topic,
           with a source bound (none: return None, the caller replays the whole changelog). With
           ``changelog_end`` (the changelog's true end now), a snapshot whose ``changelog_offset`` lies
           past it belongs to an older incarnation of the topic (deleted and recreated): step 4.
        2. Write its items into the store in batches of ``batch_rows``, file by file (each file's size,
           SHA-256 and row count are verified before any of its rows is used), reporting progress in
           ``status`` (``snapshot_rows_loaded``; the remaining rows count in the restore lag).
        3. A snapshot retired while it is read is replaced by the next newest, once.
        4. Anything else that goes wrong (corrupt or unreadable manifest or data, storage errors): a
           warning, ``multilane_state_snapshot_restores_total{outcome="failed"}``, the store wiped
           back to empty, and None -- never a partially loaded store.
        """
        from multilane.snapshots.reader import SnapshotGoneError, SnapshotReader

        labels = (topic, str(partition))
        t0 = time.monotonic()
        for attempt in range(2):
            try:
                # 1.
                reader = SnapshotReader(self.uri)
                part = reader.latest_covering(
                    topic,
                    partition,
                    committed_offset=committed_offset,
                    changelog_topic=self._changelog_topic_of(topic),
                    require_bound=True,
                )
                if part is None:
                    log.info("no usable snapshot of %s[%d] under %s", topic, partition, self.uri)
                    metrics.SNAPSHOT_RESTORES.labels(*labels, OUTCOME_NONE).inc()
                    return None
                if changelog_end is not None:
                    end = changelog_end()
                    if part.changelog_offset > end:
                        raise SnapshotMismatchError(
                            f"snapshot {part.snapshot_id} resumes at changelog offset "
                            f"{part.changelog_offset}, past the changelog's end {end} (topic recreated?)"
                        )
                # 2.
                status.snapshot_id = part.snapshot_id
                status.snapshot_rows = part.rows
                status.snapshot_rows_loaded = 0
                status.unread = max(0, part.changelog_end - part.changelog_offset)
                status.publish()
                rows = self._write(part, store, status, stop)
            except SnapshotStoppedError:
                self._reset(store, status)
                raise
            except SnapshotGoneError as exc:
                # 3.
                self._reset(store, status)
                if attempt == 0:
                    log.info("snapshot of %s[%d] retired while reading (%s); trying the newest", *labels, exc)
                    continue
                self._failed(topic, partition, exc)
                return None
            except Exception as exc:
                # 4.
                self._reset(store, status)
                self._failed(topic, partition, exc)
                return None
            seconds = time.monotonic() - t0
            metrics.SNAPSHOT_RESTORES.labels(*labels, OUTCOME_LOADED).inc()
            log.info(
                "loaded snapshot %s of %s[%d]: %d keys in %.2fs; the changelog tail starts at offset %d",
                part.snapshot_id,
                topic,
                partition,
                rows,
                seconds,
                part.changelog_offset,
            )
            return SnapshotLoad(part.snapshot_id, part.changelog_offset, rows, seconds)
        return None  # pragma: no cover -- the loop always returns

    def _write(
        self,
        part: SnapshotPartition,
        store: PartitionStore,
        status: RestoreStatus,
        stop: threading.Event | None,
    ) -> int:
        """Step 2: the items, batch by batch; the row count must match the manifest."""
        from multilane.snapshots.reader import SnapshotCorruptError

        rows = 0
        size = self.batch_rows
        if store.bulk:
            for keys, values in _files_in_key_order(part):
                for i in range(0, len(keys), size):
                    if stop is not None and stop.is_set():
                        raise SnapshotStoppedError(f"stopped while loading snapshot {part.snapshot_id}")
                    rows += store.put_all(keys[i : i + size], values[i : i + size])
                    status.snapshot_rows_loaded = rows
                    status.publish()
        else:
            for batch in part.iter_item_batches(size):
                if stop is not None and stop.is_set():
                    raise SnapshotStoppedError(f"stopped while loading snapshot {part.snapshot_id}")
                rows += store.apply(batch)
                status.snapshot_rows_loaded = rows
                status.publish()
        if rows != part.rows:
            raise SnapshotCorruptError(
                f"snapshot {part.snapshot_id}: {rows} rows of {part.topic}[{part.partition}], "
                f"manifest says {part.rows}"
            )
        return rows

    @staticmethod
    def _reset(store: PartitionStore, status: RestoreStatus) -> None:
        """Back to an empty open store and a status without a snapshot."""
        store.wipe()
        store.open()
        status.snapshot_id = None
        status.snapshot_rows = 0
        status.snapshot_rows_loaded = 0
        status.unread = None
        status.publish()

    def _failed(self, topic: str, partition: int, exc: BaseException) -> None:
        metrics.SNAPSHOT_RESTORES.labels(topic, str(partition), OUTCOME_FAILED).inc()
        log.warning(
            "cannot use the snapshot of %s[%d] under %s (%s: %s); replaying the whole changelog instead",
            topic,
            partition,
            self.uri,
            type(exc).__name__,
            exc,
        )


def _files_in_key_order(part: SnapshotPartition) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """Per data file (each verified when read): its keys and values sorted by key (bytewise,
    RocksDB's order; pyarrow sorts in C++). One file in memory at a time. The files' key-hash
    ranges do not overlap (the manifest checks it), so reading the partition by each file's range
    reads exactly that file."""
    for f in part.entry.files:
        table = part.read_table(f.key_range).select(["key", "value"]).sort_by("key")
        yield table.column("key").to_pylist(), table.column("value").to_pylist()
