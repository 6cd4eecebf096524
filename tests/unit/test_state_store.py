"""PartitionStore, KeyRangeStateView (range checks, JSON, write order) and checkpoints (local disk
only; the changelog producer is replaced by a recorder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from multilane.formats.changelog import ChangelogCodec, ChangeOp
from multilane.formats.keyranges import HASH_SPACE, KeyRange, KeyRangeMap, key_hash
from multilane.worker.state.apply import ApplyFilter
from multilane.worker.state.checkpoint import Checkpoint, CheckpointStore
from multilane.worker.state.errors import CheckpointError, StateError, StateKeyError
from multilane.worker.state.manager import checkpoint_usable
from multilane.worker.state.partition import ActivePartitionState
from multilane.worker.state.store import PartitionStore, partition_dir
from multilane.worker.state.view import KeyRangeStateView

FULL = KeyRange(0, HASH_SPACE)


class RecordingWriter:
    """Stands in for ChangelogWriter: records what would be produced."""

    def __init__(self, fail: bool = False) -> None:
        self.records: list[tuple[str, int, bytes, bytes | None]] = []
        self.fail = fail

    def produce(self, topic: str, partition: int, key: bytes, value: bytes | None) -> None:
        if self.fail:
            raise StateError("produce failed")
        self.records.append((topic, partition, key, value))

    def end_offset(self, topic: str, partition: int) -> int:
        return len(self.records)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = PartitionStore(partition_dir(tmp_path, "orders", 3)).open()
    yield s
    s.close()


def make_part(store: PartitionStore, writer: RecordingWriter, committed: int = 0) -> ActivePartitionState:
    return ActivePartitionState("orders", 3, "g.orders.changelog", store, writer, committed, set(), 0)  # type: ignore[arg-type]


def test_partition_dir_layout_and_validation(tmp_path: Path) -> None:
    assert partition_dir(tmp_path, "orders", 3) == tmp_path / "orders-3"
    for bad in ("../x", "a/b", "", ".."):
        with pytest.raises(ValueError):
            partition_dir(tmp_path, bad, 0)
    with pytest.raises(ValueError):
        partition_dir(tmp_path, "t", -1)


def test_store_put_get_delete_apply_and_reopen(store: PartitionStore) -> None:
    assert store.get(b"a") is None
    store.put(b"a", b"1")
    store.put(b"e", b"")
    assert store.get(b"a") == b"1" and store.get(b"e") == b""
    store.delete(b"a")
    assert store.get(b"a") is None
    assert store.apply([(b"x", b"1"), (b"y", b"2"), (b"x", None)]) == 3
    assert dict(store.items()) == {b"e": b"", b"y": b"2"}
    store.close()
    with pytest.raises(StateError, match="closed"):
        store.get(b"y")
    store.open()  # data survives a clean close (memtables flushed)
    assert store.get(b"y") == b"2"
    assert store.disk_bytes() > 0
    store.wipe()
    store.open()
    assert list(store.items()) == []


def test_view_writes_store_and_changelog_in_order(store: PartitionStore) -> None:
    w = RecordingWriter()
    part = make_part(store, w, committed=5)
    h = key_hash(b"user-1")
    v = KeyRangeStateView(part, b"user-1", FULL, 7, h)
    v.put(b"hello")
    v.put_json({"n": 1})
    assert v.get_json() == {"n": 1}
    v.delete()
    assert v.get() is None
    assert [r[2] for r in w.records] == [b"user-1"] * 4
    envs = [ChangelogCodec.decode(r[3]) for r in w.records]
    assert envs[0] is not None and envs[0].payload == b"hello" and envs[0].source_offset == 7
    assert envs[0].source_key_hash == h
    assert envs[2] is not None and envs[2].op is ChangeOp.DELETE
    assert envs[3] is None  # the tombstone follows its D envelope
    assert all(r[0] == "g.orders.changelog" and r[1] == 3 for r in w.records)
    assert part.above_commit_sources == {(7, h)}
    part.mark_committed(8)
    assert part.above_commit_sources == set()


def test_view_rejects_keys_outside_its_range(store: PartitionStore) -> None:
    lanes = KeyRangeMap.even(4)
    key = b"user-42"
    own = lanes[lanes.lane_of(key_hash(key))]
    other_key = next(b"k%d" % i for i in range(1000) if not own.contains(key_hash(b"k%d" % i)))
    w = RecordingWriter()
    v = KeyRangeStateView(make_part(store, w), key, own, 1, key_hash(key))
    v.put(b"mine")
    with pytest.raises(StateKeyError, match="outside this lane's key range"):
        v.put(b"x", key=other_key)
    with pytest.raises(StateKeyError, match="outside"):
        v.get(other_key)
    with pytest.raises(StateKeyError, match="outside"):
        v.delete(other_key)
    assert store.get(other_key) is None and len(w.records) == 1
    same_range = next(b"k%d" % i for i in range(10000) if own.contains(key_hash(b"k%d" % i)))
    v.put(b"ok", key=same_range)
    assert v.get(same_range) == b"ok"


def test_view_key_errors(store: PartitionStore) -> None:
    v = KeyRangeStateView(make_part(store, RecordingWriter()), None, FULL, 1, 99)
    with pytest.raises(StateKeyError, match="has no key"):
        v.get()
    with pytest.raises(StateKeyError, match="bytes"):
        v.get("text")  # type: ignore[arg-type]
    with pytest.raises(StateKeyError, match="empty"):
        v.put(b"x", key=b"")
    with pytest.raises(TypeError, match="bytes"):
        v.put("text", key=b"k")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="JSON"):
        v.put_json(object(), key=b"k")
    store.put(b"raw", b"\xff not json")
    with pytest.raises(StateError, match="not JSON"):
        v.get_json(b"raw")


def test_failed_produce_leaves_store_untouched(store: PartitionStore) -> None:
    v = KeyRangeStateView(make_part(store, RecordingWriter(fail=True)), b"k", FULL, 1, key_hash(b"k"))
    with pytest.raises(StateError):
        v.put(b"v")
    assert store.get(b"k") is None


def test_checkpoint_round_trip_and_corruption(tmp_path: Path) -> None:
    cs = CheckpointStore(tmp_path)
    assert cs.read() is None
    ck = Checkpoint(100, 40, ((41, 7), (50, 9)))
    cs.write(ck)
    assert cs.read() == ck
    cs.remove()
    assert cs.read() is None
    cs.path.write_text("{not json")
    with pytest.raises(CheckpointError):
        cs.read()
    cs.path.write_text('{"version": 99}')
    with pytest.raises(CheckpointError, match="version"):
        cs.read()
    with pytest.raises(CheckpointError):
        Checkpoint(10, 40, ((39, 1),))  # a listed source below the committed offset


class DoneSet:
    def __init__(self, done: set[tuple[int, int]]) -> None:
        self.done = done

    def is_done(self, offset: int, key_hash: int) -> bool:
        return (offset, key_hash) in self.done


def test_checkpoint_usable_rules() -> None:
    ck = Checkpoint(100, 40, ((41, 7),))
    assert checkpoint_usable(ck, ApplyFilter(42))[0]
    assert checkpoint_usable(ck, ApplyFilter(40, DoneSet({(41, 7)})))[0]
    ok, why = checkpoint_usable(ck, ApplyFilter(40))
    assert not ok and "not complete" in why
    ok, why = checkpoint_usable(ck, ApplyFilter(39, DoneSet({(41, 7)})))
    assert not ok and "behind" in why


def test_view_record_key_outside_the_lane_range_is_refused(store: PartitionStore) -> None:
    lanes = KeyRangeMap.even(2)
    key = b"user-42"
    other = lanes[1 - lanes.lane_of(key_hash(key))]
    v = KeyRangeStateView(make_part(store, RecordingWriter()), key, other, 1, key_hash(key))
    with pytest.raises(StateKeyError, match="outside"):
        v.put(b"x")
    with pytest.raises(StateKeyError, match="outside"):
        v.get(key)
    assert store.get(key) is None


def test_bulk_mode_marker_options_and_end(tmp_path: Path) -> None:
    s = PartitionStore(partition_dir(tmp_path, "orders", 3))
    s.begin_bulk()
    assert not s.marker_path.exists()  # created when the database opens
    s.open()
    assert s.bulk and s.marker_path.exists()
    # Another handle's view of the directory (as after a kill -9): the bulk load is unfinished.
    assert PartitionStore(s.directory).bulk_interrupted
    s.apply((b"k%06d" % i, b"v%d" % i) for i in range(50_000))
    s.apply([(b"k%06d" % 7, None)])
    s.end_bulk(compact=True)
    assert not s.bulk and not s.marker_path.exists()
    assert not PartitionStore(s.directory).bulk_interrupted
    assert s.level0_files() == 0  # flushed and compacted into one sorted level
    assert s.get(b"k%06d" % 8) == b"v8" and s.get(b"k%06d" % 7) is None
    assert sum(1 for _ in s.items()) == 49_999
    s.close()


def test_bulk_close_makes_writes_durable_and_reopen_continues_the_bulk_load(tmp_path: Path) -> None:
    s = PartitionStore(partition_dir(tmp_path, "orders", 3))
    s.begin_bulk()
    s.open()
    s.apply([(b"a", b"1"), (b"b", b"2")])
    s.close()  # flushes: the writes are on disk, so the marker goes
    assert not s.marker_path.exists() and s.bulk
    s.open()  # still a bulk load: marker and bulk options again
    assert s.marker_path.exists()
    assert s.get(b"a") == b"1"
    s.wipe()  # a wipe removes the marker with the database
    assert not s.marker_path.exists() and not s.db_path.exists()
    s.open()
    assert s.get(b"a") is None and s.marker_path.exists()
    s.end_bulk(compact=False)
    assert not s.marker_path.exists()
    s.destroy()
    assert not s.directory.exists()


def test_put_all_writes_rows_and_rejects_mismatched_lengths(store: PartitionStore) -> None:
    assert store.put_all([b"a", b"b"], [b"1", b"2"]) == 2
    assert store.get(b"a") == b"1" and store.get(b"b") == b"2"
    assert store.put_all([], []) == 0
    with pytest.raises(ValueError):
        store.put_all([b"c"], [])
    assert store.get(b"c") is None
