"""Run an :class:`Engine` on its own event-loop thread and call it from other threads. Does I/O.

Tests, benchmarks and embedding applications that are not asyncio use :class:`EngineRunner`: it
starts a thread with a fresh event loop, starts the engine there, and forwards control calls with
``asyncio.run_coroutine_threadsafe`` (the engine's API must only run on its loop).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from multilane.worker.engine import Engine

__all__ = ["EngineRunner"]

T = TypeVar("T")


class EngineRunner:
    """Owns one engine thread. Invariant: ``_loop`` is running on ``_thread`` between start and stop."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="multilane-engine",
                                        daemon=True)
        self._started = False

    def start(self, timeout: float = 60.0) -> EngineRunner:
        self._thread.start()
        self._started = True
        self.call(self.engine.start, timeout=timeout)
        return self

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float = 60.0) -> T:
        """Run coroutine function ``fn(*args)`` on the engine loop and wait for its result."""
        async def go() -> T:
            return await fn(*args)

        return asyncio.run_coroutine_threadsafe(go(), self._loop).result(timeout)

    def sync(self, fn: Callable[..., T], *args: Any, timeout: float = 30.0) -> T:
        """Run plain function ``fn(*args)`` on the engine loop (e.g. ``status``, ``pause``)."""
        async def go() -> T:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(go(), self._loop).result(timeout)

    def stop(self, timeout: float = 60.0) -> None:
        if not self._started:
            return
        try:
            self.call(self.engine.stop, timeout=timeout)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._loop.close()
            self._started = False

    def __enter__(self) -> EngineRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
