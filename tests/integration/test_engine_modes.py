"""The engine processes everything in each ordering mode, keeps per-key order, survives factor changes."""

from __future__ import annotations

import pytest
from test_engine_harness import committed_offset, config, ended, produce, recorder, running, wait_for

from multilane.api import OrderingMode
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery

pytestmark = pytest.mark.broker


@pytest.mark.matrix
@pytest.mark.parametrize("mode", ["key", "partition", "unordered"])
def test_each_mode_processes_everything(broker: EmbeddedBroker, topic_name: str, mode: str) -> None:
    broker.create_topic(topic_name, 1)
    n = 400 if mode == "partition" else 1500
    produced = produce(broker, topic_name, n, keys=30)
    rec = recorder(sleep_ms=1.0)
    cfg = config(broker, topic_name, f"g-{topic_name}", ordering=OrderingMode(mode), factor=8)
    with running(cfg, rec.async_processor) as (engine, runner):
        wait_for(lambda: len(ended(rec.snapshot())) >= n, 60, what="all records processed")
        wait_for(lambda: committed_offset(broker, cfg.group, topic_name) == n, 20, what="final commit")
        status = runner.sync(engine.status)
    events = rec.snapshot()
    assert_all(check_delivery(produced, events, mode=mode))
    assert status["processed_total"] >= n
    lanes_used = {e.lane for e in events if e.kind == "start"}
    if mode == "partition":
        assert lanes_used == {0}
        # one at a time per partition: starts and ends alternate
        open_ = 0
        for e in events:
            open_ += 1 if e.kind == "start" else -1 if e.kind == "end" else 0
            assert open_ <= 1
    else:
        assert len(lanes_used) > 1, "records should spread over several lanes"


def test_sync_processor_key_mode(broker: EmbeddedBroker, topic_name: str) -> None:
    broker.create_topic(topic_name, 1)
    n = 1000
    produced = produce(broker, topic_name, n, keys=25)
    rec = recorder(sleep_ms=0.5)
    cfg = config(broker, topic_name, f"g-{topic_name}", factor=6)
    with running(cfg, rec.sync_processor):
        wait_for(lambda: len(ended(rec.snapshot())) >= n, 60, what="all records processed")
    assert_all(check_delivery(produced, rec.snapshot(), mode="key"))
    assert committed_offset(broker, cfg.group, topic_name) == n


def test_null_keys_in_key_mode(broker: EmbeddedBroker, topic_name: str) -> None:
    """Null-key records are routed by their offset's hash: spread over lanes, all processed."""
    broker.create_topic(topic_name, 1)
    n = 600
    produced = produce(broker, topic_name, n, key_of=lambda i: None if i % 3 == 0 else f"k{i % 7}".encode())
    rec = recorder(sleep_ms=1.0)
    cfg = config(broker, topic_name, f"g-{topic_name}", factor=8)
    with running(cfg, rec.async_processor):
        wait_for(lambda: len(ended(rec.snapshot())) >= n, 60, what="all records processed")
    events = rec.snapshot()
    assert_all(check_delivery(produced, events, mode="key"))
    null_lanes = {e.lane for e in events if e.kind == "start" and e.key is None}
    assert len(null_lanes) >= 4, f"null keys should spread over lanes, got {null_lanes}"


@pytest.mark.parametrize("sync", [False, True])
def test_factor_changes_while_processing(broker: EmbeddedBroker, topic_name: str, sync: bool) -> None:
    """F goes 4 -> 16 -> 2 -> 8 while records flow: nothing lost, per-key order kept."""
    broker.create_topic(topic_name, 1)
    n = 3000
    produced = produce(broker, topic_name, n, keys=40)
    rec = recorder(sleep_ms=1.0)
    cfg = config(broker, topic_name, f"g-{topic_name}", factor=4, max_in_flight=500)
    proc = rec.sync_processor if sync else rec.async_processor
    with running(cfg, proc) as (engine, runner):
        for f, after in ((16, 300), (2, 1000), (8, 1800)):
            wait_for(lambda after=after: len(ended(rec.snapshot())) >= after, 60, what=f"{after} done")
            assert runner.call(engine.set_factor, f) == f
            assert runner.sync(lambda: engine.factor) == f
        wait_for(lambda: len(ended(rec.snapshot())) >= n, 60, what="all records processed")
        status = runner.sync(engine.status)
    events = rec.snapshot()
    assert_all(check_delivery(produced, events, mode="key"))
    assert status["factor"] == 8
    late_lanes = {e.lane for e in events[-200:] if e.kind == "start"}
    assert max(late_lanes) < 8


def test_factor_changes_with_records_waiting_for_retries(broker: EmbeddedBroker, topic_name: str) -> None:
    """Parked keys (a failed record waiting for its retry) are carried over a resize: their later
    records still wait behind them, so per-key order holds across the re-routing."""
    broker.create_topic(topic_name, 1)
    n = 1200
    produced = produce(broker, topic_name, n, keys=24)
    flaky = frozenset({b"k1", b"k5", b"k9", b"k13"})
    rec = recorder(sleep_ms=1.0, flaky=flaky, flaky_attempts=2)
    cfg = config(broker, topic_name, f"g-{topic_name}", factor=3, max_retries=3, retry_backoff_ms=60)
    with running(cfg, rec.async_processor) as (engine, runner):
        for f, after in ((7, 100), (2, 400), (5, 700)):
            wait_for(lambda after=after: len(ended(rec.snapshot())) >= after, 60, what=f"{after} done")
            runner.call(engine.set_factor, f)
        wait_for(lambda: len(ended(rec.snapshot())) >= n, 90, what="all processed")
        status = runner.sync(engine.status)
    events = rec.snapshot()
    assert_all(check_delivery(produced, events, mode="key"))
    assert status["partitions"][0]["dead_lettered"] == 0
    assert sum(1 for e in events if e.kind == "fail") == 2 * sum(1 for r in produced if r.key in flaky)


@pytest.mark.parametrize("mode", ["unordered", "partition"])
def test_sync_processor_other_modes_with_failures(broker: EmbeddedBroker, topic_name: str, mode: str) -> None:
    broker.create_topic(topic_name, 1)
    n = 300
    produced = produce(broker, topic_name, n, keys=10)
    rec = recorder(sleep_ms=0.5, flaky=frozenset({b"k2"}), flaky_attempts=1)
    cfg = config(broker, topic_name, f"g-{topic_name}", ordering=OrderingMode(mode), factor=6)
    with running(cfg, rec.sync_processor):
        wait_for(lambda: len(ended(rec.snapshot())) >= n, 60, what="all processed")
        wait_for(lambda: committed_offset(broker, cfg.group, topic_name) == n, 30, what="final commit")
    assert_all(check_delivery(produced, rec.snapshot(), mode=mode))
