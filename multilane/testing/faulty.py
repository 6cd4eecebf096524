"""Processors that fail on purpose, for the stop-a-bad-deploy tests. Does I/O (the event log of
:mod:`multilane.testing.processors`).

- :func:`always_fails`: logs ``start`` and ``fail`` and raises :class:`HandlerBugError` on every record
  (a handler bug that would drain the topic into the dead-letter topic without a circuit breaker).
- :func:`blocks_the_loop`: an ``async def`` that calls ``time.sleep`` (``MULTILANE_TEST_SLEEP_MS``),
  blocking the event loop.
"""

from __future__ import annotations

import time

from multilane.api import Context, Record
from multilane.testing.processors import _current

__all__ = ["HandlerBugError", "always_fails", "blocks_the_loop"]


class HandlerBugError(RuntimeError):
    """The deliberate failure of :func:`always_fails`."""


async def always_fails(record: Record, ctx: Context) -> None:
    _cfg, sink = _current()
    sink.emit("start", ctx)
    sink.emit("fail", ctx)
    raise HandlerBugError(f"handler bug on {record.topic}/{record.partition}@{record.offset}")


async def blocks_the_loop(record: Record, ctx: Context) -> None:
    cfg, sink = _current()
    sink.emit("start", ctx)
    time.sleep(cfg.sleep_s)  # noqa: ASYNC251 - the bug under test: a blocking call inside async def
    sink.emit("end", ctx)
