"""``ActivePartitionState``: the write path of one partition the worker processes. Does I/O
(RocksDB and the changelog producer).

Durability order of one change (steps in :meth:`ActivePartitionState.put` / ``delete``):
1. produce the changelog record(s) -- if this raises, nothing was applied and the processor sees it;
2. apply the change to the local store;
3. remember its source when it lies at or above the committed offset (checkpoint validity).
Both the produce and the apply happen under the partition's write lock, so the changelog holds the
changes of a partition in exactly the order the store applied them, whichever lanes made them.
"""

from __future__ import annotations

import threading

from multilane.formats.changelog import ChangelogCodec
from multilane.worker.state.changelog import ChangelogWriter
from multilane.worker.state.store import PartitionStore

__all__ = ["ActivePartitionState"]


class ActivePartitionState:
    """Invariants: ``committed_offset`` is the offset of the latest ``before_commit`` (or the offset
    the partition was opened at); ``above_commit_sources`` holds the ``(source_offset, key_hash)`` of
    every change in the store whose source offset is ``>= committed_offset`` -- applied by this worker
    or by a restore because progress said its record was done. Both are guarded by ``_lock``."""

    def __init__(
        self,
        topic: str,
        partition: int,
        changelog_topic: str,
        store: PartitionStore,
        writer: ChangelogWriter,
        committed_offset: int,
        above_commit_sources: set[tuple[int, int]],
        changelog_offset: int,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.changelog_topic = changelog_topic
        self.store = store
        self.writer = writer
        self.committed_offset = committed_offset
        self.above_commit_sources = {s for s in above_commit_sources if s[0] >= committed_offset}
        self.restored_changelog_offset = changelog_offset  # the changelog end the restore reached
        self._lock = threading.Lock()

    def get(self, key: bytes) -> bytes | None:
        return self.store.get(key)

    def put(self, key: bytes, value: bytes, source_offset: int, source_key_hash: int) -> None:
        envelope = ChangelogCodec.encode_put(value, source_offset, source_key_hash)
        with self._lock:
            # 1.
            self.writer.produce(self.changelog_topic, self.partition, key, envelope)
            # 2.
            self.store.put(key, value)
            # 3.
            if source_offset >= self.committed_offset:
                self.above_commit_sources.add((source_offset, source_key_hash))

    def delete(self, key: bytes, source_offset: int, source_key_hash: int) -> None:
        envelope = ChangelogCodec.encode_delete(source_offset, source_key_hash)
        with self._lock:
            # 1. the D envelope, then the tombstone right behind it
            self.writer.produce(self.changelog_topic, self.partition, key, envelope)
            self.writer.produce(self.changelog_topic, self.partition, key, None)
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

    def changelog_end(self) -> int:
        """One past the last changelog record this store contains (after a flush)."""
        return max(
            self.restored_changelog_offset, self.writer.end_offset(self.changelog_topic, self.partition)
        )

    def snapshot_sources(self) -> tuple[int, tuple[tuple[int, int], ...]]:
        with self._lock:
            return self.committed_offset, tuple(sorted(self.above_commit_sources))
