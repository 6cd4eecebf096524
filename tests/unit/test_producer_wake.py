"""A produced progress record wakes the producer loop (issue 22): the release's final progress record
waits for its acknowledgement inside the handoff's pause, so its delivery report must be served at
once, not after an idle 50 ms sleep. No broker: a producer double that counts its polls."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from multilane.worker.control_state import Lifecycle
from multilane.worker.housekeeping import ProducerLoop
from multilane.worker.progress_store import ProgressStore


class CountingProducer:
    def __init__(self) -> None:
        self.polls: list[float] = []
        self.produced: list[dict[str, Any]] = []

    def poll(self, _timeout: float) -> int:
        self.polls.append(time.monotonic())
        return 0

    def produce(self, topic: str, **kwargs: Any) -> None:
        self.produced.append({"topic": topic, **kwargs})

    def __len__(self) -> int:
        return 0  # nothing in flight: the loop would sleep its idle 50 ms


def test_a_produced_progress_record_wakes_the_idle_producer_loop() -> None:
    async def main() -> None:
        producer, life = CountingProducer(), Lifecycle()
        loop = ProducerLoop(producer, life)
        store = ProgressStore("unused:9092", "g", "progress", producer, on_produce=loop.wake)
        store._partitions = 4  # the topic's partition count, as after ensure_topic()
        task = asyncio.create_task(loop.run())
        await asyncio.sleep(0.01)  # the loop polled once and sleeps its idle interval now
        before = len(producer.polls)
        produced_at = time.monotonic()
        store.write("in", 3, b"record")
        await asyncio.sleep(0.02)  # well under the idle 50 ms
        woken = [t for t in producer.polls[before:] if t >= produced_at]
        life.stopping = True
        await asyncio.wait_for(task, 1.0)
        assert len(producer.produced) == 1
        assert woken and woken[0] - produced_at < 0.02, (producer.polls, produced_at)

    asyncio.run(main())
