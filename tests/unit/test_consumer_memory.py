"""The kopf side's memory of each consumer (``multilane/operator/k8s/memory.py``): every part keeps it
in a slot of its own, and deleting the consumer forgets all of it in one place -- the slots, the
certificate manager's, the status memory's, the platform's and the metrics' (fake API client, no
cluster)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

import pytest

from multilane.operator.k8s import reconcile, status_writer
from multilane.operator.k8s.certs import ControlCertManager
from multilane.operator.k8s.handlers import HandlerSettings, OperatorHandlers
from multilane.operator.k8s.memory import ConsumerMemory
from multilane.operator.k8s.platform import KubernetesPlatform
from multilane.operator.k8s.resource import cr_path
from multilane.operator.spec import children as ch
from multilane.operator.spec.control_pki import ControlTlsSettings
from multilane.operator.spec.validation import validate_spec

UID = "u-1"
REF = ch.ConsumerRef(name="orders", namespace="team-a", uid=UID)
SPEC = {
    "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "consumerGroup": "g"},
    "workload": {"image": "app:1", "processor": "app:process"},
    "scaling": {"minReplicas": 1, "maxReplicas": 3},
}
BODY = {
    "apiVersion": "multilane.dev/v1alpha1",
    "kind": "ParallelConsumer",
    "metadata": {
        "name": "orders",
        "namespace": "team-a",
        "uid": UID,
        "generation": 1,
        "resourceVersion": "7",
    },
    "spec": SPEC,
}


class FakeKube:
    """Objects by path; a patch merges into the object (the status subresource into its owner)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {cr_path(REF): copy.deepcopy(BODY)}

    async def get(self, path: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(path))

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.objects[f"{path}/{body['metadata']['name']}"] = copy.deepcopy(dict(body))
        return dict(body)

    async def patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        target = self.objects.setdefault(path.removesuffix("/status"), {})
        for key, value in body.items():
            if key != "metadata":
                target[key] = {**(target.get(key) or {}), **copy.deepcopy(dict(value))}
        target.setdefault("metadata", {})["resourceVersion"] = "8"
        return copy.deepcopy(target)


class FakeAdmin:
    async def topic_partitions(self, topics: list[str]) -> dict[str, int]:
        return dict.fromkeys(topics, 2)


def test_a_slot_has_one_owner() -> None:
    memory = ConsumerMemory()
    memory.slot("controls")
    with pytest.raises(ValueError, match="one owner"):
        memory.slot("controls")


def test_deleting_a_consumer_forgets_everything_remembered_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    forgotten: list[str] = []
    monkeypatch.setattr(ControlCertManager, "forget", lambda self, uid: forgotten.append(f"certs:{uid}"))
    monkeypatch.setattr(
        KubernetesPlatform, "forget", lambda self, ref: forgotten.append(f"platform:{ref.uid}")
    )
    for module in (reconcile, status_writer):  # Events: kopf posts them only inside its handlers
        monkeypatch.setattr(module, "post_event", lambda body, record: None)
    kube = FakeKube()
    handlers = OperatorHandlers(
        kube,  # type: ignore[arg-type]
        settings=HandlerSettings(control_tls=ControlTlsSettings(enabled=False)),
        admin_factory=lambda config: FakeAdmin(),  # type: ignore[arg-type,return-value]
        token_factory=lambda: "t" * 48,
    )

    async def main() -> None:
        assert await handlers.reconcile(BODY)  # the children applied; the status written
        spec, _ = validate_spec(SPEC)
        assert spec is not None
        handlers.sources.of(REF, spec, {"bootstrap.servers": "kafka:9092"})
        handlers.children.template_hash(REF, SPEC)
        assert await handlers.controls.of(REF) is not None  # the token Secret the reconcile created
        handlers.gate.seen(REF, BODY)

    asyncio.run(main())
    held = set(handlers.memory.remembers(UID))
    assert {"locks", "seen-resource-version", "controls", "sources", "rendered-template"} <= held
    assert handlers.status.view(REF, BODY).get("observedGeneration") == 1  # the status memory's answer
    control = handlers.controls._controls.get(UID)
    assert control is not None
    handlers.forget(BODY)
    assert handlers.memory.remembers(UID) == []
    assert handlers.controls._retired == [control[1]]  # its client is closed at the next call or close()
    assert forgotten == [f"certs:{UID}", f"platform:{UID}"]
    assert handlers.status.view(REF, BODY).get("observedGeneration") is None  # its status memory too
    asyncio.run(handlers.close())
    assert handlers.controls._retired == []
