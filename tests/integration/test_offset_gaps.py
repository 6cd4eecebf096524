"""Gaps in offsets never stall a commit (issue 31, item 3), on whichever broker the session runs.

Transaction markers take offsets, and compaction removes records: an input topic then has offsets no
fetch returns. A worker that commits "newest record + 1" stays short of the end for good when the
last offsets of a partition are such a gap (KAFKA-6607); the engine commits the consumer's position
there (``multilane.worker.fetch``, "Gaps at the end"). Each test asserts: every record a plain
``read_committed`` consumer sees is processed (and nothing else), the delivery checkers hold, the
committed offset reaches the end (live, after the final commit of a stop, and with a progress record
for it), and a restarted worker has nothing left to do.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from multilane.testing.broker import KafkaBroker
from multilane.testing.checkers import ProducedRecord, assert_all, check_delivery
from multilane.testing.processors import EventLogFollower, read_event_log
from multilane.testing.workers import FAST_GROUP_CONFIG, WorkerProcess, WorkerSpec, wait_until
from multilane.worker.progress_store import ProgressStore

pytestmark = [pytest.mark.broker, pytest.mark.matrix]

TIMEOUT = 120.0  # a loaded, shared 2-core machine


def _produce_transactions(bootstrap: str, topic: str, partitions: int, transactions: int = 30,
                          per_transaction: int = 50) -> tuple[list[ProducedRecord], list[ProducedRecord]]:
    """``transactions`` of ``per_transaction`` records spread over the partitions, every third one
    aborted after its records reached the broker (so its records and its abort marker take offsets).
    Returns (committed records, aborted records) from the delivery reports."""
    delivered: list[ProducedRecord] = []

    def report(err: Any, msg: Any) -> None:
        assert err is None, err
        delivered.append(ProducedRecord(topic, msg.partition(), msg.offset(), msg.key()))

    p: Any = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"gaps-{uuid.uuid4().hex[:8]}",
                       "enable.idempotence": True, "on_delivery": report})
    p.init_transactions(30)
    committed: list[ProducedRecord] = []
    aborted: list[ProducedRecord] = []
    n = 0
    for t in range(transactions):
        p.begin_transaction()
        for _ in range(per_transaction):
            p.produce(topic, value=b"tx-%d" % t, key=b"key-%03d" % (n % 40), partition=n % partitions)
            n += 1
        assert p.flush(30) == 0
        batch, delivered[:] = list(delivered), []
        if t % 3 == 2:
            p.abort_transaction(30)
            aborted += batch
        else:
            p.commit_transaction(30)
            committed += batch
    return committed, aborted


def _read_committed_view(bootstrap: str, topic: str, partitions: int,
                         timeout: float = 60.0) -> tuple[list[ProducedRecord], dict[tuple[str, int], int]]:
    """What a plain ``read_committed`` consumer reads to the end of every partition, and the ends its
    end-of-partition events carry (right on both brokers: fetch-based, not the watermark API)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"view-{uuid.uuid4().hex[:8]}",
                  "isolation.level": "read_committed", "enable.partition.eof": True,
                  "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    seen: list[ProducedRecord] = []
    ends: dict[tuple[str, int], int] = {}
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(ends) < partitions:
            assert time.monotonic() < deadline, f"no end of partition on {partitions - len(ends)} partitions"
            msgs: list[Any] = c.consume(500, 0.2)
            for m in msgs:
                err = m.error()
                if err is None:
                    seen.append(ProducedRecord(topic, m.partition(), m.offset(), m.key()))
                elif err.code() == KafkaError._PARTITION_EOF:
                    ends[(topic, m.partition())] = m.offset()
    finally:
        c.close()
    return seen, ends


