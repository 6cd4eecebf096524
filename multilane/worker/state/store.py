"""``PartitionStore``: the RocksDB database of one input partition. Does I/O (local disk).

Layout under the worker's state directory::

    <state_dir>/<topic>-<partition>/db/               the RocksDB database (raw bytes keys and values)
    <state_dir>/<topic>-<partition>/checkpoint.json   present only after a clean close (checkpoint.py)
    <state_dir>/<topic>-<partition>/BULK-LOAD         present while a bulk load has unflushed writes

Keys are the state keys themselves: key ranges *route* keys to lanes, they do not partition storage,
so a change of the parallelising factor never rewrites the store. All lanes of the partition share the
one database (RocksDB is safe for concurrent readers and writers).

The write-ahead log is disabled: after a crash the store is wiped and rebuilt from the changelog
anyway (the changelog, not the local disk, is the durable copy), so the WAL would only cost time.
``close()`` flushes the memtables, which is what makes a clean close's checkpoint trustworthy.

Bulk loads (a full restore, a learner's initial restore and a snapshot load: writes into a store that
started empty, nothing reads it meanwhile) run in *bulk mode* (:meth:`PartitionStore.begin_bulk`,
steps 1-2; :meth:`PartitionStore.end_bulk`, steps 3-5):

1. write the ``BULK-LOAD`` marker (fsync'd): the store now holds writes that are not durable;
2. switch to bulk options: 16 MiB memtables (random-order inserts into a small skiplist cost about
   half of those into the default 64 MiB one), no automatic compaction and no write stalls (the
   level-0 files pile up instead: about 15 for 5 M small keys);
3. flush the memtables and wait for the flush (the sync at the end);
4. restore the normal options: RocksDB's background threads now compact the level-0 files (a
   learner waits for that before it reports caught up, so that no compaction of its initial restore
   runs during a promotion, while a promotion never waits for it; a full restore lets it run while
   the partition processes); ``compact=True`` compacts synchronously instead;
5. remove the marker (fsync'd).

A kill -9 at any point before step 5 leaves the marker: the next open of the partition discards any
checkpoint and wipes the store (and a checkpoint is never written while the marker exists, because
checkpoints follow a close, which flushes and removes it).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from multilane.worker.state.errors import StateError

__all__ = ["BULK_MARKER", "PartitionStore", "partition_dir"]

BULK_MARKER = "BULK-LOAD"

# Mutable RocksDB options (SetOptions) of the bulk mode and the values they go back to afterwards.
_BULK_OPTIONS = {
    "disable_auto_compactions": "true",
    "write_buffer_size": str(16 << 20),
    "max_write_buffer_number": "4",
    "level0_slowdown_writes_trigger": "100000",
    "level0_stop_writes_trigger": "100000",
}
_NORMAL_OPTIONS = {
    "disable_auto_compactions": "false",
    "write_buffer_size": str(64 << 20),
    "max_write_buffer_number": "2",
    "level0_slowdown_writes_trigger": "20",
    "level0_stop_writes_trigger": "36",
}

_LEVEL0_COMPACTION_TRIGGER = 4  # RocksDB's default level0_file_num_compaction_trigger

_SAFE_TOPIC = re.compile(r"^[A-Za-z0-9._-]+$")


def partition_dir(state_dir: str | os.PathLike[str], topic: str, partition: int) -> Path:
    """``<state_dir>/<topic>-<partition>``. Pure (builds a path). Rejects names that could escape."""
    if not _SAFE_TOPIC.match(topic) or topic in (".", ".."):
        raise ValueError(f"topic name {topic!r} is not a legal Kafka topic name")
    if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
        raise ValueError(f"partition must be an int >= 0, got {partition!r}")
    return Path(state_dir) / f"{topic}-{partition}"


class PartitionStore:
    """One partition's RocksDB database: get/put/delete of raw bytes, batched apply, wipe.

    Invariants: ``self._db`` is None exactly when the store is closed; every method but ``open``,
    ``wipe`` and ``close`` requires it open (else :class:`StateError`). While ``bulk`` is true and
    the store is open, the ``BULK-LOAD`` marker exists and the bulk options are in force (a reopen
    during a bulk load, e.g. after a wipe, re-creates both).
    """

    def __init__(self, directory: Path) -> None:
        self.directory: Path = directory
        self.db_path: Path = directory / "db"
        self.marker_path: Path = directory / BULK_MARKER
        self._db: Rdict | None = None
        self.bulk = False
        self._lock = threading.Lock()  # guards open/close against concurrent use of the handle

    # -- lifecycle (disk I/O) ------------------------------------------------------------------------

    def open(self) -> PartitionStore:
        """Open (creating if missing) the database. Does I/O."""
        with self._lock:
            if self._db is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                opts = Options(raw_mode=True)
                opts.create_if_missing(True)
                db = Rdict(str(self.db_path), opts)
                wo = WriteOptions()
                wo.disable_wal = True  # type: ignore[method-assign,assignment]  # a property at runtime
                db.set_write_options(wo)
                if self.bulk:
                    _write_marker(self.marker_path)
                    db.set_options(_BULK_OPTIONS)
                self._db = db
        return self

    @property
    def is_open(self) -> bool:
        return self._db is not None

    @property
    def bulk_interrupted(self) -> bool:
        """True when a bulk load of an earlier process did not finish (kill -9): the files on disk
        are partial whatever a checkpoint says. Does I/O (one stat)."""
        return not self.bulk and self.marker_path.exists()

    def close(self) -> None:
        """Flush memtables to disk and close; the flush makes a bulk load's writes durable, so the
        marker goes too (``bulk`` stays set: a reopen continues the bulk load). Idempotent. Does I/O."""
        with self._lock:
            db, self._db = self._db, None
        if db is not None:
            db.flush(True)
            db.close()
            _remove_marker(self.marker_path)

    def wipe(self) -> None:
        """Close and delete the database files and a bulk marker (the checkpoint file is left to its
        owner). Does I/O."""
        self.close()
        shutil.rmtree(self.db_path, ignore_errors=True)
        _remove_marker(self.marker_path)

    def destroy(self) -> None:
        """Close and delete the whole partition directory. Does I/O."""
        self.close()
        self.bulk = False
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- bulk mode (module docstring) ---------------------------------------------------------------

    def begin_bulk(self) -> None:
        """Steps 1-2: marker, bulk options. For a store that starts empty. Does I/O."""
        if self.bulk:
            return
        self.bulk = True
        with self._lock:
            db = self._db
            if db is not None:
                # 1.
                _write_marker(self.marker_path)
                # 2.
                db.set_options(_BULK_OPTIONS)

    def end_bulk(self, compact: bool = False) -> None:
        """Steps 3-5: flush (wait), normal options (background compaction resumes), marker removed.
        ``compact``: compact the whole key space before returning (seconds for millions of keys).
        Does I/O."""
        if not self.bulk:
            return
        db = self._handle()
        # 3.
        db.flush(True)
        # 4.
        if compact:
            db.compact_range(None, None)
        db.set_options(_NORMAL_OPTIONS)
        # 5.
        self.bulk = False
        _remove_marker(self.marker_path)

    def compaction_pending(self) -> bool:
        """True while RocksDB has a compaction running or scheduled, or level 0 still holds as many
        files as trigger one (e.g. right after a bulk load, before the compaction was picked up)."""
        db = self._handle()
        pending = db.property_int_value("rocksdb.compaction-pending") or 0
        running = db.property_int_value("rocksdb.num-running-compactions") or 0
        return bool(pending or running) or self.level0_files() >= _LEVEL0_COMPACTION_TRIGGER

    def level0_files(self) -> int:
        """Files at level 0 (tests and benchmarks: a bulk load ends with none)."""
        return int(self._handle().property_int_value("rocksdb.num-files-at-level0") or 0)

    def _handle(self) -> Rdict:
        db = self._db
        if db is None:
            raise StateError(f"state store {self.directory} is closed")
        return db

    # -- data ----------------------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        value = self._handle().get(key)
        return None if value is None else bytes(value)

    def put(self, key: bytes, value: bytes) -> None:
        self._handle().put(key, value)

    def delete(self, key: bytes) -> None:
        self._handle().delete(key)

    def apply(self, changes: Iterable[tuple[bytes, bytes | None]]) -> int:
        """Write ``(key, value)`` pairs in one batch; a ``None`` value deletes. Returns the pair count."""
        batch = WriteBatch(raw_mode=True)
        n = 0
        for key, value in changes:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
            n += 1
        if n:
            self._handle().write(batch)
        return n

    def put_all(self, keys: Sequence[bytes], values: Sequence[bytes]) -> int:
        """Write ``keys[i] = values[i]`` in one batch (a bulk load's rows: no deletes). Returns the
        count."""
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")
        batch = WriteBatch(raw_mode=True)
        put = batch.put
        for key, value in zip(keys, values, strict=True):
            put(key, value)
        if keys:
            self._handle().write(batch)
        return len(keys)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every ``(key, value)`` in key order (tests, benchmarks and snapshots)."""
        it = self._handle().iter()
        it.seek_to_first()
        while it.valid():
            yield bytes(it.key()), bytes(it.value())
            it.next()

    def compact(self) -> None:
        """Compact the whole key space (drops overwritten versions). Does I/O; may take seconds."""
        self._handle().compact_range(None, None)

    def disk_bytes(self) -> int:
        """Bytes of the database's files on disk. Does I/O."""
        total = 0
        for root, _dirs, files in os.walk(self.db_path):
            for name in files:
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except OSError:
                    pass
        return total


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_marker(path: Path) -> None:
    """Create the bulk marker durably (file and directory entry). Does I/O."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        os.fsync(fh.fileno())
    _fsync_dir(path.parent)


def _remove_marker(path: Path) -> None:
    """Remove the bulk marker durably; nothing to do when absent. Does I/O."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    _fsync_dir(path.parent)
