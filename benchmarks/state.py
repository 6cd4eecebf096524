"""State store benchmark: restore rate, write overhead per record, bytes on disk per key.

``python -m benchmarks.state [--quick] [--json] [--key-order random|sorted]``. Rows:

1. Restore: a changelog partition of N records over K keys in random key order (8-byte counters, the
   envelope of ``docs/architecture.md``) restored into an empty store by
   ``StateManager.open_partition``, on today's plain write path (``bulk_restore=False``) and on the
   bulk path (``store.py``: bulk mode, ended by a flush; a learner's also by one compaction) in the
   same run; wall
   time includes the restore consumer's start-up and the read to the end of the partition. Learners
   catch up on both paths; the bulk one is promoted.
2. Write overhead: the engine (in this process, ``EngineRunner``) processing the same topic with a
   stateless no-op processor and with the per-key counting processor (one ``get`` + one ``put`` per
   record, each put also produced to the changelog and flushed before every commit); plus a
   micro-benchmark of ``view.get`` + ``view.put`` alone.
3. Bytes on disk per key after the restore (RocksDB files, memtables flushed), before and after a
   full compaction.
4. Restore from a snapshot (needs pyarrow; skipped without it): the same changelog is snapshotted
   (``SnapshotJob.run_in_process``: the Spark job's task code in this process, no Spark), a 1% tail
   is appended, then ``StateManager(snapshot_uri=...)`` restores it (``open_partition``) and a learner
   catches up from it, against a full replay of the same changelog + tail in the same run, each on
   the plain and the bulk path; every restored store must equal the plain replay.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, cast

from benchmarks._common import Column, Report, log, main, ratio
from benchmarks._data import broker_session, produce_zipf

__all__ = ["stateless_noop"]


@dataclass(frozen=True)
class Sizes:
    restore_records: int
    restore_keys: int
    engine_records: int
    engine_keys: int
    micro_ops: int
    random_key_order: bool = True  # the changelog's keys in random order (a real workload's), else sorted


FULL = Sizes(5_000_000, 1_000_000, 200_000, 10_000, 100_000)
QUICK = Sizes(400_000, 100_000, 20_000, 10_000, 10_000)


def stateless_noop(record: Any, ctx: Any) -> None:
    """The stateless reference processor: does nothing."""
    return None


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _produce_changelog(
    bootstrap: str, topic: str, records: int, keys: int, first: int = 0, shuffled: bool = False
) -> float:
    """Write ``records`` put envelopes over ``keys`` keys to partition 0, for source offsets
    ``first..first+records-1``; returns seconds. Record ``i`` writes key ``i % keys`` (the keys in
    sorted order, pass after pass) or, ``shuffled``, key ``perm[i % keys]`` of a fixed random
    permutation (the order of a real workload: RocksDB's inserts are then random)."""
    import random

    from confluent_kafka import Producer

    from multilane.formats.changelog import ChangelogCodec
    from multilane.formats.keyranges import key_hash

    p = Producer({
        "bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
        "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576, "enable.idempotence": True,
    })  # fmt: skip
    names = [b"key-%06d" % k for k in range(keys)]
    hashes = [key_hash(n) for n in names]
    order = list(range(keys))
    if shuffled:
        random.Random(keys).shuffle(order)
    t0 = time.perf_counter()
    for i in range(first, first + records):
        k = order[i % keys]
        value = ChangelogCodec.encode_put((i // keys + 1).to_bytes(8, "big"), i, hashes[k])
        while True:
            try:
                p.produce(topic, key=names[k], value=value, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(300):
        raise RuntimeError("changelog records left undelivered")
    return time.perf_counter() - t0


PATHS = (("plain", False), ("bulk", True))  # (name, StateManager(bulk_restore=...))


def _restore_once(
    bootstrap: str, group: str, workdir: str, name: str, bulk: bool, records: int, keys: int
) -> dict[str, Any]:
    """One full restore of ``restore-in[0]`` into an empty store; the keys are counted and checked."""
    from multilane.worker.state import StateManager

    sm = StateManager(os.path.join(workdir, f"restore-{name}"), bootstrap, group, bulk_restore=bulk)
    try:
        log(f"restore: restoring ({name} path)")
        t0, cpu0 = time.perf_counter(), _cpu_s()
        sm.open_partition("restore-in", 0, records, None)
        seconds, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
        store = sm.store("restore-in", 0)
        n_keys = sum(1 for _ in store.items())
        if n_keys != keys:
            raise RuntimeError(f"{name}: restored {n_keys} keys, expected {keys}")
        return {
            "sm": sm,
            "store": store,
            "seconds": seconds,
            "cpu_us": cpu * 1e6 / records,
            "keys": n_keys,
            "level0": store.level0_files(),
        }
    except BaseException:
        sm.close()
        raise


def _read_ceilings(bootstrap: str, topic: str, records: int) -> dict[str, tuple[float, float]]:
    """Read ``topic[0]`` to its end twice, writing nothing: once with a bare consumer configured as a
    changelog reader's (``reader_consumer_config``; every message touched, no field read), once
    through ``ChangelogReader.read`` (consume + decode, restore's reading hot path). Returns ``{row
    name: (seconds, CPU µs per record)}``."""
    from confluent_kafka import Consumer, TopicPartition

    from multilane.worker.state.reader import ChangelogReader, reader_consumer_config

    def consume_only() -> int:
        consumer = Consumer(reader_consumer_config(bootstrap, topic))
        try:
            consumer.assign([TopicPartition(topic, 0, 0)])
            n = 0
            while n < records:  # count records, skip error events (the end of the partition)
                n += sum(1 for m in consumer.consume(10_000, 0.03) if m.error() is None)
            return n
        finally:
            consumer.close()

    def consume_and_decode() -> int:
        reader = ChangelogReader(bootstrap, topic, 0, input_topic="restore-in")
        try:
            reader.seek(0)
            n = 0
            while n < records:
                n += reader.read(0.03).records
            return n
        finally:
            reader.close()

    out: dict[str, tuple[float, float]] = {}
    for what, read in (
        ("read only: Consumer.consume", consume_only),
        ("read only: consume + decode", consume_and_decode),
    ):
        log(f"restore: {what}")
        t0, cpu0 = time.perf_counter(), _cpu_s()
        n = read()
        seconds, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
        if n != records:
            raise RuntimeError(f"{what}: read {n:,} records, expected {records:,}")
        out[what] = (seconds, cpu * 1e6 / records)
    return out


def bench_restore(report: Report, bootstrap: str, sizes: Sizes, workdir: str) -> None:
    """Table 1 (today's plain write path and the bulk path on the same changelog, same run) and 3."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from multilane.worker.state.changelog import ChangelogTopicAdmin, changelog_topic_name

    group = f"bench-{uuid.uuid4().hex[:8]}"
    table = report.table(
        "restore",
        f"1. Restore from the changelog: {sizes.restore_records:,} records over {sizes.restore_keys:,} "
        f"keys in {'random' if sizes.random_key_order else 'sorted'} key order; today's plain write path "
        "vs the bulk path",
        [Column("what"), Column("records", fmt=",d"), Column("seconds", fmt=".2f"),
         Column("rate", "rec/s", ",.0f"), Column("cpu_us", "CPU µs/rec", ".2f"),
         Column("speedup", "rate ÷ plain", ".2f"), Column("cpu_ratio", "plain CPU ÷ this", ".2f"),
         Column("note")],
    )  # fmt: skip
    disk = report.table(
        "disk",
        "3. Bytes on disk per key (10-byte keys, 8-byte values)",
        [Column("when"), Column("keys", fmt=",d"), Column("bytes", fmt=",d"),
         Column("per_key", "bytes/key", ".1f")],
    )  # fmt: skip
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("restore-in", 1, 1)])["restore-in"].result(30)
    clt = changelog_topic_name(group, "restore-in")
    ChangelogTopicAdmin(bootstrap).ensure(clt, "restore-in")
    log(f"restore: producing {sizes.restore_records:,} changelog records")
    produce_s = _produce_changelog(
        bootstrap, clt, sizes.restore_records, sizes.restore_keys, shuffled=sizes.random_key_order
    )
    table.add(
        what="produce changelog (lz4)",
        records=sizes.restore_records,
        seconds=produce_s,
        rate=sizes.restore_records / produce_s,
    )
    ceilings = _read_ceilings(bootstrap, clt, sizes.restore_records)
    results: dict[str, dict[str, Any]] = {}
    for name, bulk in PATHS:
        r = results[name] = _restore_once(
            bootstrap, group, workdir, name, bulk, sizes.restore_records, sizes.restore_keys
        )
        r["sm"].close_partition("restore-in", 0, clean=True)
        r["sm"].close()
        plain = results["plain"]
        table.add(
            what=f"restore (open_partition, empty store), {name} path",
            records=sizes.restore_records,
            seconds=r["seconds"],
            rate=sizes.restore_records / r["seconds"],
            cpu_us=r["cpu_us"],
            speedup=ratio(plain["seconds"], r["seconds"]),
            cpu_ratio=ratio(plain["cpu_us"], r["cpu_us"]),
            note=f"{r['keys']:,} keys verified; {r['level0']} level-0 files after the restore"
            + ("; incl. the final flush (compaction left to the background)" if bulk else ""),
        )
    plain = results["plain"]
    for what, (seconds, cpu_us) in ceilings.items():
        table.add(
            what=what,
            records=sizes.restore_records,
            seconds=seconds,
            rate=sizes.restore_records / seconds,
            cpu_us=cpu_us,
            speedup=ratio(plain["seconds"], seconds),
            cpu_ratio=ratio(plain["cpu_us"], cpu_us),
            note="no filter, no store: the ceiling of any restore through confluent-kafka",
        )
    report.goal(
        "changelog restore rate, bulk ÷ plain path (same run)",
        ratio(results["plain"]["seconds"], results["bulk"]["seconds"]),
        5.0,
    )
    report.note(
        "The read-only rows bound every write path: a restore must at least consume (and decode) "
        "each changelog record. 'rate ÷ plain' of the consume-only row is the largest speed-up any "
        "restore through confluent-kafka in one process can reach on this machine."
    )
    store = results["bulk"]["store"]
    store.open()
    n_keys = results["bulk"]["keys"]
    flushed = store.disk_bytes()
    disk.add(when="after a bulk restore (flushed)", keys=n_keys, bytes=flushed,
             per_key=flushed / n_keys)  # fmt: skip
    store.compact()
    store.close()
    compacted = store.disk_bytes()
    disk.add(when="after full compaction", keys=n_keys, bytes=compacted, per_key=compacted / n_keys)
    from multilane.worker.state import StateManager

    sm = StateManager(os.path.join(workdir, "restore-bulk"), bootstrap, group)
    try:
        t0 = time.perf_counter()
        sm.open_partition("restore-in", 0, sizes.restore_records, None)
        table.add(
            what="reopen from a clean checkpoint",
            records=0,
            seconds=time.perf_counter() - t0,
            note="tails the changelog from the checkpoint offset",
        )
        sm.close_partition("restore-in", 0, clean=True)
    finally:
        sm.close()
    bench_promotion(table, bootstrap, group, sizes, workdir)
    bench_snapshot_restore(report, bootstrap, group, sizes, workdir)


def _equal_note(states: dict[str, dict[bytes, bytes]], name: str, reference: str) -> str:
    if name == reference:
        return f"{len(states[name]):,} keys (the reference)"
    return f"{len(states[name]):,} keys; equal to the {reference}: {states[name] == states[reference]}"


def bench_snapshot_restore(report: Report, bootstrap: str, group: str, sizes: Sizes, workdir: str) -> None:
    """Rows of table 4: snapshot + 1% tail vs full replay, plain and bulk write paths, through
    ``StateManager`` (steps 1-4).

    1. Snapshot the changelog (in process, no Spark), bounded at the committed offset.
    2. Append a 1% tail and commit it (the learner and the restore apply it).
    3. Full replay into an empty store (no snapshot URI) and restore with the snapshot URI, each on
       the plain and the bulk path; every store must equal the plain replay.
    4. A learner with the snapshot URI (bulk path): time to catch up.
    """
    from confluent_kafka import Consumer, TopicPartition

    from multilane.worker.state import StateManager
    from multilane.worker.state.changelog import changelog_topic_name

    n = sizes.restore_records
    table = report.table(
        "snapshot_restore",
        f"4. Restore from a snapshot + 1% tail vs full replay ({n:,} records, {sizes.restore_keys:,} keys), "
        "plain and bulk write paths",
        [Column("what"), Column("records", "changelog records read", fmt=",d"),
         Column("keys", "snapshot keys", fmt=",d"), Column("seconds", fmt=".2f"),
         Column("cpu_us", "CPU µs per record or row", ".2f"),
         Column("speedup", "plain replay ÷ this", ".1f"),
         Column("speedup_same", "replay ÷ this, same path", ".1f"), Column("note")],
    )  # fmt: skip
    try:
        from multilane.pipeline.job import SnapshotJob, SnapshotJobConfig
        from multilane.worker.state.snapshot import require_snapshot_support

        require_snapshot_support()
    except Exception as exc:
        table.add_unavailable(what="restore from snapshot", reason=str(exc))
        return
    # 1.
    uri = os.path.join(workdir, "snapshots")
    log("snapshot restore: snapshotting the changelog in process")
    t0 = time.perf_counter()
    result = SnapshotJob(
        SnapshotJobConfig(
            bootstrap=bootstrap, group=group, topics=("restore-in",), uri=uri,
            source_bounds={("restore-in", 0): n}, max_records_per_task=max(n // 2, 10_000),
        )
    ).run_in_process()  # fmt: skip
    table.add(
        what="snapshot job in process (no Spark)",
        records=result.records_read,
        keys=result.manifest.total_rows,
        seconds=time.perf_counter() - t0,
        note="the Spark tasks' code on one core; not part of a restore",
    )
    # 2.
    tail = max(n // 100, 1)
    changelog = changelog_topic_name(group, "restore-in")
    _produce_changelog(
        bootstrap, changelog, tail, sizes.restore_keys, first=n, shuffled=sizes.random_key_order
    )
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    committer.commit(offsets=[TopicPartition("restore-in", 0, n + tail)], asynchronous=False)
    committer.close()
    # 3.
    states: dict[str, dict[bytes, bytes]] = {}
    seconds: dict[str, float] = {}
    runs = [(f"{kind} {path}", kind, path, bulk) for kind in ("replay", "snapshot") for path, bulk in PATHS]
    for name, kind, path, bulk in runs:
        snap_uri = uri if kind == "snapshot" else None
        sm = StateManager(os.path.join(workdir, f"snap-{kind}-{path}"), bootstrap, group,
                          snapshot_uri=snap_uri, bulk_restore=bulk)  # fmt: skip
        try:
            log(f"snapshot restore: open_partition ({name})")
            t0, cpu0 = time.perf_counter(), _cpu_s()
            sm.open_partition("restore-in", 0, n + tail, None)
            seconds[name], cpu = time.perf_counter() - t0, _cpu_s() - cpu0
            states[name] = dict(sm.store("restore-in", 0).items())
            [st] = sm.learner_status()
        finally:
            sm.close()
        units = cast(int, st["records_read"]) + cast(int, st["snapshot_rows_loaded"])
        table.add(
            what=f"restore (open_partition), {'full replay' if kind == 'replay' else 'snapshot + tail'}, "
            f"{path} path",
            records=st["records_read"],
            keys=st["snapshot_rows_loaded"],
            seconds=seconds[name],
            cpu_us=cpu * 1e6 / max(units, 1),
            speedup=ratio(seconds["replay plain"], seconds[name]),
            speedup_same=ratio(seconds[f"replay {path}"], seconds[name]),
            note=_equal_note(states, name, "replay plain"),
        )
        if states[name] != states["replay plain"]:
            report.errors.append(f"{name} differs from the plain full replay")
    report.goal(
        f"snapshot + tail vs full replay at {n:,} records, bulk path (ratio)",
        ratio(seconds["replay bulk"], seconds["snapshot bulk"]),
        10.0,
    )
    report.goal(
        f"snapshot + tail (bulk path) vs today's full replay (plain path) at {n:,} records (ratio)",
        ratio(seconds["replay plain"], seconds["snapshot bulk"]),
        10.0,
    )
    # 4.
    learner = StateManager(os.path.join(workdir, "snap-learner"), bootstrap, group, snapshot_uri=uri)
    try:
        t0 = time.perf_counter()
        learner.learn("restore-in", 0)
        while not learner.learner_caught_up("restore-in", 0):
            if time.perf_counter() - t0 > 1800:
                raise TimeoutError("learner did not catch up in 1800 s")
            time.sleep(0.02)
        caught_up = time.perf_counter() - t0
        [st] = learner.learner_status()
        equal = dict(learner.store("restore-in", 0).items()) == states["replay plain"]
    finally:
        learner.close()
    table.add(
        what="learner catch-up from snapshot + tail (bulk path)",
        records=st["records_read"],
        keys=st["snapshot_rows_loaded"],
        seconds=caught_up,
        speedup=ratio(seconds["replay plain"], caught_up),
        speedup_same=ratio(seconds["replay bulk"], caught_up),
        note=f"equal to the replay: {equal} (compare with table 1's learner catch-up from the changelog)",
    )
    if not equal:
        report.errors.append("learner from snapshot + tail differs from the full replay")


def bench_promotion(table: Any, bootstrap: str, group: str, sizes: Sizes, workdir: str) -> None:
    """Learners restore the same changelog in the background (plain and bulk path); promotion of the
    bulk one then pauses for the catch-up of the tail only."""
    from confluent_kafka import Consumer, TopicPartition

    from multilane.worker.state import StateManager

    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    committer.commit(offsets=[TopicPartition("restore-in", 0, sizes.restore_records)], asynchronous=False)
    committer.close()
    caught: dict[str, float] = {}
    for name, bulk in PATHS:
        learner = StateManager(os.path.join(workdir, f"learner-{name}"), bootstrap, group, bulk_restore=bulk)
        try:
            t0, cpu0 = time.perf_counter(), _cpu_s()
            learner.learn("restore-in", 0)
            while not learner.learner_caught_up("restore-in", 0):
                if time.perf_counter() - t0 > 1800:
                    raise TimeoutError("learner did not catch up in 1800 s")
                time.sleep(0.05)
            caught[name] = time.perf_counter() - t0
            cpu = _cpu_s() - cpu0
            store = learner.store("restore-in", 0)
            table.add(
                what=f"learner catch-up (background), {name} path",
                records=sizes.restore_records,
                seconds=caught[name],
                rate=sizes.restore_records / caught[name],
                cpu_us=cpu * 1e6 / sizes.restore_records,
                speedup=ratio(caught["plain"], caught[name]),
                note=f"{store.level0_files()} level-0 files when caught up"
                + ("; incl. the final flush and compaction" if bulk else ""),
            )
            if not bulk:
                continue
            t0 = time.perf_counter()
            learner.open_partition("restore-in", 0, sizes.restore_records, None)
            table.add(
                what="promotion of the caught-up learner (bulk path)",
                records=0,
                seconds=time.perf_counter() - t0,
                note="the engine's pause: stop tail thread, fresh fetch to the end, apply held-back changes",
            )
            learner.close_partition("restore-in", 0, clean=True)
        finally:
            learner.close()


def _run_engine(bootstrap: str, topic: str, records: int, processor: Any, hooks: Any) -> dict[str, float]:
    from confluent_kafka import Consumer, TopicPartition

    from multilane.worker.config import EngineConfig
    from multilane.worker.engine import Engine
    from multilane.worker.runner import EngineRunner

    group = f"bench-{uuid.uuid4().hex[:8]}"
    cfg = EngineConfig(bootstrap_servers=bootstrap, group=group, operator_mode=True, assign=((topic, 0),),
                       factor=8, commit_interval_ms=200,
                       consumer_overrides={"fetch.queue.backoff.ms": "10"})  # fmt: skip
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    runner = EngineRunner(Engine(cfg, processor, hooks))
    try:
        runner.start(timeout=120)
        t0, cpu0 = time.perf_counter(), _cpu_s()
        deadline = t0 + 600
        while True:
            [tp] = probe.committed([TopicPartition(topic, 0)], timeout=10)
            if tp.offset >= records:
                break
            if time.perf_counter() > deadline:
                raise TimeoutError(f"committed {tp.offset} of {records} after 600 s")
            time.sleep(0.02)
        seconds, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    finally:
        runner.stop()
        probe.close()
    return {"seconds": seconds, "rate": records / seconds, "cpu_us": cpu * 1e6 / records}


def bench_overhead(report: Report, bootstrap: str, sizes: Sizes, workdir: str) -> None:
    from multilane.formats.keyranges import HASH_SPACE, KeyRange, key_hash
    from multilane.worker.state import StateManager
    from multilane.worker.state.examples import count_per_key

    table = report.table(
        "overhead",
        f"2. Write overhead: engine, key mode F=8, {sizes.engine_records:,} records, "
        f"Zipf(1.0) over {sizes.engine_keys:,} keys, one partition",
        [Column("processor"), Column("rate", "rec/s", ",.0f"), Column("cpu_us", "CPU µs/rec", ".2f"),
         Column("wall_us", "wall µs/rec", ".2f"), Column("note")],
    )  # fmt: skip
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("overhead-in", 1, 1)])["overhead-in"].result(30)
    data = produce_zipf(
        bootstrap, "overhead-in", sizes.engine_records, value_bytes=100, n_keys=sizes.engine_keys
    )
    log("overhead: stateless run")
    stateless = _run_engine(bootstrap, data.topic, data.records, stateless_noop, None)
    table.add(
        processor="stateless no-op",
        rate=stateless["rate"],
        cpu_us=stateless["cpu_us"],
        wall_us=1e6 / stateless["rate"],
    )
    log("overhead: stateful run")
    sm = StateManager(os.path.join(workdir, "engine"), bootstrap, f"bench-{uuid.uuid4().hex[:8]}")
    try:
        stateful = _run_engine(bootstrap, data.topic, data.records, count_per_key, sm)
    finally:
        sm.close()
    extra_wall = 1e6 / stateful["rate"] - 1e6 / stateless["rate"]
    table.add(
        processor="count_per_key (get + put)",
        rate=stateful["rate"],
        cpu_us=stateful["cpu_us"],
        wall_us=1e6 / stateful["rate"],
        note=f"+{extra_wall:.2f} µs wall, +{stateful['cpu_us'] - stateless['cpu_us']:.2f} µs CPU per record; "
        f"rate ÷ stateless {ratio(stateful['rate'], stateless['rate']):.2f}",
    )

    # micro: view.get + view.put alone (changelog produce included, flush at the end)
    admin.create_topics([NewTopic("micro-in", 1, 1)])["micro-in"].result(30)
    sm = StateManager(os.path.join(workdir, "micro"), bootstrap, f"bench-{uuid.uuid4().hex[:8]}")
    try:
        sm.open_partition("micro-in", 0, 0, None)
        full = KeyRange(0, HASH_SPACE)
        keys = [b"key-%d" % (i % sizes.engine_keys) for i in range(sizes.micro_ops)]
        t0, cpu0 = time.perf_counter(), _cpu_s()
        for i, k in enumerate(keys):
            v = sm.view("micro-in", 0, k, full, i, key_hash(k))
            raw = v.get()
            v.put((int.from_bytes(raw, "big") + 1 if raw else 1).to_bytes(8, "big"))
        sm.before_commit("micro-in", 0, sizes.micro_ops)
        seconds, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
        sm.close_partition("micro-in", 0, clean=True)
    finally:
        sm.close()
    table.add(
        processor="micro: view.get + view.put + flush",
        rate=sizes.micro_ops / seconds,
        cpu_us=cpu * 1e6 / sizes.micro_ops,
        wall_us=seconds * 1e6 / sizes.micro_ops,
        note="no engine; one thread",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--key-order",
        choices=("random", "sorted"),
        default="random",
        help="order of the keys in the changelog (default random; sorted is the order of the "
        "benchmark before issue 12, kind to RocksDB's inserts)",
    )


def body(args: argparse.Namespace, report: Report) -> None:
    sizes = QUICK if args.quick else FULL
    if args.key_order == "sorted":
        sizes = replace(sizes, random_key_order=False)
    report.params.update(sizes.__dict__)
    report.note(
        "Absolute rates depend on the machine's load (see the load average above); compare ratios "
        "measured in the same run."
    )
    workdir = tempfile.mkdtemp(prefix="multilane-bench-state-")
    try:
        with broker_session() as broker:
            bench_restore(report, broker.bootstrap, sizes, workdir)
            bench_overhead(report, broker.bootstrap, sizes, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main("state", "State store benchmark.", body, add_arguments))
