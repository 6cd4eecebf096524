"""Handoff benchmark: the longest processing pause of a partition that moves during a scale-up,
restore-before-handoff vs eager handoff, as the partition's state grows (10k, 1M, 5M keys; ``--quick``:
10k and 100k).

Does I/O: its own embedded broker, worker subprocesses on the local platform, files under a temp dir.

Per state size N and mode (one fresh topic/group each; steps in :func:`_scenario`):

1. Seed: the moving partition's changelog holds N keys (written directly in the changelog format,
   every change from source offset 0), the group's committed offset is 1, so a new owner must restore
   N keys before it may process.
2. One worker (factor 2, ~1 ms of async work per record) owns both partitions; constant load of
   ``--rate`` records/s per partition.
3. Scale to 2 replicas. ``restore-before-handoff``: the local control plane's ``HandoffExecutor``
   (the new worker learns the partition, then the old owner releases it, then the new one is
   promoted). ``eager``: the controller's release-then-grant (the new owner restores after it took
   the partition over).
4. Stop the load and wait until every produced record was processed; stop the workers.
5. The pause = the longest gap between consecutive completed records of the moved partition from
   the scale-up to the end of the run (from the processing log), and, for restore-before-handoff, the
   control plane's own figure (release call to end of the promotion call).
6. Checks: the delivery checkers (at-least-once, per-key order, no concurrent work on a key) over the
   processing log, and each partition's store on its final owner equals the reference counts (the N
   seeded keys at 1, plus the load's records per key).

Goals: restore-before-handoff under 0.5 s at every size and flat as the state grows (the promotion does
not depend on the state's size: the learner's store is handed over open, its bulk load already flushed
and compacted), while the eager pause grows with the restore it waits for.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import random
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks._common import Column, Report, log, main, ratio
from benchmarks._data import broker_session

SIZES_FULL = (10_000, 1_000_000, 5_000_000)
SIZES_QUICK = (10_000, 100_000)
MODES = ("restore-before-handoff", "eager")
EAGER_GOAL_MIN_KEYS = 1_000_000  # below this an eager restore is too short for the "what it saves" goal


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=100.0, help="records/s per partition during the run")
    parser.add_argument("--sizes", default="", help="comma-separated key counts (default 10k,1M,5M)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes to run")
    parser.add_argument("--keep", default="", help="keep worker logs in this directory")


def _seed(bootstrap: str, topic: str, group: str, moving: int, keys: int) -> None:
    """Step 1: one input record per partition, N changelog keys for ``moving``, committed offset 1."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from multilane.formats.changelog import ChangelogCodec
    from multilane.formats.keyranges import key_hash
    from multilane.worker.state.changelog import changelog_topic_name
    from multilane.worker.state.examples import encode_count

    clt = changelog_topic_name(group, topic)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(topic, num_partitions=2, replication_factor=-1),
            NewTopic(clt, num_partitions=2, replication_factor=-1),
        ]
    )
    for f in futures.values():
        f.result(15)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 100_000,
            "queue.buffering.max.messages": 2_000_000,
            "compression.type": "lz4",
        }
    )
    for p in (0, 1):
        producer.produce(topic, key=b"seed", value=b"seed", partition=p)
    value = encode_count(1)
    order = list(range(keys))
    random.Random(keys).shuffle(order)  # a real workload's key order: random inserts into RocksDB
    for n, i in enumerate(order):
        key = b"state-%08d" % i
        envelope = ChangelogCodec.encode_put(value, 0, key_hash(key))
        while True:
            try:
                producer.produce(clt, key=key, value=envelope, partition=moving)
                break
            except BufferError:
                producer.poll(0.05)
        if n % 50_000 == 0:
            producer.poll(0)
    if producer.flush(600):
        raise RuntimeError("seed records left undelivered")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, p, 1) for p in (0, 1)], asynchronous=False)
    consumer.close()


def _gap(events: list[Any], topic: str, partition: int, since: float) -> float | None:
    times = sorted(
        e.time for e in events if e.kind == "end" and e.topic == topic and e.partition == partition
    )
    best = None
    for a, b in itertools.pairwise(times):
        if b >= since:
            best = b - a if best is None else max(best, b - a)
    return best


