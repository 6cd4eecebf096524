"""The work items ``PartitionRuntime.accept_run`` builds without ``Work.__init__`` are whole.

``accept_run`` makes each item with ``object.__new__`` and stores every field itself (issue 26: the
dataclass ``__init__`` call was the largest single line of the fetch path). A field added to ``Work``
(or to ``Record``) and not stored there would leave an unset slot that raises on first read; these
tests fail first.
"""

from __future__ import annotations

import asyncio
import dataclasses

from confluent_kafka import Message

from multilane.api import OrderingMode
from multilane.worker.flow import FlowController
from multilane.worker.lanes import LaneEnv, Work
from multilane.worker.metrics import LatencyHistogram
from multilane.worker.partition import WORK_FIELDS, PartitionRuntime
from multilane.worker.retry import RetryPolicy


def test_work_fields_are_the_ones_accept_run_stores() -> None:
    assert tuple(f.name for f in dataclasses.fields(Work)) == WORK_FIELDS
    assert set(Work.__slots__) | {"topic", "partition", "offset", "key", "value", "headers",
                                  "timestamp_ms"} == set(WORK_FIELDS)


def _runtime(mode: OrderingMode) -> PartitionRuntime:
    async def proc(rec: object, ctx: object) -> None:
        return None

    env = LaneEnv(proc, True, None)
    flow = FlowController(1000, 1 << 20)
    flow.set_partitions(1)
    return PartitionRuntime("t", 3, mode, 1, env, flow, RetryPolicy(), None,  # type: ignore[arg-type]
                            LatencyHistogram(), "g", "w", 0, None)  # fmt: skip


def test_accept_run_builds_items_equal_to_the_dataclass_constructor() -> None:
    async def go() -> None:
        for mode in (OrderingMode.UNORDERED, OrderingMode.KEY):
            rt = _runtime(mode)
            msgs = [
                Message(topic="t", partition=3, offset=0, key=b"a", value=b"xyz", timestamp=(1, 1000)),
                Message(topic="t", partition=3, offset=1, key=None, value=None, timestamp=(1, 1001),
                        headers=[("h", b"1")]),
            ]  # fmt: skip
            j, refused = rt.accept_run(msgs, 0, True)
            assert (j, refused) == (2, False)
            items = [w for lane in rt.lanes.lanes for w in lane.queue]
            items.sort(key=lambda w: w.offset)
            assert len(items) == 2
            for w, m in zip(items, msgs, strict=True):
                for name in WORK_FIELDS:
                    getattr(w, name)  # every slot is set (an unset one raises AttributeError)
                expected = Work("t", 3, m.offset(), m.key(), m.value(),  # type: ignore[arg-type]
                                m.headers() or [], m.timestamp()[1], w.key_hash, w.nbytes)  # type: ignore[arg-type]
                assert [getattr(w, f) for f in WORK_FIELDS] == [getattr(expected, f) for f in WORK_FIELDS]
                assert w.attempt == 1
                assert w.headers is not items[0].headers or w is items[0]  # a list of its own
            if mode is OrderingMode.KEY:
                assert all(w.key_hash != 0 for w in items)
            assert items[0].nbytes == 3 + 1 + 64 and items[1].nbytes == 64
            assert rt.tracker.position == 2 and rt.flow_counters.records == 2

    asyncio.run(go())
