"""Publishing, retention, garbage collection and reading on a local snapshot URI, without Spark or Kafka.

Data files are written by hand in the snapshot file format, so these tests exercise the same reader and
publisher code paths as the Spark job, fast.
"""

from __future__ import annotations

import hashlib
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from multilane.formats.keyranges import KeyRange, KeyRangeMap, key_hash
from multilane.pipeline.publish import PublishError, SnapshotPublisher
from multilane.snapshots.layout import SnapshotId, data_dir, manifest_path, shard_path
from multilane.snapshots.manifest import ManifestCodec, PartitionEntry, ShardFile, SnapshotManifest
from multilane.snapshots.reader import SnapshotGoneError, SnapshotReader, parquet_schema
from multilane.snapshots.storage import SnapshotStore, list_visible_ids

T0 = datetime(2026, 11, 22, 6, 0, tzinfo=UTC)


def write_snapshot(
    store: SnapshotStore,
    created: datetime,
    items: dict[bytes, bytes],
    offset: int = 100,
    bound: int | None = None,
) -> SnapshotManifest:
    """Write one partition's snapshot (F=2) as the job would, without publishing it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sid = SnapshotId.new(created)
    layout = KeyRangeMap.even(2)
    files = []
    for shard, key_range in enumerate(layout):
        rows = sorted((key_hash(k), k, v) for k, v in items.items() if key_hash(k) in key_range)
        if not rows:
            continue
        table = pa.table(
            {
                "key": [k for _, k, _ in rows],
                "value": [v for _, _, v in rows],
                "key_hash": [h for h, _, _ in rows],
                "changelog_offset": [1] * len(rows),
                "source_offset": [1] * len(rows),
            },
            schema=parquet_schema(),
        )
        buf = io.BytesIO()
        pq.write_table(table, buf)
        data = buf.getvalue()
        rel = shard_path(sid, "orders", 0, shard)
        store.write_bytes(rel, data)
        files.append(ShardFile(rel, key_range, len(rows), len(data), hashlib.sha256(data).hexdigest()))
    entry = PartitionEntry(
        "orders", "g.orders.changelog", 0, 0, offset, offset, bound, len(items), offset, tuple(files)
    )
    return SnapshotManifest(sid, created, "g", layout, (entry,))


def test_publish_makes_a_snapshot_visible_and_readable(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path))
    items = {b"k%d" % i: b"v%d" % i for i in range(50)}
    m = write_snapshot(store, T0, items)
    reader = SnapshotReader(str(tmp_path))
    assert reader.latest_covering("orders", 0) is None  # data alone is invisible
    SnapshotPublisher(store).publish(m)
    part = reader.latest_covering("orders", 0)
    assert part is not None and part.snapshot_id == m.snapshot_id and part.changelog_offset == 100
    assert dict(part.iter_items()) == items
    half = KeyRange(0, 2**31)
    assert dict(part.iter_key_range(half)) == {k: v for k, v in items.items() if key_hash(k) in half}
    odd = KeyRange(12345, 3 * 2**30)  # crosses the shard boundary
    assert dict(part.iter_key_range(odd)) == {k: v for k, v in items.items() if key_hash(k) in odd}
    assert (tmp_path / "data" / m.snapshot_id / "_manifest.json").read_bytes() == ManifestCodec.encode(m)
    assert reader.latest_covering("orders", 1) is None


def test_publish_refuses_missing_or_wrong_size_data(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path))
    m = write_snapshot(store, T0, {b"a": b"1", b"b": b"2"})
    Path(store.abs(m.partitions[0].files[0].path)).write_bytes(b"short")
    with pytest.raises(PublishError, match="size"):
        SnapshotPublisher(store).publish(m)
    assert list_visible_ids(store) == []


def test_reader_skips_temp_and_corrupt_manifests(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path))
    old = write_snapshot(store, T0, {b"a": b"old"})
    SnapshotPublisher(store).publish(old)
    new = write_snapshot(store, T0 + timedelta(minutes=1), {b"a": b"new"})
    store.write_bytes(f"manifests/{new.snapshot_id}.json.tmp-abcd", ManifestCodec.encode(new))
    part = SnapshotReader(str(tmp_path)).latest_covering("orders", 0)
    assert part is not None and part.snapshot_id == old.snapshot_id  # a temp manifest is not visible
    store.write_bytes(manifest_path(new.snapshot_id), ManifestCodec.encode(new)[:40])  # torn write
    reader = SnapshotReader(str(tmp_path))
    part = reader.latest_covering("orders", 0)
    assert part is not None and part.snapshot_id == old.snapshot_id
    with pytest.raises(ValueError, match="corrupt or truncated"):
        reader.manifest(new.snapshot_id)


def test_reader_passes_over_snapshots_bounded_above_the_committed_offset(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path))
    a = write_snapshot(store, T0, {b"a": b"1"}, bound=10)
    b = write_snapshot(store, T0 + timedelta(minutes=1), {b"a": b"2"}, bound=50)
    for m in (a, b):
        SnapshotPublisher(store).publish(m)
    reader = SnapshotReader(str(tmp_path))
    assert reader.latest_covering("orders", 0).snapshot_id == b.snapshot_id  # type: ignore[union-attr]
    assert reader.latest_covering("orders", 0, committed_offset=60).snapshot_id == b.snapshot_id  # type: ignore[union-attr]
    assert reader.latest_covering("orders", 0, committed_offset=20).snapshot_id == a.snapshot_id  # type: ignore[union-attr]
    assert reader.latest_covering("orders", 0, committed_offset=5) is None


def test_retention_deletes_manifest_first_and_garbage_after_grace(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path))
    publisher = SnapshotPublisher(store)
    published = []
    for i in range(4):
        m = write_snapshot(store, T0 + timedelta(minutes=i), {b"a": b"%d" % i})
        publisher.publish(m)
        published.append(m.snapshot_id)
    dead = write_snapshot(store, T0 + timedelta(minutes=10), {b"a": b"dead"})  # never published
    young = write_snapshot(store, T0 + timedelta(minutes=59), {b"a": b"young"})  # still being written
    store.write_bytes(f"manifests/{dead.snapshot_id}.json.tmp-1", b"{")

    report = publisher.cleanup(retain=2, now=T0 + timedelta(minutes=65), grace=timedelta(minutes=30))
    assert report.retired == [published[1], published[0]]
    assert report.garbage_data == [dead.snapshot_id]
    assert report.garbage_tmp == [f"{dead.snapshot_id}.json.tmp-1"]
    assert list_visible_ids(store) == published[2:]
    remaining = sorted(p.name for p in (tmp_path / "data").iterdir())
    assert remaining == sorted([*published[2:], young.snapshot_id])
    assert not (tmp_path / data_dir(published[0])).exists()

    # A reader holding a snapshot that is retired meanwhile gets a clear error, not wrong data.
    gone = SnapshotReader(str(tmp_path)).latest_covering("orders", 0)
    assert gone is not None
    publisher.retire(gone.snapshot_id)
    with pytest.raises(SnapshotGoneError):
        dict(gone.iter_items())
