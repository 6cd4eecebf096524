"""``OperatorRunner``: the real kopf operator (``kopf.operator(...)`` with
:class:`~multilane.operator.k8s.handlers.OperatorHandlers`) in a thread with its own event loop, against
an API server URL (the emulated one: :mod:`multilane.testing.kube_api`). Used by the operator tests
and the burst benchmark's ``operator`` variant. Does I/O (HTTP to the API server, threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import kopf

from multilane.operator.k8s.handlers import OperatorHandlers, configure_kopf
from multilane.operator.k8s.kube import KubeClient, KubeSettings

__all__ = ["OperatorRunner"]


class OperatorRunner:
    """Runs the real kopf operator (``kopf.operator(...)``) with :class:`OperatorHandlers` against the
    emulator, in a thread with its own event loop: when kopf stops it cancels every task created
    after it started in its loop, which must not include the test's servers and doubles."""

    def __init__(
        self,
        url: str,
        make_handlers: Callable[[KubeClient], OperatorHandlers],
        token: str = "",
        login: Callable[..., Any] | None = None,
    ) -> None:
        self.url = url
        self.token = token  # bearer token of the operator's service account ("" : none)
        # kopf's login handler (e.g. the product's multilane.operator.k8s.cli.kopf_login); None: ``token``
        self.login = login
        self.make_handlers = make_handlers
        self.handlers: OperatorHandlers | None = None
        self.starts = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = threading.Event()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        kube = KubeClient(KubeSettings(host=self.url, token=self.token))
        self.handlers = handlers = self.make_handlers(kube)
        registry = kopf.OperatorRegistry()

        def _login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=self.url, insecure=True, token=self.token or None)

        kopf.on.login(registry=registry)(self.login or _login)

        handlers.register(registry)
        settings = kopf.OperatorSettings()
        configure_kopf(settings)
        settings.watching.reconnect_backoff = 0.2
        self._task = loop.create_task(
            kopf.operator(registry=registry, settings=settings, clusterwide=True, standalone=True)
        )
        self._started.set()
        try:
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(self._task)
        finally:
            loop.run_until_complete(handlers.close())
            loop.run_until_complete(kube.close())
            loop.close()

    async def start(self) -> OperatorHandlers:
        self._started.clear()
        self._thread = threading.Thread(target=self._main, name="kopf-operator", daemon=True)
        self._thread.start()
        await asyncio.to_thread(self._started.wait, 30)
        self.starts += 1
        assert self.handlers is not None
        return self.handlers

    async def stop(self) -> None:
        """Kill the operator (its task cancelled: no graceful handover), like a crashed pod."""
        if self._thread is None:
            return
        if self._loop is not None and self._task is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._task.cancel)
        await asyncio.to_thread(self._thread.join, 30)
        self._thread = None
