"""The snapshot job end to end on Spark (local[2]) and the embedded broker.

One SparkSession for the module; one test in the default suite (the end-to-end path), the others
``slow``. The job's logic without Spark (same task code, in process) is tested in
``test_snapshot_inprocess.py``. Changelogs are generated with overwrites, deletes (``D`` envelope +
tombstone), lone tombstones and, for the bounded case, changes of uncommitted input records; every
result is compared with the state rebuilt by replaying the changelog (an oracle written out here).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from multilane.formats.keyranges import KeyRangeMap, key_hash
from multilane.pipeline.changes import encode_envelope
from multilane.pipeline.job import SnapshotJob, SnapshotJobConfig
from multilane.pipeline.restore import replay_changelog, restore_from_snapshot_and_tail
from multilane.snapshots.layout import DATA_DIR, MANIFESTS_DIR
from multilane.snapshots.reader import SnapshotCorruptError, SnapshotReader
from multilane.testing.broker import EmbeddedBroker

pytestmark = [pytest.mark.spark, pytest.mark.broker]

Record = tuple[bytes, str, int, bytes]  # key, kind (P, D, T = lone tombstone), source offset, payload


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    from multilane.pipeline.job import spark_session

    existing = SparkSession.getActiveSession()  # another module's session: reuse it, leave it running
    # C1-only JIT and the serial GC start the JVM ~30% faster; fine for the small jobs of tests.
    fast_jvm = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    session = spark_session(
        "local[2]", conf={"spark.default.parallelism": "2", "spark.driver.extraJavaOptions": fast_jvm}
    )
    try:
        yield session
    finally:
        if existing is None:
            session.stop()


def oracle(records: list[Record], committed: int | None = None) -> dict[bytes, bytes]:
    """Replay semantics written out independently: newest applicable change per key, deletes remove."""
    state: dict[bytes, bytes] = {}
    prev: tuple[bytes, str] | None = None
    for key, kind, src, payload in records:
        if kind == "T":
            if prev != (key, "D"):
                state.pop(key, None)
        elif committed is None or src < committed:
            if kind == "P":
                state[key] = payload
            else:
                state.pop(key, None)
        prev = (key, kind)
    return state


def generate(rng: random.Random, n: int, keys: int, first_source: int = 0) -> list[Record]:
    """``n`` changes over ``keys`` keys: 70% puts, 20% deletes (+ tombstone), 10% lone tombstones."""
    out: list[Record] = []
    for i in range(n):
        key = b"key-%d" % rng.randrange(keys)
        src = first_source + i
        roll = rng.random()
        if roll < 0.7:
            out.append((key, "P", src, b"v-%d-%d" % (src, rng.randrange(1000))))
        elif roll < 0.9:
            out.append((key, "D", src, b""))
            out.append((key, "T", -1, b""))
        else:
            out.append((key, "T", -1, b""))
    return out


def produce(broker: EmbeddedBroker, topic: str, partition: int, records: list[Record]) -> int:
    """Write ``records`` to one changelog partition; returns the end offset (from delivery reports)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    ends: list[int] = []
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            ends.append(msg.offset() + 1)

    for key, kind, src, payload in records:
        value = None if kind == "T" else encode_envelope(kind, src, key_hash(key), payload)
        producer.produce(topic, key=key, value=value, partition=partition, on_delivery=on_delivery)
    producer.flush(30)
    assert not errors and len(ends) == len(records)
    return max(ends, default=0)


def job_config(broker: EmbeddedBroker, group: str, uri: str, **kw: Any) -> SnapshotJobConfig:
    base: dict[str, Any] = {
        "bootstrap": broker.bootstrap,
        "group": group,
        "topics": ("orders",),
        "uri": uri,
        "source_bound": "none",
        "max_records_per_task": 250,
        "idle_timeout_s": 20.0,
    }
    base.update(kw)
    return SnapshotJobConfig(**base)


