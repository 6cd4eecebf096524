"""What the embedded broker supports of Kafka transactions (the basis of exactly-once outputs).

Measured here, so that docs/outputs.md can say it plainly: ``init_transactions``, commit, abort and
``send_offsets_to_transaction`` are accepted (the offset it carries becomes the group's committed
offset), but an aborted transaction's records that reached the broker are still delivered to
``isolation.level=read_committed`` consumers. Without that isolation a transaction cannot hide the
outputs of an attempt that is later aborted, so exactly-once outputs are not possible on this broker;
multilane's outputs are at-least-once (duplicates after a kill -9, never a loss).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from multilane.testing.broker import EmbeddedBroker

pytestmark = pytest.mark.broker


def _read(bootstrap: str, topic: str, isolation: str, timeout: float = 4.0) -> list[bytes | None]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"tx-read-{uuid.uuid4().hex[:6]}",
                  "isolation.level": isolation, "enable.auto.commit": False})
    out: list[bytes | None] = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out += [m.value() for m in c.consume(10, 0.2) if m.error() is None]
    finally:
        c.close()
    return out


def test_transactions_commit_abort_and_offsets(broker: EmbeddedBroker, topic_name: str) -> None:
    broker.create_topic(topic_name, 1)
    src = f"{topic_name}-src"
    broker.create_topic(src, 1)
    group = f"tx-{topic_name}"
    p: Any = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{topic_name}",
                       "enable.idempotence": True})
    p.init_transactions(30)
    # a committed transaction, carrying the consumer group's offset 7 of the source topic
    p.begin_transaction()
    p.produce(topic_name, b"committed", b"k")
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        p.send_offsets_to_transaction([TopicPartition(src, 0, 7)], c.consumer_group_metadata(), 30)
        p.commit_transaction(30)
        committed = c.committed([TopicPartition(src, 0)], timeout=10)[0].offset
    finally:
        c.close()
    # an aborted one
    p.begin_transaction()
    p.produce(topic_name, b"aborted", b"k")
    p.flush(10)
    p.abort_transaction(30)
    # The facts: the API is accepted and the offset lands, but an aborted transaction's records that
    # reached the broker are delivered even to read_committed consumers: no isolation, so outputs
    # cannot be made exactly-once on this broker.
    assert _read(broker.bootstrap, topic_name, "read_committed") == [b"committed", b"aborted"]
    assert committed == 7, f"send_offsets_to_transaction: committed offset {committed}"
