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

from multilane.formats.keyranges import KeyRangeMap, key_hash
from multilane.pipeline.changes import Change
from multilane.pipeline.kafka_io import ChangelogRangeReader
from multilane.pipeline.merge import is_live, merge_raw_range, newest
from multilane.pipeline.planning import OffsetRange
from multilane.snapshots.layout import shard_path
from multilane.snapshots.reader import parquet_schema
from multilane.snapshots.storage import SnapshotStore

__all__ = [
    "PARQUET_COLUMNS",
    "ROW",
    "TAIL",
    "read_ranges",
    "write_shards",
]

TAIL = 0
"""Tag of a read task's summary item: ``(TAIL, (topic, partition), tail_offset | None, records_read)``."""
ROW = 1
"""Tag of a kept change: ``(ROW, (topic, partition, shard, key_hash, key), change)``."""

PARQUET_COLUMNS = ("key", "value", "key_hash", "changelog_offset", "source_offset")
_ROWS_PER_BATCH = 65_536


def read_ranges(
    kafka_config: Mapping[str, Any], idle_timeout_s: float, layout: list[list[int]]
) -> Callable[[Iterable[OffsetRange]], Iterator[tuple[Any, ...]]]:
    """The read task: for each offset range, the newest change per key before its tail, then a TAIL item.

    1. Read the range with confluent-kafka (``assign`` at ``start``, stop at ``end``).
    2. Keep the newest change per key; stop at the first envelope at or above the source bound.
    3. Emit the kept changes (ROW) keyed by ``(topic, partition, shard, key_hash(key), key)`` for the
       ``layout`` (``KeyRangeMap.to_list()`` form), then the range's tail offset and record count (TAIL).
    """
    config = dict(kafka_config)
    ranges_map = KeyRangeMap.from_list(layout)

    def run(ranges: Iterable[OffsetRange]) -> Iterator[tuple[Any, ...]]:
        for r in ranges:
            # 1.
            reader = ChangelogRangeReader(config, idle_timeout_s=idle_timeout_s)
            batches = reader.read_raw(r.changelog_topic, r.partition, r.start, r.end)
            try:
                # 2. (fast path: decodes only the kept record of each key)
                result = merge_raw_range(batches, r.source_bound, f"{r.changelog_topic}[{r.partition}]")
            finally:
                batches.close()  # stops the reader (and closes its consumer) when merge stopped early
            # 3.
            for key, change in result.newest.items():
                h = key_hash(key)  # a state key always lies in the key range of the lane that owns it
                yield (ROW, (r.topic, r.partition, ranges_map.lane_of(h), h, key), change)
            yield (TAIL, (r.topic, r.partition), result.tail_offset, result.records)

    return run


SortKey = tuple[str, int, int, int, bytes]


def write_shards(
    store_uri: str, snapshot_id: str
) -> Callable[[Iterable[tuple[SortKey, Change]]], Iterator[dict[str, Any]]]:
    """The write task: merge its sorted changes and write one Parquet file per (topic, partition, shard).

    Input items are ``((topic, partition, shard, key_hash, key), change)`` sorted by that key, so each
    shard's changes are contiguous, ordered by key hash, and a key's changes are adjacent.

    1. Per key, the newest change wins (by changelog offset); a key whose newest change is a delete
       is dropped.
    2. Write the shard's rows to a local temporary Parquet file, in record batches.
    3. Upload it to ``data/<id>/<topic>/<partition>/shard-<i>.parquet``, hashing while copying.
    4. Emit ``{"topic", "partition", "shard", "path", "rows", "bytes", "sha256"}``.
    """

    def run(items: Iterable[tuple[SortKey, Change]]) -> Iterator[dict[str, Any]]:
        store = SnapshotStore(store_uri)
        tmp_dir = tempfile.mkdtemp(prefix="multilane-snapshot-")
        try:
            current: tuple[str, int, int] | None = None
            sink: _ShardSink | None = None
            for (topic, partition, shard, h, key), change in _newest_per_key(items):
                if not is_live(change):
                    continue
                if current != (topic, partition, shard):
                    if sink is not None and current is not None:
                        yield sink.finish(store, current)
                    current = (topic, partition, shard)
                    sink = _ShardSink(os.path.join(tmp_dir, f"{partition}-{shard}.parquet"), snapshot_id)
                assert sink is not None
                sink.add(key, change.payload, h, change.changelog_offset, change.source_offset)
            if sink is not None and current is not None:
                yield sink.finish(store, current)
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)

    return run


def _newest_per_key(items: Iterable[tuple[SortKey, Change]]) -> Iterator[tuple[SortKey, Change]]:
    """Step 1 on sorted input: one item per sort key, its newest change."""
    prev_key: SortKey | None = None
    best: Change | None = None
    for k, change in items:
        if k == prev_key and best is not None:
            best = newest(best, change)
            continue
        if prev_key is not None and best is not None:
            yield prev_key, best
        prev_key, best = k, change
    if prev_key is not None and best is not None:
        yield prev_key, best


class _ShardSink:
    """Buffers one shard's rows into record batches of a local Parquet file (steps 2-4 above)."""

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
        # 2.
        self._flush()
        self.writer.close()
        topic, partition, shard = shard_id
        rel = shard_path(self.snapshot_id, topic, partition, shard)
        # 3.
        size, sha = store.upload_file(self.local_path, rel)
        os.unlink(self.local_path)
        # 4.
        return {
            "topic": topic,
            "partition": partition,
            "shard": shard,
            "path": rel,
            "rows": self.rows,
            "bytes": size,
            "sha256": sha,
        }
