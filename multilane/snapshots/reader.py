"""Reading published snapshots: the learner's side of the snapshot URI. Does I/O (the snapshot URI).

Only ``manifests/<id>.json`` files are listed, so a snapshot being written, or one whose job was
killed, is never seen. Every data file is checked against the size and SHA-256 its manifest records
before any row is used.

Usage (restore = snapshot items, then the changelog tail from ``changelog_offset``)::

    part = SnapshotReader(uri).latest_covering("orders", 3, committed_offset=committed)
    if part is not None:
        for key, value in part.iter_items():           # or part.iter_key_range(KeyRange(lo, hi))
            store.put(key, value)
        tail_from = part.changelog_offset
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from multilane.formats.keyranges import HASH_SPACE, KeyRange, KeyRangeMap
from multilane.snapshots.layout import SnapshotId, manifest_path
from multilane.snapshots.manifest import (
    ManifestCodec,
    ManifestError,
    PartitionEntry,
    ShardFile,
    SnapshotManifest,
)
from multilane.snapshots.storage import SnapshotStore, list_visible_ids

__all__ = ["SnapshotCorruptError", "SnapshotGoneError", "SnapshotPartition", "SnapshotReader"]

log = logging.getLogger(__name__)


class SnapshotGoneError(FileNotFoundError):
    """A file of the snapshot disappeared (retention retired the snapshot while it was being read)."""


class SnapshotCorruptError(RuntimeError):
    """A data file's size or SHA-256 differs from its manifest."""


