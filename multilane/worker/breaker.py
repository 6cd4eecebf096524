"""The circuit breaker: after N consecutive dead letters a worker stops taking records. No network I/O
(it logs, and blocked sync callers sleep on their thread).

A handler bug (a wrong signature slipped past, a dependency down) fails every record; without a breaker
the worker drains the input topic into the dead-letter topic. The breaker counts the failures that the
error policy makes final (:meth:`multilane.worker.retry.RetryPolicy.should_retry` says no more retries:
that record is dead-lettered); a success in between starts the count again. When the count reaches
``threshold`` (``--breaker-dead-letters``) the breaker opens (steps 1-3 of :meth:`CircuitBreaker.failed`):

1. The failure that reached the threshold is still dead-lettered (at most ``threshold`` dead letters).
2. From then on every record is *held* before its processor runs, and every failure is held instead
   of being raised: a held record never completes, so its offset and everything after it is never
   committed (nothing is committed past a record neither processed nor dead-lettered), and the lanes
   stop taking records; the fetch stops at the in-flight bound.
3. One ERROR line says why; the worker reports not-ready (``/readyz``) and ``multilane_breaker_open``
   is 1.

:meth:`reset` (``POST /breaker/reset`` on the control endpoint) closes it: held records run (a held
failure runs its processor again, as after a restart). A restart closes it too (replay from the
committed offset). A record whose failure was counted and that then runs again (the engine retried
it after all) takes its count back.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["BreakerClosedError", "CircuitBreaker"]

log = logging.getLogger(__name__)

RecordId = tuple[str, int, int]


class BreakerClosedError(Exception):
    """The worker is stopping while a record was held by the open breaker (its outcome is ignored)."""


class CircuitBreaker:
    """Counts consecutive final failures; holds records while open. Thread-safe (sync processors).

    Invariants: ``consecutive`` is written under ``_lock``; ``is_open`` is True from the failure that
    reached ``threshold`` until :meth:`reset`; ``threshold == 0`` never opens.
    """

    def __init__(self, threshold: int, is_final: Callable[[int, BaseException], bool],
                 clock: Callable[[], float] = time.monotonic, poll_s: float = 0.2) -> None:
        if threshold < 0:
            raise ValueError(f"breaker threshold must be >= 0 (0 = off), got {threshold}")
        self.threshold = threshold
        self._is_final = is_final  # (attempt, exc) -> the failure is dead-lettered (no retry left)
        self._clock = clock
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self.consecutive = 0
        self.is_open = False
        self.opened_at: float | None = None
        self.reason = ""
        self.held = 0  # records held right now
        self.opened_total = 0
        self.stopping = False
        # records whose failure was counted as final: a re-run means it was retried, not dead-lettered
        self._counted: dict[RecordId, float] = {}

    # -- the processor wrapper's calls ------------------------------------------------------------------

    def entered(self, rid: RecordId) -> None:
        """A record's attempt starts (hot path: one dict check while nothing was counted)."""
        if self._counted:
            with self._lock:
                if self._counted.pop(rid, None) is not None and self.consecutive > 0 and not self.is_open:
                    self.consecutive -= 1

    def succeeded(self) -> None:
        if self.consecutive and not self.is_open:
            with self._lock:
                if not self.is_open:
                    self.consecutive = 0
                    self._counted.clear()

    def failed(self, rid: RecordId, attempt: int, exc: BaseException) -> bool:
        """An attempt failed: True when the record must be held (the breaker is open), False when the
        failure may go on to the engine's retry/dead-letter policy (steps 1-3 of the module)."""
        if self.threshold == 0:
            return False
        with self._lock:
            if self.is_open:
                return True  # 2. hold
            if not self._is_final(attempt, exc):
                return False
            # 1. this one is dead-lettered; count it
            self.consecutive += 1
            self._counted[rid] = self._clock()
            if self.consecutive >= self.threshold:
                self._open(rid, exc)
            return False

    def _open(self, rid: RecordId, exc: BaseException) -> None:
        # 3. say why (once)
        self.is_open = True
        self.opened_at = self._clock()
        self.opened_total += 1
        self.reason = (f"{self.consecutive} consecutive records dead-lettered, the last "
                       f"{rid[0]}/{rid[1]}@{rid[2]}: {type(exc).__name__}: {str(exc)[:200]}")
        log.error("circuit breaker open: %s; the worker takes no more records and commits nothing past "
                  "them until POST /breaker/reset or a restart", self.reason)

    def reset(self) -> bool:
        """Close the breaker; held records run. Returns whether it was open."""
        with self._lock:
            was = self.is_open
            self.is_open = False
            self.consecutive = 0
            self._counted.clear()
            self.opened_at = None
            self.reason = ""
        if was:
            log.warning("circuit breaker reset: taking records again")
        return was

    def stop(self) -> None:
        """The worker stops: held sync records give up (their outcome is ignored by then)."""
        self.stopping = True

    # -- holding ----------------------------------------------------------------------------------------

    async def hold_async(self) -> None:
        """Wait on the loop while the breaker is open (a cancellation ends it)."""
        self.held += 1
        try:
            while self.is_open:  # noqa: ASYNC110 - opened and reset from other threads too
                await asyncio.sleep(self._poll_s)
        finally:
            self.held -= 1

    def hold_sync(self) -> None:
        """Wait on the processor's thread while the breaker is open; BreakerClosedError on stop."""
        with self._lock:
            self.held += 1
        try:
            while self.is_open:
                if self.stopping:
                    raise BreakerClosedError("the worker stopped while the breaker held this record")
                time.sleep(self._poll_s)
        finally:
            with self._lock:
                self.held -= 1

    def status(self) -> dict[str, Any]:
        return {"open": self.is_open, "threshold": self.threshold, "consecutive": self.consecutive,
                "held": self.held, "reason": self.reason, "opened_total": self.opened_total}
