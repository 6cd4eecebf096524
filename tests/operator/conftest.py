"""Fixtures for the operator tests: the emulated API server (with the real CRD), worker doubles, and a
runner for the real kopf operator (``kopf.operator(...)`` in a task, stopped with ``task.cancel()``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
    """Starts the real kopf operator with :class:`OperatorHandlers` against the emulator."""

    def __init__(self, url: str, make_handlers: Callable[[KubeClient], OperatorHandlers]) -> None:
        self.url = url
        self.make_handlers = make_handlers
        self.task: asyncio.Task[None] | None = None
        self.kube: KubeClient | None = None
        self.handlers: OperatorHandlers | None = None
        self.starts = 0

    async def start(self) -> OperatorHandlers:
        self.kube = KubeClient(KubeSettings(host=self.url))
        self.handlers = self.make_handlers(self.kube)
        registry = kopf.OperatorRegistry()

        @kopf.on.login(registry=registry)
        def _login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=self.url, insecure=True)

        self.handlers.register(registry)
        settings = kopf.OperatorSettings()
        configure_kopf(settings)
        settings.watching.reconnect_backoff = 0.2
        self.task = asyncio.create_task(
            kopf.operator(registry=registry, settings=settings, clusterwide=True, standalone=True)
        )
        self.starts += 1
        return self.handlers

    async def stop(self) -> None:
        """Kill the operator (task cancelled: no graceful handover), like a crashed pod."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self.task, timeout=15)
            self.task = None
        if self.handlers is not None:
            await self.handlers.close()
        if self.kube is not None:
            await self.kube.close()
            self.kube = None


@pytest_asyncio.fixture
async def operator_factory(
    api: tuple[ApiServerEmulator, str], fleet: WorkerFleet, source: StaticSource
) -> AsyncIterator[Callable[..., OperatorRunner]]:
    """``operator_factory(**handler_kwargs)`` -> an :class:`OperatorRunner` (not started)."""
    runners: list[OperatorRunner] = []

    def make(tick_s: float = 0.5, **kwargs: Any) -> OperatorRunner:
        def handlers(kube: KubeClient) -> OperatorHandlers:
            options: dict[str, Any] = {
                "platform": KubernetesPlatform(kube, control_url=fleet.control_url),
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
