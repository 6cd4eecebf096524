"""The demo's example processor: a stateful, IO-bound per-key counter. Does I/O (``ctx.state``, an
``asyncio.sleep`` standing in for a remote call, and the event log when one is configured).

``stateful_io`` counts the records of each key in ``ctx.state`` (see
:func:`multilane.worker.state.examples.count_per_key`), then waits ``MULTILANE_DEMO_SLEEP_MS``
(default 10 ms). With ``MULTILANE_TEST_LOG`` set it writes ``start``/``end`` events in the format of
:mod:`multilane.testing.processors`, so the delivery checkers can judge the run.
"""

from __future__ import annotations

import asyncio
import os

from multilane.api import Context, Record
from multilane.testing.processors import FileEventSink
from multilane.worker.state.examples import count_per_key

__all__ = ["SLEEP_ENV", "stateful_io"]

SLEEP_ENV = "MULTILANE_DEMO_SLEEP_MS"

_SLEEP_S = float(os.environ.get(SLEEP_ENV, "10")) / 1000.0
_LOG = os.environ.get("MULTILANE_TEST_LOG")
_SINK = FileEventSink(_LOG) if _LOG else None


async def stateful_io(record: Record, ctx: Context) -> None:
    """Count the key in the state store, then do ~10 ms of (simulated) remote I/O."""
    if _SINK is not None:
        _SINK.emit("start", ctx)
    count_per_key(record, ctx)
    try:
        if _SLEEP_S > 0:
            await asyncio.sleep(_SLEEP_S)
    except asyncio.CancelledError:
        # The engine cancelled the attempt (a release passed its drain deadline): it stops here and
        # the next owner replays the record. Logged so the checkers know it no longer runs.
        if _SINK is not None:
            _SINK.emit("cancel", ctx)
        raise
    if _SINK is not None:
        _SINK.emit("end", ctx)