def test_snapshot_equals_replay_then_restore_from_snapshot_and_tail(
    spark: Any, broker: EmbeddedBroker, topic_name: str, tmp_path: Path
) -> None:
    group, uri = topic_name, str(tmp_path / "snapshots")
    changelog = f"{group}.orders.changelog"
    broker.create_topic(changelog, 2)
    rng = random.Random(6)
    records = {p: generate(rng, 400 + 100 * p, keys=60) for p in (0, 1)}
    ends = {p: produce(broker, changelog, p, records[p]) for p in (0, 1)}

    # 1. Snapshot the whole changelog, sharded by F=4: it equals the replayed state.
    result = SnapshotJob(job_config(broker, group, uri, layout=KeyRangeMap.even(4))).run(spark)
    reader = SnapshotReader(uri)
    assert reader.snapshot_ids() == [result.manifest.snapshot_id]
    for p in (0, 1):
        part = reader.latest_covering("orders", p)
        assert part is not None
        assert part.changelog_offset == part.changelog_end == ends[p]
        expected = oracle(records[p])
        assert expected, "the generated changelog must leave some keys"
        assert dict(part.iter_items()) == expected
        assert part.rows == len(expected)
        # Every shard holds exactly the keys of its range, sorted by key hash.
        for key_range in KeyRangeMap.even(4):
            got = dict(part.iter_key_range(key_range))
            assert got == {k: v for k, v in expected.items() if key_hash(k) in key_range}
        rows = list(part.iter_rows())
        assert all(r["key_hash"] == key_hash(r["key"]) and r["changelog_offset"] < ends[p] for r in rows)
    assert reader.latest_covering("orders", 2) is None
    assert result.records_read == sum(len(r) for r in records.values())

    # 2. More changes arrive after the snapshot: snapshot + tail == replay of everything.
    more = generate(rng, 150, keys=60, first_source=10_000)
    produce(broker, changelog, 0, more)
    restored = restore_from_snapshot_and_tail(
        uri, bootstrap=broker.bootstrap, group=group, topic="orders", partition=0
    )
    replayed = replay_changelog(bootstrap=broker.bootstrap, group=group, topic="orders", partition=0)
    assert restored.snapshot_id == result.manifest.snapshot_id
    assert restored.tail_from == ends[0] and restored.tail_records == len(more)
    assert restored.state == replayed.state == oracle(records[0] + more)

    # 3. Reshard to another layout (3 ranges) with source bounds: the snapshot stops at the first change
    #    of an uncommitted input record; restore with the committed offset still equals replay.
    bound = 300
    bounded = SnapshotJob(
        job_config(
            broker,
            group,
            uri,
            layout=KeyRangeMap.even(3),
            source_bounds={("orders", 0): bound, ("orders", 1): 10**9},
        )
    ).run(spark)
    assert bounded.manifest.factor == 3
    entry = bounded.manifest.partition("orders", 0)
    assert entry is not None
    all_records = records[0] + more
    first_uncommitted = next(i for i, r in enumerate(all_records) if r[1] != "T" and r[2] >= bound)
    assert entry.changelog_offset == first_uncommitted < entry.changelog_end
    for committed in (bound, bound + 57, 20_000):
        at_commit = restore_from_snapshot_and_tail(
            uri,
            bootstrap=broker.bootstrap,
            group=group,
            topic="orders",
            partition=0,
            committed_offset=committed,
        )
        assert at_commit.snapshot_id == bounded.manifest.snapshot_id
        assert at_commit.state == oracle(all_records, committed)
    # A restore whose committed offset is below the bound must not use that snapshot.
    older = SnapshotReader(uri).latest_covering("orders", 0, committed_offset=bound - 1)
    assert older is not None and older.snapshot_id == result.manifest.snapshot_id

    # 4. A corrupted data file is refused, not silently used.
    victim = tmp_path / "snapshots" / entry.files[0].path
    victim.write_bytes(victim.read_bytes()[:-1] + b"\x00")
    part0 = SnapshotReader(uri).latest_covering("orders", 0)
    assert part0 is not None
    with pytest.raises(SnapshotCorruptError):
        dict(part0.iter_items())


