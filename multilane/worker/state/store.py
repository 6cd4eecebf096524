"""``PartitionStore``: the RocksDB database of one input partition. Does I/O (local disk).

Layout under the worker's state directory::

    <state_dir>/<topic>-<partition>/db/               the RocksDB database (raw bytes keys and values)
    <state_dir>/<topic>-<partition>/checkpoint.json   present only after a clean close (checkpoint.py)

Keys are the state keys themselves: key ranges *route* keys to lanes, they do not partition storage,
so a change of the parallelising factor never rewrites the store. All lanes of the partition share the
one database (RocksDB is safe for concurrent readers and writers).

The write-ahead log is disabled: after a crash the store is wiped and rebuilt from the changelog
anyway (the changelog, not the local disk, is the durable copy), so the WAL would only cost time.
``close()`` flushes the memtables, which is what makes a clean close's checkpoint trustworthy.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from multilane.worker.state.errors import StateError

__all__ = ["PartitionStore", "partition_dir"]

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

    Invariant: ``self._db`` is None exactly when the store is closed; every method but ``open``,
    ``wipe`` and ``close`` requires it open (else :class:`StateError`).
    """

    def __init__(self, directory: Path) -> None:
        self.directory: Path = directory
        self.db_path: Path = directory / "db"
        self._db: Rdict | None = None
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
                self._db = db
        return self

    @property
    def is_open(self) -> bool:
        return self._db is not None

    def close(self) -> None:
        """Flush memtables to disk and close. Idempotent. Does I/O."""
        with self._lock:
            db, self._db = self._db, None
        if db is not None:
            db.flush(True)
            db.close()

    def wipe(self) -> None:
        """Close and delete the database files (the checkpoint file is left to its owner). Does I/O."""
        self.close()
        shutil.rmtree(self.db_path, ignore_errors=True)

    def destroy(self) -> None:
        """Close and delete the whole partition directory. Does I/O."""
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)

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
