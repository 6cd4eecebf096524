"""Fixtures for the operator tests: the emulated API server (with the real CRD), worker doubles, and a
runner for the real kopf operator (``kopf.operator(...)`` in a task, stopped with ``task.cancel()``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kmock
import kopf
import pytest
import pytest_asyncio

from multilane.operator.handlers import HandlerSettings, OperatorHandlers, configure_kopf
from multilane.operator.kube import KubeClient, KubeSettings, api_path
from multilane.operator.metrics import OperatorMetrics
from multilane.operator.platform import KubernetesPlatform
from multilane.testing.broker import EmbeddedBroker
from tests.operator.doubles import StatefulSetControllerDouble, StaticSource, WorkerFleet
from tests.operator.emulator import ApiServerEmulator

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "parallelconsumers.multilane.dev.yaml"
NS = "team-a"
TOKEN = "t" * 40


# Access logs of the in-test HTTP servers cost CPU on a loaded machine and say nothing new.
logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


@pytest_asyncio.fixture
async def api() -> AsyncIterator[tuple[ApiServerEmulator, str]]:
    """The emulated API server with the ParallelConsumer CRD and the builtin resources used."""
    async with ApiServerEmulator() as emu, kmock.Server(emu):
        emu.load_crd(CRD_PATH)
        for gv, plural, kind, status in [
            ("v1", "pods", "Pod", True),
            ("v1", "secrets", "Secret", False),
            ("v1", "services", "Service", True),
            ("v1", "serviceaccounts", "ServiceAccount", False),
            ("v1", "events", "Event", False),
            ("apps/v1", "statefulsets", "StatefulSet", True),
            ("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
            ("rbac.authorization.k8s.io/v1", "roles", "Role", False),
            ("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", False),
            ("coordination.k8s.io/v1", "leases", "Lease", False),
        ]:
            emu.add_builtin(gv if "/" in gv else f"/{gv}", plural, kind, status=status)
        # kopf's namespace observer waits for the namespaces resource to be discoverable (it is not
        # listed: the operator runs cluster-wide).
        emu.add_builtin("/v1", "namespaces", "Namespace", namespaced=False)
        yield emu, str(emu.url).rstrip("/")


@pytest_asyncio.fixture
async def kube(api: tuple[ApiServerEmulator, str]) -> AsyncIterator[KubeClient]:
    async with KubeClient(KubeSettings(host=api[1])) as client:
        yield client


@pytest_asyncio.fixture
async def fleet() -> AsyncIterator[WorkerFleet]:
    f = WorkerFleet(TOKEN)
    await f.start()
    yield f
    await f.stop()


@pytest_asyncio.fixture
async def sts_controller(
    kube: KubeClient, fleet: WorkerFleet, api: tuple[ApiServerEmulator, str]
) -> AsyncIterator[StatefulSetControllerDouble]:
    ctl = StatefulSetControllerDouble(kube, fleet, api[1], NS)
    ctl.start()
    yield ctl
    await ctl.stop()


@pytest.fixture
def source() -> StaticSource:
    return StaticSource()


class OperatorRunner:
    """Runs the real kopf operator (``kopf.operator(...)``) with :class:`OperatorHandlers` against the
    emulator, in a thread with its own event loop: when kopf stops it cancels every task created
    after it started in its loop, which must not include the test's servers and doubles."""

    def __init__(self, url: str, make_handlers: Callable[[KubeClient], OperatorHandlers]) -> None:
        self.url = url
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
        kube = KubeClient(KubeSettings(host=self.url))
        self.handlers = handlers = self.make_handlers(kube)
        registry = kopf.OperatorRegistry()

        @kopf.on.login(registry=registry)
        def _login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=self.url, insecure=True)

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


@pytest_asyncio.fixture
async def operator_factory(
    api: tuple[ApiServerEmulator, str], fleet: WorkerFleet, source: StaticSource
) -> AsyncIterator[Callable[..., OperatorRunner]]:
    """``operator_factory(tick_s=, control_url=, **handler_kwargs)`` -> an :class:`OperatorRunner`
    (not started); worker control URLs come from the fleet double unless ``control_url`` is given."""
    runners: list[OperatorRunner] = []

    def make(tick_s: float = 0.5, control_url: Any = None, **kwargs: Any) -> OperatorRunner:
        def handlers(kube: KubeClient) -> OperatorHandlers:
            options: dict[str, Any] = {
                "platform": KubernetesPlatform(kube, control_url=control_url or fleet.control_url),
                "settings": HandlerSettings(tick_s=tick_s, kafka_timeout_s=3.0, release_deadline_s=2.0),
                "metrics": OperatorMetrics(),
                "source_factory": lambda spec, config: source,
                "token_factory": lambda: TOKEN,
            }
            options.update(kwargs)
            return OperatorHandlers(kube, **options)

        runner = OperatorRunner(api[1], handlers)
        runners.append(runner)
        return runner

    yield make
    for r in runners:
        await r.stop()
    logging.getLogger("kopf").handlers.clear()


@pytest.fixture
def topic(broker: EmbeddedBroker, topic_name: str) -> str:
    broker.create_topic(topic_name, partitions=4)
    return topic_name


def consumer_body(name: str, bootstrap: str, topic: str, **scaling: Any) -> dict[str, Any]:
    return {
        "apiVersion": "multilane.dev/v1alpha1",
        "kind": "ParallelConsumer",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "kafka": {"bootstrapServers": bootstrap, "topics": [topic], "consumerGroup": f"{name}-group"},
            "workload": {"image": "ghcr.io/example/app:1.0", "processor": "app.handlers:process"},
            "scaling": {"intervalSeconds": 5, "stabilisationSeconds": 0, **scaling},
        },
    }


CR_COLLECTION = api_path("multilane.dev/v1alpha1", "parallelconsumers", NS)


def cr_path(name: str, sub: str | None = None) -> str:
    return api_path("multilane.dev/v1alpha1", "parallelconsumers", NS, name, sub)
