"""``KafkaSource`` and ``KafkaAdminClient`` against the embedded broker (real Kafka protocol).

Records are produced one batch each (flush per record): this broker reports end offsets as the last
batch's base offset + 1 (FACTS.md), which is exact only then.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from multilane.operator.kafka_admin import KafkaAdminClient
from multilane.operator.sources import KafkaSource, MetricsUnavailableError, QueryContext
from multilane.testing.broker import EmbeddedBroker

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="function")]


async def test_lag_from_committed_and_end_offsets_and_rates_from_two_samples(
    broker: EmbeddedBroker, topic_name: str
) -> None:
    broker.create_topic(topic_name, partitions=2)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        producer.produce(topic_name, value=b"x", partition=i % 2)
        producer.flush(10)
    group = f"{topic_name}-g"
    committer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    committer.commit(offsets=[TopicPartition(topic_name, 0, 3)], asynchronous=False)

    now = [1000.0]
    admin = KafkaAdminClient({"bootstrap.servers": broker.bootstrap}, timeout_s=5)
    source = KafkaSource(admin, clock=lambda: now[0])
    ctx = QueryContext("ns", "app", group, [f"{topic_name}/0", f"{topic_name}/1"])
    try:
        assert await admin.topic_partitions([topic_name, "missing-topic"]) == {topic_name: 2}
        first = await source.sample(ctx)
        assert first.lag == {f"{topic_name}/0": 2, f"{topic_name}/1": 5}  # 5 - 3 committed; 5 - 0 (none)
        assert first.input_rate is None and first.processing_rate is None  # no previous sample

        for _ in range(4):
            producer.produce(topic_name, value=b"y", partition=1)
            producer.flush(10)
        committer.commit(offsets=[TopicPartition(topic_name, 0, 5)], asynchronous=False)
        now[0] += 2.0
        second = await source.sample(ctx)
        assert second.lag == {f"{topic_name}/0": 0, f"{topic_name}/1": 9}
        assert second.input_rate == pytest.approx(4 / 2.0)
        assert second.processing_rate == pytest.approx(2 / 2.0)
    finally:
        committer.close()
        admin.close()


async def test_unreachable_cluster_is_unavailable() -> None:
    admin = KafkaAdminClient({"bootstrap.servers": "127.0.0.1:1"}, timeout_s=1)
    try:
        with pytest.raises(MetricsUnavailableError):
            await KafkaSource(admin).sample(QueryContext("ns", "app", "g", ["t/0"]))
    finally:
        admin.close()
