"""Fixtures for the operator tests: the emulated API server (with the real CRD), worker doubles, and a
runner for the real kopf operator (:class:`multilane.testing.kopf_runner.OperatorRunner`).

Least privilege: every emulated API server of this directory authenticates and authorizes against
the chart's rendered RBAC (:mod:`multilane.testing.kube_rbac`; the ``rbac`` session fixture renders
the chart once). The operator calls with the token of the chart's service account
(:data:`OPERATOR_TOKEN`), the worker pods with their bound tokens (resolved to their StatefulSet's
service account, whose Role the operator creates), the tests themselves without a token (the
cluster administrator). ``tests/operator/test_zz_least_privilege.py`` then fails on any granted rule
no scenario used."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from multilane.operator.k8s.handlers import HandlerSettings, OperatorHandlers
from multilane.operator.k8s.kube import KubeClient, KubeSettings, api_path
from multilane.operator.k8s.platform import KubernetesPlatform
from multilane.operator.metrics import OperatorMetrics
from multilane.operator.rollout.workers import WorkerControlClient
from multilane.operator.spec.control_pki import ControlTlsSettings
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.kopf_runner import OperatorRunner
from multilane.testing.kube_api import ApiServerEmulator, emulated_api_server
from multilane.testing.kube_rbac import RbacAuthorizer, RuleUsage, pod_token_resolver, service_account_user
from tests.operator.doubles import StatefulSetControllerDouble, StaticSource, WorkerFleet
from tests.support import after_workers

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "parallelconsumers.multilane.dev.yaml"
NS = "team-a"
TOKEN = "t" * 40
OPERATOR_TOKEN = "operator-service-account-token"
CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "multilane"
RELEASE_NS = "multilane-system"
# The chart's RBAC, rendered as the scenarios need it: the defaults, with the consumers' namespace
# granted the control Secrets explicitly (what a user installing the chart does, docs/security.md).
RBAC_VALUES: dict[str, Any] = {"rbac": {"secretNamespaces": [NS]}}
NO_TLS = ControlTlsSettings(enabled=False)


class RbacSession:
    """The rendered chart and the rule usage of every scenario of the session."""

    def __init__(self, manifests: list[dict[str, Any]]) -> None:
        self.manifests = manifests
        self.usage = RuleUsage()
        sa = next(d for d in manifests if d.get("kind") == "ServiceAccount")
        self.operator_user = service_account_user(RELEASE_NS, sa["metadata"]["name"])
        self.scenarios: set[str] = set()  # test node ids that ran under it

    def authorizer(self, emu: ApiServerEmulator) -> RbacAuthorizer:
        authz = RbacAuthorizer(self.manifests, self.usage, anonymous_user="system:admin")
        authz.add_token(OPERATOR_TOKEN, self.operator_user)
        authz.resolvers.append(pod_token_resolver(emu, NS))
        return authz


def render_chart(values: dict[str, Any], namespace: str = RELEASE_NS) -> list[dict[str, Any]]:
    import yaml

    helm = pytest.importorskip("helm_python", reason="helm-python-sdk is not installed")
    out = helm.Chart.load(str(CHART_DIR)).render(values, name="ml", namespace=namespace, is_install=True)
    return [
        doc
        for path, text in sorted(out.items())
        if path.endswith((".yaml", ".yml"))
        for doc in yaml.safe_load_all(text)
        if doc
    ]


@pytest.fixture(scope="session")
def rbac(request: pytest.FixtureRequest) -> Iterator[RbacSession]:
    """The chart's RBAC for every emulated API server of the session, and what the scenarios used (on
    an xdist worker, sent to the controller at the end: ``tests/support/after_workers.py``)."""
    session = RbacSession(render_chart(RBAC_VALUES))
    yield session
    after_workers.export(request.config, session.manifests, session.usage.used, session.usage.denied,
                         session.scenarios)


# Access logs of the in-test HTTP servers cost CPU on a loaded machine and say nothing new.
logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


@pytest_asyncio.fixture
async def api(
    rbac: RbacSession, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[ApiServerEmulator, str]]:
    """The emulated API server with the real CRD and the builtin resources used, under the chart's
    RBAC."""
    async with emulated_api_server(CRD_PATH) as served:
        served[0].authorizer = rbac.authorizer(served[0])
        rbac.scenarios.add(request.node.nodeid)
        yield served


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


@pytest_asyncio.fixture
async def operator_factory(
    api: tuple[ApiServerEmulator, str], fleet: WorkerFleet, source: StaticSource
) -> AsyncIterator[Callable[..., OperatorRunner]]:
    """``operator_factory(tick_s=, control_url=, **handler_kwargs)`` -> an :class:`OperatorRunner`
    (not started); worker control URLs come from the fleet double unless ``control_url`` is given."""
    runners: list[OperatorRunner] = []

    def make(
        tick_s: float = 0.5, control_url: Any = None, login: Any = None, **kwargs: Any
    ) -> OperatorRunner:
        def handlers(kube: KubeClient) -> OperatorHandlers:
            options: dict[str, Any] = {
                "platform": KubernetesPlatform(kube, control_url=control_url or fleet.control_url),
                # plain HTTP to the workers: the fleet double and the pods' HTTP router speak no TLS
                # (tests/operator/test_control_tls_k8s.py runs the control port on mutual TLS)
                "settings": HandlerSettings(
                    tick_s=tick_s, kafka_timeout_s=3.0, release_deadline_s=2.0, control_tls=NO_TLS
                ),
                "metrics": OperatorMetrics(),
                "source_factory": lambda spec, config: source,
                "token_factory": lambda: TOKEN,
            }
            options.update(kwargs)
            return OperatorHandlers(kube, **options)

        runner = OperatorRunner(api[1], handlers, token=OPERATOR_TOKEN, login=login)
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


async def get_status(kube: KubeClient, name: str = "demo") -> dict[str, Any]:
    obj = await kube.get(cr_path(name))
    return dict((obj or {}).get("status") or {})


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in status.get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return {}


async def events(kube: KubeClient, reason: str | None = None) -> list[dict[str, Any]]:
    items = await kube.list(api_path("v1", "events", NS))
    return [e for e in items if reason is None or e.get("reason") == reason]


@dataclass
class OperatorScenario:
    """The set-up the operator scenarios share (one fixture, ``scenario``): the emulated API server's
    client, the broker and its 4-partition topic, the worker-fleet and StatefulSet doubles, the
    metric-source double and the operator factory."""

    kube: KubeClient
    broker: EmbeddedBroker
    topic: str
    fleet: WorkerFleet
    sts_controller: StatefulSetControllerDouble
    source: StaticSource
    operator_factory: Callable[..., OperatorRunner]

    @property
    def partitions(self) -> list[str]:
        return sorted(f"{self.topic}/{i}" for i in range(4))

    def body(self, name: str = "demo", **scaling: Any) -> dict[str, Any]:
        """A ParallelConsumer NAME on the broker's topic (``consumer_body``)."""
        return consumer_body(name, self.broker.bootstrap, self.topic, **scaling)

    async def start_operator(self, *, plain_control: bool = False, **kwargs: Any) -> OperatorRunner:
        """A started operator; ``plain_control``: worker control without the learner API (the fleet
        double has none), so no restore-before-handoff."""
        if plain_control:
            kwargs.setdefault("control_factory", lambda token: WorkerControlClient(token))
        runner = self.operator_factory(**kwargs)
        await runner.start()
        return runner

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        created = await self.kube.create(CR_COLLECTION, body)
        assert created is not None
        return created

    async def status(self, name: str = "demo") -> dict[str, Any]:
        return await get_status(self.kube, name)

    async def condition(self, type_: str, name: str = "demo") -> dict[str, Any]:
        return cond(await self.status(name), type_)

    async def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        return await events(self.kube, reason)


@pytest_asyncio.fixture
async def scenario(
    kube: KubeClient,
    broker: EmbeddedBroker,
    topic: str,
    fleet: WorkerFleet,
    sts_controller: StatefulSetControllerDouble,
    source: StaticSource,
    operator_factory: Callable[..., OperatorRunner],
) -> OperatorScenario:
    return OperatorScenario(kube, broker, topic, fleet, sts_controller, source, operator_factory)
