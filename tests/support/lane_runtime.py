"""A partition runtime on its own (no engine, no broker) for unit tests of lanes: built, fed with
in-memory messages, waited on. No I/O."""

from __future__ import annotations

import asyncio
from typing import Any

from multilane.api import OrderingMode
from multilane.worker.flow import FlowController
from multilane.worker.lanes import LaneEnv
from multilane.worker.metrics import LatencyHistogram
from multilane.worker.partition import PartitionRuntime, Phase
from multilane.worker.retry import RetryPolicy

__all__ = ["runtime", "until"]


def runtime(processor: Any, mode: OrderingMode, factor: int) -> PartitionRuntime:
    """An active runtime of topic ``t`` partition 0 running ``processor`` (async) on ``factor`` lanes."""
    env = LaneEnv(processor, True, None, yield_every=64)
    flow = FlowController(10_000, 1 << 30)
    flow.set_partitions(1)
    rt = PartitionRuntime("t", 0, mode, factor, env, flow, RetryPolicy(), None,  # type: ignore[arg-type]
                          LatencyHistogram(), "g", "w", 0, None)
    rt.phase = Phase.ACTIVE
    return rt


async def until(cond: Any, what: str) -> None:
    """Wait (1 ms steps, at most 3,000) until ``cond()``; AssertionError naming ``what`` else."""
    for _ in range(3000):
        if cond():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"timed out waiting for {what}")