@pytest.mark.slow
def test_job_killed_before_publishing_leaves_nothing_visible(
    spark: Any, broker: EmbeddedBroker, topic_name: str, tmp_path: Path
) -> None:
    group, uri = topic_name, str(tmp_path / "snapshots")
    changelog = f"{group}.orders.changelog"
    broker.create_topic(changelog, 1)
    broker.create_topic("orders", 1)  # the input topic, for the group's committed offset
    records = generate(random.Random(7), 300, keys=40)
    produce(broker, changelog, 0, records)
    _commit(broker, group, "orders", 0, 10**6)

    # 1. Run the CLI in a subprocess that pauses after writing all data; SIGKILL it there.
    cmd = [
        sys.executable, "-m", "multilane", "snapshot", "--pause-before-publish-s", "120",
        "--bootstrap-servers", broker.bootstrap,
        "--group", group, "--topic", "orders", "--uri", uri, "--master", "local[1]", "--factor", "2",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 150
        for line in proc.stderr:
            if "multilane-snapshot data-written" in line or time.monotonic() > deadline:
                break
        assert proc.poll() is None, "the job ended before it could be killed"
        written = list((tmp_path / "snapshots" / DATA_DIR).rglob("*.parquet"))
        assert written, "the job should have written its data files"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    reader = SnapshotReader(uri)
    assert reader.snapshot_ids() == []
    assert reader.latest_covering("orders", 0) is None
    assert not list((tmp_path / "snapshots" / MANIFESTS_DIR).glob("*.json"))

    # 2. A later run publishes, removes the killed job's leftovers (grace 0), and applies retention.
    config = job_config(broker, group, uri, source_bound="committed", staging_grace=timedelta(0), retain=1)
    first = SnapshotJob(config).run(spark)
    assert len(first.cleanup.garbage_data) == 1
    part = SnapshotReader(uri).latest_covering("orders", 0, committed_offset=10**6)
    assert part is not None and dict(part.iter_items()) == oracle(records)
    second = SnapshotJob(config).run(spark)
    assert second.cleanup.retired == [first.manifest.snapshot_id]
    assert SnapshotReader(uri).snapshot_ids() == [second.manifest.snapshot_id]
    assert sorted(p.name for p in (tmp_path / "snapshots" / DATA_DIR).iterdir()) == [
        second.manifest.snapshot_id
    ]


@pytest.mark.slow
def test_run_local_snapshot_runs_the_cronjob_command(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path
) -> None:
    from multilane.pipeline.local import run_local_snapshot

    group = topic_name
    broker.create_topic(f"{group}.orders.changelog", 1)
    records = generate(random.Random(9), 200, keys=30)
    produce(broker, f"{group}.orders.changelog", 0, records)
    pc = {
        "metadata": {"name": "demo"},
        "spec": {
            "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "consumerGroup": group},
            "workload": {"image": "example/app:1"},
            "state": {"enabled": True, "snapshot": {"uri": "s3://elsewhere", "schedule": "", "retention": 2}},
        },
    }
    run = run_local_snapshot(
        pc,
        bootstrap_servers=broker.bootstrap,
        uri=str(tmp_path),
        master="local[1]",
        extra_args=["--source-bound", "none"],
        timeout_s=300,
    )
    assert run.ok, run.stderr_tail
    part = SnapshotReader(str(tmp_path)).latest_covering("orders", 0)
    assert part is not None and part.snapshot_id == run.snapshot_id
    assert dict(part.iter_items()) == oracle(records)


def _commit(broker: EmbeddedBroker, group: str, topic: str, partition: int, offset: int) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        consumer.commit(offsets=[TopicPartition(topic, partition, offset)], asynchronous=False)
    finally:
        consumer.close()
