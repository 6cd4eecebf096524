"""Outputs tied to commits on the embedded broker: ``ctx.produce`` through the engine, the committed offset
never passes a record whose outputs are unacknowledged, and with ``ordering=key`` each key's outputs
leave in input order. The delivery checkers and the outputs checker hold."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import pytest
from confluent_kafka import Producer
from test_engine_harness import committed_offset, config, ended, produce, recorder, running, wait_for

from multilane.api import Context, OrderingMode, Record
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery
from multilane.testing.outputs import OutputSeen, check_outputs, read_outputs
from multilane.worker.outputs import OutputProducer, output_producer_config, with_outputs

pytestmark = pytest.mark.broker


def _output_producer(broker: EmbeddedBroker) -> OutputProducer:
    return OutputProducer.from_config(output_producer_config(broker.bootstrap, "test-outputs"))


def _forwarder(rec: Any, out_topic: str, per_input: int, sync: bool = False) -> Any:
    """The recorder's processor (events for the checkers; random work), then ``per_input`` outputs."""
    rnd = random.Random(3)

    def outputs(record: Record, ctx: Context) -> None:
        for i in range(per_input):
            ctx.produce(out_topic, f"1:{record.topic}:{record.partition}:{record.offset}:{i}", key=record.key)

    if sync:
        def proc_sync(record: Record, ctx: Context) -> None:
            rec.sync_processor(record, ctx)
            outputs(record, ctx)

        return proc_sync

    async def proc(record: Record, ctx: Context) -> None:
        await asyncio.sleep(rnd.random() * 0.003)
        await rec.async_processor(record, ctx)
        outputs(record, ctx)

    return proc


@pytest.mark.matrix
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_key_mode_outputs_complete_and_in_input_order(broker: EmbeddedBroker, topic_name: str,
                                                      sync: bool) -> None:
    """Key mode, 2 input partitions, F=8, 3 outputs per record into a 3-partition topic: every input has
    its outputs, each key's outputs are in input order, the checkers hold, everything is committed."""
    broker.create_topic(topic_name, 2)
    out_topic = f"{topic_name}-out"
    broker.create_topic(out_topic, 3)
    n = 600
    produced = produce(broker, topic_name, n, keys=15) + produce(broker, topic_name, n, keys=15, partition=1)
    rec = recorder()
    out = _output_producer(broker)
    cfg = config(broker, topic_name, f"g-{topic_name}", partitions=(0, 1), factor=8)
    try:
        with running(cfg, with_outputs(_forwarder(rec, out_topic, 3, sync), out)):
            wait_for(lambda: len(ended(rec.snapshot())) >= n, 60, what="all records processed")
            wait_for(lambda: all(committed_offset(broker, cfg.group, topic_name, p) == n for p in (0, 1)),
                     30, what="both partitions committed")
    finally:
        out.close(10)
    seen = read_outputs(broker.bootstrap, out_topic, 3)
    assert_all(check_delivery(produced, rec.snapshot(), mode="key"),
               check_outputs(produced, seen, per_input=3, ordered=True))
    assert len(seen) == 3 * 2 * n  # no failure, no replay: exactly once here


class HeldProducer:
    """A real producer whose delivery reports are served only while ``open`` is set."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self.open = threading.Event()

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self.producer.produce(*args, **kwargs)

    def poll(self, timeout: float) -> int:
        if not self.open.wait(timeout):
            return 0
        return int(self.producer.poll(timeout))

    def flush(self, timeout: float) -> int:
        return int(self.producer.flush(timeout))


@pytest.mark.matrix
def test_nothing_is_committed_before_its_outputs_are_acknowledged(broker: EmbeddedBroker,
                                                                  topic_name: str) -> None:
    """Processors return at once, but their outputs' acknowledgements are held: after several commit
    cycles nothing is committed; once released, everything is, with every output in the topic."""
    broker.create_topic(topic_name, 1)
    out_topic = f"{topic_name}-out"
    broker.create_topic(out_topic, 1)
    n = 50
    produced = produce(broker, topic_name, n, keys=5)
    rec = recorder()
    held = HeldProducer(Producer(output_producer_config(broker.bootstrap, "held-outputs")))
    out = OutputProducer(held)
    cfg = config(broker, topic_name, f"g-{topic_name}", ordering=OrderingMode.UNORDERED, factor=64)
    try:
        with running(cfg, with_outputs(_forwarder(rec, out_topic, 1), out)) as (engine, runner):
            wait_for(lambda: len(ended(rec.snapshot())) >= n, 60, what="all processors returned")
            # five commit cycles (200 ms) with every processor returned and no output acknowledged
            threading.Event().wait(1.0)
            assert committed_offset(broker, cfg.group, topic_name) in (None, 0)
            assert runner.sync(engine.status)["processed_total"] == 0
            held.open.set()
            wait_for(lambda: committed_offset(broker, cfg.group, topic_name) == n, 30, what="commit")
    finally:
        held.open.set()
        out.close(10)
    assert_all(check_delivery(produced, rec.snapshot(), mode="unordered"),
               check_outputs(produced, read_outputs(broker.bootstrap, out_topic, 1), 1, ordered=False))


def test_outputs_checker_finds_missing_and_backwards() -> None:
    """The checker itself can fail (pure)."""
    from multilane.testing.checkers import ProducedRecord

    inputs = [ProducedRecord("t", 0, o, b"k") for o in range(3)]
    good = [OutputSeen(0, i, b"k", 1, "t", 0, o, 0) for i, o in enumerate([0, 1, 2])]
    assert check_outputs(inputs, good, 1, ordered=True).ok
    assert not check_outputs(inputs, good[:2], 1, ordered=True).ok
    back = [OutputSeen(0, i, b"k", 1, "t", 0, o, 0) for i, o in enumerate([0, 2, 1])]
    r = check_outputs(inputs, back, 1, ordered=True)
    assert not r.ok and r.counts["backwards"] == 1
    # a new incarnation may repeat from an earlier offset
    replay = good + [OutputSeen(0, 3 + i, b"k", 2, "t", 0, o, 0) for i, o in enumerate([1, 2])]
    assert check_outputs(inputs, replay, 1, ordered=True).ok
