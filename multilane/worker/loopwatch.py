"""Loop-blocking detection: names the processor (and its record) that blocks the event loop. Does no
network I/O (a daemon thread reads the loop thread's stack).

``time.sleep`` or a blocking call inside ``async def`` stops every lane of the worker: records then run
one at a time, silently. :class:`LoopBlockWatch` (steps 1-3):

1. A callback on the loop stamps a heartbeat every ``interval_s``.
2. A daemon thread checks the heartbeat; when it is older than ``threshold_s`` the loop is blocked
   right now, and the thread reads the loop thread's current stack (``sys._current_frames``).
3. It logs one WARNING per blocking episode naming the innermost frame of user code (file, line,
   function), the processor frame's record (the guard's ``record`` local,
   :mod:`multilane.worker.guard`) and how long the loop was blocked, and counts it
   (``multilane_loop_blocked_total``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from types import FrameType
from typing import Any

__all__ = ["LoopBlockWatch", "describe_blocker"]

log = logging.getLogger(__name__)

_SKIP = ("/asyncio/", "/multilane/worker/", "/selectors.py", "/threading.py")


def describe_blocker(frame: FrameType | None, record_code: Any = None) -> str:
    """The innermost frame outside asyncio and the engine, and the record in flight; "" when the stack
    holds no such frame (pure)."""
    where = ""
    record = None
    f = frame
    found_user = False
    while f is not None:
        code = f.f_code
        if not found_user and not any(s in code.co_filename for s in _SKIP):
            where = f"{code.co_name} ({code.co_filename}:{f.f_lineno})"
            found_user = True
        if record_code is not None and code is record_code:
            record = f.f_locals.get("record")
            break
        f = f.f_back
    if not where:
        return ""
    if record is not None:
        where += f" on record {record.topic}/{record.partition}@{record.offset}"
    return where


class LoopBlockWatch:
    """Watches one event loop (steps 1-3 of the module docstring). ``record_code``: the code object
    whose frame holds the record (the guard's async wrapper)."""

    def __init__(self, threshold_s: float = 0.5, record_code: Any = None) -> None:
        self.threshold_s = threshold_s
        self.interval_s = min(0.1, threshold_s / 4)
        self.record_code = record_code
        self.blocked_total = 0
        self.last_warning = ""
        self._beat = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._tick()
        self._thread = threading.Thread(target=self._watch, name="multilane-loopwatch", daemon=True)
        self._thread.start()

    # 1.
    def _tick(self) -> None:
        self._beat = time.monotonic()
        if not self._stop.is_set() and self._loop is not None:
            self._handle = self._loop.call_later(self.interval_s, self._tick)

    # 2.
    def _watch(self) -> None:
        blocked = False
        started = 0.0
        while not self._stop.wait(self.interval_s):
            lag = time.monotonic() - self._beat - self.interval_s
            if lag < self.threshold_s:
                if blocked and self.last_warning != "no processor code":
                    log.warning("event loop was blocked for %.2fs in all (%s)", time.monotonic() - started,
                                self.last_warning)
                blocked = False
                continue
            if blocked:
                continue
            # 3. a new episode: name it once
            blocked = True
            started = self._beat + self.interval_s
            frame = sys._current_frames().get(self._loop_thread or 0)
            self.last_warning = describe_blocker(frame, self.record_code)
            self.blocked_total += 1
            if not self.last_warning:  # no processor code on the stack: CPU starvation, engine work
                self.last_warning = "no processor code"
                log.info("event loop late by %.2fs with no processor code running (an overloaded "
                         "machine, or engine work)", lag)
                continue
            log.warning("event loop blocked for more than %.2fs by %s: an 'async def' processor must not "
                        "block (use 'await asyncio.sleep', an async client, or asyncio.to_thread for "
                        "blocking calls); every lane waits meanwhile", lag, self.last_warning)

    def stop(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()