@dataclass(frozen=True)
class SnapshotPartition:
    """One changelog partition of a published snapshot.

    Invariants: ``entry`` belongs to ``manifest``; ``changelog_offset`` (where restore resumes
    tailing the changelog) ``<= changelog_end`` (the true end of the changelog when the job started).
    """

    manifest: SnapshotManifest
    entry: PartitionEntry
    store: SnapshotStore
    verify: bool = True

    @property
    def snapshot_id(self) -> str:
        return self.manifest.snapshot_id

    @property
    def topic(self) -> str:
        return self.entry.topic

    @property
    def partition(self) -> int:
        return self.entry.partition

    @property
    def changelog_topic(self) -> str:
        return self.entry.changelog_topic

    @property
    def changelog_offset(self) -> int:
        """Replay the changelog from this offset on top of the snapshot's items."""
        return self.entry.changelog_offset

    @property
    def changelog_end(self) -> int:
        return self.entry.changelog_end

    @property
    def source_bound(self) -> int | None:
        return self.entry.source_bound

    @property
    def rows(self) -> int:
        return self.entry.rows

    @property
    def layout(self) -> KeyRangeMap:
        return self.manifest.layout

    def _read_file(self, f: ShardFile, columns: list[str] | None = None) -> Any:
        """One data file as a pyarrow Table (only ``columns``, default all), after checking its size,
        SHA-256 and row count against the manifest. ``ParquetFile`` rather than ``read_table``: the
        latter imports ``pyarrow.dataset`` (~0.3 s on first use) for nothing."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            data = self.store.read_bytes(f.path)
        except FileNotFoundError as exc:
            raise SnapshotGoneError(f"snapshot {self.snapshot_id}: {f.path} is gone (retired?)") from exc
        if self.verify:
            if len(data) != f.size:
                raise SnapshotCorruptError(
                    f"snapshot {self.snapshot_id}: {f.path} has {len(data)} bytes, manifest says {f.size}"
                )
            digest = hashlib.sha256(data).hexdigest()
            if digest != f.sha256:
                raise SnapshotCorruptError(f"snapshot {self.snapshot_id}: {f.path} fails its SHA-256 check")
        table = pq.ParquetFile(pa.BufferReader(data)).read(columns=columns)
        if self.verify and table.num_rows != f.rows:
            raise SnapshotCorruptError(
                f"snapshot {self.snapshot_id}: {f.path} has {table.num_rows} rows, manifest says {f.rows}"
            )
        return table

    def read_table(self, key_range: KeyRange | None = None) -> Any:
        """All rows (or those whose ``key_hash`` lies in ``key_range``) as one pyarrow Table."""
        import pyarrow as pa
        import pyarrow.compute as pc


        tables = []
        for f in self.entry.files:
            if key_range is not None and (
                f.key_range.end <= key_range.start or f.key_range.start >= key_range.end
            ):
                continue
            table = self._read_file(f)
            if key_range is not None and not (
                key_range.start <= f.key_range.start and f.key_range.end <= key_range.end
            ):
                h = table.column("key_hash").cast(pa.int64())
                mask = pc.greater_equal(h, key_range.start)
                if key_range.end < HASH_SPACE:
                    mask = pc.and_(mask, pc.less(h, key_range.end))
                table = table.filter(mask)
            tables.append(table)
        if not tables:
            return parquet_schema().empty_table()
        return pa.concat_tables(tables)

    def iter_rows(self, key_range: KeyRange | None = None) -> Iterator[dict[str, Any]]:
        """Rows as dicts (key, value, key_hash, changelog_offset, source_offset), file by file."""
        for batch in self.read_table(key_range).to_batches():
            yield from batch.to_pylist()

    def iter_key_range(self, key_range: KeyRange) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` of the keys whose key hash lies in ``key_range``."""
        yield from self._items(key_range)

    def iter_items(self) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` of every key in the partition's snapshot."""
        yield from self._items(None)

    def _items(self, key_range: KeyRange | None) -> Iterator[tuple[bytes, bytes]]:
        table = self.read_table(key_range)
        for batch in table.to_batches():
            yield from zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True)

    def iter_item_batches(self, max_rows: int = 10_000) -> Iterator[list[tuple[bytes, bytes]]]:
        """``(key, value)`` lists of at most ``max_rows`` items, reading (and verifying) one file at a
        time: memory stays at one file's table, not the partition's (a learner's bulk load).

        A file that fails its check raises :class:`SnapshotCorruptError` when it is reached, so the
        caller may already hold the earlier files' items: discard them on any error.
        """
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        for f in self.entry.files:
            table = self._read_file(f, ["key", "value"])
            for batch in table.to_batches(max_chunksize=max_rows):
                keys = batch.column(0).to_pylist()
                values = batch.column(1).to_pylist()
                yield list(zip(keys, values, strict=True))


class SnapshotReader:
    """Lists and opens the published snapshots under ``uri`` (a local path or a pyarrow URI)."""

    def __init__(self, uri: str, *, verify: bool = True) -> None:
        self.uri = uri
        self.store = SnapshotStore(uri)
        self.verify = verify

    def snapshot_ids(self) -> list[str]:
        """Published snapshot ids, newest first."""
        return list(reversed(list_visible_ids(self.store)))

    def manifest(self, snapshot_id: str) -> SnapshotManifest:
        """Read and validate one manifest (:class:`ManifestError` if corrupt, FileNotFoundError if gone)."""
        if not SnapshotId.is_valid(snapshot_id):
            raise ValueError(f"not a snapshot id: {snapshot_id!r}")
        path = manifest_path(snapshot_id)
        m = ManifestCodec.decode(self.store.read_bytes(path), source=f"{self.uri}/{path}")
        if m.snapshot_id != snapshot_id:
            raise ManifestError(f"{self.uri}/{path}: names snapshot {m.snapshot_id!r}, not {snapshot_id!r}")
        return m

    def manifests(self) -> Iterator[SnapshotManifest]:
        """Valid published manifests, newest first; corrupt ones are skipped with a warning."""
        for sid in self.snapshot_ids():
            try:
                yield self.manifest(sid)
            except FileNotFoundError:
                continue  # retired meanwhile
            except ManifestError as exc:
                log.warning("skipping snapshot %s: %s", sid, exc)

    def latest(self) -> SnapshotManifest | None:
        return next(self.manifests(), None)

    def latest_covering(
        self,
        topic: str,
        partition: int,
        *,
        committed_offset: int | None = None,
        changelog_topic: str | None = None,
        require_bound: bool = False,
    ) -> SnapshotPartition | None:
        """The newest snapshot holding ``topic``'s ``partition``, or None.

        With ``committed_offset`` (the input partition's committed offset the restore will use), a
        snapshot bounded at a higher source offset is passed over: it may hold changes that this
        restore must skip (the group's offsets were moved backwards since). ``changelog_topic`` passes
        over snapshots of another changelog (another group sharing the URI). ``require_bound`` passes
        over snapshots taken without a source bound (``--source-bound none``): they may hold changes
        of records that were never committed, which a worker's restore must not apply.
        """
        for m in self.manifests():
            entry = m.partition(topic, partition)
            if entry is None:
                continue
            if changelog_topic is not None and entry.changelog_topic != changelog_topic:
                continue
            if require_bound and entry.source_bound is None:
                log.info(
                    "snapshot %s of %s[%d] has no source bound; trying older", m.snapshot_id, topic, partition
                )
                continue
            if (
                committed_offset is not None
                and entry.source_bound is not None
                and entry.source_bound > committed_offset
            ):
                log.info(
                    "snapshot %s of %s[%d] is bounded at %d > committed %d; trying older",
                    m.snapshot_id,
                    topic,
                    partition,
                    entry.source_bound,
                    committed_offset,
                )
                continue
            return SnapshotPartition(m, entry, self.store, self.verify)
        return None


def parquet_schema() -> Any:
    """The snapshot file schema: key, value (binary), key_hash (uint32), changelog/source offsets (int64)."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("key", pa.binary(), nullable=False),
            pa.field("value", pa.binary(), nullable=False),
            pa.field("key_hash", pa.uint32(), nullable=False),
            pa.field("changelog_offset", pa.int64(), nullable=False),
            pa.field("source_offset", pa.int64(), nullable=False),
        ]
    )
