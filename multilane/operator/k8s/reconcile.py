"""``ChildrenReconciler``: the reconcile handler of a ParallelConsumer -- validate, check the
environment, apply the children. Does I/O (Kubernetes API, Kafka admin through the environment check).

:meth:`ChildrenReconciler.reconcile` (``on.create`` / ``on.update(field="spec")`` / ``on.resume``, and
the control pass when the spec is not applied yet) runs the numbered steps of
:mod:`multilane.operator.k8s.handlers`' docstring. Inputs: the API client, the consumer's lock (shared
with the control pass), the environment check, the status writer, the certificate manager (None: no
control TLS), the token factory, the NetworkPolicy settings and the metrics. It owns two memories of
each consumer: the immutable StatefulSet change it holds (read by the control pass through
:meth:`ChildrenReconciler.held`) and the template hash it renders for a spec.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from multilane.operator.k8s.certs import ControlCertManager
from multilane.operator.k8s.environment import EnvironmentCheck
from multilane.operator.k8s.kube import KubeClient, KubeConflictError, KubeError, api_path
from multilane.operator.k8s.memory import Slot
from multilane.operator.k8s.resource import PAUSED_ANNOTATION, consumer_ref, is_paused, post_event
from multilane.operator.k8s.statefulset import apply_stateful_set
from multilane.operator.k8s.status_writer import StatusWriter
from multilane.operator.k8s.writes import conditional_patch
from multilane.operator.metrics import OperatorMetrics
from multilane.operator.pass_model import EventRecord
from multilane.operator.spec import children as ch
from multilane.operator.spec import control_pki
from multilane.operator.spec.conditions import condition, now_iso, set_condition
from multilane.operator.spec.network import NetworkPolicySettings, network_policy
from multilane.operator.spec.validation import ConsumerSpec, validate_spec

__all__ = ["ChildrenReconciler"]

log = logging.getLogger(__name__)

_PLURALS = {
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Service": "services",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "StatefulSet": "statefulsets",
    "CronJob": "cronjobs",
    "NetworkPolicy": "networkpolicies",
}


class ChildrenReconciler:
    def __init__(
        self,
        kube: KubeClient,
        locks: Slot[asyncio.Lock],
        environment: EnvironmentCheck,
        status: StatusWriter,
        metrics: OperatorMetrics,
        *,
        certs: ControlCertManager | None,
        token_factory: Callable[[], str],
        network: NetworkPolicySettings | None,
        immutable: Slot[str],
        rendered: Slot[tuple[Any, str]],
    ) -> None:
        self._kube = kube
        self._locks = locks  # uid -> the lock one reconcile or control pass of the consumer holds
        self._environment = environment
        self._status = status
        self._metrics = metrics
        self._certs = certs  # the control port's certificates (None: plain HTTP, no TLS Secret)
        self._token_factory = token_factory
        self._network = network  # the NetworkPolicy child's peers (None: no NetworkPolicy)
        # uid -> message naming the immutable StatefulSet fields a spec change would change: set by
        # reconcile while that change is held, removed when a reconcile applies the StatefulSet.
        self._immutable = immutable
        self._rendered = rendered  # uid -> (raw spec, the template hash rendered for it)

    def held(self, uid: str) -> str | None:
        """The immutable StatefulSet change held for the consumer (None: none held)."""
        return self._immutable.get(uid)

    async def reconcile(self, body: Mapping[str, Any]) -> bool:
        """Validate fully, then apply the children. Returns True when the children are applied."""
        ref = consumer_ref(body)
        async with self._locks.setdefault(ref.uid, asyncio.Lock):
            try:
                with self._metrics.timed("reconcile"):
                    applied = await self._reconcile(ref, body)
            except KubeError as exc:
                self._metrics.reconciles.labels("error").inc()
                self._metrics.errors.labels("kubernetes").inc()
                raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=10) from exc
            self._metrics.reconciles.labels("applied" if applied else "held").inc()
            return applied

    async def _reconcile(self, ref: ch.ConsumerRef, body: Mapping[str, Any]) -> bool:
        status = dict(body.get("status") or {})
        conditions = list(status.get("conditions") or [])
        generation = int((body.get("metadata") or {}).get("generation") or 1)
        stamp = now_iso()
        # 1. Paused: hold everything.
        if is_paused(body):
            if (condition(conditions, "Paused") or {}).get("status") != "True":
                post_event(
                    body, EventRecord("Normal", "Paused", f"annotation {PAUSED_ANNOTATION}=true: holding")
                )
            conditions = set_condition(
                conditions, "Paused", True, "PausedByAnnotation", "changes held", now=stamp
            )
            await self._status.patch(ref, {"conditions": conditions})
            return False
        conditions = set_condition(conditions, "Paused", False, "NotPaused", "", now=stamp)
        # 2. Validate the spec.
        spec, problems = validate_spec(body.get("spec"))
        # 3. Check the environment.
        if spec is not None:
            problems, _, _ = await self._environment.check(ref, spec)
        # 4. Problems: a condition and Events, no child touched.
        if problems or spec is None:
            await self._status.degrade(ref, body, conditions, problems, generation)
            return False
        # 5. Apply the children.
        held_before = self._immutable.get(ref.uid)
        held = await self.apply(ref, spec, body, status)
        # 6. Status.
        if held:
            self._immutable.set(ref.uid, held)
            if held != held_before:  # one Event per held change (kopf may run a handler again)
                post_event(body, EventRecord("Warning", "ImmutableFieldChange", held))
            conditions = set_condition(conditions, "Degraded", True, "ImmutableFieldChange", held, now=stamp)
        else:
            self._immutable.pop(ref.uid)
            conditions = set_condition(conditions, "Degraded", False, "AsExpected", "", now=stamp)
        ready_reason = (condition(conditions, "Ready") or {}).get("reason")
        if ready_reason not in {"WaitingForWorkers", "Rebalancing", "AllPartitionsAssigned"}:
            conditions = set_condition(
                conditions, "Ready", False, "WaitingForWorkers", "children applied", now=stamp
            )
        patch: dict[str, Any] = {
            "observedGeneration": generation,
            "labelSelector": f"{ch.CONSUMER_LABEL}={ref.name}",
            "conditions": conditions,
        }
        if spec.replicas is not None:
            last = dict(status.get("lastDecision") or {})
            if last.get("replicas") != spec.replicas:
                patch["lastDecision"] = {
                    **last,
                    "time": last.get("time") or stamp,
                    "replicas": spec.replicas,
                    "factor": int(last.get("factor") or status.get("factor") or spec.min_factor),
                    "reason": "spec.scaling.replicas (scale subresource) pins the replica count",
                }
        await self._status.patch(ref, patch)
        post_event(body, EventRecord("Normal", "Applied", f"children applied for generation {generation}"))
        return True

    def _with_tls(self, ref: ch.ConsumerRef, manifest: dict[str, Any]) -> dict[str, Any]:
        if manifest["kind"] != "StatefulSet" or self._certs is None:
            return manifest
        return control_pki.with_control_tls(ref, manifest)

    def template_hash(self, ref: ch.ConsumerRef, raw: Any) -> str | None:
        """The pod template hash this operator renders for the raw spec ``raw`` (None: not valid),
        kept while the spec stays the same."""
        cached = self._rendered.get(ref.uid)
        if cached is None or cached[0] != raw:
            spec, _ = validate_spec(raw)
            if spec is None:
                return None
            template = self._with_tls(ref, ch.stateful_set(ref, dict(raw or {}), 0))["spec"]["template"]
            cached = self._rendered.set(
                ref.uid,
                (copy.deepcopy(raw), template["metadata"]["annotations"][ch.TEMPLATE_HASH_ANNOTATION]),
            )
        return cached[1]

    async def apply(
        self, ref: ch.ConsumerRef, spec: ConsumerSpec, body: Mapping[str, Any], status: Mapping[str, Any]
    ) -> str | None:
        """Apply every child; returns the message of a held immutable StatefulSet change (or None)."""
        raw_spec = dict(body.get("spec") or {})
        held: str | None = None
        kube = self._kube
        # The token Secret: created once, never overwritten.
        secrets_path = api_path("v1", "secrets", ref.namespace)
        if await kube.get(api_path("v1", "secrets", ref.namespace, ref.token_secret)) is None:
            try:
                await kube.create(secrets_path, ch.control_token_secret(ref, self._token_factory()))
            except KubeConflictError:
                pass  # someone (an earlier pass) created it: keep theirs
        if self._certs is not None:
            await self._certs.ensure(ref)  # the control port's certificates, before the pods mount them
        sts_path = api_path("apps/v1", "statefulsets", ref.namespace, ref.name)
        existing = await kube.get(sts_path)

        def replicas_for(current: Mapping[str, Any] | None) -> int:
            """The replicas decided from the StatefulSet as read (again on a 409)."""
            if current is not None:
                replicas = int((current.get("spec") or {}).get("replicas") or 0)
            else:
                replicas = spec.replicas or int(
                    (status.get("lastDecision") or {}).get("replicas") or spec.min_replicas
                )
            if spec.replicas is not None and spec.replicas > replicas:
                replicas = spec.replicas  # scale-ups apply at once; scale-downs go through release first
            return min(max(replicas, spec.min_replicas if current is None else 0), spec.max_replicas)

        replicas = replicas_for(existing)
        manifests = [self._with_tls(ref, m) for m in ch.children(ref, raw_spec, replicas)]
        if self._network is not None:
            manifests.append(network_policy(ref, self._network))
        for manifest in manifests:
            kind = manifest["kind"]
            if kind == "StatefulSet":
                held = await apply_stateful_set(
                    kube, ref, manifest, existing, body, lambda r: post_event(body, r), replicas_for
                )
                continue
            api_version = manifest["apiVersion"]
            collection = api_path(api_version, _PLURALS[kind], ref.namespace)
            path = api_path(api_version, _PLURALS[kind], ref.namespace, manifest["metadata"]["name"])
            # Create, or merge-patch to the manifest: a function of the spec alone, decided on no read
            # of the child (and the chart grants no get on these kinds), so there is no resourceVersion
            # to carry; the writes decided on a read carry theirs (k8s/writes.py).
            try:
                await kube.create(collection, manifest)
            except KubeConflictError:
                await kube.patch(path, ch.patch_body(manifest))
        if ch.snapshot_cronjob(ref, raw_spec) is None:
            # Scheduled snapshots off: suspend a CronJob left from an earlier spec. Not deleted: the
            # operator holds no delete on cronjobs (least privilege); it goes with its owner.
            cronjob_path = api_path("batch/v1", "cronjobs", ref.namespace, ch.snapshot_cronjob_name(ref))
            suspend = {"spec": {"suspend": True}}
            await conditional_patch(
                kube, cronjob_path, lambda c: None if (c.get("spec") or {}).get("suspend") else suspend
            )
        return held