async def _scenario(bootstrap: str, keys: int, mode: str, rate: float, workdir: Path) -> dict[str, Any]:
    """Steps 1-4 of the module docstring for one (size, mode); returns the row."""
    from multilane.demo.processors import SLEEP_ENV
    from multilane.operator.local.plane import LocalControlPlane, LocalWorkerTemplate
    from multilane.operator.rollout.handoff import HandoffConfig
    from multilane.operator.spec.validation import validate_spec
    from multilane.testing.checkers import check_delivery
    from multilane.testing.loadgen import RateProfile, produce_paced
    from multilane.testing.processors import read_event_log

    run = uuid.uuid4().hex[:6]
    topic = group = f"handoff-{run}"
    moving = 1  # the planner moves the highest partition of the over-quota worker
    # 1.
    await asyncio.to_thread(_seed, bootstrap, topic, group, moving, keys)
    spec, problems = validate_spec(
        {
            "kafka": {"bootstrapServers": bootstrap, "topics": [topic], "consumerGroup": group},
            "workload": {"image": "local", "processor": "multilane.demo.processors:stateful_io"},
            "scaling": {
                "minReplicas": 1,
                "maxReplicas": 2,
                "replicas": 1,
                "minFactor": 2,
                "maxFactor": 2,
                "intervalSeconds": 1,
            },
        }
    )
    assert spec is not None, problems
    events = workdir / f"events-{run}.log"
    template = LocalWorkerTemplate(
        bootstrap,
        group,
        "multilane.demo.processors:stateful_io",
        factor=2,
        drain_timeout_s=10.0,
        env={"MULTILANE_TEST_LOG": str(events), SLEEP_ENV: "1"},
    )
    cp = LocalControlPlane(
        workdir / f"cp-{run}", spec, template, [f"{topic}/0", f"{topic}/1"],
        HandoffConfig(acceptable_recovery_lag=1000, learner_timeout_s=300.0, release_deadline_s=10.0),
        name="w", tick_s=0.2, restore_before_handoff=(mode == MODES[0]),
    )  # fmt: skip

    def owner() -> dict[str, str]:
        members = (cp.status.get("assignment") or {}).get("members") or []
        return {p: m["worker"] for m in members for p in m["partitions"]}

    async def until(cond: Any, limit_s: float, what: str) -> None:
        deadline = time.monotonic() + limit_s
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not reached in {limit_s:.0f}s")
            await cp.tick()
            await asyncio.sleep(0.1)

    stop = threading.Event()
    produced: list[Any] = []

    def run_load() -> None:
        result = produce_paced(
            bootstrap,
            topic,
            RateProfile.constant(2 * rate, 600),
            keys=200,
            zipf_s=0.0,
            should_stop=stop.is_set,
        )
        produced.extend(result.records)

    def all_processed() -> bool:
        ended = {
            (e.partition, e.offset) for e in read_event_log(events) if e.kind == "end" and e.topic == topic
        }
        return all((r.partition, r.offset) in ended for r in produced)

    try:
        # 2.
        await cp.start()
        await until(lambda: len(owner()) == 2, 300, "both partitions on w-0")
        load = threading.Thread(target=run_load, daemon=True)
        load.start()
        for _ in range(10):  # ~2 s of steady processing before the scale-up
            await cp.tick()
            await asyncio.sleep(0.2)
        # 3.
        cp.spec = dataclasses.replace(spec, replicas=2)
        scaled_at = time.time()
        await until(
            lambda: (
                owner().get(f"{topic}/{moving}") == "w-1"
                and not cp.status.get("rollout")
                and not (cp.status.get("assignment") or {}).get("pending")
            ),
            600,
            "the partition moved to w-1",
        )
        for _ in range(15):  # ~3 s of processing after the move
            await cp.tick()
            await asyncio.sleep(0.2)
        # 4.
        stop.set()
        await asyncio.to_thread(load.join, 60)
        await until(all_processed, 120, "every produced record processed")
    finally:
        stop.set()
        await cp.close()
    # 5.
    evs = read_event_log(events)
    record = cp.executor.completed[-1] if cp.executor is not None and cp.executor.completed else None
    # 6.
    failures = [str(r) for r in check_delivery(produced, evs, mode="key") if not r.ok]
    owners = {0: "w-0", moving: "w-1"}
    for p, worker in owners.items():
        state_dir = workdir / f"cp-{run}" / "workers" / worker / "state"
        keys_of_p = [r.key for r in produced if r.partition == p]
        problem = await asyncio.to_thread(
            _check_state, state_dir, topic, p, keys if p == moving else 0, keys_of_p
        )
        if problem:
            failures.append(f"partition {p} on {worker}: {problem}")
    return {
        "keys": keys,
        "mode": mode,
        "checks": "; ".join(failures) if failures else f"ok ({len(produced):,} records; state = reference)",
        "pause_s": _gap(evs, topic, moving, scaled_at),
        "control_plane_pause_s": None if record is None else record.pause_s,
        "warm_up_s": None if record is None else record.learn_s,
        "eager_fallback": None if record is None else record.eager,
        "release_s": None if record is None else record.release_s,
        "promote_s": None if record is None else record.promote_s,
    }


