"""``KubernetesPlatform``: workers are the pods of a StatefulSet; liveness from pods and Leases. Does I/O.

Liveness on Kubernetes (:class:`KubernetesPlatform`): a worker is *alive* while its pod exists, is not
terminating, and its Lease (``coordination.k8s.io/v1``, named after the pod) was renewed by the worker
within ``leaseDurationSeconds`` (plus ``clock_skew_s``); it is *eligible* for new partitions while
alive and its pod is not terminating. A worker is *known dead* when its pod is gone (absent from the
list) or it is not alive (Lease expired or never renewed). The operator creates each Lease without a
``renewTime`` (the worker's ``LeaseKeeper`` renews it), so a fresh pod is not alive until its worker
process renewed once.

Reads: from the :class:`~multilane.operator.k8s.cache.WatchCache` (kopf's watches) once it is bound,
so a control pass costs no API request; without it (no kopf), one LIST of pods and of Leases and one
GET of the StatefulSet per pass. :meth:`KubernetesPlatform.workload_problems` reads the pods of the
last :meth:`~KubernetesPlatform.list_workers` and lists the StatefulSet's FailedCreate Events only
while pods stay missing (from the second pass, at most every 5 s).
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from multilane.operator.k8s.cache import WatchCache
from multilane.operator.k8s.kube import KubeClient, KubeConflictError, api_path
from multilane.operator.k8s.writes import conditional_patch, replicas_of, while_same
from multilane.operator.platform import WorkerInfo, parse_time
from multilane.operator.spec.children import (
    CONSUMER_LABEL,
    CONTROL_PORT,
    TEMPLATE_HASH_ANNOTATION,
    ConsumerRef,
    lease_manifest,
)
from multilane.operator.spec.pod_health import pod_problems, statefulset_problems

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
        cache: WatchCache | None = None,
    ) -> None:
        self.kube = kube
        self.control_url = control_url
        self.clock = clock
        self.clock_skew_s = clock_skew_s
        self.cache = cache or WatchCache()
        self._pods: dict[str, list[Mapping[str, Any]]] = {}  # uid -> pods of the last list_workers
        self.events_every_s = 5.0  # FailedCreate Events are listed at most this often per consumer
        # uid -> (monotonic time pods were first seen missing, time Events were last listed)
        self._missing: dict[str, tuple[float, float]] = {}
        self._failed: dict[str, list[tuple[str, str]]] = {}  # uid -> the last FailedCreate problems

    def _sts_path(self, ref: ConsumerRef) -> str:
        return api_path("apps/v1", "statefulsets", ref.namespace, ref.name)

    async def _statefulset(self, ref: ConsumerRef) -> Mapping[str, Any] | None:
        if self.cache.bound:
            return self.cache.statefulset(ref)
        return await self.kube.get(self._sts_path(ref))

    async def ensure_workers(self, ref: ConsumerRef, replicas: int) -> None:
        """Conditional on the StatefulSet's ``resourceVersion``, while its replicas are those the pass's
        view decided from (else KubeConflictError: the next pass decides again;
        ``multilane/operator/k8s/writes.py``)."""
        decide = while_same(await self._statefulset(ref), replicas_of, {"spec": {"replicas": replicas}})
        written = await conditional_patch(self.kube, self._sts_path(ref), decide)
        if written is not None:
            self.cache.remember(ref, written)

    async def current_workers(self, ref: ConsumerRef) -> int:
        sts = await self._statefulset(ref)
        return int(((sts or {}).get("spec") or {}).get("replicas") or 0)

    async def list_workers(self, ref: ConsumerRef) -> list[WorkerInfo]:
        pods: list[Mapping[str, Any]]
        lease_list: list[Mapping[str, Any]]
        if self.cache.bound:
            pods, lease_list = self.cache.pods(ref), self.cache.leases(ref)
        else:
            pods = list(
                await self.kube.list(api_path("v1", "pods", ref.namespace), {CONSUMER_LABEL: ref.name})
            )
            lease_list = list(
                await self.kube.list(
                    api_path("coordination.k8s.io/v1", "leases", ref.namespace), {CONSUMER_LABEL: ref.name}
                )
            )
        self._pods[ref.uid] = list(pods)
        leases = {(lease.get("metadata") or {}).get("name"): lease for lease in lease_list}
        now = self.clock()
        workers = []
        for pod in pods:
            meta = pod.get("metadata") or {}
            name = str(meta.get("name", ""))
            if not _is_worker_pod(ref, pod):
                continue  # not a StatefulSet pod of this consumer
            tail = name.rpartition("-")[2]
            if name not in leases:
                # The operator owns Lease creation; the worker can only renew.
                try:
                    await self.kube.create(
                        api_path("coordination.k8s.io/v1", "leases", ref.namespace), lease_manifest(ref, name)
                    )
                except KubeConflictError:
                    pass
            alive, reason = self._liveness(leases.get(name), now)
            annotations = meta.get("annotations") or {}
            workers.append(
                WorkerInfo(
                    name=name,
                    ordinal=int(tail),
                    alive=alive,
                    control_url=self.control_url(ref, name),
                    terminating=bool(meta.get("deletionTimestamp")),
                    reason=reason,
                    revision=str(annotations.get(TEMPLATE_HASH_ANNOTATION) or ""),
                    ready=_pod_ready(pod),
                )
            )
        return sorted(workers, key=lambda w: w.ordinal)

    async def desired_revision(self, ref: ConsumerRef) -> str | None:
        """The template hash of the StatefulSet's pod template (what a re-created pod runs)."""
        sts = await self._statefulset(ref)
        template = ((sts or {}).get("spec") or {}).get("template") or {}
        value = ((template.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION)
        return str(value) if value else None

    async def replace_worker(self, ref: ConsumerRef, name: str) -> None:
        """Delete the pod; the StatefulSet controller creates it again from the current template."""
        await self.kube.delete(api_path("v1", "pods", ref.namespace, name))

    async def workload_problems(self, ref: ConsumerRef) -> list[tuple[str, str]]:
        """Why pods do not run (:mod:`multilane.operator.spec.pod_health`): from the pods of the last
        :meth:`list_workers`; the StatefulSet's Events are listed only while pods are missing."""
        pods = [p for p in self._pods.get(ref.uid, []) if _is_worker_pod(ref, p)]
        problems = pod_problems(pods)
        sts = await self._statefulset(ref)
        if int(((sts or {}).get("spec") or {}).get("replicas") or 0) <= len(pods):
            self._missing.pop(ref.uid, None)
            self._failed.pop(ref.uid, None)
            return problems
        # Pods missing: on the second pass that sees it (a pod being created is no problem), then at
        # most every events_every_s, list this StatefulSet's FailedCreate Events.
        now = time.monotonic()
        first, read = self._missing.setdefault(ref.uid, (now, float("-inf")))
        if now > first and now - read >= self.events_every_s:
            self._missing[ref.uid] = (first, now)
            fields = {"involvedObject.name": ref.name, "reason": "FailedCreate"}
            events = await self.kube.list(api_path("v1", "events", ref.namespace), fields=fields)
            self._failed[ref.uid] = statefulset_problems(sts, len(pods), events)
        return problems + self._failed.get(ref.uid, [])

    def forget(self, ref: ConsumerRef) -> None:
        self._pods.pop(ref.uid, None)
        self._missing.pop(ref.uid, None)
        self._failed.pop(ref.uid, None)

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


def _pod_ready(pod: Mapping[str, Any]) -> bool | None:
    """The pod's Ready condition (its readiness probe); None when the pod reports no conditions."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status")) == "True"
    return None


def _is_worker_pod(ref: ConsumerRef, pod: Mapping[str, Any]) -> bool:
    stem, _, tail = str((pod.get("metadata") or {}).get("name", "")).rpartition("-")
    return stem == ref.name and tail.isdigit()