def _outside_committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[tuple[str, int], int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        c.close()
    return {(tp.topic, tp.partition): tp.offset for tp in got}


def _run_to_the_end(broker: KafkaBroker, topic: str, partitions: int, view: list[ProducedRecord],
                    ends: dict[tuple[str, int], int], tmp_path: Path, workers: list[WorkerProcess]) -> None:
    """Run a key-mode worker over ``topic``; assert everything in ``view`` (and nothing else) is
    processed, the committed offsets reach ``ends`` live and after the stop's final commit, a progress
    record exists for them, and a restarted worker finds nothing to do."""
    log = str(tmp_path / "events.log")
    group = f"g-{topic}"
    assign = ",".join(f"{topic}:{p}" for p in range(partitions))
    spec = WorkerSpec(broker.bootstrap, group=group, assign=assign, ordering="key", factor=4,
                      event_log=log, commit_interval_ms=200,
                      consumer_config={**FAST_GROUP_CONFIG, "isolation.level": "read_committed"})
    w = WorkerProcess(spec, tmp_path / "w1")
    workers.append(w)
    w.start().wait_ready(90)
    follower = EventLogFollower(log)
    want = {r[:3] for r in view}
    wait_until(lambda: (follower.poll(), want <= follower.ended)[1], TIMEOUT, 0.2, "every visible record")
    # Live: the committed offsets reach the ends (the last offsets are a marker, or a compaction gap).
    try:
        wait_until(lambda: w.committed() == ends, 30, 0.2, "committed offsets at the ends")
    except TimeoutError as exc:
        raise AssertionError(f"committed {w.committed()} never reached the ends {ends}") from exc
    assert w.terminate(60) == 0
    # After the stop's final commit, read from outside; and the progress record for that offset.
    assert _outside_committed(broker.bootstrap, group, topic, partitions) == ends
    store = ProgressStore(broker.bootstrap, group, f"multilane-progress.{group}", None)
    store.ensure_topic(partitions)
    for (t, p), end in ends.items():
        rec = store.read_progress(t, p, end)
        assert rec is not None and rec.base_offset == end, f"no progress record for {t}/{p} at {end}"
    # A restart has nothing to do: no record starts again.
    w2 = WorkerProcess(spec, tmp_path / "w2")
    workers.append(w2)
    w2.start().wait_ready(90)
    wait_until(lambda: w2.committed() == ends, 30, 0.2, "the restarted worker at the ends")
    time.sleep(1.0)
    assert w2.terminate(60) == 0
    events = read_event_log(log)
    assert not [e for e in events if e.pid == w2.pid and e.kind == "start"], "a restart ran records again"
    strangers = {e.tpo for e in events if e.kind == "start"} - want
    assert not strangers, f"processed offsets a read_committed consumer never sees: {sorted(strangers)[:10]}"
    assert_all(check_delivery(view, events, mode="key"))


def test_transactional_input_with_aborted_transactions_commits_to_the_end(
    broker: KafkaBroker, broker_kind: str, topic_name: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """30 transactions of 50 records over 2 partitions, every third aborted (the last one too, so
    each partition ends with aborted records and an abort marker): the worker commits the end."""
    broker.create_topic(topic_name, 2)
    committed, aborted = _produce_transactions(broker.bootstrap, topic_name, 2)
    view, ends = _read_committed_view(broker.bootstrap, topic_name, 2)
    seen = {r[:3] for r in view}
    assert {r[:3] for r in committed} <= seen, "a committed transaction's record is not readable"
    leaked = seen & {r[:3] for r in aborted}
    if broker_kind == "embedded":
        # test_broker_transactions: the embedded broker delivers aborted records that reached it
        assert len(leaked) == len(aborted)
    else:
        assert not leaked, f"{len(leaked)} aborted records reached a read_committed consumer"
    for (t, p), end in ends.items():
        last_record = max(r.offset for r in view if r.partition == p)
        last_written = max(r.offset for r in committed + aborted if r.partition == p)
        assert end >= last_written + 2 > last_record + 1, (
            f"{t}/{p}: end {end}, last record read {last_record}, last written {last_written}: "
            "no marker after the last record, so this input has no gap at its end"
        )
    _run_to_the_end(broker, topic_name, 2, view, ends, tmp_path, workers)


def _has_gaps(view: list[ProducedRecord]) -> bool:
    by_partition: dict[int, list[int]] = {}
    for r in view:
        by_partition.setdefault(r.partition, []).append(r.offset)
    return any(offs != list(range(offs[0], offs[0] + len(offs))) or offs[0] > 0
               for offs in by_partition.values())


def test_compacted_input_commits_to_the_end(
    broker: KafkaBroker, broker_kind: str, topic_name: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """A compacted input topic. Apache Kafka: once the broker's cleaner removed older values, gaps
    between the records. Tansu never compacts (test_broker_facts.py::test_compaction): there the same
    topic keeps every record at contiguous offsets, asserted, so this run covers a compacted topic
    without gaps. On both: everything readable is processed once, and the committed offsets reach
    the ends."""
    partitions = 2
    broker.create_topic(topic_name, partitions, config={
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.001",
        "min.compaction.lag.ms": "0", "delete.retention.ms": "100",
    })
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for version in range(12):  # waves: each rolls the segments of the one before
        for k in range(30):
            p.produce(topic_name, value=b"v%d-" % version + b"x" * 200, key=b"key-%03d" % k,
                      partition=k % partitions)
        assert p.flush(30) == 0
        if broker_kind != "embedded":
            time.sleep(0.2)
    deadline = time.monotonic() + 90
    view, ends = _read_committed_view(broker.bootstrap, topic_name, partitions)
    if broker_kind == "embedded":
        assert not _has_gaps(view) and len(view) == 12 * 30, (
            f"Tansu compacted the topic ({len(view)} of {12 * 30} records left): this test's Tansu "
            "run no longer covers the case without gaps; see test_broker_facts.py::test_compaction")
        assert ends == {(topic_name, q): 12 * 15 for q in range(partitions)}, ends
        _run_to_the_end(broker, topic_name, partitions, view, ends, tmp_path, workers)
        return
    while not _has_gaps(view):
        assert time.monotonic() < deadline, "the broker did not compact the topic within 90 s"
        time.sleep(2.0)
        p.produce(topic_name, value=b"roll", key=b"key-roll", partition=0)  # rolls the active segment
        p.produce(topic_name, value=b"roll", key=b"key-roll", partition=1)
        assert p.flush(30) == 0
        view, ends = _read_committed_view(broker.bootstrap, topic_name, partitions)
    while True:  # the cleaner may still be at work: wait until two reads agree
        time.sleep(2.0)
        again, again_ends = _read_committed_view(broker.bootstrap, topic_name, partitions)
        if again == view and again_ends == ends:
            break
        assert time.monotonic() < deadline, "the compacted topic kept changing"
        view, ends = again, again_ends
    assert len(view) < 12 * 30, "nothing was compacted away"
    print(f"compacted: {len(view)} of {12 * 30} records left (plus the roll records), ends {ends}")
    _run_to_the_end(broker, topic_name, partitions, view, ends, tmp_path, workers)
