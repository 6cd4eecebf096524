"""The snapshot job: changelog topics -> merged, key-range-sharded Parquet snapshot, published atomically.

Does I/O: Kafka (driver and Spark tasks), the snapshot URI, a Spark session. The job runs on any Spark
master (``local[*]`` by default); see :class:`SnapshotJob` for its numbered steps.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from multilane.formats.keyranges import KeyRangeMap, key_hash
from multilane.pipeline.kafka_io import (
    ChangelogExtentProber,
    committed_offsets,
    consumer_config,
    partitions_of,
)
from multilane.pipeline.planning import (
    OffsetRange,
    OffsetRangePlanner,
    PartitionExtent,
    ShardPlanner,
    changelog_topic_name,
)
from multilane.pipeline.publish import CleanupReport, SnapshotPublisher
from multilane.pipeline.tasks import ROW, TAIL, read_ranges, write_shards
from multilane.snapshots.layout import SnapshotId
from multilane.snapshots.manifest import PartitionEntry, ShardFile, SnapshotManifest
from multilane.snapshots.storage import SnapshotStore

__all__ = ["SnapshotJob", "SnapshotJobConfig", "SnapshotResult", "spark_session"]

log = logging.getLogger(__name__)

"""Fault injection for tests: seconds to sleep after all data is written, before the manifest."""

SOURCE_BOUND_COMMITTED = "committed"
SOURCE_BOUND_NONE = "none"


@dataclass(frozen=True)
class SnapshotJobConfig:
    """What to snapshot and where.

    Invariants: ``topics`` non-empty; ``retain >= 1``; ``source_bound`` is ``"committed"`` (bound each
    partition by the group's committed offset of the input partition, see
    :mod:`multilane.pipeline.merge`) or ``"none"`` (cover the whole changelog); ``source_bounds``, when
    given, overrides both per ``(topic, partition)``.
    """

    bootstrap: str
    group: str
    topics: tuple[str, ...]
    uri: str
    layout: KeyRangeMap = field(default_factory=lambda: KeyRangeMap.even(1))
    partitions: tuple[int, ...] | None = None
    retain: int = 3
    max_records_per_task: int = 1_000_000
    source_bound: str = SOURCE_BOUND_COMMITTED
    source_bounds: Mapping[tuple[str, int], int] | None = None
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    staging_grace: timedelta = timedelta(hours=1)
    write_tasks: int | None = None
    idle_timeout_s: float = 60.0
    # Seconds to wait after the data is written and before the manifest is published, announcing
    # ``multilane-snapshot data-written <id>`` on stderr first: a test kills the job in that window.
    pause_before_publish_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.topics:
            raise ValueError("at least one topic is needed")
        if self.retain < 1:
            raise ValueError(f"retain must be >= 1, got {self.retain}")
        if self.source_bound not in (SOURCE_BOUND_COMMITTED, SOURCE_BOUND_NONE):
            raise ValueError(f"source_bound must be 'committed' or 'none', got {self.source_bound!r}")


@dataclass
class SnapshotResult:
    """A published snapshot, what cleanup deleted, and how long each phase took (seconds)."""

    manifest: SnapshotManifest
    cleanup: CleanupReport
    timings: dict[str, float]
    records_read: int

    def summary(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "snapshot_id": m.snapshot_id,
            "partitions": len(m.partitions),
            "rows": m.total_rows,
            "files": sum(len(p.files) for p in m.partitions),
            "records_read": self.records_read,
            "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
            "records_per_s": round(self.records_read / max(self.timings.get("total", 0.0), 1e-9), 1),
            "retired": self.cleanup.retired,
            "garbage": self.cleanup.garbage_data + self.cleanup.garbage_tmp,
        }


def spark_session(
    master: str = "local[*]", app_name: str = "multilane-snapshot", conf: Mapping[str, str] | None = None
) -> Any:
    """Get or create a Spark session for the job (a local master runs executors with this interpreter)."""
    from pyspark.sql import SparkSession

    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    defaults = {
        "spark.ui.enabled": "false",
        "spark.speculation": "false",  # a speculative duplicate would upload a shard twice
        "spark.python.worker.reuse": "true",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "8",
    }
    for k, v in {**defaults, **(conf or {})}.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


class SnapshotJob:
    """Builds one snapshot and publishes it.

    1. Plan (driver): list each changelog's partitions, find each one's ``[start, true end)``, read the
       source bounds, cut offset ranges (:class:`OffsetRangePlanner`), allocate the snapshot id.
    2. Read (Spark, one task per offset range): read the range with confluent-kafka and keep the newest
       change per key before the first uncommitted change (:func:`multilane.pipeline.merge.merge_range`),
       keyed by ``(topic, partition, shard, key_hash(key), key)``.
    3. Tails (driver): each partition's snapshot ``changelog_offset`` = the smallest tail of its ranges.
    4. Merge (Spark): drop changes at or past that offset; shuffle by (partition, shard) and sort by
       (key hash, key), so that a key's changes from every range are adjacent.
    5. Write (Spark): the newest change per key wins, keys whose newest change is a delete are dropped,
       and each non-empty shard becomes one Parquet file under ``data/<id>/`` (size, SHA-256 recorded).
    6. Publish (driver): data-folder manifest, then ``manifests/<id>.json`` (see
       :meth:`SnapshotPublisher.publish`); only now is the snapshot visible.
    7. Cleanup (driver): retention (newest ``retain`` kept, older retired manifest first), then
       garbage of killed jobs older than ``staging_grace``.
    """

    def __init__(self, config: SnapshotJobConfig) -> None:
        self.config = config
        self.kafka = consumer_config(config.bootstrap, config.kafka_config)
        self.store = SnapshotStore(config.uri)
        self.shards = ShardPlanner(config.layout)

    # -- 1. plan ----------------------------------------------------------------------------------------

    def plan_extents(self) -> list[PartitionExtent]:
        """Measure every changelog partition to snapshot (Kafka I/O on the driver)."""
        cfg = self.config
        out: list[PartitionExtent] = []
        prober = ChangelogExtentProber(self.kafka, timeout_s=cfg.idle_timeout_s)
        for topic in cfg.topics:
            changelog = changelog_topic_name(cfg.group, topic)
            available = partitions_of(self.kafka, changelog)
            parts = [p for p in available if cfg.partitions is None or p in cfg.partitions]
            bounds: Mapping[int, int | None]
            if cfg.source_bounds is not None:
                bounds = {p: cfg.source_bounds.get((topic, p)) for p in parts}
            elif cfg.source_bound == SOURCE_BOUND_COMMITTED:
                committed = committed_offsets(self.kafka, cfg.group, topic, parts)
                # Nothing committed: no change is known to be committed; the snapshot of that
                # partition is empty and restore replays its whole changelog.
                bounds = {p: (c if c is not None else 0) for p, c in committed.items()}
            else:
                bounds = dict.fromkeys(parts)
            for p, (start, end) in sorted(prober.probe(changelog, parts).items()):
                out.append(PartitionExtent(topic, changelog, p, start, end, bounds.get(p)))
        return out

    # -- run ----------------------------------------------------------------------------------------------

    def run(self, spark: Any, now: datetime | None = None) -> SnapshotResult:
        """Run steps 1-7 on ``spark`` (a SparkSession); returns the published snapshot."""
        cfg = self.config
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        sc = spark.sparkContext
        created = now or datetime.now(UTC)
        # 1.
        extents = self.plan_extents()
        ranges = OffsetRangePlanner(cfg.max_records_per_task, min_ranges=sc.defaultParallelism).plan(extents)
        snapshot_id = SnapshotId.new(created)
        timings["plan"] = time.perf_counter() - t0
        log.info("snapshot %s: %d partitions, %d offset ranges", snapshot_id, len(extents), len(ranges))

        # 2.-4. (Spark is lazy: the read runs when the tails are collected)
        t1 = time.perf_counter()
        tails, tail_records, live, read = self._read_and_merge(sc, ranges, extents)
        timings["read"] = time.perf_counter() - t1
        # 5.
        t2 = time.perf_counter()
        try:
            files = self._write(sc, live, snapshot_id)
        finally:
            read.unpersist()
        timings["merge_write"] = time.perf_counter() - t2

        return self._publish(snapshot_id, created, extents, tails, tail_records, files, timings, t0)

    def run_in_process(self, now: datetime | None = None) -> SnapshotResult:
        """Steps 1-7 without Spark: the read and write task functions run one after the other in this
        process (the same code the Spark tasks run, on one core). For small changelogs, tests and
        benchmarks that need a real snapshot without a Spark session; needs only confluent-kafka and
        pyarrow.
        """
        cfg = self.config
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        created = now or datetime.now(UTC)
        # 1.
        extents = self.plan_extents()
        ranges = OffsetRangePlanner(cfg.max_records_per_task, min_ranges=1).plan(extents)
        snapshot_id = SnapshotId.new(created)
        timings["plan"] = time.perf_counter() - t0
        # 2.
        t1 = time.perf_counter()
        read = list(read_ranges(self.kafka, cfg.idle_timeout_s, cfg.layout.to_list())(ranges))
        # 3.
        tails = {(e.topic, e.partition): e.end for e in extents}
        tail_records: dict[tuple[str, int], int] = dict.fromkeys(tails, 0)
        for item in read:
            if item[0] == TAIL:
                _tag, tp, tail, n = item
                if tail is not None:
                    tails[tp] = min(tails[tp], tail)
                tail_records[tp] += n
        # 4.
        kept = [
            (item[1], item[2])
            for item in read
            if item[0] == ROW and item[2].changelog_offset < tails[(item[1][0], item[1][1])]
        ]
        del read
        kept.sort(key=lambda kc: kc[0])
        timings["read"] = time.perf_counter() - t1
        # 5.
        t2 = time.perf_counter()
        files = list(write_shards(cfg.uri, snapshot_id)(kept))
        timings["merge_write"] = time.perf_counter() - t2
        return self._publish(snapshot_id, created, extents, tails, tail_records, files, timings, t0)

    def _publish(
        self,
        snapshot_id: str,
        created: datetime,
        extents: Sequence[PartitionExtent],
        tails: Mapping[tuple[str, int], int],
        tail_records: Mapping[tuple[str, int], int],
        files: Sequence[Mapping[str, Any]],
        timings: dict[str, float],
        t0: float,
    ) -> SnapshotResult:
        """Steps 6-7 (driver): publish the manifest atomically, then retention and garbage."""
        cfg = self.config
        manifest = self._manifest(snapshot_id, created, extents, tails, tail_records, files)
        pause = cfg.pause_before_publish_s
        if pause > 0:
            log.warning("snapshot %s: data written; pausing %.1fs before publishing", snapshot_id, pause)
            print(f"multilane-snapshot data-written {snapshot_id}", file=sys.stderr, flush=True)
            time.sleep(pause)
        # 6.
        t4 = time.perf_counter()
        publisher = SnapshotPublisher(self.store)
        publisher.publish(manifest)
        timings["publish"] = time.perf_counter() - t4
        # 7.
        t3 = time.perf_counter()
        cleanup = publisher.cleanup(cfg.retain, datetime.now(UTC), cfg.staging_grace, protect=(snapshot_id,))
        timings["cleanup"] = time.perf_counter() - t3
        timings["total"] = time.perf_counter() - t0
        return SnapshotResult(manifest, cleanup, timings, sum(tail_records.values()))

    def _read_and_merge(
        self, sc: Any, ranges: Sequence[OffsetRange], extents: Sequence[PartitionExtent]
    ) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int], Any, Any]:
        """Steps 2-4 up to the shuffle: returns tails, records read, the sorted kept changes, the cache."""
        from pyspark import StorageLevel

        cfg = self.config
        ends = {(e.topic, e.partition): e.end for e in extents}
        if not ranges:
            empty = sc.emptyRDD()
            return dict(ends), dict.fromkeys(ends, 0), empty, empty
        # 2.
        read = (
            sc.parallelize(list(ranges), len(ranges))
            .mapPartitions(read_ranges(self.kafka, cfg.idle_timeout_s, cfg.layout.to_list()))
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        # 3.
        tails = dict(ends)
        records: dict[tuple[str, int], int] = dict.fromkeys(ends, 0)
        for _tag, tp, tail, n in read.filter(lambda item: item[0] == TAIL).collect():
            if tail is not None:
                tails[tp] = min(tails[tp], tail)
            records[tp] += n
        # 4. (the newest-per-key reduction happens in the write tasks, on sorted input: one shuffle)
        bc = sc.broadcast(tails)
        n_shards = len(cfg.layout)
        tasks = max(1, cfg.write_tasks or 2 * sc.defaultParallelism)

        def before_tail(item: tuple[Any, ...]) -> bool:
            if item[0] != ROW:
                return False
            _tag, (topic, partition, _shard, _h, _key), change = item
            return bool(change.changelog_offset < bc.value[(topic, partition)])

        def shard_partition(k: tuple[str, int, int, int, bytes]) -> int:
            # Deterministic across processes (never Python's salted hash): partition-major shard number.
            return key_hash(k[0].encode()) + k[1] * n_shards + k[2]

        kept = (
            read.filter(before_tail)
            .map(lambda item: (item[1], item[2]))
            .repartitionAndSortWithinPartitions(numPartitions=tasks, partitionFunc=shard_partition)
        )
        return tails, records, kept, read

    def _write(self, sc: Any, kept: Any, snapshot_id: str) -> list[dict[str, Any]]:
        """Step 5: each write task merges its sorted changes and writes one file per shard."""
        files: list[dict[str, Any]] = kept.mapPartitions(write_shards(self.config.uri, snapshot_id)).collect()
        return files

    def _manifest(
        self,
        snapshot_id: str,
        created: datetime,
        extents: Sequence[PartitionExtent],
        tails: Mapping[tuple[str, int], int],
        records: Mapping[tuple[str, int], int],
        files: Sequence[Mapping[str, Any]],
    ) -> SnapshotManifest:
        by_partition: dict[tuple[str, int], list[ShardFile]] = {}
        seen: set[str] = set()
        for f in files:
            if f["path"] in seen:
                raise RuntimeError(f"shard file {f['path']} reported twice")
            seen.add(f["path"])
            by_partition.setdefault((f["topic"], f["partition"]), []).append(
                ShardFile(f["path"], self.shards.range_of(f["shard"]), f["rows"], f["bytes"], f["sha256"])
            )
        entries = []
        for e in extents:
            tp = (e.topic, e.partition)
            shard_files = sorted(by_partition.pop(tp, []), key=lambda s: s.key_range.start)
            entries.append(
                PartitionEntry(
                    topic=e.topic,
                    changelog_topic=e.changelog_topic,
                    partition=e.partition,
                    changelog_start=e.start,
                    changelog_end=e.end,
                    changelog_offset=tails.get(tp, e.end),
                    source_bound=e.source_bound,
                    rows=sum(s.rows for s in shard_files),
                    records_read=records.get(tp, 0),
                    files=tuple(shard_files),
                )
            )
        if by_partition:
            raise RuntimeError(f"files for unplanned partitions: {sorted(by_partition)}")
        return SnapshotManifest(
            snapshot_id=snapshot_id,
            created_at=created,
            group=self.config.group,
            layout=self.config.layout,
            partitions=tuple(entries),
            stats={"records_read": sum(records.values())},
        )
