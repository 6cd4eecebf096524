"""The progress record a new owner reads when it takes a partition over (embedded broker): the newest
one for its key, found by reading to the end-of-partition event (no quiet-period wait)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer

from multilane.testing.broker import EmbeddedBroker
from multilane.worker.progress_store import ProgressStore, progress_key

pytestmark = pytest.mark.broker


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