def _check_state(state_dir: Path, topic: str, partition: int, seeded: int, keys: list[bytes]) -> str | None:
    """Step 6 for one partition: its store equals the seeded keys (count 1) plus the load's counts.
    Streams the store (millions of keys). Returns the problem, None when equal. Does I/O."""
    from multilane.worker.state.examples import decode_count, reference_counts
    from multilane.worker.state.store import PartitionStore, partition_dir

    expected = reference_counts(keys)
    store = PartitionStore(partition_dir(state_dir, topic, partition)).open()
    seen_seeded = 0
    wrong: list[str] = []
    try:
        for key, raw in store.items():
            count = decode_count(raw)
            if key.startswith(b"state-"):
                seen_seeded += 1
                if count != 1:
                    wrong.append(f"{key!r}={count} (seeded: 1)")
            elif expected.pop(key, None) != count:
                wrong.append(f"{key!r}={count}")
    finally:
        store.close()
    if seen_seeded != seeded:
        wrong.append(f"{seen_seeded:,} seeded keys, expected {seeded:,}")
    if expected:
        wrong.append(f"{len(expected)} keys missing")
    return ", ".join(wrong[:5]) or None


def body(args: argparse.Namespace, report: Report) -> None:
    sizes = tuple(int(s) for s in args.sizes.split(",") if s) or (SIZES_QUICK if args.quick else SIZES_FULL)
    report.params.update({"sizes": list(sizes), "rate_per_partition": args.rate, "partitions": 2})
    table = report.table(
        "pause",
        "Longest processing pause of the moved partition during a scale-up (1 -> 2 workers)",
        [
            Column("keys", fmt=","),
            Column("mode"),
            Column("pause_s", "longest gap (s)", fmt=".2f"),
            Column("control_plane_pause_s", "release -> promoted (s)", fmt=".2f"),
            Column("release_s", "release call (s)", fmt=".2f"),
            Column("promote_s", "promotion call (s)", fmt=".2f"),
            Column("warm_up_s", "learner warm-up (s)", fmt=".2f"),
            Column("eager_fallback", "eager fallback"),
            Column("checks", "delivery checks and state"),
        ],
    )
    pauses: dict[tuple[str, int], float | None] = {}
    modes = [m for m in args.modes.split(",") if m in MODES]
    with broker_session() as broker, tempfile.TemporaryDirectory(prefix="bench-handoff-") as scratch:
        tmp = args.keep or scratch
        for keys in sizes:
            for mode in modes:
                log(f"handoff: {keys:,} keys, {mode}")
                try:
                    row = asyncio.run(_scenario(broker.bootstrap, keys, mode, args.rate, Path(tmp)))
                except Exception as exc:  # a row fails alone
                    table.add_unavailable(f"{type(exc).__name__}: {exc}", keys=keys, mode=mode)
                    continue
                table.add(**row)
                pauses[(mode, keys)] = row["pause_s"]
                if not row["checks"].startswith("ok"):
                    report.errors.append(f"{keys:,} keys, {mode}: {row['checks']}")
    largest, smallest = max(sizes), min(sizes)
    rbh_large = pauses.get((MODES[0], largest))
    if MODES[0] in modes:
        for keys in sizes:
            report.goal(
                f"restore-before-handoff pause at {keys:,} keys (s)", pauses.get((MODES[0], keys)), 0.5, "<"
            )
    report.goal(
        f"restore-before-handoff pause growth {smallest:,} -> {largest:,} keys (ratio)",
        ratio(rbh_large, pauses.get((MODES[0], smallest))),
        2.0,
        "<=",
    )
    saved = ratio(pauses.get((MODES[1], largest)), rbh_large)
    if largest >= EAGER_GOAL_MIN_KEYS:
        report.goal(f"eager / restore-before-handoff pause at {largest:,} keys (ratio)", saved, 2.0, ">=")
    elif saved is not None:
        report.note(
            f"eager / restore-before-handoff pause at {largest:,} keys: {saved:.2f} (reported only: an "
            f"eager restore of this little state takes a fraction of a second; the goal of >= 2 applies "
            f"from {EAGER_GOAL_MIN_KEYS:,} keys, in the full run)"
        )
    report.note(
        "pause = longest gap between consecutive completed records of the moved partition after the "
        "scale-up (processing log); the control-plane figure is release call -> end of promotion."
    )


if __name__ == "__main__":
    raise SystemExit(main("handoff", "Handoff pause: restore-before-handoff vs eager.", body, add_arguments))
