"""Security properties of the operator against the emulated API server under the chart's RBAC
(``conftest.py``): authentication (401), authorization (403 as a kube-apiserver ``Status``), the
RBAC escalation check, and no confused deputy (the operator does not read the credentials Secret a
ParallelConsumer names, by default)."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import pytest

from multilane.operator.k8s.kube import KubeClient, api_path
from multilane.operator.kafka_admin import KafkaAdminClient
from multilane.operator.spec.children import ConsumerRef, snapshot_cronjob_name
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.kube_api import ApiServerEmulator
from multilane.testing.kube_rbac import RuleUsage
from tests.operator.conftest import CR_COLLECTION, NS, OPERATOR_TOKEN, consumer_body, cr_path
from tests.operator.doubles import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="function")

SECRETS = api_path("v1", "secrets", NS)


async def _status_of(url: str, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """HTTP status and JSON answer of one request with ``token``."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url + path, json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


def _deliberate(emu: ApiServerEmulator) -> None:
    """This test's refusals are on purpose: keep them out of the session's record."""
    emu.authorizer.usage = RuleUsage()


async def test_unknown_and_expired_tokens_get_401(api: tuple[ApiServerEmulator, str]) -> None:
    emu, url = api
    _deliberate(emu)
    code, status = await _status_of(url, "not-a-token", "GET", CR_COLLECTION)
    assert code == 401 and status["kind"] == "Status" and status["reason"] == "Unauthorized"
    assert (await _status_of(url, OPERATOR_TOKEN, "GET", CR_COLLECTION))[0] == 200
    emu.authorizer.expire(OPERATOR_TOKEN)
    assert (await _status_of(url, OPERATOR_TOKEN, "GET", CR_COLLECTION))[0] == 401


async def test_the_operator_is_refused_what_the_chart_does_not_grant(
    api: tuple[ApiServerEmulator, str],
) -> None:
    emu, url = api
    _deliberate(emu)
    # Secrets: never listed; never read outside the namespaces granted explicitly.
    code, status = await _status_of(url, OPERATOR_TOKEN, "GET", SECRETS)
    assert code == 403, status
    assert status["kind"] == "Status" and status["reason"] == "Forbidden" and status["code"] == 403
    assert 'cannot list resource "secrets"' in status["message"]
    other_ns = api_path("v1", "secrets", "kube-system", "x")
    assert (await _status_of(url, OPERATOR_TOKEN, "GET", other_ns))[0] == 403
    # Nor written there (the control-tls Secret's create and rotation patch: the consumers' namespace
    # only, tests/operator/test_control_tls_k8s.py).
    assert (await _status_of(url, OPERATOR_TOKEN, "PATCH", other_ns, {"data": {}}))[0] == 403
    secret = {"metadata": {"name": "x-control-tls"}, "data": {}}
    other_collection = api_path("v1", "secrets", "kube-system")
    assert (await _status_of(url, OPERATOR_TOKEN, "POST", other_collection, secret))[0] == 403
    # No delete of the children that go with their owner, no cluster RBAC. (StatefulSets and pods may
    # be deleted: the opt-in recreate and the day-2 pod replacement.)
    for method, path in [
        ("DELETE", api_path("v1", "services", NS, "x")),
        ("DELETE", api_path("rbac.authorization.k8s.io/v1", "roles", NS, "x")),
        ("GET", api_path("rbac.authorization.k8s.io/v1", "clusterroles")),
    ]:
        assert (await _status_of(url, OPERATOR_TOKEN, method, path))[0] == 403, (method, path)


async def test_the_operator_cannot_grant_what_it_does_not_hold(api: tuple[ApiServerEmulator, str]) -> None:
    """Kubernetes' escalation check: a Role with a rule the operator lacks is refused."""
    emu, url = api
    _deliberate(emu)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "sneaky"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}],
    }
    roles = api_path("rbac.authorization.k8s.io/v1", "roles", NS)
    code, status = await _status_of(url, OPERATOR_TOKEN, "POST", roles, role)
    assert code == 403 and "attempts to grant list /secrets" in status["message"], status


