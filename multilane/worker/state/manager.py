"""``StateManager``: the engine's state hooks (``PartitionStateHooks``) over per-partition stores,
their changelog, restore and learners. Does I/O (RocksDB, Kafka, local files).

Phases of a partition in this worker: *closed* (maybe with a checkpoint on disk) -> ``open_partition``
-> *active* -> ``close_partition`` -> *closed*; *closed* -> ``learn`` -> *learning* -> ``open_partition``
(promotion) -> *active*; *active* -> ``demote`` -> *learning*; *learning*/*closed* -> ``drop`` -> gone.
See ``docs/state.md`` for the durability order, checkpoint rules and the learner protocol.

The hooks the engine calls (open, before_commit, close) and the learner verbs (learn, promote,
demote, drop) share one lock over the partitions' stores and their phases, so every phase transition
is here, checkable in one place. What an open does to the store itself (a learner's promotion, the
checkpoint rules, the snapshot load, the changelog replay) is in ``opening.py``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from prometheus_client.registry import Collector

from multilane.formats.keyranges import KeyRange
from multilane.worker.state import metrics, opening
from multilane.worker.state.apply import ApplyFilter, DoneOracle
from multilane.worker.state.changelog import ChangelogTopicAdmin, ChangelogWriter, changelog_topic_name
from multilane.worker.state.checkpoint import Checkpoint, CheckpointStore
from multilane.worker.state.committed import CommittedOffsetReader
from multilane.worker.state.errors import StateDurabilityError, StatePhaseError
from multilane.worker.state.learner import PartitionLearner
from multilane.worker.state.opening import OpenRestorer, checkpoint_usable
from multilane.worker.state.partition import ActivePartitionState, HeldChange
from multilane.worker.state.reader import ChangelogReader, OnCorrupt
from multilane.worker.state.restore import RestoreStatus
from multilane.worker.state.snapshot import SnapshotLoader
from multilane.worker.state.store import PartitionStore, partition_dir
from multilane.worker.state.view import KeyRangeStateView

__all__ = ["StateManager", "checkpoint_usable"]

log = logging.getLogger(__name__)

TP = tuple[str, int]


class StateManager:
    """Implements the engine's ``PartitionStateHooks``. Thread-safe: hooks may be called from any thread;
    ``view`` and the returned views are used concurrently by lanes.

    Invariants (guarded by ``_lock``): a partition is in at most one of ``_active`` and ``_learners``;
    ``_status`` has an entry for every partition in either.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        bootstrap_servers: str,
        group: str,
        *,
        producer_config: Mapping[str, object] | None = None,
        consumer_config: Mapping[str, object] | None = None,
        admin_config: Mapping[str, str] | None = None,
        changelog_topic_config: Mapping[str, str] | None = None,
        on_corrupt: OnCorrupt = "fail",
        committed_poll_interval_s: float = 0.5,
        restore_stall_timeout_s: float = 60.0,
        flush_timeout_s: float = 60.0,
        snapshot_uri: str | None = None,
        bulk_restore: bool = True,
        close_wait_s: float = 120.0,
        transactional: bool = False,
    ) -> None:
        """``snapshot_uri``: where the snapshot job publishes state snapshots (``docs/snapshots.md``);
        full restores and learners then start from the newest usable snapshot plus the changelog tail.
        Needs pyarrow (:class:`~multilane.worker.state.snapshot.SnapshotSupportError` otherwise).

        ``bulk_restore``: restores into an empty store (full restores, a learner's initial restore,
        snapshot loads) write in the store's bulk mode (``store.py``); False keeps the plain write
        path (benchmarks compare both). ``close_wait_s``: how long an open, learn or drop of a
        partition waits for a close of the same partition still running (``close_partition`` may run
        after the engine answered a release).

        ``transactional`` (exactly-once outputs): changelog records are held and go out in the input
        partition's transaction (``partition.py``; :meth:`take_changes`, :meth:`changes_committed`);
        the worker then has no shared changelog producer (``producer_config`` is unused); restores
        and learners read only committed changelog records, as always (``reader.py``)."""
        if on_corrupt not in ("fail", "skip"):
            raise ValueError(f"on_corrupt must be 'fail' or 'skip', got {on_corrupt!r}")
        if not group:
            raise ValueError("group must be non-empty")
        # Before any client is created: a missing pyarrow fails here, leaking nothing.
        self.snapshot_uri = snapshot_uri or None
        self._snapshots: SnapshotLoader | None = (
            SnapshotLoader(snapshot_uri, self.changelog_topic) if snapshot_uri else None
        )
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.bootstrap_servers = bootstrap_servers
        self.group = group
        self.on_corrupt: OnCorrupt = on_corrupt
        self._consumer_config = dict(consumer_config or {})
        self._poll_interval_s = committed_poll_interval_s
        self._stall_timeout_s = restore_stall_timeout_s
        self._flush_timeout_s = flush_timeout_s
        self.bulk_restore = bulk_restore
        self._close_wait_s = close_wait_s
        self.transactional = transactional
        # The shared changelog producer. Invariant: None exactly when ``transactional`` (the changelog
        # records go in the input partitions' transactions, never through it).
        self._writer: ChangelogWriter | None = (
            None if transactional else ChangelogWriter(bootstrap_servers, producer_config)
        )
        self._admin = ChangelogTopicAdmin(bootstrap_servers, changelog_topic_config, admin_config)
        self._committed_reader: CommittedOffsetReader | None = None
        self._lock = threading.RLock()
        self._active: dict[TP, ActivePartitionState] = {}
        self._learners: dict[TP, PartitionLearner] = {}
        self._status: dict[TP, RestoreStatus] = {}
        # Partitions whose close_partition is running; the event is set when it has finished.
        # Invariant: an entry exists exactly while a close of that partition runs.
        self._closing: dict[TP, threading.Event] = {}
        # Steps 4-5 of open_partition (no state of its own).
        self._restorer = OpenRestorer(self._snapshots, self._reader, stall_timeout_s=self._stall_timeout_s)

    # -- helpers --------------------------------------------------------------------------------------

    def changelog_topic(self, topic: str) -> str:
        return changelog_topic_name(self.group, topic)

    def _committed(self) -> CommittedOffsetReader:
        with self._lock:
            if self._committed_reader is None:
                self._committed_reader = CommittedOffsetReader(
                    self.bootstrap_servers, self.group, self._consumer_config
                )
            return self._committed_reader

    def _reader(self, topic: str, partition: int) -> ChangelogReader:
        return ChangelogReader(
            self.bootstrap_servers,
            self.changelog_topic(topic),
            partition,
            input_topic=topic,
            consumer_config=self._consumer_config,
            on_corrupt=self.on_corrupt,
        )

    def _wait_closed(self, tp: TP) -> None:
        """Wait until a close of ``tp`` that is still running has finished (it may run after the engine
        answered a release; an open, learn or drop must not touch the files before it is done)."""
        with self._lock:
            done = self._closing.get(tp)
        if done is not None and not done.wait(self._close_wait_s):
            raise StatePhaseError(f"{tp[0]}[{tp[1]}] is still closing after {self._close_wait_s}s")

    # -- PartitionStateHooks --------------------------------------------------------------------------

    def open_partition(
        self,
        topic: str,
        partition: int,
        committed_offset: int | None,
        progress: DoneOracle | None,
        changelog_end: int | None = None,
    ) -> None:
        """Make the partition's store current and active (blocking; steps 0-6). ``changelog_end``: the
        end the partition's last owner released its changelog at (:meth:`changelog_end` there), which
        lets a promotion (step 1) stop reading there.

        0. Wait for a close of the partition that is still running (``close_partition``).
        1. A partition this worker is learning is promoted (fast path; see ``learner.py``).
        2. Otherwise make sure the changelog topic exists.
        3. Take the checkpoint: reuse the local store when ``checkpoint_usable``, else wipe it (an
           interrupted bulk load's marker makes any checkpoint unusable). A wiped store is filled in
           bulk mode (``bulk_restore``; ended, i.e. flushed, after step 5; RocksDB compacts it in the
           background).
        4. No usable checkpoint and a snapshot URI: load the newest usable snapshot into the empty
           store (``snapshot.py``); the changelog is then read from its ``changelog_offset``. No
           snapshot, or an unusable one (logged, counted, the store left empty): from offset 0.
        5. Read the changelog to its end from the checkpoint offset, the snapshot's offset or 0,
           applying the changes of complete records (below ``committed_offset`` or done per
           ``progress``), skipping the rest. A snapshot offset the changelog no longer has (topic
           recreated) wipes the store and replays from 0.
        6. Register the partition as active.

        ``committed_offset`` None (or negative): the group never committed this partition, so no
        change is committed and only changes done per ``progress`` apply.
        """
        tp = (topic, partition)
        committed_offset = 0 if committed_offset is None else max(0, committed_offset)
        flt = ApplyFilter(committed_offset, progress)
        # 0.
        self._wait_closed(tp)
        with self._lock:
            if tp in self._active:
                raise StatePhaseError(f"{topic}[{partition}] is already active")
            learner = self._learners.pop(tp, None)
        # 1.
        if learner is not None:
            result = opening.promote_learner(learner, committed_offset, progress, changelog_end)
            if result is not None:
                self._activate(
                    tp, learner.store, flt, result.changelog_offset, set(result.above_commit_sources)
                )
                return
        # 2.
        clt = self.changelog_topic(topic)
        self._admin.ensure(clt, topic)
        # 3.
        directory = partition_dir(self.state_dir, topic, partition)
        store, start, sources = opening.prepare_store(directory, tp, flt, bulk_restore=self.bulk_restore)
        status = RestoreStatus(topic, partition, committed_offset=committed_offset)
        with self._lock:
            self._status[tp] = status
        t0 = time.monotonic()
        # One changelog reader (consumer) for the probe of step 4 and the replay of step 5.
        reader = self._reader(topic, partition)
        try:
            # 4., 5.
            position, above_commit_sources = self._restorer.restore(
                tp, store, flt, sources, start, status, reader, t0
            )
            # 6.
            self._activate(tp, store, flt, position, above_commit_sources)
        finally:
            reader.close()

    def _activate(
        self,
        tp: TP,
        store: PartitionStore,
        flt: ApplyFilter,
        changelog_offset: int,
        sources: set[tuple[int, int]],
    ) -> None:
        part = ActivePartitionState(
            tp[0],
            tp[1],
            self.changelog_topic(tp[0]),
            store,
            self._writer,
            flt.committed_offset,
            sources,
            changelog_offset,
        )
        with self._lock:
            self._active[tp] = part
            status = self._status.setdefault(tp, RestoreStatus(tp[0], tp[1]))
            status.phase, status.unread, status.buffered = "active", 0, 0
            status.committed_offset = flt.committed_offset
            status.publish()

    def view(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        key_range: KeyRange,
        source_offset: int,
        source_key_hash: int,
    ) -> KeyRangeStateView:
        part = self._active.get((topic, partition))
        if part is None:
            raise StatePhaseError(f"{topic}[{partition}] is not active in this worker's state store")
        return KeyRangeStateView(part, key, key_range, source_offset, source_key_hash)

    def before_commit(self, topic: str, partition: int, offset: int) -> None:
        """Make every change produced so far for the partition durable (blocking), then remember that
        ``offset`` is being committed. Raises :class:`StateDurabilityError`: do not commit then."""
        part = self._active.get((topic, partition))
        if part is None:
            raise StatePhaseError(f"{topic}[{partition}] is not active in this worker's state store")
        self._flush(part)
        part.mark_committed(offset)
        status = self._status.get((topic, partition))
        if status is not None:
            status.committed_offset = offset

    def take_changes(
        self, topic: str, partition: int, is_complete: Callable[[int], bool]
    ) -> list[HeldChange]:
        """Transactional: the held changelog records of the records ``is_complete`` says are complete,
        in apply order, for the partition's next transaction (empty when the partition is not active)."""
        part = self._active.get((topic, partition))
        return [] if part is None else part.take_changes(is_complete)

    def changes_committed(self, topic: str, partition: int, offset: int, changelog_end: int | None) -> None:
        """Transactional: the partition's transaction committing ``offset`` succeeded; its changelog
        records end at ``changelog_end`` (None: it carried none)."""
        part = self._active.get((topic, partition))
        if part is None:
            return
        part.changes_committed(offset, changelog_end)
        status = self._status.get((topic, partition))
        if status is not None:
            status.committed_offset = offset

    def changelog_end(self, topic: str, partition: int) -> int | None:
        """One past the partition's last changelog record, as far as this worker knows it (the end its
        restore reached, or its own last acknowledged write beyond): the true end while it is the
        partition's only writer and after ``before_commit``. None when the partition is not active."""
        part = self._active.get((topic, partition))
        return None if part is None else part.changelog_end()

    def make_durable(self, topic: str, partition: int) -> None:
        """Wait until every change produced so far for the partition is acknowledged (blocking), without
        marking anything committed (the progress cycle calls it before a progress record claims the
        records behind those changes done). Raises :class:`StateDurabilityError` when one was lost."""
        part = self._active.get((topic, partition))
        if part is None:
            raise StatePhaseError(f"{topic}[{partition}] is not active in this worker's state store")
        self._flush(part)

    def _flush(self, part: ActivePartitionState) -> None:
        """Wait for the shared producer's acknowledgements of the partition's changes (blocking);
        nothing to wait for when transactional (its changes are held for its transaction)."""
        if self._writer is not None:
            self._writer.flush_partition(part.changelog_topic, part.partition, self._flush_timeout_s)

    def close_partition(self, topic: str, partition: int, clean: bool) -> None:
        """Close the partition's store (steps 1-3). ``clean``: the engine made its final commit.

        May run after the engine answered the release (the flush of the memtables is off the handoff's
        critical path): the partition leaves ``_active`` at once, and an ``open_partition``, ``learn``
        or ``drop`` of it waits until this close has finished (``_closing``), so that none of them
        touches the files (or reads a checkpoint) before step 3.

        1. Flush the partition's changes; a lost change turns a clean close into an unclean one, and so
           does a change still held for a transaction (transactional: not in the committed changelog).
        2. Close the database (flushing its memtables).
        3. Clean: write the checkpoint. Unclean: none, so the next open wipes the store.
        """
        tp = (topic, partition)
        self._wait_closed(tp)
        with self._lock:
            part = self._active.pop(tp, None)
            learner = self._learners.pop(tp, None)
            self._status.pop(tp, None)
            done = None if part is None and learner is None else threading.Event()
            if done is not None:
                self._closing[tp] = done
        metrics.forget(topic, partition)
        if done is None:
            return
        try:
            if learner is not None:
                self._close_learner(learner, clean)
            elif part is not None:
                self._close_active(part, clean)
        finally:
            with self._lock:
                self._closing.pop(tp, None)
            done.set()

    def _close_active(self, part: ActivePartitionState, clean: bool) -> None:
        """Steps 1-3 of :meth:`close_partition` for an active partition."""
        topic, partition = part.topic, part.partition
        # 1.
        if clean:
            try:
                self._flush(part)
            except StateDurabilityError as exc:
                log.error("closing %s[%d] uncleanly: %s", topic, partition, exc)
                clean = False
        if clean and part.holds_changes():
            log.warning("closing %s[%d] uncleanly: changes not in a committed transaction", topic, partition)
            clean = False
        # 2.
        part.store.close()
        # 3.
        ckpts = CheckpointStore(part.store.directory)
        if clean:
            committed, sources = part.snapshot_sources()
            ckpts.write(Checkpoint(part.changelog_end(), committed, sources))
        else:
            ckpts.remove()
        if self._writer is not None:
            self._writer.reset(part.changelog_topic, partition)

    def _close_learner(self, learner: PartitionLearner, clean: bool) -> None:
        try:
            learner.stop()
        finally:
            learner.reader.close()
        ok = clean and learner.error is None
        learner.store.close()
        ckpts = CheckpointStore(learner.store.directory)
        if ok:
            ckpts.write(learner.checkpoint())
        else:
            ckpts.remove()

    # -- learner control ------------------------------------------------------------------------------

    def learn(self, topic: str, partition: int) -> None:
        """Start learning a partition this worker does not process (returns at once; steps 1-4).

        1. Make sure the changelog topic exists; read the input group's committed offset.
        2. Take the checkpoint: reuse the store when the committed offset has not moved behind it
           (sources not yet committed stay *unverified* until they commit or promotion checks them).
        3. Otherwise wipe the store and start at changelog offset 0, in bulk mode (``bulk_restore``;
           the tail thread ends it, flushing and compacting, at its first end of the changelog); with
           a snapshot URI the tail thread first loads the newest usable snapshot (bounded at or below
           ``committed``) and starts at its ``changelog_offset`` (``learner.py``, step 0 of the
           thread).
        4. Start the tail thread.
        """
        tp = (topic, partition)
        self._wait_closed(tp)
        with self._lock:
            if tp in self._active:
                raise StatePhaseError(f"{topic}[{partition}] is active here: use demote()")
            if tp in self._learners:
                return
            # 1.
            self._admin.ensure(self.changelog_topic(topic), topic)
            committed = self._committed().committed(topic, partition)
            # 2.
            directory = partition_dir(self.state_dir, topic, partition)
            store = PartitionStore(directory)
            ckpt = opening.take_checkpoint(directory)
            start, unverified = 0, set()
            if ckpt is not None and committed >= ckpt.committed_offset:
                start, unverified = ckpt.changelog_offset, set(ckpt.above_commit_sources)
            # 3.
            if start == 0:
                store.wipe()
                if self.bulk_restore:
                    store.begin_bulk()
            store.open()
            reader = self._reader(topic, partition)
            reader.seek(start)
            status = RestoreStatus(topic, partition)
            learner = PartitionLearner(
                topic,
                partition,
                store,
                reader,
                self._committed(),
                committed,
                status,
                unverified=unverified,
                poll_interval_s=self._poll_interval_s,
                stall_timeout_s=self._stall_timeout_s,
                snapshots=self._snapshots if start == 0 else None,
            )
            self._learners[tp] = learner
            self._status[tp] = status
            # 4.
            learner.start()

    def demote(self, topic: str, partition: int) -> None:
        """Active -> learner: close cleanly (checkpoint), then learn from that checkpoint."""
        with self._lock:
            if (topic, partition) in self._active:
                self.close_partition(topic, partition, clean=True)
        self.learn(topic, partition)

    def drop(self, topic: str, partition: int) -> None:
        """Stop learning (if learning) and delete the partition's local files. Not for active ones."""
        tp = (topic, partition)
        self._wait_closed(tp)
        with self._lock:
            if tp in self._active:
                raise StatePhaseError(f"{topic}[{partition}] is active here: release it before dropping")
            learner = self._learners.pop(tp, None)
            self._status.pop(tp, None)
        if learner is not None:
            self._close_learner(learner, clean=False)
        PartitionStore(partition_dir(self.state_dir, topic, partition)).destroy()
        metrics.forget(topic, partition)

    def promote(self, topic: str, partition: int) -> None:
        """Check that the partition is learning, healthy and caught up (the control endpoint's
        ``/v1/promote``). The switch itself happens when the engine opens the partition (it is
        assigned to this worker): ``open_partition`` of a learning partition is the promotion.

        Raises :class:`StatePhaseError` when the partition is not learning, failed, or not caught up.
        """
        learner = self._learners.get((topic, partition))
        if learner is None:
            raise StatePhaseError(f"{topic}[{partition}] is not learning here")
        if learner.error is not None:
            raise StatePhaseError(f"learner {topic}[{partition}] failed: {learner.error}")
        if not learner.caught_up.is_set():
            raise StatePhaseError(f"learner {topic}[{partition}] has not caught up yet")

    def metrics_collectors(self) -> tuple[Collector, ...]:
        """The state store's Prometheus collectors, for the worker's metrics registry to register
        (``multilane_restore_records_remaining``, ``multilane_restore_records_per_second``, ...)."""
        return metrics.COLLECTORS

    def learner_status(self) -> list[dict[str, object]]:
        """Per partition known here: phase, restore lag (unread + held back), rate, ETA."""
        with self._lock:
            statuses = list(self._status.values())
        return [s.as_dict() for s in sorted(statuses, key=lambda s: (s.topic, s.partition))]

    def learner_caught_up(self, topic: str, partition: int) -> bool:
        """True once the learner of the partition has reached the end of the changelog at least once."""
        learner = self._learners.get((topic, partition))
        return learner is not None and learner.caught_up.is_set()

    # -- inspection and shutdown ----------------------------------------------------------------------

    def store(self, topic: str, partition: int) -> PartitionStore:
        """The open store of an active or learning partition (tests, snapshots)."""
        tp = (topic, partition)
        part = self._active.get(tp)
        if part is not None:
            return part.store
        learner = self._learners.get(tp)
        if learner is not None:
            return learner.store
        raise StatePhaseError(f"{topic}[{partition}] is neither active nor learning here")

    def close(self) -> None:
        """Stop learners (with checkpoints), close still-active partitions *uncleanly* (the engine did
        not say their final commit happened), wait for closes still running on other threads (a close
        after a release answer), flush and close the Kafka clients."""
        with self._lock:
            learners = list(self._learners)
            active = list(self._active)
        for topic, partition in learners:
            self.close_partition(topic, partition, clean=True)
        for topic, partition in active:
            log.warning("state of %s[%d] still active at shutdown: closing uncleanly", topic, partition)
            self.close_partition(topic, partition, clean=False)
        with self._lock:
            closing = list(self._closing)
        for tp in closing:
            try:
                self._wait_closed(tp)
            except StatePhaseError as exc:
                log.error("%s", exc)
        if self._writer is not None:
            self._writer.close()
        with self._lock:
            reader, self._committed_reader = self._committed_reader, None
        if reader is not None:
            reader.close()

    def __enter__(self) -> StateManager:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
