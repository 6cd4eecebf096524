"""Stall watchdog: finds records that run longer than a threshold. No I/O besides logging.

The engine calls :meth:`StallWatchdog.scan` about once a second on its loop. A record counts as
stalled while it runs longer than ``threshold_s``; each stalled record is logged once (with topic,
partition and offset), and the count is exported as ``multilane_stalled_records``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from multilane.worker.lanes import Lane, RunSlot

__all__ = ["StallWatchdog"]

log = logging.getLogger(__name__)


class StallWatchdog:
    def __init__(self, threshold_s: float) -> None:
        if threshold_s <= 0:
            raise ValueError("stall threshold must be > 0")
        self.threshold_s = threshold_s
        self.stalled = 0  # stalled records found by the last scan

    def scan(self, slots: Iterable[tuple[Lane, RunSlot]], now: float | None = None) -> int:
        """Count (and warn once about) records running longer than the threshold."""
        t = time.monotonic() if now is None else now
        n = 0
        for _lane, slot in slots:
            work = slot.work
            if work is None:
                continue
            age = t - slot.started
            if age < self.threshold_s:
                continue
            n += 1
            if slot.warned is not work:
                slot.warned = work
                rec = work
                log.warning(
                    "stalled record: %s/%d@%d has been running for %.1fs (attempt %d, threshold %.1fs)",
                    rec.topic, rec.partition, rec.offset, age, work.attempt, self.threshold_s,
                )
        self.stalled = n
        return n