class _RecordingAdmin(KafkaAdminClient):
    configs: list[dict[str, str]] = []

    def __init__(self, config: Any, timeout_s: float = 5.0) -> None:
        _RecordingAdmin.configs.append(dict(config))
        super().__init__(config, timeout_s=timeout_s)


async def test_no_confused_deputy_the_named_secret_is_not_read(
    kube: KubeClient, broker: EmbeddedBroker, topic: str, operator_factory: Any
) -> None:
    """A ParallelConsumer names a Secret: by default the operator never reads it (its credentials
    reach no Kafka client of the operator); the workers get it by envFrom, in their own namespace."""
    await kube.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "someone-elses"},
            "data": {"sasl.password": base64.b64encode(b"hunter2").decode()},
        },
    )
    _RecordingAdmin.configs = []
    runner = operator_factory(admin_factory=lambda config: _RecordingAdmin(config, timeout_s=3.0))
    await runner.start()
    body = consumer_body("deputy", broker.bootstrap, topic)
    body["spec"]["kafka"]["credentialsSecretRef"] = {"name": "someone-elses"}
    await kube.create(CR_COLLECTION, body)
    sts = await wait_for(
        lambda: kube.get(api_path("apps/v1", "statefulsets", NS, "deputy")), timeout=60, what="sts"
    )
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"prefix": "MULTILANE_KAFKA_", "secretRef": {"name": "someone-elses"}}]
    assert _RecordingAdmin.configs, "the operator made no Kafka admin call"
    assert all("sasl.password" not in c and "hunter2" not in c.values() for c in _RecordingAdmin.configs)


async def test_scheduled_snapshots_cronjob_created_then_suspended(
    api: tuple[ApiServerEmulator, str],
    kube: KubeClient,
    broker: EmbeddedBroker,
    topic: str,
    operator_factory: Any,
) -> None:
    """The CronJob rule (create, get, patch) is what scheduled snapshots need: created with the
    schedule, suspended (not deleted) when the schedule goes."""
    api[0].add_builtin("batch/v1", "cronjobs", "CronJob", status=True)
    runner = operator_factory()
    await runner.start()
    body = consumer_body("snap", broker.bootstrap, topic)
    body["spec"]["state"] = {"enabled": True, "snapshot": {"uri": "s3://bucket/p", "schedule": "0 * * * *"}}
    await kube.create(CR_COLLECTION, body)
    cronjob = api_path("batch/v1", "cronjobs", NS, snapshot_cronjob_name(ConsumerRef("snap", NS, "u")))
    created = await wait_for(lambda: kube.get(cronjob), timeout=60, what="the snapshot CronJob")
    assert created["spec"]["schedule"] == "0 * * * *" and not created["spec"].get("suspend")
    await kube.patch(cr_path("snap"), {"spec": {"state": {"snapshot": {"schedule": ""}}}})

    async def suspended() -> bool:
        return bool(((await kube.get(cronjob)) or {}).get("spec", {}).get("suspend"))

    await wait_for(suspended, timeout=60, what="the CronJob suspended")


async def test_every_consumer_gets_its_network_policy(
    kube: KubeClient, broker: EmbeddedBroker, topic: str, operator_factory: Any
) -> None:
    """The NetworkPolicy child NAME-workers, in the consumer's own namespace (covered without listing
    namespaces in the chart): control port from the operator pods only, metrics from monitoring only."""
    runner = operator_factory()
    await runner.start()
    await kube.create(CR_COLLECTION, consumer_body("fenced", broker.bootstrap, topic))
    path = api_path("networking.k8s.io/v1", "networkpolicies", NS, "fenced-workers")
    policy = await wait_for(lambda: kube.get(path), timeout=60, what="the NetworkPolicy child")
    sts = await wait_for(
        lambda: kube.get(api_path("apps/v1", "statefulsets", NS, "fenced")), timeout=60, what="sts"
    )
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    control, metrics = policy["spec"]["ingress"]
    assert [p["port"] for p in control["ports"]] == [8471] and [p["port"] for p in metrics["ports"]] == [9464]
    assert control["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert policy["metadata"]["ownerReferences"][0]["name"] == "fenced"


async def test_operator_cli_refuses_bad_labels_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from multilane.operator.k8s import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--operator-pod-labels", "no-equals-sign"])
    assert cli.run(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "KEY=VALUE" in err
