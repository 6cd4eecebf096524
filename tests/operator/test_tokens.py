"""Bound service-account tokens rotate and expire: the operator's ``KubeClient`` and the worker's
``LeaseKeeper`` re-read the projected token file, so an expired token (the emulated API server
answers 401 for it, ``RbacAuthorizer.expire``) is replaced without a restart."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from multilane.operator.k8s.kube import KubeClient, KubeError, KubeSettings, api_path
from multilane.testing.kube_api import ApiServerEmulator
from multilane.testing.kube_rbac import RuleUsage, service_account_user
from multilane.worker.lease import LeaseKeeper, LeaseSettings
from tests.operator.conftest import CR_COLLECTION, NS, consumer_body, cr_path

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_operator_client_rereads_an_expired_token(
    api: tuple[ApiServerEmulator, str], tmp_path: Path
) -> None:
    emu, url = api
    authz = emu.authorizer
    authz.usage = RuleUsage()  # the 401s here are on purpose
    user = next(iter(set(authz.tokens.values())))  # the operator's service account
    token_file = tmp_path / "token"
    token_file.write_text("bound-token-1\n")
    authz.add_token("bound-token-1", user)
    settings = KubeSettings(host=url, token_file=str(token_file), token_refresh_s=3600)
    async with KubeClient(settings) as client:
        assert await client.list(CR_COLLECTION) == []
        assert client.token_reads == 1
        # The kubelet rotates the file; the old token expires (a restart would be the only cure
        # for a client that read it once).
        authz.add_token("bound-token-2", user)
        token_file.write_text("bound-token-2\n")
        authz.expire("bound-token-1")
        assert await client.list(CR_COLLECTION) == []  # 401, re-read, retried once
        assert client.token_reads == 2
        # A token that stays invalid is an error, not a loop.
        authz.expire("bound-token-2")
        with pytest.raises(KubeError) as excinfo:
            await client.list(CR_COLLECTION)
        assert excinfo.value.status == 401


async def test_worker_lease_keeper_rereads_an_expired_token(
    api: tuple[ApiServerEmulator, str], kube: KubeClient, tmp_path: Path
) -> None:
    emu, url = api
    authz = emu.authorizer
    authz.usage = RuleUsage()
    # The worker's own Lease and the Role the operator would create for it (get/update on it only).
    leases = api_path("coordination.k8s.io/v1", "leases", NS)
    await kube.create(leases, {"metadata": {"name": "w-0"}, "spec": {"holderIdentity": "w-0"}})
    rbac = "rbac.authorization.k8s.io/v1"
    await kube.create(
        api_path(rbac, "roles", NS),
        {
            "metadata": {"name": "w"},
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": ["w-0"],
                    "verbs": ["get", "update"],
                }
            ],
        },
    )
    await kube.create(
        api_path(rbac, "rolebindings", NS),
        {
            "metadata": {"name": "w"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "w"},
            "subjects": [{"kind": "ServiceAccount", "name": "w", "namespace": NS}],
        },
    )
    user = service_account_user(NS, "w")
    token_file = tmp_path / "token"
    token_file.write_text("w-token-1")
    authz.add_token("w-token-1", user)
    settings = LeaseSettings(
        api_url=url, namespace=NS, name="w-0", holder="w-0", token_file=str(token_file), token_refresh_s=3600
    )
    keeper = LeaseKeeper(settings, on_lost=lambda: None)
    async with aiohttp.ClientSession(base_url=url + "/") as session:
        assert await keeper.renew_once(session)
        authz.add_token("w-token-2", user)
        token_file.write_text("w-token-2")
        authz.expire("w-token-1")
        assert not await keeper.renew_once(session)  # 401 with the old token ...
        assert await keeper.renew_once(session)  # ... the file is re-read before the next call
    assert keeper.token_reads == 2 and keeper.renewals == 2
    # The worker may renew its own Lease only.
    assert authz.usage.used and not [d for d in authz.usage.denied if "cannot" in d]


async def test_kopf_rereads_its_expired_token_without_a_restart(
    api: tuple[ApiServerEmulator, str],
    kube: KubeClient,
    operator_factory: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf's own requests (watches, its finalizer and annotation patches) log in through the product's
    login handler (``multilane.operator.k8s.cli.kopf_login``: the kubernetes client's config, read again
    on each call). Its token expires; kopf's next request gets 401, kopf calls the login handler again,
    which reads the rotated token file; the operator handles the next ParallelConsumer without a
    restart."""
    from multilane.operator.k8s.cli import kopf_login

    emu, url = api
    authz = emu.authorizer
    authz.usage = RuleUsage()  # the 401 here is on purpose
    user = next(iter(set(authz.tokens.values())))  # the operator's service account
    token_file = tmp_path / "token"
    token_file.write_text("kopf-token-1")  # as the kubelet writes it: no newline
    authz.add_token("kopf-token-1", user)
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emu", "cluster": {"server": url}}],
        "users": [{"name": "operator", "user": {"tokenFile": str(token_file)}}],
        "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "operator"}}],
        "current-context": "emu",
    }
    (tmp_path / "kubeconfig").write_text(json.dumps(kubeconfig))
    # the kubernetes client reads $KUBECONFIG once, at import: its default location is patched instead
    monkeypatch.setattr(
        "kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "kubeconfig")
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod: the kubeconfig
    runner = operator_factory(login=kopf_login)
    await runner.start()

    async def handled(name: str) -> bool:
        obj = await kube.get(cr_path(name)) or {}
        finalizers = (obj.get("metadata") or {}).get("finalizers") or []
        return "multilane.dev/finalizer" in finalizers and bool((obj.get("status") or {}).get("conditions"))

    async def wait(name: str) -> None:
        deadline = time.monotonic() + 60
        while not await handled(name):
            assert time.monotonic() < deadline, f"{name} not handled by kopf within 60 s"
            await asyncio.sleep(0.3)

    await kube.create(CR_COLLECTION, consumer_body("before", "127.0.0.1:1", "t"))
    await wait("before")
    # The kubelet rotates the token file; the old token expires.
    authz.add_token("kopf-token-2", user)
    token_file.write_text("kopf-token-2")
    authz.expire("kopf-token-1")
    await kube.create(CR_COLLECTION, consumer_body("after", "127.0.0.1:1", "t"))
    await wait("after")  # kopf's finalizer patch went through with the new token
    assert any("401" in line and "kopf-token-1" in line for line in authz.usage.denied), authz.usage.denied
    assert runner.starts == 1 and runner.running  # no restart
