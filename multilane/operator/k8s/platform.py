"""``KubernetesPlatform``: workers are the pods of a StatefulSet; liveness from pods and Leases. Does I/O.

Liveness on Kubernetes (:class:`KubernetesPlatform`): a worker is *alive* while its pod exists, is not
terminating, and its Lease (``coordination.k8s.io/v1``, named after the pod) was renewed by the worker
within ``leaseDurationSeconds`` (plus ``clock_skew_s``); it is *eligible* for new partitions while
alive and its pod is not terminating. A worker is *known dead* when its pod is gone (absent from the
list) or it is not alive (Lease expired or never renewed). The operator creates each Lease without a
``renewTime`` (the worker's ``LeaseKeeper`` renews it), so a fresh pod is not alive until its worker
process renewed once.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Mapping
from typing import Any

from multilane.operator.k8s.kube import KubeClient, KubeConflictError, api_path
from multilane.operator.platform import WorkerInfo, parse_time
from multilane.operator.spec.children import CONSUMER_LABEL, CONTROL_PORT, ConsumerRef, lease_manifest

__all__ = ["CONTROL_URL_TEMPLATE_ENV", "KubernetesPlatform", "default_control_url"]


# Test-only: a template for worker control URLs in place of the headless Service's DNS names, with
# the placeholders {pod}, {service}, {namespace} and {port} (multilane/testing/pods.py routes
# http://127.0.0.1:PORT/{namespace}/{pod} to the pod's process). Unset (the default) in a cluster.
CONTROL_URL_TEMPLATE_ENV = "MULTILANE_CONTROL_URL_TEMPLATE"


def default_control_url(ref: ConsumerRef, pod: str) -> str:
    """``http://POD.NAME-workers.NAMESPACE.svc:8471``: the pod's DNS name under the headless Service
    (or :data:`CONTROL_URL_TEMPLATE_ENV`'s template when set)."""
    template = os.environ.get(CONTROL_URL_TEMPLATE_ENV)
    if template:
        return template.format(
            pod=pod, service=ref.workers_service, namespace=ref.namespace, port=CONTROL_PORT
        )
    return f"http://{pod}.{ref.workers_service}.{ref.namespace}.svc:{CONTROL_PORT}"


class KubernetesPlatform:
    """Workers are the pods of the StatefulSet ``NAME``; liveness from pods and Leases."""

    def __init__(
        self,
        kube: KubeClient,
        control_url: Callable[[ConsumerRef, str], str] = default_control_url,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        clock_skew_s: float = 2.0,
    ) -> None:
        self.kube = kube
        self.control_url = control_url
        self.clock = clock
        self.clock_skew_s = clock_skew_s

    async def ensure_workers(self, ref: ConsumerRef, replicas: int) -> None:
        path = api_path("apps/v1", "statefulsets", ref.namespace, ref.name)
        await self.kube.patch(path, {"spec": {"replicas": replicas}})

    async def current_workers(self, ref: ConsumerRef) -> int:
        sts = await self.kube.get(api_path("apps/v1", "statefulsets", ref.namespace, ref.name))
        return int(((sts or {}).get("spec") or {}).get("replicas") or 0)

    async def list_workers(self, ref: ConsumerRef) -> list[WorkerInfo]:
        pods = await self.kube.list(api_path("v1", "pods", ref.namespace), {CONSUMER_LABEL: ref.name})
        leases = {
            (lease.get("metadata") or {}).get("name"): lease
            for lease in await self.kube.list(
                api_path("coordination.k8s.io/v1", "leases", ref.namespace), {CONSUMER_LABEL: ref.name}
            )
        }
        now = self.clock()
        workers = []
        for pod in pods:
            meta = pod.get("metadata") or {}
            name = str(meta.get("name", ""))
            stem, _, tail = name.rpartition("-")
            if stem != ref.name or not tail.isdigit():
                continue  # not a StatefulSet pod of this consumer
            if name not in leases:
                # The operator owns Lease creation; the worker can only renew.
                try:
                    await self.kube.create(
                        api_path("coordination.k8s.io/v1", "leases", ref.namespace), lease_manifest(ref, name)
                    )
                except KubeConflictError:
                    pass
            alive, reason = self._liveness(leases.get(name), now)
            workers.append(
                WorkerInfo(
                    name=name,
                    ordinal=int(tail),
                    alive=alive,
                    control_url=self.control_url(ref, name),
                    terminating=bool(meta.get("deletionTimestamp")),
                    reason=reason,
                )
            )
        return sorted(workers, key=lambda w: w.ordinal)

    def _liveness(self, lease: Mapping[str, Any] | None, now: dt.datetime) -> tuple[bool, str]:
        if lease is None:
            return False, "no lease yet"
        spec = lease.get("spec") or {}
        renewed = parse_time(spec.get("renewTime"))
        if renewed is None:
            return False, "lease never renewed"
        duration = float(spec.get("leaseDurationSeconds") or 15)
        age = (now - renewed).total_seconds()
        if age > duration + self.clock_skew_s:
            return False, f"lease expired {age - duration:.0f}s ago"
        return True, ""
