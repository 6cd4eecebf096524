"""Bringing a partition's store current when :meth:`StateManager.open_partition` opens it: a learner's
promotion (step 1), the checkpoint rules (step 3), the snapshot load (step 4) and the changelog replay
(step 5). Does I/O (RocksDB, Kafka, local files, the snapshot URI), except :func:`checkpoint_usable`.

Everything here fills or checks a store and never touches the manager's phases (``_active``,
``_learners``, ``_status``, ``_closing``): registering the partition (step 6) and every other phase
transition stay in ``manager.py``, under its lock. The numbered steps are those of
:meth:`~multilane.worker.state.manager.StateManager.open_partition`. ``learn`` reuses
:func:`take_checkpoint`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from multilane.worker.state import metrics
from multilane.worker.state.apply import ApplyFilter, ChangeApplier, DoneOracle
from multilane.worker.state.checkpoint import Checkpoint, CheckpointStore
from multilane.worker.state.errors import CheckpointError
from multilane.worker.state.learner import PartitionLearner, PromotionResult
from multilane.worker.state.reader import ChangelogOffsetError, ChangelogReader
from multilane.worker.state.restore import ChangelogRestorer, RestoreStatus
from multilane.worker.state.snapshot import SnapshotLoader
from multilane.worker.state.store import PartitionStore

__all__ = ["OpenRestorer", "checkpoint_usable", "prepare_store", "promote_learner", "take_checkpoint"]

# The manager's logger: these are its log lines (moved here from ``manager.py``).
log = logging.getLogger("multilane.worker.state.manager")


def checkpoint_usable(ckpt: Checkpoint, flt: ApplyFilter) -> tuple[bool, str]:
    """May a store closed with ``ckpt`` be reused under ``flt``? Pure.

    Yes when the committed offset has not moved backwards (changes below the old one stay committed)
    and every change applied at or above the old committed offset is applicable now.
    """
    if flt.committed_offset < ckpt.committed_offset:
        return False, (
            f"committed offset {flt.committed_offset} is behind the checkpoint's {ckpt.committed_offset}"
        )
    bad = [s for s in ckpt.above_commit_sources if not flt.applicable(*s)]
    if bad:
        return False, f"{len(bad)} local changes belong to records that are not complete (first {bad[0]})"
    return True, "ok"


def take_checkpoint(directory: Path) -> Checkpoint | None:
    """Read and delete the checkpoint: from here on the store may change, so it must not be reused
    after a crash."""
    ckpts = CheckpointStore(directory)
    try:
        ckpt = ckpts.read()
    except CheckpointError as exc:
        log.warning("ignoring %s: %s", ckpts.path, exc)
        ckpt = None
    if PartitionStore(directory).bulk_interrupted:
        log.warning("a bulk load of %s was interrupted: the store is wiped", directory)
        ckpt = None
    ckpts.remove()
    return ckpt


def promote_learner(
    learner: PartitionLearner, committed_offset: int, progress: DoneOracle | None,
    changelog_end: int | None = None,
) -> PromotionResult | None:
    """Step 1 of :meth:`StateManager.open_partition`: promote the partition's learner (blocking; see
    ``learner.py``; ``changelog_end``: where the last owner's changelog ended at its release). The
    learner's reader is closed either way.

    Returns the result of a fast promotion: the learner's store, still open, is current at
    ``result.changelog_offset``. None after a slow one: the learner's store is wiped (closed) and the
    caller restores it from the changelog start. Raises what the promotion raised, the learner failed
    and its store closed.
    """
    topic, partition = learner.topic, learner.partition
    try:
        result = learner.promote(committed_offset, progress, changelog_end)
    except BaseException:
        learner.status.phase = "failed"
        learner.store.close()
        raise
    finally:
        learner.reader.close()
    if result.fast:
        log.info(
            "promoted %s[%d] in %.3fs (stop %.3fs, catch-up %.3fs; %d held-back changes applied, %d dropped)",
            topic,
            partition,
            result.seconds,
            result.stop_seconds,
            result.catch_up_seconds,
            result.applied_from_buffer,
            result.dropped,
        )
        return result
    log.warning(
        "slow promotion of %s[%d]: %s; restoring from the changelog start",
        topic,
        partition,
        result.reason,
    )
    metrics.SLOW_PROMOTIONS.labels(topic, str(partition)).inc()
    learner.store.wipe()
    return None


def prepare_store(
    directory: Path, tp: tuple[str, int], flt: ApplyFilter, *, bulk_restore: bool
) -> tuple[PartitionStore, int, set[tuple[int, int]]]:
    """Step 3 of :meth:`StateManager.open_partition`: take the checkpoint, reuse the store when
    ``checkpoint_usable``, else wipe it (in bulk mode when ``bulk_restore``), and open it (disk I/O).

    Returns the open store, the changelog offset to read from (0: the store is empty) and the sources
    of the changes it holds above the committed offset.
    """
    topic, partition = tp
    store = PartitionStore(directory)
    ckpt = take_checkpoint(directory)
    start, sources = 0, set()
    if ckpt is not None:
        ok, why = checkpoint_usable(ckpt, flt)
        if ok:
            start, sources = ckpt.changelog_offset, set(ckpt.above_commit_sources)
        else:
            log.info("checkpoint of %s[%d] not reusable (%s); full restore", topic, partition, why)
    if start == 0:
        store.wipe()
        if bulk_restore:
            store.begin_bulk()
    store.open()
    return store, start, sources


class OpenRestorer:
    """Steps 4-5 of :meth:`StateManager.open_partition` (blocking; Kafka, RocksDB and snapshot I/O):
    load the newest usable snapshot into an empty store, then read the changelog to its end and end
    the bulk load. Holds the manager's restore settings; no state of its own, so thread-safe.

    ``snapshots``: the manager's snapshot loader (None: no snapshot URI). ``new_reader(topic,
    partition)``: a fresh changelog reader, for a replay from 0 after a snapshot offset the changelog
    no longer has. ``stall_timeout_s``: how long a read may make no progress.
    """

    def __init__(
        self,
        snapshots: SnapshotLoader | None,
        new_reader: Callable[[str, int], ChangelogReader],
        *,
        stall_timeout_s: float,
    ) -> None:
        self._snapshots = snapshots
        self._new_reader = new_reader
        self._stall_timeout_s = stall_timeout_s

    def restore(
        self,
        tp: tuple[str, int],
        store: PartitionStore,
        flt: ApplyFilter,
        sources: set[tuple[int, int]],
        start: int,
        status: RestoreStatus,
        reader: ChangelogReader,
        t0: float,
    ) -> tuple[int, set[tuple[int, int]]]:
        """Steps 4-5 with ``reader`` (the caller closes it), from changelog offset ``start`` (0: the
        store is empty). Returns the changelog end position and the sources of the changes above the
        committed offset, for step 6. On failure the status is failed and the store closed."""
        topic, partition = tp
        committed_offset = flt.committed_offset
        # 4.
        from_snapshot = False
        if start == 0 and self._snapshots is not None:
            try:
                load = self._snapshots.load(
                    topic,
                    partition,
                    committed_offset,
                    store,
                    status,
                    changelog_end=lambda: reader.probe_end(self._stall_timeout_s),
                )
            except BaseException:
                status.phase = "failed"
                store.close()
                raise
            if load is not None:
                start, from_snapshot = load.changelog_offset, True
        # 5.
        log.info(
            "restoring %s[%d] from changelog offset %d (committed offset %d%s)",
            topic,
            partition,
            start,
            committed_offset,
            f", snapshot {status.snapshot_id}" if from_snapshot else "",
        )
        try:
            try:
                position, applier = self._replay(reader, store, flt, sources, start, status)
            except ChangelogOffsetError as exc:
                if not from_snapshot:
                    raise
                log.warning("%s (snapshot %s): replaying the whole changelog", exc, status.snapshot_id)
                metrics.SNAPSHOT_RESTORES.labels(topic, str(partition), "failed").inc()
                store.wipe()
                store.open()
                status.snapshot_id, status.snapshot_rows, status.snapshot_rows_loaded = None, 0, 0
                start = 0
                fresh = self._new_reader(topic, partition)
                try:
                    position, applier = self._replay(fresh, store, flt, sources, start, status)
                finally:
                    fresh.close()
            bulk_t0 = time.monotonic()
            store.end_bulk()  # RocksDB compacts it in the background
            bulk_s = time.monotonic() - bulk_t0
        except BaseException:
            status.phase = "failed"
            store.close()
            raise
        log.info(
            "restored %s[%d] from changelog offset %d to %d in %.2fs (%d snapshot keys, %d applied, "
            "%d skipped; bulk flush %.2fs)",
            topic,
            partition,
            start,
            position,
            time.monotonic() - t0,
            status.snapshot_rows_loaded,
            applier.applied,
            applier.skipped,
            bulk_s,
        )
        return position, applier.above_commit_sources

    def _replay(
        self,
        reader: ChangelogReader,
        store: PartitionStore,
        flt: ApplyFilter,
        sources: set[tuple[int, int]],
        start: int,
        status: RestoreStatus,
    ) -> tuple[int, ChangeApplier]:
        """Read the changelog from ``start`` to its end into ``store`` with ``reader`` (blocking;
        Kafka and RocksDB I/O). Returns the end position and the applier (its counts and
        above-commit sources)."""
        applier = ChangeApplier(flt, None, set(sources))
        reader.seek(start)
        ChangelogRestorer(reader, store, applier, status, stall_timeout_s=self._stall_timeout_s).run_to_end()
        return reader.position, applier
