"""Snapshot benchmark: restore from snapshot + changelog tail vs full changelog replay; snapshot job speed.

``python -m benchmarks.snapshot [--quick] [--json]``. For each size N (1M and 5M changelog records over
100,000 keys; ``--quick``: 50k and 200k over 10,000 keys), one changelog partition is written with
lz4 compression (as the state store's changelog writer does): 100-byte puts, 5% deletes (``D``
envelope + tombstone). Then:

1. the snapshot job (``SnapshotJob`` on ``local[2]``, F=4) snapshots it; its wall time excludes the
   Spark session start (reported once) and includes planning, read, merge, write and publish;
2. a tail of 1% more changes is appended (what a learner finds after the snapshot);
3. with Spark stopped, the partition's state is restored twice in this process: from the snapshot plus
   the tail (``restore_from_snapshot_and_tail``) and by replaying the whole changelog
   (``replay_changelog``); both states must be equal.

Goal: restore from snapshot + tail >= 5x faster than full replay at 5M records (a ratio measured in the
same run; the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import gc
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from benchmarks._common import Column, Report, log, main, ratio
from benchmarks._data import broker_session

GROUP = "bench"


@dataclass(frozen=True)
class Sizes:
    records: tuple[int, ...]
    keys: int


FULL = Sizes((1_000_000, 5_000_000), 100_000)
QUICK = Sizes((50_000, 200_000), 10_000)


def produce_changelog(bootstrap: str, topic: str, n: int, keys: int, seed: int, first_source: int) -> int:
    """Write ``n`` changes (95% puts of 100 bytes, 5% deletes + tombstone) to partition 0; returns the end."""
    from confluent_kafka import Producer

    from multilane.formats.keyranges import key_hash
    from multilane.pipeline.changes import DELETE, PUT, encode_envelope

    rng = random.Random(seed)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "acks": 1,
            "enable.idempotence": False,
        }
    )
    end = [0]
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        elif msg.offset() + 1 > end[0]:
            end[0] = msg.offset() + 1

    key_bytes = [b"key-%06d" % i for i in range(keys)]
    hashes = [key_hash(k) for k in key_bytes]
    payload = b"v" * 90

    def send(key: bytes, value: bytes | None) -> None:
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=0, on_delivery=on_delivery)
                return
            except BufferError:
                producer.poll(0.05)

    for i in range(n):
        k = rng.randrange(keys)
        src = first_source + i
        if rng.random() < 0.05:
            send(key_bytes[k], encode_envelope(DELETE, src, hashes[k]))
            send(key_bytes[k], None)
        else:
            send(key_bytes[k], encode_envelope(PUT, src, hashes[k], payload + b"%010d" % src))
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(300)
    if errors:
        raise RuntimeError(f"produce to {topic} failed: {errors[:3]}")
    return end[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default="local[2]", help="Spark master for the snapshot job")
    parser.add_argument("--factor", type=int, default=4, help="key-range shards per partition")


def body(args: argparse.Namespace, report: Report) -> None:
    from multilane.formats.keyranges import KeyRangeMap
    from multilane.pipeline.job import SnapshotJob, SnapshotJobConfig, spark_session
    from multilane.pipeline.restore import replay_changelog, restore_from_snapshot_and_tail

    sizes = QUICK if args.quick else FULL
    report.params.update(
        records=list(sizes.records), keys=sizes.keys, master=args.master, factor=args.factor, tail="1%"
    )
    jobs = report.table(
        "job",
        "Snapshot job (one changelog partition)",
        [
            Column("records", fmt=","),
            Column("rows", "snapshot rows", fmt=","),
            Column("files"),
            Column("seconds", "job s", fmt=".1f"),
            Column("rate", "records/s", fmt=",.0f"),
            Column("produce_s", "produce s", fmt=".1f"),
            Column("note"),
        ],
    )
    restores = report.table(
        "restore",
        "Restore of one partition: snapshot + tail vs full replay",
        [
            Column("records", fmt=","),
            Column("tail", "tail records", fmt=","),
            Column("snapshot_s", "snapshot+tail s", fmt=".2f"),
            Column("replay_s", "full replay s", fmt=".2f"),
            Column("speedup", "speed-up", fmt=".1f"),
            Column("keys", "keys restored", fmt=","),
            Column("equal", "states equal"),
            Column("note"),
        ],
    )
    root = tempfile.mkdtemp(prefix="multilane-bench-snapshot-")
    try:
        with broker_session() as broker:
            # 1. + 2. Produce, snapshot, append the tail (Spark up for this phase only).
            t = time.perf_counter()
            spark = spark_session(args.master, conf={"spark.default.parallelism": "2"})
            report.note(
                f"Spark session start ({args.master}): {time.perf_counter() - t:.1f} s (not in job s)"
            )
            topics: dict[int, tuple[str, str]] = {}
            try:
                for n in sizes.records:
                    topic = f"t{n}"
                    changelog = f"{GROUP}.{topic}.changelog"
                    broker.create_topic(changelog, 1)
                    log(f"producing {n:,} changes to {changelog}")
                    t = time.perf_counter()
                    produce_changelog(broker.bootstrap, changelog, n, sizes.keys, seed=n, first_source=0)
                    produce_s = time.perf_counter() - t
                    uri = f"{root}/{topic}"
                    config = SnapshotJobConfig(
                        bootstrap=broker.bootstrap,
                        group=GROUP,
                        topics=(topic,),
                        uri=uri,
                        layout=KeyRangeMap.even(args.factor),
                        source_bound="none",
                        max_records_per_task=max(n // 4, 10_000),
                    )
                    log(f"snapshot job over {n:,} records")
                    result = SnapshotJob(config).run(spark)
                    s = result.summary()
                    jobs.add(
                        records=result.records_read,
                        rows=s["rows"],
                        files=s["files"],
                        seconds=result.timings["total"],
                        rate=s["records_per_s"],
                        produce_s=produce_s,
                        note=" ".join(f"{k}={v:.1f}" for k, v in result.timings.items() if k != "total"),
                    )
                    tail = max(n // 100, 1)
                    produce_changelog(
                        broker.bootstrap, changelog, tail, sizes.keys, seed=n + 1, first_source=n
                    )
                    topics[n] = (topic, uri)
            finally:
                spark.stop()
            # 3. Restores, Spark stopped (pyarrow's Parquet reader imported first: not part of a restore).
            import pyarrow.parquet  # noqa: F401

            for n, (topic, uri) in topics.items():
                gc.collect()
                log(f"restore from snapshot + tail ({n:,})")
                snap = restore_from_snapshot_and_tail(
                    uri, bootstrap=broker.bootstrap, group=GROUP, topic=topic, partition=0
                )
                gc.collect()
                log(f"full replay ({n:,})")
                full = replay_changelog(bootstrap=broker.bootstrap, group=GROUP, topic=topic, partition=0)
                equal = snap.state == full.state
                speedup = ratio(full.timings["total"], snap.timings["total"])
                restores.add(
                    records=n,
                    tail=snap.tail_records,
                    snapshot_s=snap.timings["total"],
                    replay_s=full.timings["total"],
                    speedup=speedup,
                    keys=len(snap.state),
                    equal=equal,
                    note=f"snapshot read {snap.timings['snapshot']:.2f} s, tail {snap.timings['tail']:.2f} s",
                )
                if not equal:
                    report.errors.append(f"{n}: restored state differs from the replayed state")
                del snap, full
                if n == max(sizes.records):
                    report.goal(f"restore speed-up vs full replay at {n:,} records", speedup, 5.0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report.note(
        "Replay and tail are read with the same reader (confluent-kafka, assign) and decoded by the state "
        "store's codec; records = changelog records including the tombstones that follow deletes."
    )


if __name__ == "__main__":
    raise SystemExit(main("snapshot", "Snapshot benchmark.", body, add_arguments))
