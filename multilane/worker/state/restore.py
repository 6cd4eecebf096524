"""``ChangelogRestorer``: reads a changelog partition to its end and applies it to a store.
Does I/O (Kafka and RocksDB).

The restorer only moves data; *what* it applies is decided by its :class:`ChangeApplier` (skip or
hold back changes of records that are not complete). Progress is published in a
:class:`RestoreStatus` (for ``learner_status()``) and in the ``multilane_restore_*`` gauges.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from multilane.worker.state import metrics
from multilane.worker.state.apply import ChangeApplier
from multilane.worker.state.errors import RestoreError
from multilane.worker.state.reader import ChangelogReader, RateMeter
from multilane.worker.state.store import PartitionStore

__all__ = ["ChangelogRestorer", "RestoreStatus"]


@dataclass
class RestoreStatus:
    """What a partition's restore or learner reports. Written by one thread, read by others (plain
    attribute reads of ints/floats are atomic under the GIL)."""

    topic: str
    partition: int
    phase: str = "restoring"  # restoring | learning | promoting | active | failed
    changelog_position: int = 0
    unread: int | None = None
    buffered: int = 0
    records_read: int = 0
    records_per_second: float = 0.0
    committed_offset: int = 0
    error: str | None = None
    # Snapshot the restore started from (None: none, or the changelog from its start). Invariant:
    # 0 <= snapshot_rows_loaded <= snapshot_rows.
    snapshot_id: str | None = None
    snapshot_rows: int = 0
    snapshot_rows_loaded: int = 0

    @property
    def restore_lag(self) -> int | None:
        """Changes not yet applied: unread changelog records, held-back (buffered) ones, and snapshot
        rows not loaded yet (while a snapshot loads, ``unread`` estimates the tail from the manifest)."""
        if self.unread is None:
            return None
        return self.unread + self.buffered + (self.snapshot_rows - self.snapshot_rows_loaded)

    @property
    def eta_seconds(self) -> float | None:
        lag = self.restore_lag
        if lag is None:
            return None
        if lag == 0:
            return 0.0
        return lag / self.records_per_second if self.records_per_second > 0 else None

    def as_dict(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "phase": self.phase,
            "restore_lag": self.restore_lag,
            "unread": self.unread,
            "buffered": self.buffered,
            "records_per_second": round(self.records_per_second, 1),
            "eta_seconds": None if self.eta_seconds is None else round(self.eta_seconds, 3),
            "changelog_position": self.changelog_position,
            "committed_offset": self.committed_offset,
            "records_read": self.records_read,
            "error": self.error,
            "snapshot_id": self.snapshot_id,
            "snapshot_rows": self.snapshot_rows,
            "snapshot_rows_loaded": self.snapshot_rows_loaded,
        }

    def publish(self) -> None:
        labels = (self.topic, str(self.partition))
        lag = self.restore_lag
        metrics.RESTORE_RECORDS_REMAINING.labels(*labels).set(-1 if lag is None else lag)
        metrics.RESTORE_RECORDS_PER_SECOND.labels(*labels).set(self.records_per_second)
        metrics.LEARNER_BUFFERED.labels(*labels).set(self.buffered)
        metrics.SNAPSHOT_ROWS_LOADED.labels(*labels).set(self.snapshot_rows_loaded)


class ChangelogRestorer:
    """Applies a changelog partition to a store through an applier. Not thread-safe."""

    def __init__(
        self,
        reader: ChangelogReader,
        store: PartitionStore,
        applier: ChangeApplier,
        status: RestoreStatus,
        *,
        stall_timeout_s: float = 60.0,
        batch_size: int = 10_000,
        end_after_bulk: bool = False,
    ) -> None:
        """``end_after_bulk``: at the end of the partition, leave ``unread`` unknown (None) while the
        store is still in bulk mode -- the learner reports it caught up only after ending the bulk
        load."""
        self.reader = reader
        self.store = store
        self.applier = applier
        self.status = status
        self.stall_timeout_s = stall_timeout_s
        self.batch_size = batch_size
        self.end_after_bulk = end_after_bulk
        self._meter = RateMeter()

    def step(self, timeout_s: float) -> bool:
        """Read and apply one batch; True when the end of the partition was reached."""
        batch = self.reader.read(timeout_s, self.batch_size)
        if batch.entries:
            writes = self.applier.feed(batch.entries)
            if writes:
                self.store.apply(writes.items())
        st = self.status
        st.records_read += batch.records
        st.records_per_second = self._meter.add(batch.records)
        st.changelog_position = self.reader.position
        st.buffered = len(self.applier.buffer) if self.applier.buffer is not None else 0
        if batch.eof:
            st.unread = None if self.end_after_bulk and self.store.bulk else 0
        else:
            st.unread = self.reader.remaining()
        st.publish()
        return batch.eof

    def run_to_end(self, stop: threading.Event | None = None) -> bool:
        """Read until the end of the partition (steps 1-2). Returns False when ``stop`` was set first.

        1. Read and apply batches until an EOF event.
        2. Raise :class:`RestoreError` when neither a record nor an EOF arrives for ``stall_timeout_s``
           (a broker outage, or an offset beyond the end on a broker that does not report it).
        """
        last_progress = time.monotonic()
        position = self.reader.position
        while stop is None or not stop.is_set():
            # 1.
            if self.step(0.03):  # consume() waits for a full batch or the timeout: keep it short
                return True
            # 2.
            now = time.monotonic()
            if self.reader.position != position:
                position, last_progress = self.reader.position, now
            elif now - last_progress > self.stall_timeout_s:
                raise RestoreError(
                    f"restore of {self.reader.topic}[{self.reader.partition}] made no progress at offset "
                    f"{position} for {self.stall_timeout_s}s"
                )
        return False

    def run_until(self, end: int, timeout_s: float) -> bool:
        """Read on, without a fresh fetch, until ``end`` (a changelog end offset handed over by the
        partition's last owner) is read. Returns False when ``timeout_s`` passed first (the caller then
        reads to the end with :meth:`run_to_end`). Already at or past ``end``: True, no read at all."""
        deadline = time.monotonic() + timeout_s
        while self.reader.position < end:
            if time.monotonic() > deadline:
                return False
            self.step(0.01)
        return True
