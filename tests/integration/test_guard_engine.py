"""The guard under the engine's lane runners (in-process, embedded broker): ``--record-timeout-s``
cancels an async attempt that runs too long and the record is retried and completes; the end-to-end
latency is observed; the checkers hold."""

from __future__ import annotations

import asyncio

import pytest
from test_engine_harness import committed_offset, config, ended, produce, recorder, running, wait_for

from multilane.api import Context, Record
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery
from multilane.worker.guard import EndToEndLatency, guarded

pytestmark = pytest.mark.broker


def test_record_timeout_retries_a_slow_attempt(broker: EmbeddedBroker, topic_name: str) -> None:
    broker.create_topic(topic_name, 1)
    n = 200
    produced = produce(broker, topic_name, n, keys=10)
    rec = recorder()
    timeouts: list[int] = []

    async def proc(record: Record, ctx: Context) -> None:
        if record.offset % 50 == 7 and ctx.attempt == 1:
            try:
                await asyncio.sleep(30)  # far beyond the timeout: cancelled at 0.3 s
            except asyncio.CancelledError:
                timeouts.append(record.offset)
                raise
        await rec.async_processor(record, ctx)

    latency = EndToEndLatency()
    cfg = config(broker, topic_name, f"g-{topic_name}", factor=4, max_retries=2)
    with running(cfg, guarded(proc, timeout_s=0.3, latency=latency)):
        wait_for(lambda: len(ended(rec.snapshot())) >= n, 60, what="all records processed")
        wait_for(lambda: committed_offset(broker, cfg.group, topic_name) == n, 30, what="final commit")
    assert sorted(timeouts) == [7, 57, 107, 157]
    assert latency.histogram.total >= n
    assert_all(check_delivery(produced, rec.snapshot(), mode="key"))
