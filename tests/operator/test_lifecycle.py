"""The real kopf operator against the emulated API server (multilane/testing/kube_api.py), the embedded
Kafka broker (real topics, real admin calls) and the worker-fleet double (tests/operator/doubles.py).

Emulated, not real: the API server (kmock + ApiServerEmulator), the StatefulSet controller/kubelet
(StatefulSetControllerDouble creates the pods), the workers' HTTP control endpoints (WorkerFleet),
garbage collection by owner references (ApiServerEmulator). Real: kopf, the operator code, the
LeaseKeeper of each worker, Kafka topic checks against the embedded broker.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from multilane.operator.k8s.handlers import HandlerSettings
from multilane.operator.k8s.kube import KubeClient, KubeError, api_path
from multilane.testing.broker import EmbeddedBroker
from tests.operator.conftest import (
    CR_COLLECTION,
    NO_TLS,
    NS,
    TOKEN,
    cond,
    consumer_body,
    cr_path,
    events,
    get_status,
)
from tests.operator.doubles import (
    StatefulSetControllerDouble,
    StaticSource,
    WorkerFleet,
    partitions_of,
    wait_for,
)

pytestmark = pytest.mark.asyncio(loop_scope="function")

CHILDREN = [
    ("apps/v1", "statefulsets", "demo"),
    ("v1", "services", "demo-workers"),
    ("policy/v1", "poddisruptionbudgets", "demo"),
    ("v1", "serviceaccounts", "demo-worker"),
    ("rbac.authorization.k8s.io/v1", "roles", "demo-worker"),
    ("rbac.authorization.k8s.io/v1", "rolebindings", "demo-worker"),
    ("v1", "secrets", "demo-control-token"),
]


async def test_create_builds_children_assigns_partitions_and_reports_status(
    kube: KubeClient,
    broker: EmbeddedBroker,
    topic: str,
    fleet: WorkerFleet,
    sts_controller: StatefulSetControllerDouble,
    source: StaticSource,
    operator_factory: Any,
) -> None:
    runner = operator_factory()
    await runner.start()
    cr = await kube.create(CR_COLLECTION, consumer_body("demo", broker.bootstrap, topic, minReplicas=2))
    uid = cr["metadata"]["uid"]

    # Children, each with the owner reference and the consumer label.
    for gv, plural, name in CHILDREN:
        obj = await wait_for(
            lambda gv=gv, plural=plural, name=name: kube.get(api_path(gv, plural, NS, name)),
            what=f"{plural}/{name}",
        )
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
        assert obj["metadata"]["ownerReferences"][0]["controller"] is True
        assert obj["metadata"]["labels"]["multilane.dev/consumer"] == "demo"
    sts = await kube.get(api_path("apps/v1", "statefulsets", NS, "demo"))
    assert sts is not None and sts["spec"]["replicas"] == 2
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "--control-token-file" in container["args"] and "8471" in container["args"]
    secret = await kube.get(api_path("v1", "secrets", NS, "demo-control-token"))
    assert secret is not None
    token = secret.get("stringData", {}).get("token") or base64.b64decode(secret["data"]["token"]).decode()
    assert token == TOKEN

    # Workers (pods from the StatefulSet double) get every partition exactly once, with a generation.
    def assigned() -> bool:
        # Balanced once both workers' Leases are live (a first pass may see one live worker only and
        # give it everything; the next pass rebalances).
        a = fleet.assignment()
        balanced = sorted(len(ps) for ps in a.values()) == [2, 2]
        return len(a) == 2 and partitions_of(a) == sorted(f"{topic}/{i}" for i in range(4)) and balanced

    await wait_for(assigned, timeout=60, what="all partitions assigned")
    assert sorted(len(ps) for ps in fleet.assignment().values()) == [2, 2]
    assert all(w.generation >= 1 for w in fleet.workers.values())

    # Status and conditions.
    async def ready() -> dict[str, Any] | None:
        # Ready on the balanced assignment: an earlier pass, with one live worker, may have written
        # Ready with everything on that worker, and the balancing pass writes its status after it
        # has assigned the workers.
        status = await get_status(kube)
        members = (status.get("assignment") or {}).get("members") or []
        balanced = {m["worker"]: set(m["partitions"]) for m in members} == fleet.assignment()
        # replicas counts the live workers: under load a worker's liveness can lapse for a pass
        live = status.get("replicas") == 2
        return status if cond(status, "Ready").get("status") == "True" and balanced and live else None

    status = await wait_for(ready, timeout=60, what="Ready=True on the balanced assignment, 2 live workers")
    assert status["observedGeneration"] == 1
    assert status["labelSelector"] == "multilane.dev/consumer=demo"
    assert status["replicas"] == 2
    assert status["assignment"]["generation"] >= 1
    members = {m["worker"]: set(m["partitions"]) for m in status["assignment"]["members"]}
    assert members == fleet.assignment()
    assert cond(status, "Degraded")["status"] == "False"
    assert all(c.get("lastTransitionTime") for c in status["conditions"])
    assert await wait_for(lambda: events(kube, "Applied"), what="Applied event")
    assert await wait_for(lambda: events(kube, "Rebalanced"), what="Rebalanced event")


async def test_bad_spec_degrades_with_event_and_touches_no_child(
    kube: KubeClient,
    broker: EmbeddedBroker,
    topic_name: str,
    fleet: WorkerFleet,
    operator_factory: Any,
    api: Any,
) -> None:
    runner = operator_factory()
    await runner.start()
    # minReplicas > maxReplicas: the CRD's CEL rule refuses it (tests/operator/test_api_rules.py). With
    # the rules off (a CRD that predates them) this checks the operator's own validation, which must
    # hold even if the rule were bypassed.
    body = consumer_body("bad", broker.bootstrap, topic_name, minReplicas=5, maxReplicas=2)
    with pytest.raises(KubeError, match="minReplicas must not exceed maxReplicas"):
        await kube.create(CR_COLLECTION, body)
    api[0].cel_rules = False
    await kube.create(CR_COLLECTION, body)

    async def degraded() -> dict[str, Any] | None:
        c = cond(await get_status(kube, "bad"), "Degraded")
        return c if c.get("status") == "True" else None

    c = await wait_for(degraded, what="Degraded")
    assert c["reason"] == "InvalidScalingBounds"
    assert await wait_for(lambda: events(kube, "InvalidScalingBounds"), what="Warning event")
    assert cond(await get_status(kube, "bad"), "Ready")["status"] == "False"

    # Fix the bounds; the topic does not exist: TopicNotFound, checked against the real broker.
    await kube.patch(cr_path("bad"), {"spec": {"scaling": {"minReplicas": 1}}})

    async def topic_missing() -> dict[str, Any] | None:
        c = cond(await get_status(kube, "bad"), "Degraded")
        return c if c.get("reason") == "TopicNotFound" else None

    await wait_for(topic_missing, what="TopicNotFound")
    for gv, plural, name in CHILDREN:
        assert await kube.get(api_path(gv, plural, NS, name.replace("demo", "bad"))) is None, plural

    # Create the topic: the operator notices on its own (transient problems are re-checked).
    broker.create_topic(topic_name, partitions=2)
    await wait_for(lambda: kube.get(api_path("apps/v1", "statefulsets", NS, "bad")), timeout=60, what="sts")
    assert runner.running  # never crashed


async def test_missing_credentials_and_unreachable_broker_are_conditions(
    kube: KubeClient, broker: EmbeddedBroker, topic: str, operator_factory: Any
) -> None:
    # The explicit grant (docs/security.md): this operator reads the credentials Secret itself.
    settings = HandlerSettings(
        tick_s=0.5,
        kafka_timeout_s=3.0,
        release_deadline_s=2.0,
        read_kafka_credentials=True,
        control_tls=NO_TLS,
    )
    runner = operator_factory(settings=settings)
    await runner.start()
    body = consumer_body("creds", broker.bootstrap, topic)
    body["spec"]["kafka"]["credentialsSecretRef"] = {"name": "kafka-creds"}
    await kube.create(CR_COLLECTION, body)
    unreachable = consumer_body("nokafka", "127.0.0.1:1", topic)
    await kube.create(CR_COLLECTION, unreachable)

    async def reason(name: str) -> str | None:
        return cond(await get_status(kube, name), "Degraded").get("reason")

    await wait_for(lambda: _eq(reason("creds"), "CredentialsSecretMissing"), what="CredentialsSecretMissing")
    await wait_for(lambda: _eq(reason("nokafka"), "KafkaUnreachable"), timeout=60, what="KafkaUnreachable")
    assert await kube.get(api_path("apps/v1", "statefulsets", NS, "creds")) is None
    assert await kube.get(api_path("apps/v1", "statefulsets", NS, "nokafka")) is None

    # The Secret appears: the children follow, with the Secret referenced (never copied).
    await kube.create(
        api_path("v1", "secrets", NS),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "kafka-creds"},
            "data": {"sasl.username": base64.b64encode(b"u").decode()},
        },
    )
    sts = await wait_for(
        lambda: kube.get(api_path("apps/v1", "statefulsets", NS, "creds")), timeout=60, what="sts"
    )
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"prefix": "MULTILANE_KAFKA_", "secretRef": {"name": "kafka-creds"}}]
    assert "sasl.username" not in str(container.get("env"))
    assert runner.running


async def _eq(value: Any, expected: Any) -> bool:
    return (await value) == expected


async def _is_none(value: Any) -> bool:
    return (await value) is None
