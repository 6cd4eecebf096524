"""Output topics are checked before a worker consumes (``--output-topic``, ``worker.output_topics``).

1. The broker fact behind it: a produce to a missing topic, or a metadata request naming it, creates
   it with the broker's default partition count (4 on the embedded broker), silently; a producer with
   ``allow.auto.create.topics=false`` creates nothing (its record times out).
2. A declared output topic that is missing stops the worker with one line (exit 2) before it consumes:
   nothing committed, the topic still absent.
3. Declared with a partition count (``NAME:PARTITIONS``, here through an App's setting) it is created
   with that many partitions, and the worker's outputs land in it (delivery and outputs checkers hold).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient
from test_engine_harness import committed_offset, produce, sigterm, wait_for, worker_process

from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery
from multilane.testing.outputs import check_outputs, read_outputs
from multilane.testing.processors import read_event_log

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


def _partitions(broker: EmbeddedBroker, topic: str) -> int | None:
    """The topic's partition count, from a request that names no topic (it creates nothing)."""
    t = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10).topics.get(topic)
    return len(t.partitions) if t is not None and t.error is None else None


def test_the_broker_creates_a_missing_topic_on_produce(broker: EmbeddedBroker, topic_name: str,
                                                       broker_kind: str) -> None:
    """1. The fact the start-time check is for (the default producer, consumer and admin settings):
    Tansu gives a new topic 4 partitions, Apache Kafka ``num.partitions`` (1 by default)."""
    default = 4 if broker_kind == "embedded" else 1
    produced = f"{topic_name}-produced"
    p = Producer({"bootstrap.servers": broker.bootstrap})
    errors: list[object] = []
    p.produce(produced, b"v", on_delivery=lambda err, _msg: errors.append(err))
    assert p.flush(30) == 0
    assert errors == [None] and _partitions(broker, produced) == default
    # a producer told not to (allow.auto.create.topics=false) creates nothing: the record times out
    refused = f"{topic_name}-refused"
    p = Producer({"bootstrap.servers": broker.bootstrap, "allow.auto.create.topics": "false",
                  "message.timeout.ms": 1000})
    errors.clear()
    p.produce(refused, b"v", on_delivery=lambda err, _msg: errors.append(err))
    assert p.flush(30) == 0
    assert [e.code() for e in errors] == [KafkaError._MSG_TIMED_OUT]  # type: ignore[union-attr]
    assert _partitions(broker, refused) is None
    # a metadata request naming the topic creates it too (the admin client's default)...
    named = f"{topic_name}-named"
    AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(named, timeout=10)
    assert _partitions(broker, named) == default
    # ...but not a consumer's (librdkafka's consumer default: allow.auto.create.topics=false)
    quiet = f"{topic_name}-quiet"
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": quiet})
    try:
        c.list_topics(quiet, timeout=10)
    finally:
        c.close()
    assert _partitions(broker, quiet) is None


def _worker(broker: EmbeddedBroker, topic: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "multilane", "worker", "--bootstrap-servers", broker.bootstrap,
            "--group", f"g-{topic}", "--topic", topic, "--processor",
            "multilane.testing.outputs:forwarding_async", "--commit-interval-ms", "200",
            "--consumer-config", "session.timeout.ms=2000", *extra]


def test_a_missing_output_topic_stops_the_worker_with_one_line(broker: EmbeddedBroker,
                                                               topic_name: str) -> None:
    broker.create_topic(topic_name, 1)
    produce(broker, topic_name, 5)
    out_topic = f"{topic_name}-totals"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MULTILANE_TEST_OUTPUT_TOPIC": out_topic}
    with worker_process(_worker(broker, topic_name, "--output-topic", out_topic), env=env) as proc:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err[-3000:]
    assert "multilane-worker ready" not in out
    lines = [line for line in err.splitlines() if line.startswith("multilane worker:")]
    assert lines == [f"multilane worker: output topic(s) {out_topic} do not exist on {broker.bootstrap}: "
                     f"create them first, or give a partition count for the worker to create them "
                     f"(--output-topic {out_topic}:PARTITIONS, App(output_topic=\"{out_topic}:PARTITIONS\"))"]
    assert "Traceback" not in err
    assert _partitions(broker, out_topic) is None
    assert committed_offset(broker, f"g-{topic_name}", topic_name) is None


APP = '''
import multilane
from multilane.testing.outputs import forwarding_async

app = multilane.App(forwarding_async, output_topic="{out}:3", commit_interval_ms=200,
                    consumer_config=["session.timeout.ms=2000"])
'''


def test_an_output_topic_with_a_partition_count_is_created(broker: EmbeddedBroker, topic_name: str,
                                                           tmp_path: Path) -> None:
    broker.create_topic(topic_name, 2)
    n = 100
    produced = produce(broker, topic_name, n, keys=10) + produce(broker, topic_name, n, keys=10, partition=1)
    out_topic = f"{topic_name}-totals"
    (tmp_path / "outapp.py").write_text(APP.format(out=out_topic))
    log_path = tmp_path / "events.log"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "MULTILANE_TEST_LOG": str(log_path),
           "MULTILANE_TEST_OUTPUT_TOPIC": out_topic, "MULTILANE_TEST_OUTPUTS": "1"}
    argv = [sys.executable, "-m", "multilane", "worker", "--app", "outapp:app", "--bootstrap-servers",
            broker.bootstrap, "--group", f"g-{topic_name}", "--topic", topic_name]
    with worker_process(argv, env=env, cwd=tmp_path) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("multilane-worker ready"), (line, proc.stderr.read() if proc.stderr else "")
        assert _partitions(broker, out_topic) == 3
        wait_for(lambda: log_path.exists() and len({(e.partition, e.offset) for e in read_event_log(log_path)
                                                    if e.kind == "end"}) >= 2 * n,
                 60, what="every record processed")
        wait_for(lambda: all(committed_offset(broker, f"g-{topic_name}", topic_name, p) == n for p in (0, 1)),
                 30, what="the commits")
        err = sigterm(proc)
    assert proc.returncode == 0, err[-3000:]
    assert f"created output topic {out_topic} with 3 partitions" in err
    # the worker's own progress topic has the input's partition count (not the broker's default: a
    # metadata request naming a missing topic would have created it with Tansu's 4)
    assert _partitions(broker, f"multilane-progress.g-{topic_name}") == 2
    seen = read_outputs(broker.bootstrap, out_topic, 3)
    assert_all(check_delivery(produced, read_event_log(log_path), mode="key"),
               check_outputs(produced, seen, per_input=1, ordered=True))
