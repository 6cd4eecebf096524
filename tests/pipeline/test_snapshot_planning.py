"""Pure planning of snapshot jobs: offset ranges, key-range shards, layouts, ids, retention, garbage."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilane.formats.keyranges import HASH_SPACE, KeyRangeMap
from multilane.pipeline.planning import (
    OffsetRange,
    OffsetRangePlanner,
    PartitionExtent,
    ShardPlanner,
    changelog_topic_name,
    parse_ranges,
)
from multilane.pipeline.retention import RetentionPlanner, StagingGarbagePlanner
from multilane.snapshots.layout import SnapshotId, parse_manifest_name, shard_path


def extent(p: int, start: int, end: int, bound: int | None = None) -> PartitionExtent:
    return PartitionExtent("orders", "g.orders.changelog", p, start, end, bound)


# -- offset ranges ---------------------------------------------------------------------------------------


def test_ranges_split_evenly_and_cover_the_extent() -> None:
    ranges = OffsetRangePlanner(max_records=4).plan([extent(0, 10, 20, bound=7)])
    assert [(r.start, r.end) for r in ranges] == [(10, 13), (13, 16), (16, 20)]
    assert all(r.source_bound == 7 and r.partition == 0 for r in ranges)


def test_empty_partition_has_no_range() -> None:
    assert OffsetRangePlanner(max_records=4).plan([extent(0, 5, 5)]) == []


def test_min_ranges_cuts_small_changelogs_in_proportion() -> None:
    ranges = OffsetRangePlanner(max_records=1000, min_ranges=4).plan([extent(0, 0, 30), extent(1, 0, 10)])
    per_partition = [sum(1 for r in ranges if r.partition == p) for p in (0, 1)]
    assert per_partition == [3, 1]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 200)), min_size=1, max_size=5),
    st.integers(1, 40),
    st.integers(1, 8),
)
def test_ranges_tile_each_extent(spans: list[tuple[int, int]], max_records: int, min_ranges: int) -> None:
    extents = [extent(p, s, s + n) for p, (s, n) in enumerate(spans)]
    ranges = OffsetRangePlanner(max_records, min_ranges).plan(extents)
    for e in extents:
        mine = [r for r in ranges if r.partition == e.partition]
        if e.records == 0:
            assert mine == []
            continue
        assert mine[0].start == e.start and mine[-1].end == e.end
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
        sizes = [r.end - r.start for r in mine]
        assert max(sizes) - min(sizes) <= 1
        assert max(sizes) <= max_records or len(mine) == e.records


def test_invalid_extents_and_ranges_are_rejected() -> None:
    with pytest.raises(ValueError, match="start <= end"):
        extent(0, 5, 4)
    with pytest.raises(ValueError, match="start < end"):
        OffsetRange("t", "g.t.changelog", 0, 3, 3)
    with pytest.raises(ValueError, match="source bound"):
        extent(0, 0, 1, bound=-1)
    with pytest.raises(ValueError):
        OffsetRangePlanner(max_records=0)


# -- shards and layouts ----------------------------------------------------------------------------------


def test_shard_planner_maps_hashes_to_layout_ranges() -> None:
    planner = ShardPlanner(KeyRangeMap.even(4))
    assert planner.shards_per_partition == 4
    assert [planner.shard_of(h) for h in (0, HASH_SPACE // 4 - 1, HASH_SPACE // 4, HASH_SPACE - 1)] == [
        0,
        0,
        1,
        3,
    ]
    assert planner.factor() == 4
    assert ShardPlanner(parse_ranges("0:10,10:4294967296")).factor() is None


def test_parse_ranges_accepts_a_tiling_and_rejects_gaps() -> None:
    layout = parse_ranges(f"0:{HASH_SPACE // 2}, {HASH_SPACE // 2}:{HASH_SPACE}")
    assert layout == KeyRangeMap.even(2)
    with pytest.raises(ValueError, match="contiguous"):
        parse_ranges(f"0:10,11:{HASH_SPACE}")
    with pytest.raises(ValueError, match="START:END"):
        parse_ranges("0-10")


def test_changelog_topic_name() -> None:
    assert changelog_topic_name("app", "orders") == "app.orders.changelog"


# -- ids and paths ---------------------------------------------------------------------------------------


def test_snapshot_ids_sort_by_time_and_round_trip() -> None:
    t = datetime(2026, 11, 22, 6, 11, 29, 123456, tzinfo=UTC)
    sid = SnapshotId.new(t, nonce="0a1b2c3d")
    assert sid == "snap-20261122T061129123Z-0a1b2c3d"
    assert SnapshotId.created_at(sid) == t.replace(microsecond=123000)
    later = SnapshotId.new(t + timedelta(milliseconds=1))
    assert sorted([later, sid]) == [sid, later]
    with pytest.raises(ValueError):
        SnapshotId.created_at("snap-garbage")
    with pytest.raises(ValueError, match="timezone"):
        SnapshotId.new(datetime(2026, 1, 1))


def test_manifest_names_and_shard_paths() -> None:
    sid = "snap-20261122T061129123Z-0a1b2c3d"
    assert parse_manifest_name(f"{sid}.json") == (sid, False)
    assert parse_manifest_name(f"{sid}.json.tmp-00ff") == (sid, True)
    assert parse_manifest_name("notes.txt") is None
    assert parse_manifest_name("snap-bad.json") is None
    assert shard_path(sid, "orders", 3, 1) == f"data/{sid}/orders/3/shard-00001.parquet"
    with pytest.raises(ValueError):
        shard_path(sid, "../x", 0, 0)


# -- retention and garbage -------------------------------------------------------------------------------


def _ids(n: int, start: datetime) -> list[str]:
    return [SnapshotId.new(start + timedelta(minutes=i), nonce=f"{i:08x}") for i in range(n)]


def test_retention_keeps_the_newest_n() -> None:
    ids = _ids(5, datetime(2026, 1, 1, tzinfo=UTC))
    plan = RetentionPlanner(2).plan(reversed(ids))
    assert plan.keep == (ids[4], ids[3])
    assert plan.delete == (ids[2], ids[1], ids[0])


def test_retention_never_deletes_a_protected_snapshot_and_rejects_zero() -> None:
    ids = _ids(3, datetime(2026, 1, 1, tzinfo=UTC))
    plan = RetentionPlanner(1).plan(ids, protect=[ids[0]])
    assert set(plan.keep) == {ids[2], ids[0]} and plan.delete == (ids[1],)
    with pytest.raises(ValueError):
        RetentionPlanner(0)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 12), st.integers(1, 6))
def test_retention_partitions_the_ids(n: int, retain: int) -> None:
    ids = _ids(n, datetime(2026, 1, 1, tzinfo=UTC))
    plan = RetentionPlanner(retain).plan(ids)
    assert sorted(plan.keep + plan.delete) == sorted(ids)
    assert len(plan.keep) == min(n, retain)
    assert all(k > d for k in plan.keep for d in plan.delete)


def test_garbage_is_unpublished_and_older_than_the_grace() -> None:
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    old, young, published = (
        SnapshotId.new(now - timedelta(hours=2), nonce="00000001"),
        SnapshotId.new(now - timedelta(minutes=5), nonce="00000002"),
        SnapshotId.new(now - timedelta(hours=3), nonce="00000003"),
    )
    gc = StagingGarbagePlanner(timedelta(hours=1))
    assert gc.data_garbage([old, young, published, "lost+found"], [published], now) == [old]
    assert gc.tmp_garbage([(f"{old}.json.tmp-1", old), (f"{young}.json.tmp-2", young)], now) == [
        f"{old}.json.tmp-1"
    ]
