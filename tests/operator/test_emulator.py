"""Checks of the API-server emulator itself (multilane/testing/kube_api.py): the behaviours the other
operator tests rely on."""

from __future__ import annotations

from typing import Any

import pytest

from multilane.operator.k8s.kube import KubeClient, KubeConflictError, KubeError, api_path
from tests.operator.conftest import CR_COLLECTION, consumer_body, cr_path

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_create_stamps_defaults_prunes_and_validates(kube: KubeClient, api: Any) -> None:
    body = consumer_body("emu", "k:9092", "orders")
    body["spec"]["unknownField"] = 1
    created = await kube.create(CR_COLLECTION, body)
    meta = created["metadata"]
    assert (
        meta["uid"] and meta["resourceVersion"] and meta["generation"] == 1 and meta["namespace"] == "team-a"
    )
    assert "unknownField" not in created["spec"]  # pruned
    assert created["spec"]["scaling"]["maxReplicas"] == 10  # defaulted from the CRD
    with pytest.raises(KubeConflictError):
        await kube.create(CR_COLLECTION, body)
    bad = consumer_body("emu2", "k:9092", "orders")
    bad["spec"]["scaling"]["intervalSeconds"] = 0  # CRD minimum is 1
    with pytest.raises(KubeError, match="422"):
        await kube.create(CR_COLLECTION, bad)


async def test_status_subresource_generation_and_nullable_fields(kube: KubeClient, api: Any) -> None:
    await kube.create(CR_COLLECTION, consumer_body("emu", "k:9092", "orders"))
    released = [{"partition": "orders/0", "committedOffset": None}]
    pending = {"generation": 2, "members": [], "released": released, "granted": []}
    obj = await kube.patch(
        cr_path("emu", "status"), {"status": {"assignment": {"generation": 1, "pending": pending}}}
    )
    assert obj["status"]["assignment"]["pending"]["released"] == released  # nullable: accepted
    assert obj["metadata"]["generation"] == 1  # status writes do not bump the generation
    obj = await kube.patch(
        cr_path("emu"), {"spec": {"scaling": {"maxReplicas": 3}}, "status": {"replicas": 9}}
    )
    assert obj["metadata"]["generation"] == 2 and "replicas" not in obj["status"]  # status ignored here
    with pytest.raises(KubeConflictError):
        await kube.patch(cr_path("emu"), {"metadata": {"resourceVersion": "1"}, "spec": {}})
    with pytest.raises(KubeError, match="422"):
        await kube.patch(cr_path("emu", "status"), {"status": {"replicas": "many"}})
    # The scale subresource writes spec.scaling.replicas.
    obj = await kube.patch(cr_path("emu", "scale"), {"spec": {"replicas": 2}})
    assert (await kube.get(cr_path("emu")) or {})["spec"]["scaling"]["replicas"] == 2


async def test_owner_reference_garbage_collection(kube: KubeClient, api: Any) -> None:
    owner = await kube.create(CR_COLLECTION, consumer_body("emu", "k:9092", "orders"))
    ref = {
        "apiVersion": "multilane.dev/v1alpha1",
        "kind": "ParallelConsumer",
        "name": "emu",
        "uid": owner["metadata"]["uid"],
    }
    await kube.create(
        api_path("v1", "secrets", "team-a"), {"metadata": {"name": "child", "ownerReferences": [ref]}}
    )
    await kube.delete(cr_path("emu"))
    assert await kube.get(api_path("v1", "secrets", "team-a", "child")) is None
