"""LaneGroup: the lanes of one partition, the routing of its records to them by key-hash range, and
the factor change at run time (:meth:`LaneGroup.resize`, numbered steps). No I/O (runs on the loop).
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import logging
from typing import Any

from multilane.api import OrderingMode
from multilane.formats.keyranges import HASH_SPACE, KeyRange, KeyRangeMap
from multilane.worker.lanes import Lane, LaneEnv, LaneHost, RunSlot, Work

__all__ = ["LaneGroup"]

log = logging.getLogger(__name__)

FULL_RANGE = KeyRange(0, HASH_SPACE)


class LaneGroup:
    """The lanes of one partition and the routing of its records to them.

    Invariant: in key mode ``lanes[i].key_range == layout[i]`` and ``starts[i] == layout[i].start``;
    in partition and unordered modes there is exactly one lane, covering the whole hash space.
    """

    def __init__(self, mode: OrderingMode, factor: int, host: LaneHost, env: LaneEnv) -> None:
        self.mode = mode
        self.factor = factor
        self.host = host
        self.env = env
        self.layout = KeyRangeMap.even(factor if mode is OrderingMode.KEY else 1)
        self.lanes: list[Lane] = self._make_lanes(self.layout)
        self.starts = [r.start for r in self.layout.ranges]
        self._resizing: asyncio.Lock | None = None

    def _make_lanes(self, layout: KeyRangeMap) -> list[Lane]:
        if self.mode is OrderingMode.KEY:
            return [Lane(i, r, self.host, self.env, 1, True) for i, r in enumerate(layout.ranges)]
        if self.mode is OrderingMode.PARTITION:
            return [Lane(0, FULL_RANGE, self.host, self.env, 1, True, block_all=True)]
        return [Lane(0, FULL_RANGE, self.host, self.env, self.factor, False)]

    def start(self) -> None:
        for lane in self.lanes:
            lane.start()

    def close(self) -> None:
        for lane in self.lanes:
            lane.close()

    def hold(self) -> None:
        """Start no queued record any more (records running now finish); for a release, which hands
        the queued records to the next owner. Irreversible short of :meth:`close`."""
        for lane in self.lanes:
            lane.holding = True

    def route(self, work: Work) -> None:
        lanes = self.lanes
        if len(lanes) == 1:
            lanes[0].push(work)
        else:
            lanes[bisect.bisect_right(self.starts, work.key_hash) - 1].push(work)

    def lane_index(self, key_hash: int) -> int:
        return bisect.bisect_right(self.starts, key_hash) - 1

    @property
    def running(self) -> int:
        return sum(lane.running for lane in self.lanes)

    @property
    def queued(self) -> int:
        return sum(len(lane.queue) for lane in self.lanes)

    @property
    def busy_fraction(self) -> float:
        """Records being processed / concurrency (lane utilisation, at most 1): a record that only
        waits for its outputs' acknowledgements lent its place and is not counted."""
        cap = sum(lane.concurrency for lane in self.lanes)
        return sum(lane.running - lane.lent for lane in self.lanes) / cap if cap else 0.0

    def batches_running(self) -> list[concurrent.futures.Future[Any]]:
        """Thread-pool batches still running (sync processors); after close() each of them stops
        once its current record returns."""
        return [f for lane in self.lanes for f in lane.batches if not f.done()]

    def slots(self) -> list[tuple[Lane, RunSlot]]:
        return [(lane, s) for lane in self.lanes for s in lane.slots]

    async def resize(self, factor: int) -> None:
        """Change the factor while records flow; per-key order is kept and nothing is lost.

        Unordered mode changes the runner count. Partition mode only records the factor. Key mode:

        1. Hold every lane: runners finish their current record and take no new one; fetched
           records keep arriving in the (held) queues.
        2. Wait until no record runs.
        3. Take every record that is not running from the old lanes: queued, parked and
           retry-pending ones (with their remaining backoff).
        4. Build lanes for the even layout of ``factor``, route the taken records to them in
           offset order (so each key's records keep their order), and re-park retry-pending records.
        5. Close the old lanes and start the new ones.
        """
        if self._resizing is None:
            self._resizing = asyncio.Lock()
        async with self._resizing:
            self.factor = factor
            if self.mode is OrderingMode.UNORDERED:
                self.lanes[0].set_concurrency(factor)
                return
            if self.mode is OrderingMode.PARTITION or len(self.lanes) == factor:
                return
            old = self.lanes
            # 1. hold
            for lane in old:
                lane.holding = True
            # 2. wait for running records
            while any(lane.running for lane in old):  # noqa: ASYNC110 - counters of several lanes
                await asyncio.sleep(0.002)
            # 3. take everything that is not running
            items: list[Work] = []
            pending: list[tuple[Work, float]] = []
            for lane in old:
                got, later = lane.drain_items()
                items.extend(got)
                pending.extend(later)
            items.sort(key=lambda w: w.offset)
            # 4. new layout; route in offset order; re-park retries
            layout = KeyRangeMap.even(factor)
            lanes = self._make_lanes(layout)
            self.layout = layout
            self.starts = [r.start for r in layout.ranges]
            self.lanes = lanes
            for work, delay in sorted(pending, key=lambda p: p[0].offset):
                lanes[self.lane_index(work.key_hash)].retry_later(work, delay)
            for work in items:
                self.route(work)
            # 5. swap runners
            for lane in old:
                lane.close()
            for lane in lanes:
                lane.start()
            log.info("factor changed to %d (%d queued records re-routed)", factor, len(items))
