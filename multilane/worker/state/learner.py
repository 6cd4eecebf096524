"""``PartitionLearner``: keeps a store caught up with a partition the worker does not process.
Does I/O (a background thread reading the changelog and the input group's committed offsets).

The active owner writes changes of records that may never be committed (it may be released or die
mid-flight), so the learner applies a change only once its input record is committed, holding the
others back in a :class:`PendingChangeBuffer` (in changelog order, per key). It polls the committed
offset every ``poll_interval_s`` and releases what became applicable.

Start (the tail thread, when the store starts empty and a snapshot URI is configured):
0. load the newest usable snapshot (source bound at or below the learner's committed offset) into the
   store and tail the changelog from its ``changelog_offset``; no snapshot, or an unusable one: tail
   from offset 0. If that offset is no longer in the changelog (topic recreated), wipe the store and
   tail from 0. Stopping the learner during the load leaves it failed (promotion restores in full).
A store that starts empty is written in bulk mode (``store.py``); at the first end of the changelog the
thread ends the bulk load (flush) and waits for RocksDB's background compaction of it *before* it
reports caught up (``unread`` stays unknown meanwhile), so that no flush or compaction of the initial
restore is left to run during a promotion; a promotion that comes anyway (the operator released on a
small ``unread`` just before the end) waits for that flush at most, never for the compaction: it stops
the wait like any tail step.

Promotion protocol (:meth:`PartitionLearner.promote`, called when the engine opens the partition):
1. stop the tail thread (it notices within one read of ``tail_step_s``);
2. check the learner's store can be used: the engine's committed offset has not moved behind the one
   the learner applied up to, and every unverified source (carried over from a checkpoint or a
   demotion) is applicable; otherwise report that a full restore is needed;
3. switch the filter to the engine's committed offset and progress record, and read the changelog to
   its end: to the end offset the old owner released at when the promotion was handed it (every
   change the old owner flushed before its final commit lies below it; the tail thread usually read
   there already, so nothing is fetched), else (or when that end is not read within
   ``handed_end_wait_s``) from a fresh fetch until its end-of-partition event (which comes after
   every change the old owner flushed);
4. apply the held-back changes that are now applicable, in changelog order, and drop the rest (their
   records are processed again by the new owner).
The pause is the time of steps 3-4: with a handed-over end, the records the tail thread had not read
yet; without, one fetch round-trip plus the tail written since the last poll.
Nothing in it depends on the size of the state: the store is handed over open (no reopen, no flush,
no compaction, no iteration); only a learner promoted before it ever caught up still ends its bulk
load there (a flush of at most the bulk memtables, no compaction).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from multilane.worker.state.apply import ApplyFilter, ChangeApplier, DoneOracle, PendingChangeBuffer
from multilane.worker.state.checkpoint import Checkpoint
from multilane.worker.state.committed import CommittedOffsetReader
from multilane.worker.state.errors import RestoreError, StateError
from multilane.worker.state.metrics import SNAPSHOT_RESTORES
from multilane.worker.state.reader import ChangelogOffsetError, ChangelogReader
from multilane.worker.state.restore import ChangelogRestorer, RestoreStatus
from multilane.worker.state.snapshot import SnapshotLoader, SnapshotStoppedError
from multilane.worker.state.store import PartitionStore

__all__ = ["PartitionLearner", "PromotionResult"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PromotionResult:
    fast: bool  # False: the learner's store cannot be used; the caller restores from scratch
    reason: str
    seconds: float
    applied_from_buffer: int = 0
    dropped: int = 0
    changelog_offset: int = 0
    above_commit_sources: frozenset[tuple[int, int]] = frozenset()
    stop_seconds: float = 0.0  # step 1
    catch_up_seconds: float = 0.0  # step 3


class PartitionLearner:
    """Invariants: the store holds exactly the applicable changes of the changelog prefix
    ``[0, reader.position)`` that are not in the buffer (plus, for ``unverified`` sources, changes
    applied before this learner started whose records are not known to be committed yet); only the
    tail thread touches the reader, store and applier while it runs."""

    handed_end_wait_s = 5.0  # longest read toward a handed-over changelog end (step 3), then a fresh fetch
    # The tail thread's longest read: bounds how long a promotion's step 1 waits for the thread to stop
    # (an idle learner wakes this often).
    tail_step_s = 0.02

    def __init__(
        self,
        topic: str,
        partition: int,
        store: PartitionStore,
        reader: ChangelogReader,
        committed_reader: CommittedOffsetReader,
        committed_offset: int,
        status: RestoreStatus,
        *,
        unverified: set[tuple[int, int]] | None = None,
        poll_interval_s: float = 0.5,
        stall_timeout_s: float = 60.0,
        snapshots: SnapshotLoader | None = None,
    ) -> None:
        """``snapshots``: load a snapshot first (step 0); only for a store that starts empty at
        changelog offset 0."""
        self.topic = topic
        self.partition = partition
        self.store = store
        self.reader = reader
        self._committed_reader = committed_reader
        self.applier = ChangeApplier(ApplyFilter(committed_offset), PendingChangeBuffer())
        self.status = status
        status.phase = "restoring"
        status.committed_offset = committed_offset
        self.restorer = ChangelogRestorer(
            reader, store, self.applier, status, stall_timeout_s=stall_timeout_s, end_after_bulk=True
        )
        self.unverified: set[tuple[int, int]] = {s for s in (unverified or set()) if s[0] >= committed_offset}
        self._poll_interval_s = poll_interval_s
        self.compaction_wait_s = 300.0  # longest wait for the compaction after the initial bulk load
        self._snapshots = snapshots
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.caught_up = threading.Event()  # set at the first end of the changelog

    # -- thread ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"learner-{self.topic}-{self.partition}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            # 0.
            from_snapshot = self._load_snapshot()
            next_poll = 0.0
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_poll:
                    self._refresh_committed()
                    next_poll = now + self._poll_interval_s
                try:
                    eof = self.restorer.step(self.tail_step_s)
                except ChangelogOffsetError as exc:
                    if not from_snapshot:
                        raise
                    from_snapshot = False
                    self._restart_from_zero(exc)
                    continue
                if eof and not self.caught_up.is_set():
                    self._end_bulk()
                    self.caught_up.set()
                    self.status.phase = "learning"
                    log.info(
                        "learner %s[%d] caught up at changelog offset %d",
                        self.topic,
                        self.partition,
                        self.reader.position,
                    )
        except SnapshotStoppedError as exc:  # stopped during step 0: the store is partial
            self.error = exc
            self.status.phase = "failed"
            self.status.error = str(exc)
            log.info("learner %s[%d]: %s", self.topic, self.partition, exc)
        except BaseException as exc:  # reported through status and promote()
            self.error = exc
            self.status.phase = "failed"
            self.status.error = str(exc)
            log.exception("learner %s[%d] failed", self.topic, self.partition)

    def _end_bulk(self) -> None:
        """The initial restore reached the end of the changelog: flush it and let RocksDB compact it
        now, before the learner reports caught up, rather than during a promotion. A stop (promotion)
        ends the wait at once; the compaction then finishes in the background."""
        if not self.store.bulk:
            return
        t0 = time.monotonic()
        self.store.end_bulk()
        flushed = time.monotonic()
        while self.store.compaction_pending() and not self._stop.wait(0.02):
            if time.monotonic() - flushed > self.compaction_wait_s:
                log.warning(
                    "learner %s[%d]: the compaction after the bulk load is still running after %.0fs; "
                    "reporting caught up anyway",
                    self.topic,
                    self.partition,
                    self.compaction_wait_s,
                )
                break
        self.status.unread = 0
        self.status.publish()
        log.info(
            "learner %s[%d]: bulk load ended (flush %.2fs, compaction %.2fs)",
            self.topic,
            self.partition,
            flushed - t0,
            time.monotonic() - flushed,
        )

    def _load_snapshot(self) -> bool:
        """Step 0: load a snapshot into the (empty) store; True when the tail starts at its offset."""
        if self._snapshots is None:
            return False
        load = self._snapshots.load(
            self.topic,
            self.partition,
            self.applier.flt.committed_offset,
            self.store,
            self.status,
            stop=self._stop,
            changelog_end=lambda: self.reader.probe_end(self.restorer.stall_timeout_s),
        )
        # Always reposition: probing the changelog's end moved the reader.
        self.reader.seek(0 if load is None else load.changelog_offset)
        return load is not None

    def _restart_from_zero(self, exc: ChangelogOffsetError) -> None:
        """Step 0's fallback: the snapshot's offset is not in the changelog; start over, empty, at 0."""
        log.warning("%s (snapshot %s): learning from the changelog start", exc, self.status.snapshot_id)
        SNAPSHOT_RESTORES.labels(self.topic, str(self.partition), "failed").inc()
        self.store.wipe()
        self.store.open()
        self.applier = ChangeApplier(ApplyFilter(self.applier.flt.committed_offset), PendingChangeBuffer())
        self.restorer.applier = self.applier
        st = self.status
        st.snapshot_id, st.snapshot_rows, st.snapshot_rows_loaded = None, 0, 0
        self.reader.seek(0)

    def _refresh_committed(self) -> None:
        try:
            committed = self._committed_reader.committed(self.topic, self.partition)
        except StateError as exc:  # transient (coordinator moving, broker down): try again next poll
            log.warning("learner %s[%d]: %s", self.topic, self.partition, exc)
            return
        if committed <= self.applier.flt.committed_offset:
            return
        self.applier.flt = ApplyFilter(committed)
        writes = self.applier.release()
        if writes:
            self.store.apply(writes)
        self.unverified = {s for s in self.unverified if s[0] >= committed}
        self.status.committed_offset = committed
        self.status.buffered = len(self.applier.buffer or ())

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join(timeout_s)
            if t.is_alive():
                raise RestoreError(f"learner {self.topic}[{self.partition}] did not stop in {timeout_s}s")
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- promotion and checkpoints --------------------------------------------------------------------

    def promote(
        self, committed_offset: int, progress: DoneOracle | None, changelog_end: int | None = None
    ) -> PromotionResult:
        """Make the store current for the engine's committed offset (steps 1-4 of the module doc).
        ``changelog_end``: the changelog end the partition's last owner released at (step 3 then reads
        on to it instead of waiting for a fresh fetch's end-of-partition event)."""
        t0 = time.monotonic()
        # 1.
        self.stop()
        stopped = time.monotonic()
        if self.error is not None:
            return PromotionResult(False, f"learner failed: {self.error}", time.monotonic() - t0)
        # 2.
        flt = ApplyFilter(committed_offset, progress)
        if committed_offset < self.applier.flt.committed_offset:
            return PromotionResult(
                False,
                f"committed offset {committed_offset} is behind the learner's "
                f"{self.applier.flt.committed_offset}",
                time.monotonic() - t0,
            )
        unusable = [s for s in self.unverified if not flt.applicable(*s)]
        if unusable:
            return PromotionResult(
                False,
                f"{len(unusable)} local changes belong to records that are not complete",
                time.monotonic() - t0,
            )
        # 3.
        self.status.phase = "promoting"
        self.applier.flt = flt
        released = self.applier.release()
        if released:
            self.store.apply(released)
        if changelog_end is None or not self.restorer.run_until(changelog_end, self.handed_end_wait_s):
            self.reader.seek(self.reader.position)
            self.restorer.run_to_end()
        caught_up = time.monotonic()
        # 4.
        before = self.applier.applied
        writes, dropped = self.applier.drain()
        if writes:
            self.store.apply(writes)
        if self.store.bulk:  # promoted before it ever caught up: a flush, no compaction, in the pause
            self.store.end_bulk()
        self.status.buffered = 0
        self.status.unread = 0
        self.status.publish()
        sources = {s for s in self.applier.above_commit_sources if s[0] >= committed_offset}
        sources |= {s for s in self.unverified if s[0] >= committed_offset}
        return PromotionResult(
            True,
            "caught up",
            time.monotonic() - t0,
            self.applier.applied - before + len(released),
            dropped,
            self.reader.position,
            frozenset(sources),
            stopped - t0,
            caught_up - stopped,
        )

    def checkpoint(self) -> Checkpoint:
        """What the store holds once the thread is stopped: the changelog up to the first held-back
        change (re-reading from there re-applies later changes idempotently, in order)."""
        if self.running:
            raise RestoreError("stop the learner before taking its checkpoint")
        buf = self.applier.buffer
        first = buf.first_offset if buf is not None else None
        offset = self.reader.position if first is None else first
        committed = self.applier.flt.committed_offset
        return Checkpoint(offset, committed, tuple(sorted(s for s in self.unverified if s[0] >= committed)))
