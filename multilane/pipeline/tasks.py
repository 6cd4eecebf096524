"""The functions Spark tasks run on executors: read + pre-merge offset ranges, write shard files. Does I/O.

They are plain module-level functions (and small closures over picklable values) so that the Spark
job ships only their arguments; executors need ``multilane``, ``confluent-kafka`` and ``pyarrow``
installed (the container image has them).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from multilane.pipeline.kafka_io import ChangelogRangeReader
from multilane.pipeline.layout import shard_path
from multilane.pipeline.merge import merge_range
from multilane.pipeline.planning import OffsetRange
from multilane.pipeline.storage import SnapshotStore

__all__ = [
    "PARQUET_COLUMNS",
    "ROW",
    "TAIL",
    "parquet_schema",
    "read_ranges",
    "write_shards",
]

TAIL = 0
"""Tag of a read task's summary item: ``(TAIL, (topic, partition), tail_offset | None, records_read)``."""
ROW = 1
"""Tag of a kept change: ``(ROW, (topic, partition, key), change)``."""

PARQUET_COLUMNS = ("key", "value", "key_hash", "changelog_offset", "source_offset")
_ROWS_PER_BATCH = 65_536


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


def read_ranges(
    kafka_config: Mapping[str, Any], idle_timeout_s: float
) -> Callable[[Iterable[OffsetRange]], Iterator[tuple[Any, ...]]]:
    """The read task: for each offset range, the newest change per key before its tail, then a TAIL item.

    1. Read the range with confluent-kafka (``assign`` at ``start``, stop at ``end``).
    2. Keep the newest change per key; stop at the first envelope at or above the source bound.
    3. Emit the kept changes (ROW), then the range's tail offset and record count (TAIL).
    """
    config = dict(kafka_config)

    def run(ranges: Iterable[OffsetRange]) -> Iterator[tuple[Any, ...]]:
        for r in ranges:
            # 1.
            reader = ChangelogRangeReader(config, idle_timeout_s=idle_timeout_s)
            changes = reader.read(r.changelog_topic, r.partition, r.start, r.end)
            try:
                # 2.
                result = merge_range(changes, r.source_bound)
            finally:
                changes.close()  # stops the reader (and closes its consumer) when merge stopped early
            # 3.
            for key, change in result.newest.items():
                yield (ROW, (r.topic, r.partition, key), change)
            yield (TAIL, (r.topic, r.partition), result.tail_offset, result.records)

    return run


def write_shards(
    store_uri: str, snapshot_id: str
) -> Callable[
    [Iterable[tuple[tuple[str, int, int, int, bytes], tuple[bytes, int, int]]]], Iterator[dict[str, Any]]
]:
    """The write task: one Parquet file per (topic, partition, shard) of its sorted input.

    Input items are ``((topic, partition, shard, key_hash, key), (value, changelog_offset,
    source_offset))``, sorted by key, so each shard's rows are contiguous and ordered by key hash.

    1. Write the shard's rows to a local temporary Parquet file, in record batches.
    2. Upload it to ``data/<id>/<topic>/<partition>/shard-<i>.parquet``, hashing while copying.
    3. Emit ``{"topic", "partition", "shard", "path", "rows", "bytes", "sha256"}``.
    """

    def run(
        items: Iterable[tuple[tuple[str, int, int, int, bytes], tuple[bytes, int, int]]],
    ) -> Iterator[dict[str, Any]]:
        store = SnapshotStore(store_uri)
        tmp_dir = tempfile.mkdtemp(prefix="multilane-snapshot-")
        try:
            current: tuple[str, int, int] | None = None
            sink: _ShardSink | None = None
            for (topic, partition, shard, h, key), (value, changelog_offset, source_offset) in items:
                if current != (topic, partition, shard):
                    if sink is not None and current is not None:
                        yield sink.finish(store, current)
                    current = (topic, partition, shard)
                    sink = _ShardSink(os.path.join(tmp_dir, f"{partition}-{shard}.parquet"), snapshot_id)
                assert sink is not None
                sink.add(key, value, h, changelog_offset, source_offset)
            if sink is not None and current is not None:
                yield sink.finish(store, current)
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)

    return run


class _ShardSink:
    """Buffers one shard's rows into record batches of a local Parquet file (steps 1-3 above)."""

    def __init__(self, local_path: str, snapshot_id: str) -> None:
        import pyarrow.parquet as pq

        self.local_path = local_path
        self.snapshot_id = snapshot_id
        self.schema = parquet_schema()
        self.writer = pq.ParquetWriter(local_path, self.schema, compression="snappy")
        self.cols: tuple[list[bytes], list[bytes], list[int], list[int], list[int]] = ([], [], [], [], [])
        self.rows = 0

    def add(self, key: bytes, value: bytes, h: int, changelog_offset: int, source_offset: int) -> None:
        c = self.cols
        c[0].append(key)
        c[1].append(value)
        c[2].append(h)
        c[3].append(changelog_offset)
        c[4].append(source_offset)
        self.rows += 1
        if len(c[0]) >= _ROWS_PER_BATCH:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if not self.cols[0]:
            return
        batch = pa.RecordBatch.from_arrays(
            [pa.array(col, type=f.type) for col, f in zip(self.cols, self.schema, strict=True)],
            schema=self.schema,
        )
        self.writer.write_batch(batch)
        for col in self.cols:
            col.clear()

    def finish(self, store: SnapshotStore, shard_id: tuple[str, int, int]) -> dict[str, Any]:
        # 1.
        self._flush()
        self.writer.close()
        topic, partition, shard = shard_id
        rel = shard_path(self.snapshot_id, topic, partition, shard)
        # 2.
        size, sha = store.upload_file(self.local_path, rel)
        os.unlink(self.local_path)
        # 3.
        return {
            "topic": topic,
            "partition": partition,
            "shard": shard,
            "path": rel,
            "rows": self.rows,
            "bytes": size,
            "sha256": sha,
        }
