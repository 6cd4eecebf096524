"""Regression: a partition with no committed offset must not skip a record refused by back-pressure.

Found by the state tests: with several partitions sharing a small process-wide in-flight bound, a
partition whose very first fetched record did not fit was paused with an unknown position, and the
resume did not seek back, so librdkafka continued after the refused record (a lost record).
"""

from __future__ import annotations

import pytest
from test_engine_harness import committed_offset, config, produce, recorder, running, wait_for

from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery

pytestmark = pytest.mark.broker


@pytest.mark.parametrize("sync", [False, True])
def test_first_record_refused_by_back_pressure_is_not_skipped(
    broker: EmbeddedBroker, topic_name: str, sync: bool
) -> None:
    partitions = 4
    broker.create_topic(topic_name, partitions)
    produced = []
    for p in range(partitions):
        produced += produce(broker, topic_name, 4, keys=3, partition=p)
    rec = recorder(sleep_ms=1200.0)
    # Slow records and a process-wide bound of 2: the process stays full, the engine's periodic poll
    # while full hands over other partitions' first records, which do not fit and are refused.
    cfg = config(broker, topic_name, f"g-{topic_name}", partitions=range(partitions),
                 factor=4, max_in_flight=2)
    proc = rec.sync_processor if sync else rec.async_processor
    with running(cfg, proc):
        def done() -> int:
            return len({(e.partition, e.offset) for e in rec.snapshot() if e.kind == "end"})

        wait_for(lambda: done() >= len(produced), 90, what="every record processed")
        for p in range(partitions):
            wait_for(lambda p=p: committed_offset(broker, cfg.group, topic_name, p) == 4, 30,
                     what=f"final commit of partition {p}")
    assert_all(check_delivery(produced, rec.snapshot(), mode="key"))
