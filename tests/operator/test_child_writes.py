"""The operator's child writes carry the ``resourceVersion`` they were decided on
(``multilane/operator/k8s/writes.py``): against the strict API double (409 for a stale
``resourceVersion``), a child another writer changed between the operator's read and its write is
re-read and the decision made again, never overwritten; the control loop's replica write
(``KubernetesPlatform.ensure_workers``) fails its pass instead of overwriting."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from multilane.operator.k8s.kube import KubeClient, KubeConflictError, api_path
from multilane.operator.k8s.platform import KubernetesPlatform
from multilane.operator.k8s.statefulset import apply_stateful_set
from multilane.operator.k8s.writes import conditional_patch
from multilane.operator.spec.children import ConsumerRef
from tests.operator.conftest import NS

pytestmark = pytest.mark.asyncio(loop_scope="function")

SERVICES = api_path("v1", "services", NS)


def _service(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": {"clusterIP": "None"}}


def race_after_reads(
    kube: KubeClient, monkeypatch: pytest.MonkeyPatch, writes: list[Mapping[str, Any]]
) -> None:
    """After each of the next GETs, another writer patches the object (one entry of ``writes`` per GET),
    so the operator's write that follows is based on a stale read."""
    real_get = kube.get
    pending = list(writes)

    async def get_then_race(path: str) -> dict[str, Any] | None:
        obj = await real_get(path)
        if pending and obj is not None:
            await KubeClient.patch(kube, path, pending.pop(0))
        return obj

    monkeypatch.setattr(kube, "get", get_then_race)


async def test_a_child_changed_since_read_is_re_read_and_decided_again(
    kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await kube.create(SERVICES, _service("svc"))
    seen: list[dict[str, str]] = []

    def decide(current: Mapping[str, Any]) -> dict[str, Any] | None:
        labels = dict((current.get("metadata") or {}).get("labels") or {})
        seen.append(labels)
        return {"metadata": {"labels": {"ours": "yes", "count": str(len(labels))}}}

    race_after_reads(kube, monkeypatch, [{"metadata": {"labels": {"theirs": "yes"}}}])
    written = await conditional_patch(kube, f"{SERVICES}/svc", decide)
    # The first write (decided on a read without "theirs") got 409; the second decision saw it.
    assert seen == [{}, {"theirs": "yes"}]
    assert written is not None and written["metadata"]["labels"] == {
        "theirs": "yes",
        "ours": "yes",
        "count": "1",
    }


async def test_a_decision_another_writer_made_moot_is_not_written(
    kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claim an annotation unless someone holds it: the other writer claims it between our read and our
    write; the retry decides nothing, so theirs stays."""
    await kube.create(SERVICES, _service("claimed"))

    def claim(current: Mapping[str, Any]) -> dict[str, Any] | None:
        if ((current.get("metadata") or {}).get("annotations") or {}).get("owner"):
            return None
        return {"metadata": {"annotations": {"owner": "operator"}}}

    race_after_reads(kube, monkeypatch, [{"metadata": {"annotations": {"owner": "someone-else"}}}])
    written = await conditional_patch(kube, f"{SERVICES}/claimed", claim)
    assert written is not None and written["metadata"]["annotations"]["owner"] == "someone-else"
    stored = await KubeClient.get(kube, f"{SERVICES}/claimed") or {}
    assert stored["metadata"]["annotations"]["owner"] == "someone-else"


async def test_a_child_that_keeps_changing_is_given_up_not_overwritten(
    kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await kube.create(SERVICES, _service("busy"))
    race_after_reads(kube, monkeypatch, [{"metadata": {"labels": {"n": str(i)}}} for i in range(3)])
    with pytest.raises(KubeConflictError):
        await conditional_patch(kube, f"{SERVICES}/busy", lambda _: {"metadata": {"labels": {"n": "ours"}}})
    stored = await KubeClient.get(kube, f"{SERVICES}/busy") or {}
    assert stored["metadata"]["labels"] == {"n": "2"}


async def test_the_replica_write_re_reads_on_churn_and_fails_the_pass_on_a_changed_basis(
    kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ensure_workers`` patches replicas conditional on the StatefulSet's resourceVersion: a change
    that leaves the replicas alone (the controllers' status and label writes) costs a re-read; another
    writer's scale between the pass's read and its write fails the pass (KubeConflictError, the next
    pass decides again), and theirs stays."""
    sts_collection = api_path("apps/v1", "statefulsets", NS)
    labels = {"app": "w"}
    containers = [{"name": "c", "image": "i"}]
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "w"},
        "spec": {
            "replicas": 1,
            "serviceName": "w",
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": containers}},
        },
    }
    await kube.create(sts_collection, sts)
    platform = KubernetesPlatform(kube)
    ref = ConsumerRef("w", NS, "uid-w")
    # Churn after the pass's read and after the write's read: the first write gets 409, re-reads.
    race_after_reads(kube, monkeypatch, [{"metadata": {"labels": {"churn": str(i)}}} for i in range(2)])
    await platform.ensure_workers(ref, 2)
    stored = await KubeClient.get(kube, f"{sts_collection}/w") or {}
    assert stored["spec"]["replicas"] == 2 and stored["metadata"]["labels"]["churn"] == "1"
    # Another writer scales between the pass's read and its write: refused, theirs stays.
    race_after_reads(kube, monkeypatch, [{"spec": {"replicas": 5}}])
    with pytest.raises(KubeConflictError):
        await platform.ensure_workers(ref, 3)
    assert ((await KubeClient.get(kube, f"{sts_collection}/w") or {})["spec"])["replicas"] == 5
    await platform.ensure_workers(ref, 3)  # the next pass, from a fresh read
    assert ((await KubeClient.get(kube, f"{sts_collection}/w") or {})["spec"])["replicas"] == 3


async def test_a_statefulset_update_decides_its_replicas_again_after_a_409(
    kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reconcile's StatefulSet update (``apply_stateful_set``, step 3) carries the resourceVersion
    of its read; another writer's scale in between answers 409, and the retry decides the replicas from
    the new read: the template change lands, the other writer's count stays."""
    sts_collection = api_path("apps/v1", "statefulsets", NS)
    labels = {"app": "u"}
    sts: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "u"},
        "spec": {
            "replicas": 1,
            "serviceName": "u",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "i:1"}]},
            },
        },
    }
    existing = await kube.create(sts_collection, sts)
    desired = copy.deepcopy(sts)
    desired["spec"]["template"]["spec"]["containers"][0]["image"] = "i:2"
    race_after_reads(kube, monkeypatch, [{"spec": {"replicas": 4}}])
    decided: list[int] = []

    def replicas_for(current: Mapping[str, Any] | None) -> int:
        decided.append(int(((current or {}).get("spec") or {}).get("replicas") or 0))
        return decided[-1]

    held = await apply_stateful_set(
        kube, ConsumerRef("u", NS, "uid-u"), desired, existing, {}, lambda _: None, replicas_for
    )
    assert held is None
    stored = await KubeClient.get(kube, f"{sts_collection}/u") or {}
    assert decided == [1, 4]  # decided on the first read, 409, decided again on the second
    assert stored["spec"]["replicas"] == 4
    assert stored["spec"]["template"]["spec"]["containers"][0]["image"] == "i:2"
