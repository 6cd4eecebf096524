"""Example processors for ``multilane worker --processor multilane.demo.examples:NAME``.

No I/O besides sleeping (they stand in for calls to remote systems):

- ``io_bound`` (async): sleeps ``MULTILANE_EXAMPLE_SLEEP_MS`` milliseconds (default 10), like a call to
  a remote API; thousands can be in flight on one event loop.
- ``io_bound_sync``: the same with ``time.sleep`` on the thread pool.
- ``cpu_light`` (sync): a little CPU work per record (a CRC over the value,
  ``MULTILANE_EXAMPLE_CPU_ROUNDS`` times, default 10).
- ``noop`` (async) and ``noop_sync``: do nothing (measure the engine's own overhead).
"""

from __future__ import annotations

import asyncio
import os
import time
import zlib

from multilane.api import Context, Record

__all__ = ["cpu_light", "io_bound", "io_bound_sync", "noop", "noop_sync"]


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r} is not a number") from exc
    if value < 0:
        raise ValueError(f"{name}={raw!r} must be >= 0")
    return value


_SLEEP_S = _env_float("MULTILANE_EXAMPLE_SLEEP_MS", 10.0) / 1000.0
_CPU_ROUNDS = int(_env_float("MULTILANE_EXAMPLE_CPU_ROUNDS", 10.0))


async def io_bound(record: Record, ctx: Context) -> None:
    """Wait like a remote call would (``asyncio.sleep``)."""
    await asyncio.sleep(_SLEEP_S)


def io_bound_sync(record: Record, ctx: Context) -> None:
    """Wait like a blocking remote call would (``time.sleep``, on the thread pool)."""
    time.sleep(_SLEEP_S)


def cpu_light(record: Record, ctx: Context) -> None:
    """A little CPU work: CRC-32 over the value a few times."""
    data = record.value or b""
    crc = 0
    for _ in range(_CPU_ROUNDS):
        crc = zlib.crc32(data, crc)


async def noop(record: Record, ctx: Context) -> None:
    """Nothing (async)."""


def noop_sync(record: Record, ctx: Context) -> None:
    """Nothing (sync)."""
