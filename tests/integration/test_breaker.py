"""Stop a bad deploy: a handler that raises on every record trips the circuit breaker. Real
``multilane worker`` processes on the embedded broker; the committed offset is read with kafka-python
(its own protocol implementation, an independent check)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import ExclusiveKeyChecker, assert_all
from multilane.testing.loadgen import produce_records
from multilane.testing.processors import read_event_log
from multilane.testing.workers import WorkerProcess, WorkerSpec, wait_until

pytestmark = pytest.mark.broker

N = 5


def _dead_letters(bootstrap: str, topic: str) -> list[int]:
    """Origin offsets of the dead letters in ``topic`` (kafka-python)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000,
                      auto_offset_reset="earliest")
    try:
        c.assign([TopicPartition(topic, 0)])
        c.seek_to_beginning()
        return [int(dict(m.headers)["multilane.origin.offset"]) for m in c]
    finally:
        c.close()


def _committed(bootstrap: str, group: str, topic: str) -> int | None:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return c.committed(TopicPartition(topic, 0))
    finally:
        c.close()


def _breaker_open(w: WorkerProcess) -> bool:
    return w.metric_sum("multilane_breaker_open") == 1.0


def test_breaker_stops_a_handler_that_always_fails(broker: EmbeddedBroker, topic_name: str, tmp_path: Path,
                                                   workers: list[WorkerProcess]) -> None:
    broker.create_topic(topic_name, 1)
    broker.create_topic(f"{topic_name}.dlq", 1)
    produced = produce_records(broker.bootstrap, topic_name, 300, keys=40, partition=0).records
    assert len(produced) == 300
    log = str(tmp_path / "events.log")
    spec = WorkerSpec(broker.bootstrap, group=f"g-{topic_name}", assign=f"{topic_name}:0",
                      processor="multilane.testing.faulty:always_fails", factor=4, max_retries=1,
                      retry_backoff_ms=50, event_log=log, extra_args=["--breaker-dead-letters", str(N)])
    w = WorkerProcess(spec, tmp_path)
    workers.append(w)
    w.start().wait_ready(90)
    # the first failure, then the breaker within 10 s of it
    wait_until(lambda: any(e.kind == "fail" for e in read_event_log(log)), 60, 0.05, "a first failure")
    first_fail = min(e.time for e in read_event_log(log) if e.kind == "fail")
    wait_until(lambda: _breaker_open(w), 30, 0.1, "the breaker open")
    assert time.time() - first_fail < 10.0, "the breaker took more than 10 s after the first failure"
    code, body = w.request("GET", "/readyz", token=None)
    assert code == 503 and any("circuit breaker open" in r for r in body["reasons"]), body
    # it stops taking records: no new attempt starts for 3 s
    started = len([e for e in read_event_log(log) if e.kind == "start"])
    time.sleep(3.0)
    assert len([e for e in read_event_log(log) if e.kind == "start"]) == started
    dead = _dead_letters(broker.bootstrap, f"{topic_name}.dlq")
    assert 1 <= len(dead) <= N, f"{len(dead)} dead letters with a breaker of {N}"
    # nothing is committed past a record neither processed (none is) nor dead-lettered
    committed = _committed(broker.bootstrap, spec.group, topic_name) or 0
    first_not_done = min(set(range(300)) - set(dead))
    assert committed <= first_not_done, f"committed {committed} past offset {first_not_done}"
    assert "circuit breaker open" in w.stderr_tail(200)
    # reset: records run again, and the breaker opens again after N more dead letters
    code, body = w.request("POST", "/breaker/reset", body={})
    assert code == 200 and body["was_open"] is True
    wait_until(lambda: len(_dead_letters(broker.bootstrap, f"{topic_name}.dlq")) > len(dead), 30, 0.2,
               "more dead letters after the reset")
    wait_until(lambda: _breaker_open(w), 30, 0.1, "the breaker open again")
    assert len(_dead_letters(broker.bootstrap, f"{topic_name}.dlq")) <= 2 * N
    code, _ = w.request("POST", "/breaker/reset", token=None)
    assert code == 401
    assert w.terminate(60) == 0
    assert_all(ExclusiveKeyChecker(by="key").check(read_event_log(log)))
