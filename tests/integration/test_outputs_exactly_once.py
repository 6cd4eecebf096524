"""Exactly-once outputs through the engine (``--outputs exactly-once``), on the session's broker: every
input's outputs appear once to a ``read_committed`` reader, across retries (an attempt that produced
and then failed leaves nothing), a dead letter (an output of the transaction) and a restart of the
worker; per-key order holds across incarnations; the delivery checkers hold; a transaction commits
after ``max_records`` records long before the commit interval; a second owner's open fences the first.

These paths involve no aborted transaction that reached the broker, so they hold on the embedded broker
too (it leaks aborted transactions to ``read_committed`` readers, ``test_broker_transactions.py``); the
kill -9 test needs Apache Kafka (``test_outputs_exactly_once_chaos.py``).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from test_engine_harness import committed_offset, config, ended, produce, recorder, wait_for

from multilane.api import Context, NonRetryable, Record
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery
from multilane.testing.outputs import check_outputs, read_outputs
from multilane.worker.config import EngineConfig
from multilane.worker.engine import Engine
from multilane.worker.runner import EngineRunner
from multilane.worker.transactions import (
    TransactionalOutputs,
    TransactionFencedError,
    transactional_producer_config,
    with_transactional_outputs,
)

pytestmark = pytest.mark.broker


def transactions(broker: Any, group: str, max_records: int = 10_000) -> TransactionalOutputs:
    conf = transactional_producer_config(broker.bootstrap, "test-eos", "")
    return TransactionalOutputs.from_config(conf, group, max_records=max_records)


@contextmanager
def running_eos(cfg: EngineConfig, processor: Any, max_records: int = 10_000) -> Iterator[Engine]:
    """An engine with exactly-once outputs (the worker CLI's wiring, in process)."""
    txns = TransactionalOutputs.from_config(
        transactional_producer_config(cfg.bootstrap_servers, "test-eos", ""), cfg.group,
        max_records=max_records)
    engine = Engine(cfg, with_transactional_outputs(processor, txns), None, transactions=txns)
    runner = EngineRunner(engine).start()
    try:
        yield engine
    finally:
        runner.stop()


def _forwarder(rec: Any, out_topic: str, poison: bytes, fail_every: int) -> Any:
    """The recorder's processor, two outputs, then: every ``fail_every``-th offset fails its first attempt
    *after* producing (its retry must not repeat those outputs); ``poison``'s records are dead-lettered."""
    rnd = random.Random(5)
    failed: set[tuple[int, int]] = set()

    async def proc(record: Record, ctx: Context) -> None:
        await asyncio.sleep(rnd.random() * 0.002)
        await rec.async_processor(record, ctx)
        for i in range(2):
            ctx.produce(out_topic, f"1:{record.topic}:{record.partition}:{record.offset}:{i}", key=record.key)
        if record.key == poison:
            raise NonRetryable("poison")
        if record.offset % fail_every == 0 and (record.partition, record.offset) not in failed:
            failed.add((record.partition, record.offset))
            raise RuntimeError("fails after producing")

    return proc


def _read_dlq(bootstrap: str, topic: str) -> list[bytes | None]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"dlq-{uuid.uuid4().hex[:6]}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    out: list[bytes | None] = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        for _ in range(40):
            out += [m.value() for m in c.consume(100, 0.1) if m.error() is None]
    finally:
        c.close()
    return out


def test_exactly_once_across_retries_dead_letters_and_a_restart(broker: EmbeddedBroker,
                                                                topic_name: str) -> None:
    broker.create_topic(topic_name, 2)
    out_topic = f"{topic_name}-out"
    broker.create_topic(out_topic, 3)
    dlq_topic = f"{topic_name}.dlq"
    broker.create_topic(dlq_topic, 1)
    n = 300
    produced = produce(broker, topic_name, n, keys=12) + produce(broker, topic_name, n, keys=12, partition=1)
    poison = produced[7].key
    assert poison is not None
    rec = recorder()
    cfg = config(broker, topic_name, f"g-{topic_name}", partitions=(0, 1), factor=8, max_retries=3,
                 dead_letter_topic=dlq_topic)
    with running_eos(cfg, _forwarder(rec, out_topic, poison, fail_every=17)):
        wait_for(lambda: all(committed_offset(broker, cfg.group, topic_name, p) == n for p in (0, 1)),
                 60, what="both partitions committed (first run)")
    # a restart: the second incarnation sees only new records (the committed offsets say so)
    more = produce(broker, topic_name, 100, keys=12) + produce(broker, topic_name, 100, keys=12, partition=1)
    with running_eos(cfg, _forwarder(rec, out_topic, poison, fail_every=17)):
        wait_for(lambda: all(committed_offset(broker, cfg.group, topic_name, p) == n + 100 for p in (0, 1)),
                 60, what="both partitions committed (after the restart)")
    inputs = [r for r in produced + more if r.key != poison]
    seen = read_outputs(broker.bootstrap, out_topic, 3, quiet_s=1.0)
    dead = [r for r in produced + more if r.key == poison]
    # exactly once, in per-key order across the two incarnations; the poison records' outputs never
    # left (their attempts failed), their dead letters did, once each
    result = check_outputs(inputs, seen, per_input=2, ordered=True, exactly_once=True)
    assert_all(check_delivery(produced + more, rec.snapshot(), mode="key", exempt_keys=[poison]), result)
    assert not [o for o in seen if o.key == poison]
    assert len(seen) == 2 * len(inputs)
    assert len(_read_dlq(broker.bootstrap, dlq_topic)) == len(dead)
    assert ended(rec.snapshot()) >= {r.offset for r in inputs if r.partition == 0}


@pytest.mark.parametrize("outputs", [True, False], ids=["with-outputs", "without-outputs"])
def test_a_transaction_commits_after_max_records_before_the_interval(broker: EmbeddedBroker,
                                                                      topic_name: str, outputs: bool) -> None:
    """``max_records`` counts the records in the transaction, whether they produced outputs or not."""
    broker.create_topic(topic_name, 1)
    out_topic = f"{topic_name}-out"
    broker.create_topic(out_topic, 1)
    produce(broker, topic_name, 200, keys=10)

    async def proc(record: Record, ctx: Context) -> None:
        if outputs:
            ctx.produce(out_topic, f"1:{record.topic}:{record.partition}:{record.offset}:0", key=record.key)

    cfg = config(broker, topic_name, f"g-{topic_name}", factor=4, commit_interval_ms=120_000)
    with running_eos(cfg, proc, max_records=20):
        wait_for(lambda: (committed_offset(broker, cfg.group, topic_name) or 0) >= 160, 20,
                 what="commits after 20 records, long before the 120 s interval")


def test_the_next_owners_open_fences_the_previous_owner(broker: EmbeddedBroker, topic_name: str) -> None:
    """Two workers' transactional outputs for the same partition: the second ``open`` fences the first,
    whose next transaction fails with :class:`TransactionFencedError` and never commits."""
    broker.create_topic(topic_name, 1)
    out_topic = f"{topic_name}-out"
    broker.create_topic(out_topic, 1)
    group = f"g-{topic_name}"
    tp = (topic_name, 0)
    old, new = transactions(broker, group), transactions(broker, group)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        old.open(tp)
        new.open(tp)
        old.hold(topic_name, 0, 0, [(out_topic, b"zombie", b"k", [])])
        txn = old.transaction(tp)
        assert txn is not None and txn.turn.acquire(blocking=False)
        with pytest.raises(TransactionFencedError):
            old.commit(txn, old.take(tp, lambda o: True), None, topic_name, 0, 1, c.consumer_group_metadata())
        assert old.fenced(tp)
        new_txn = new.transaction(tp)
        assert new_txn is not None and new_txn.turn.acquire(blocking=False)
        new.commit(new_txn, [(out_topic, b"owner", b"k", [])], None, topic_name, 0, 1,
                   c.consumer_group_metadata())
    finally:
        c.close()
        old.close_all()
        new.close_all()
    values = [m.value for m in _read_values(broker.bootstrap, out_topic)]
    assert values == [b"owner"]
    assert committed_offset(broker, group, topic_name) == 1


class _Msg:
    def __init__(self, value: bytes | None) -> None:
        self.value = value


def _read_values(bootstrap: str, topic: str) -> list[_Msg]:
    return [_Msg(v) for v in _read_dlq(bootstrap, topic)]
