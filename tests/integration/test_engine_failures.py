"""Failures: retries, dead letters, poison records, bad progress records, processors that raise."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from test_engine_harness import committed_offset, config, ended, produce, recorder, running, wait_for

from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery
from multilane.worker.progress_store import progress_key

pytestmark = pytest.mark.broker


def _read_all(broker: EmbeddedBroker, topic: str, expect: int, timeout: float = 20.0) -> list:
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"reader-{topic}",
                  "enable.auto.commit": False})
    md = c.list_topics(topic, timeout=10).topics[topic]
    c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
    out: list = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expect and time.monotonic() < deadline:
            out.extend(m for m in c.consume(100, timeout=0.2) if m.error() is None)
    finally:
        c.close()
    return out


def test_poison_record_is_retried_then_dead_lettered(broker: EmbeddedBroker, topic_name: str) -> None:
    """A poison key: retried max_retries times with backoff, then dead-lettered with headers; other
    keys (also in its lane) keep flowing meanwhile, and the committed offset passes it afterwards."""
    broker.create_topic(topic_name, 1)
    n = 400
    produced = produce(broker, topic_name, n, keys=40)
    poison_offset = next(r.offset for r in produced if r.key == b"k3")
    rec = recorder(sleep_ms=1.0, poison=frozenset({b"k3"}))
    cfg = config(broker, topic_name, f"g-{topic_name}", factor=2, max_retries=2, retry_backoff_ms=400)
    with running(cfg, rec.async_processor) as (engine, runner):
        wait_for(lambda: runner.sync(engine.status)["partitions"][0]["dead_lettered"] >= 10, 60,
                 what="all poison records dead-lettered")
        wait_for(lambda: committed_offset(broker, cfg.group, topic_name) == n, 30, what="commit past poison")
    events = rec.snapshot()
    poison = [r for r in produced if r.key == b"k3"]
    good = [r for r in produced if r.key != b"k3"]
    assert_all(check_delivery(good, [e for e in events if e.key != b"k3"], mode="key"))
    # three attempts per poison record, in order of attempts
    attempts = [e.attempt for e in events if e.kind == "fail" and e.offset == poison_offset]
    assert attempts == [1, 2, 3]
    # other keys finished while the first poison record waited for its retries
    first_fail = next(e.seq for e in events if e.kind == "fail" and e.offset == poison_offset)
    last_fail = [e.seq for e in events if e.kind == "fail" and e.offset == poison_offset][-1]
    others_between = [e for e in events[first_fail:last_fail] if e.kind == "end" and e.key != b"k3"]
    assert len(others_between) > 50, "other keys should flow while a poison record backs off"
    # dead letters: one per poison record, with headers naming the error and origin
    dlq = _read_all(broker, f"{topic_name}.dlq", len(poison))
    assert sorted(int(dict(m.headers())["multilane.origin.offset"]) for m in dlq) == \
        [r.offset for r in poison]
    h = dict(dlq[0].headers())
    assert h["multilane.origin.topic"] == topic_name.encode()
    assert h["multilane.origin.partition"] == b"0"
    assert b"PoisonRecordError" in h["multilane.error.type"]
    assert h["multilane.error.message"]
    assert h["multilane.attempts"] == b"3"
    assert dlq[0].key() == b"k3"


def test_flaky_processor_succeeds_on_retry(broker: EmbeddedBroker, topic_name: str) -> None:
    broker.create_topic(topic_name, 1)
    n = 200
    produced = produce(broker, topic_name, n, keys=5)
    rec = recorder(flaky=frozenset({b"k1", b"k2"}), flaky_attempts=1)
    cfg = config(broker, topic_name, f"g-{topic_name}", factor=4, max_retries=3)
    with running(cfg, rec.sync_processor) as (engine, runner):
        wait_for(lambda: len(ended(rec.snapshot())) >= n, 60, what="all processed")
        status = runner.sync(engine.status)
    events = rec.snapshot()
    assert_all(check_delivery(produced, events, mode="key"))
    assert status["partitions"][0]["dead_lettered"] == 0
    fails = [e for e in events if e.kind == "fail"]
    assert len(fails) == sum(1 for r in produced if r.key in (b"k1", b"k2"))
    assert all(e.attempt == 1 for e in fails)


def test_undecodable_progress_is_ignored(broker: EmbeddedBroker, topic_name: str,
                                         caplog: pytest.LogCaptureFixture) -> None:
    """Garbage in the progress topic: a warning, and every record above the committed offset runs."""
    broker.create_topic(topic_name, 1)
    n = 300
    produced = produce(broker, topic_name, n, keys=10)
    group = f"g-{topic_name}"
    # commit offset 100 for the group and put garbage progress in the progress topic
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic_name, 0, 100)], asynchronous=False)
    c.close()
    cfg = config(broker, topic_name, group)
    broker.create_topic(cfg.progress_topic_name, 1)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    p.produce(cfg.progress_topic_name, key=progress_key(topic_name, 0), value=b"MLP\x01garbage!!",
              partition=0)
    p.flush(10)
    rec = recorder()
    with caplog.at_level(logging.WARNING, logger="multilane"), running(cfg, rec.async_processor):
        wait_for(lambda: len(ended(rec.snapshot())) >= n - 100, 60, what="records above 100 processed")
    events = rec.snapshot()
    assert ended(events) == set(range(100, n)), "nothing above the committed offset may be skipped"
    assert_all(check_delivery([r for r in produced if r.offset >= 100], events, mode="key"))
    assert any("undecodable progress" in r.getMessage() for r in caplog.records)


def test_broker_link_cut_then_restored(tmp_path: object) -> None:
    """The link to the broker is cut mid-stream: the engine keeps going with what it has, commits fail
    and are retried, and once the link is back everything is processed and committed by itself."""
    from multilane.testing.proxy import ProxiedBroker

    with ProxiedBroker() as pb:
        topic = "linkcut"
        pb.create_topic(topic, 1)
        n = 1500
        produced = produce(pb, topic, n, keys=30)  # type: ignore[arg-type]
        rec = recorder(sleep_ms=2.0)
        cfg = config(pb, topic, "g-linkcut", factor=4, max_in_flight=200)  # type: ignore[arg-type]
        with running(cfg, rec.async_processor) as (engine, runner):
            wait_for(lambda: len(ended(rec.snapshot())) >= 200, 60, what="some processed")
            pb.proxy.cut()
            time.sleep(3.0)
            during = len(ended(rec.snapshot()))
            assert runner.sync(engine.status)["processed_total"] >= 200
            pb.proxy.restore()
            wait_for(lambda: len(ended(rec.snapshot())) >= n, 90, what="all processed after restore")
            wait_for(lambda: committed_offset(pb, cfg.group, topic) == n, 60,  # type: ignore[arg-type]
                     what="commit to the end after restore")
        assert during < n
        assert_all(check_delivery(produced, rec.snapshot(), mode="key"))
