"""The operator's apply path for the snapshot CronJob: created with a schedule, suspended (never
deleted) when the schedule is removed, resumed when it comes back. Fake Kubernetes client."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

from multilane.operator.k8s.handlers import OperatorHandlers
from multilane.operator.k8s.kube import KubeConflictError, api_path
from multilane.operator.spec import children as ch
from multilane.operator.spec.validation import validate_spec

REF = ch.ConsumerRef(name="orders", namespace="team-a", uid="1234")
CRONJOB = api_path("batch/v1", "cronjobs", "team-a", "orders-snapshot")


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(path))

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        full = f"{path}/{body['metadata']['name']}"
        if full in self.objects:
            raise KubeConflictError(409, full)
        self.objects[full] = copy.deepcopy(dict(body))
        return dict(body)

    async def patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        def merge(into: dict[str, Any], patch: Mapping[str, Any]) -> None:
            for key, value in patch.items():
                if isinstance(value, Mapping) and isinstance(into.get(key), dict):
                    merge(into[key], value)
                else:
                    into[key] = copy.deepcopy(value)

        merge(self.objects[path], body)
        return self.objects[path]

    async def delete(self, path: str) -> bool:
        self.deleted.append(path)
        return self.objects.pop(path, None) is not None


def _spec(schedule: str) -> dict[str, Any]:
    return {
        "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "consumerGroup": "g"},
        "workload": {"image": "app:1", "processor": "app:process"},
        "scaling": {"minReplicas": 1, "maxReplicas": 3},
        "state": {"enabled": True, "snapshot": {"uri": "s3://b/p", "schedule": schedule}},
    }


def _apply(handlers: OperatorHandlers, raw: dict[str, Any]) -> None:
    spec, problems = validate_spec(raw)
    assert spec is not None, problems
    body = {"metadata": {"name": "orders", "namespace": "team-a", "uid": "1234"}, "spec": raw}
    asyncio.run(handlers.children.apply(REF, spec, body, {}))


def test_cronjob_created_suspended_on_removal_and_resumed() -> None:
    kube = FakeKube()
    handlers = OperatorHandlers(kube, token_factory=lambda: "t" * 48)  # type: ignore[arg-type]
    _apply(handlers, _spec("0 * * * *"))
    assert kube.objects[CRONJOB]["spec"]["schedule"] == "0 * * * *"
    assert kube.objects[CRONJOB]["spec"]["suspend"] is False
    _apply(handlers, _spec("30 2 * * *"))  # changed schedule: patched
    assert kube.objects[CRONJOB]["spec"]["schedule"] == "30 2 * * *"
    _apply(handlers, _spec(""))  # schedule removed: suspended, not deleted
    assert kube.objects[CRONJOB]["spec"]["suspend"] is True
    assert kube.deleted == []
    _apply(handlers, _spec("0 * * * *"))  # schedule back: resumed
    assert kube.objects[CRONJOB]["spec"]["suspend"] is False


def test_no_cronjob_is_created_without_a_schedule() -> None:
    kube = FakeKube()
    handlers = OperatorHandlers(kube, token_factory=lambda: "t" * 48)  # type: ignore[arg-type]
    _apply(handlers, _spec(""))
    assert CRONJOB not in kube.objects
    assert any(p.endswith("/statefulsets/orders") for p in kube.objects)
