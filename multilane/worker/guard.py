"""The worker's guard around the processor: circuit breaker, per-record timeout, end-to-end latency.
No network I/O (a sync timeout runs the processor on a helper thread).

The engine counts a record complete when the processor callable it runs returns, so these features
compose around the processor instead of changing the engine (steps 1-4 of :func:`guarded`):

1. Hold the record while the breaker is open (:class:`~multilane.worker.breaker.CircuitBreaker`).
2. Run the inner processor (outputs, decoding and the user's function), bounded by ``timeout_s``
   (``--record-timeout-s``): an async processor under ``asyncio.timeout`` (cancelled at the deadline),
   a sync one on a helper thread that is waited for ``timeout_s`` (the thread itself cannot be
   stopped; it runs on, its outcome ignored). Either raises :class:`RecordTimeoutError`, a retriable
   failure.
3. A failure goes to the breaker: held while it is open (and run again after a reset), else raised to
   the engine's retry and dead-letter policy.
4. A success resets the breaker's count and observes the end-to-end latency (now minus the record's
   timestamp) in :class:`EndToEndLatency`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import time
from typing import Any

from multilane.api import Context, Processor, Record, is_async_processor, needs_state, processor_needs_state
from multilane.worker.breaker import CircuitBreaker
from multilane.worker.metrics import LatencyHistogram

__all__ = ["E2E_BUCKETS", "EndToEndLatency", "RecordTimeoutError", "guarded"]

#: Buckets of ``multilane_end_to_end_latency_seconds`` (a backlog makes it minutes, not milliseconds).
E2E_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                                  120.0, 300.0, 600.0, 1800.0, 3600.0)


class RecordTimeoutError(TimeoutError):
    """The record's processing took longer than ``--record-timeout-s`` (retried like any failure)."""


class EndToEndLatency:
    """Seconds from a record's timestamp to the end of its processing (a histogram; thread-safe)."""

    def __init__(self) -> None:
        self.histogram = LatencyHistogram(E2E_BUCKETS)
        self._lock = threading.Lock()

    def observe_ms(self, timestamp_ms: int) -> None:
        if timestamp_ms > 0:
            self.histogram.observe(max(0.0, time.time() - timestamp_ms / 1000.0))

    def observe_ms_locked(self, timestamp_ms: int) -> None:
        with self._lock:
            self.observe_ms(timestamp_ms)


def guarded(processor: Processor, breaker: CircuitBreaker | None = None, timeout_s: float = 0.0,
            latency: EndToEndLatency | None = None) -> Processor:
    """``processor`` behind the guard (steps 1-4 of the module docstring); same kind, same marks.

    The async wrapper's frame holds the record in its ``record`` local: the loop-blocking monitor
    (:mod:`multilane.worker.loopwatch`) reads it to name the record that blocked the loop.
    """
    brk = breaker or CircuitBreaker(0, lambda _a, _e: False)
    observe = latency.observe_ms if latency is not None else None
    wrapped: Any
    if is_async_processor(processor):
        inner_async: Any = processor

        async def run_guarded_async(record: Record, ctx: Context) -> None:
            rid = (record.topic, record.partition, record.offset)
            while True:
                # 1. hold while open
                if brk.is_open:
                    await brk.hold_async()
                brk.entered(rid)
                # 2. run, bounded
                try:
                    if timeout_s > 0:
                        try:
                            async with asyncio.timeout(timeout_s) as cm:
                                await inner_async(record, ctx)
                        except TimeoutError as exc:
                            if cm.expired():
                                raise RecordTimeoutError(f"{rid[0]}/{rid[1]}@{rid[2]} took longer than "
                                                         f"--record-timeout-s {timeout_s:g}") from exc
                            raise
                    else:
                        await inner_async(record, ctx)
                except Exception as exc:
                    # 3. failure: held while open, else to the retry policy
                    if brk.failed(rid, ctx.attempt, exc):
                        await brk.hold_async()
                        continue
                    raise
                # 4. success
                brk.succeeded()
                if observe is not None:
                    observe(record.timestamp_ms)
                return

        wrapped = run_guarded_async
    else:
        inner_sync: Any = processor
        pool = (concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="multilane-timed")
                if timeout_s > 0 else None)
        observe_sync = latency.observe_ms_locked if latency is not None else None

        def call(record: Record, ctx: Context) -> None:
            if pool is None:
                inner_sync(record, ctx)
                return
            fut = pool.submit(inner_sync, record, ctx)
            try:
                fut.result(timeout_s)
            except concurrent.futures.TimeoutError as exc:
                raise RecordTimeoutError(f"{record.topic}/{record.partition}@{record.offset} took longer "
                                         f"than --record-timeout-s {timeout_s:g}") from exc

        def run_guarded(record: Record, ctx: Context) -> None:
            rid = (record.topic, record.partition, record.offset)
            while True:
                if brk.is_open:
                    brk.hold_sync()
                brk.entered(rid)
                try:
                    call(record, ctx)
                except Exception as exc:
                    if brk.failed(rid, ctx.attempt, exc):
                        brk.hold_sync()
                        continue
                    raise
                brk.succeeded()
                if observe_sync is not None:
                    observe_sync(record.timestamp_ms)
                return

        wrapped = run_guarded
    functools.update_wrapper(wrapped, processor)
    if processor_needs_state(processor):
        needs_state(wrapped)
    return wrapped  # type: ignore[no-any-return,unused-ignore]
