"""The progress record a new owner reads when it takes a partition over (embedded broker): the newest
one for its key, found by reading to the end-of-partition event (no quiet-period wait)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Producer

from multilane.testing.broker import EmbeddedBroker
from multilane.worker.progress_store import ProgressStore, progress_key

pytestmark = [pytest.mark.broker, pytest.mark.matrix]


def test_read_latest_returns_the_newest_value_per_key(broker: EmbeddedBroker) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    store = ProgressStore(broker.bootstrap, group, f"multilane-progress.{group}", producer, {})
    store.ensure_topic(2)
    topic = store.topic
    assert store.read_latest("in", 0) is None  # empty partition
    for batch in range(3):  # several producer batches, two keys sharing partition 0
        for i in range(200):
            producer.produce(topic, key=progress_key("in", 0), value=b"a-%d-%d" % (batch, i), partition=0)
            producer.produce(topic, key=progress_key("other", 0), value=b"b-%d-%d" % (batch, i), partition=0)
        producer.flush(10)
    assert store.read_latest("in", 0) == b"a-2-199"
    assert store.read_latest("other", 0) == b"b-2-199"
    assert store.read_latest("absent", 0) is None
    producer.produce(topic, key=progress_key("in", 0), value=b"newer", partition=0)
    producer.flush(10)
    assert store.read_latest("in", 0) == b"newer"


def test_read_latest_ends_on_a_partition_written_all_the_time(broker: EmbeddedBroker) -> None:
    """Every worker writes progress records: the partition is never quiet and a fetch rarely comes back
    empty (no end-of-partition event). The read ends once it passed the end its first fetch reported,
    instead of waiting for its timeout (15 s: the pauses of the 8-worker rollout of issue 22)."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1})
    store = ProgressStore(broker.bootstrap, group, f"multilane-progress.{group}", producer, {})
    store.ensure_topic(1)
    topic = store.topic
    for i in range(500):
        producer.produce(topic, key=progress_key("busy", 0), value=b"x-%d" % i, partition=0)
    producer.produce(topic, key=progress_key("in", 0), value=b"wanted", partition=0)
    producer.flush(10)
    stop = threading.Event()

    def write_all_the_time() -> None:
        other = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1})
        i = 0
        while not stop.is_set():
            other.produce(topic, key=progress_key("busy", 0), value=b"y-%d" % i, partition=0)
            other.poll(0)
            i += 1
            time.sleep(0.002)
        other.flush(10)

    writer = threading.Thread(target=write_all_the_time, daemon=True)
    writer.start()
    try:
        time.sleep(0.5)
        started = time.monotonic()
        found = store.read_latest("in", 0, timeout=15.0, quiet_s=0.3)
        took = time.monotonic() - started
    finally:
        stop.set()
        writer.join(10)
    assert found == b"wanted"
    assert took < 5.0, f"the read took {took:.1f}s: it waited for a quiet broker or its timeout"
