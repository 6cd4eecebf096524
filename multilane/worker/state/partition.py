"""``ActivePartitionState``: the write path of one partition the worker processes. Does I/O
(RocksDB and the changelog producer).

Durability order of one change (steps in :meth:`ActivePartitionState.put` / ``delete``):
1. produce the changelog record(s) -- if this raises, nothing was applied and the processor sees it;
2. apply the change to the local store;
3. remember its source when it lies at or above the committed offset (checkpoint validity).
Both the produce and the apply happen under the partition's write lock, so the changelog holds the
changes of a partition in exactly the order the store applied them, whichever lanes made them.

Exactly-once outputs (no shared changelog producer: ``writer=None``): step 1 *holds* the changelog
record(s) instead of producing them, in apply order, with their source offset. The commit cycle takes
the held changes of the records its plan counts complete (:meth:`ActivePartitionState.take_changes`)
and produces them in the partition's transaction, with the outputs, the progress record and the
committed offset; after the commit, :meth:`ActivePartitionState.changes_committed` records the
changelog end and the committed offset. So a ``read_committed`` changelog holds exactly the changes
of records whose outputs and offsets committed. A change still held at a close makes the close
unclean (the local store is ahead of the changelog: the next open wipes it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from multilane.formats.changelog import ChangelogCodec
from multilane.worker.state.changelog import ChangelogWriter
from multilane.worker.state.store import PartitionStore

__all__ = ["ActivePartitionState", "HeldChange"]

# source offset, changelog topic, partition, key, value
HeldChange = tuple[int, str, int, bytes, bytes | None]


class ActivePartitionState:
    """Invariants: ``committed_offset`` is the offset of the latest ``before_commit`` (or the offset
    the partition was opened at); ``above_commit_sources`` holds the ``(source_offset, key_hash)`` of
    every change in the store whose source offset is ``>= committed_offset`` -- applied by this worker
    or by a restore because progress said its record was done. Both are guarded by ``_lock``.
    ``transactional`` (exactly-once outputs) is ``writer is None``, fixed at construction: ``_held``
    lists, in apply order, the changelog records not yet committed (guarded by ``_lock``); ``_txn_end``
    is one past the last changelog record this worker committed.
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        changelog_topic: str,
        store: PartitionStore,
        writer: ChangelogWriter | None,
        committed_offset: int,
        above_commit_sources: set[tuple[int, int]],
        changelog_offset: int,
    ) -> None:
        """``writer``: the worker's shared changelog producer; None with exactly-once outputs (the
        changes are held for the partition's transaction)."""
        self.topic = topic
        self.partition = partition
        self.changelog_topic = changelog_topic
        self.store = store
        self.writer = writer
        self.committed_offset = committed_offset
        self.above_commit_sources = {s for s in above_commit_sources if s[0] >= committed_offset}
        self.restored_changelog_offset = changelog_offset  # the changelog end the restore reached
        self._lock = threading.Lock()
        self.transactional = writer is None
        self._held: list[HeldChange] = []
        self._txn_end = 0

    def _write(self, key: bytes, value: bytes | None, source_offset: int) -> None:
        """Step 1, under ``_lock``: produce the changelog record, or hold it for the transaction."""
        if self.writer is None:
            self._held.append((source_offset, self.changelog_topic, self.partition, key, value))
        else:
            self.writer.produce(self.changelog_topic, self.partition, key, value)

    def get(self, key: bytes) -> bytes | None:
        return self.store.get(key)

    def put(self, key: bytes, value: bytes, source_offset: int, source_key_hash: int) -> None:
        envelope = ChangelogCodec.encode_put(value, source_offset, source_key_hash)
        with self._lock:
            # 1.
            self._write(key, envelope, source_offset)
            # 2.
            self.store.put(key, value)
            # 3.
            if source_offset >= self.committed_offset:
                self.above_commit_sources.add((source_offset, source_key_hash))

    def delete(self, key: bytes, source_offset: int, source_key_hash: int) -> None:
        envelope = ChangelogCodec.encode_delete(source_offset, source_key_hash)
        with self._lock:
            # 1. the D envelope, then the tombstone right behind it
            self._write(key, envelope, source_offset)
            self._write(key, None, source_offset)
            # 2.
            self.store.delete(key)
            # 3.
            if source_offset >= self.committed_offset:
                self.above_commit_sources.add((source_offset, source_key_hash))

    def mark_committed(self, offset: int) -> None:
        """Record that the engine is committing ``offset``; forget sources now below it."""
        with self._lock:
            self.committed_offset = offset
            self.above_commit_sources = {s for s in self.above_commit_sources if s[0] >= offset}

    def take_changes(self, is_complete: Callable[[int], bool]) -> list[HeldChange]:
        """Transactional: remove and return, in apply order, the held changes whose source record
        ``is_complete`` says is complete (the others stay held, in order)."""
        with self._lock:
            taken = [c for c in self._held if is_complete(c[0])]
            if taken:
                self._held = [c for c in self._held if not is_complete(c[0])]
            return taken

    def changes_committed(self, offset: int, changelog_end: int | None) -> None:
        """Transactional: a transaction committing ``offset`` (and changes up to ``changelog_end``,
        None when it carried none) succeeded."""
        if changelog_end is not None:
            with self._lock:
                self._txn_end = max(self._txn_end, changelog_end)
        self.mark_committed(offset)

    def holds_changes(self) -> bool:
        """Transactional: changes applied to the store are not in the committed changelog yet."""
        with self._lock:
            return bool(self._held)

    def changelog_end(self) -> int:
        """One past the last changelog record this store contains (after a flush or a commit)."""
        with self._lock:
            txn_end = self._txn_end
        written = 0 if self.writer is None else self.writer.end_offset(self.changelog_topic, self.partition)
        return max(self.restored_changelog_offset, txn_end, written)

    def snapshot_sources(self) -> tuple[int, tuple[tuple[int, int], ...]]:
        with self._lock:
            return self.committed_offset, tuple(sorted(self.above_commit_sources))
