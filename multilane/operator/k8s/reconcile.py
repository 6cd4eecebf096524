"""The reconcile handler of a ParallelConsumer: validate, check the environment, apply the children.
Does I/O (Kubernetes API, Kafka admin).

:meth:`ReconcileSteps.reconcile` (``on.create`` / ``on.update(field="spec")`` / ``on.resume``, and
the timer when the spec is not applied yet) runs the numbered steps of
:mod:`multilane.operator.k8s.handlers`' docstring; the control loop
(:mod:`multilane.operator.k8s.control_pass`) reuses :meth:`ReconcileSteps._check_environment` and
:meth:`ReconcileSteps._degrade`.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from multilane.operator.controller import EventRecord
from multilane.operator.k8s.handler_core import PAUSED_ANNOTATION, HandlerCore, _event, _paused, _ref
from multilane.operator.k8s.kube import KubeConflictError, KubeError, api_path
from multilane.operator.k8s.statefulset import apply_stateful_set
from multilane.operator.k8s.writes import conditional_patch
from multilane.operator.kafka_admin import KafkaUnavailableError
from multilane.operator.spec import children as ch
from multilane.operator.spec.conditions import condition, now_iso, set_condition
from multilane.operator.spec.network import network_policy
from multilane.operator.spec.validation import ConsumerSpec, Problem, check_environment, validate_spec

log = logging.getLogger(__name__)


class ReconcileSteps(HandlerCore):
    """The reconcile handler and the steps the control loop shares with it."""

    async def reconcile(self, body: Mapping[str, Any]) -> bool:
        """Validate fully, then apply the children. Returns True when the children are applied."""
        ref = _ref(body)
        async with self._lock(ref.uid):
            try:
                with self.metrics.timed("reconcile"):
                    applied = await self._reconcile(ref, body)
            except KubeError as exc:
                self.metrics.reconciles.labels("error").inc()
                self.metrics.errors.labels("kubernetes").inc()
                raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=10) from exc
            self.metrics.reconciles.labels("applied" if applied else "held").inc()
            return applied

    async def _reconcile(self, ref: ch.ConsumerRef, body: Mapping[str, Any]) -> bool:
        status = dict(body.get("status") or {})
        conditions = list(status.get("conditions") or [])
        generation = int((body.get("metadata") or {}).get("generation") or 1)
        stamp = now_iso()
        # 1. Paused: hold everything.
        if _paused(body):
            if (condition(conditions, "Paused") or {}).get("status") != "True":
                _event(body, EventRecord("Normal", "Paused", f"annotation {PAUSED_ANNOTATION}=true: holding"))
            conditions = set_condition(
                conditions, "Paused", True, "PausedByAnnotation", "changes held", now=stamp
            )
            await self._patch_status(ref, {"conditions": conditions})
            return False
        conditions = set_condition(conditions, "Paused", False, "NotPaused", "", now=stamp)
        # 2. Validate the spec.
        spec, problems = validate_spec(body.get("spec"))
        # 3. Check the environment.
        if spec is not None:
            problems, _, _ = await self._check_environment(ref, spec)
        # 4. Problems: a condition and Events, no child touched.
        if problems or spec is None:
            await self._degrade(ref, body, conditions, problems, generation)
            return False
        # 5. Apply the children.
        held_before = self._immutable.get(ref.uid)
        held = await self._apply_children(ref, spec, body, status)
        # 6. Status.
        if held:
            self._immutable[ref.uid] = held
            if held != held_before:  # one Event per held change (kopf may run a handler again)
                _event(body, EventRecord("Warning", "ImmutableFieldChange", held))
            conditions = set_condition(conditions, "Degraded", True, "ImmutableFieldChange", held, now=stamp)
        else:
            self._immutable.pop(ref.uid, None)
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
        await self._patch_status(ref, patch)
        _event(body, EventRecord("Normal", "Applied", f"children applied for generation {generation}"))
        return True

    async def _credentials(self, ref: ch.ConsumerRef, name: str, fresh: bool) -> dict[str, Any] | None:
        """The credentials Secret: read on reconcile (``fresh``) and after ``secret_ttl_s``."""
        cached = self._secrets.get(ref.uid)
        now = time.monotonic()
        if fresh or cached is None or now - cached[0] > self.settings.secret_ttl_s:
            secret = await self.kube.get(api_path("v1", "secrets", ref.namespace, name))
            cached = (now, secret)
            self._secrets[ref.uid] = cached
        return cached[1]

    async def _check_environment(
        self, ref: ch.ConsumerRef, spec: ConsumerSpec, fresh: bool = True
    ) -> tuple[list[Problem], dict[str, str], dict[str, int] | None]:
        """Problems, the Kafka client config (with credentials, in memory only), partition counts."""
        secret_exists: bool | None = None
        config: dict[str, str] = {"bootstrap.servers": spec.bootstrap_servers, **spec.kafka_config}
        if spec.credentials_secret and self.settings.read_kafka_credentials:
            secret = await self._credentials(ref, spec.credentials_secret, fresh)
            secret_exists = secret is not None
            for key, value in ((secret or {}).get("data") or {}).items():
                config[key] = base64.b64decode(value).decode()
        topic_partitions: dict[str, int] | None
        kafka_error = None
        if secret_exists is False:
            topic_partitions = {
                t: 0 for t in spec.topics
            }  # cannot ask without credentials; report the Secret
        else:
            try:
                topic_partitions = await self.admin_factory(config).topic_partitions(spec.topics)
            except KafkaUnavailableError as exc:
                self.metrics.errors.labels("kafka").inc()
                topic_partitions, kafka_error = None, str(exc)
        problems = check_environment(
            spec, secret_exists=secret_exists, topic_partitions=topic_partitions, kafka_error=kafka_error
        )
        return problems, config, topic_partitions

    async def _degrade(
        self,
        ref: ch.ConsumerRef,
        body: Mapping[str, Any],
        conditions: list[dict[str, Any]],
        problems: list[Problem],
        generation: int,
    ) -> None:
        stamp = now_iso()
        message = "; ".join(p.message for p in problems)[:1000]
        reason = problems[0].reason if problems else "InvalidSpec"
        previous = condition(conditions, "Degraded") or {}
        if previous.get("status") != "True" or previous.get("message") != message:
            for p in problems:
                _event(body, EventRecord("Warning", p.reason, p.message))
        conditions = set_condition(conditions, "Degraded", True, reason, message, now=stamp)
        conditions = set_condition(conditions, "Ready", False, reason, message, now=stamp)
        await self._patch_status(ref, {"conditions": conditions})
        log.warning("%s/%s not applied (generation %d): %s", ref.namespace, ref.name, generation, message)

    async def _apply_children(
        self, ref: ch.ConsumerRef, spec: ConsumerSpec, body: Mapping[str, Any], status: Mapping[str, Any]
    ) -> str | None:
        """Apply every child; returns the message of a held immutable StatefulSet change (or None)."""
        raw_spec = dict(body.get("spec") or {})
        held: str | None = None
        # The token Secret: created once, never overwritten.
        secrets_path = api_path("v1", "secrets", ref.namespace)
        if await self.kube.get(api_path("v1", "secrets", ref.namespace, ref.token_secret)) is None:
            try:
                await self.kube.create(secrets_path, ch.control_token_secret(ref, self.token_factory()))
            except KubeConflictError:
                pass  # someone (an earlier pass) created it: keep theirs
        if self.settings.control_tls.enabled:
            await self.certs.ensure(ref)  # the control port's certificates, before the pods mount them
        sts_path = api_path("apps/v1", "statefulsets", ref.namespace, ref.name)
        existing = await self.kube.get(sts_path)

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
        if self.settings.network_policy is not None:
            manifests.append(network_policy(ref, self.settings.network_policy))
        for manifest in manifests:
            kind = manifest["kind"]
            if kind == "StatefulSet":
                held = await apply_stateful_set(
                    self.kube, ref, manifest, existing, body, lambda r: _event(body, r), replicas_for
                )
                continue
            api_version = manifest["apiVersion"]
            plural = {
                "ServiceAccount": "serviceaccounts",
                "Role": "roles",
                "RoleBinding": "rolebindings",
                "Service": "services",
                "PodDisruptionBudget": "poddisruptionbudgets",
                "StatefulSet": "statefulsets",
                "CronJob": "cronjobs",
                "NetworkPolicy": "networkpolicies",
            }[kind]
            collection = api_path(api_version, plural, ref.namespace)
            path = api_path(api_version, plural, ref.namespace, manifest["metadata"]["name"])
            # Create, or merge-patch to the manifest: a function of the spec alone, decided on no read
            # of the child (and the chart grants no get on these kinds), so there is no resourceVersion
            # to carry; the writes decided on a read carry theirs (k8s/writes.py).
            try:
                await self.kube.create(collection, manifest)
            except KubeConflictError:
                await self.kube.patch(path, ch.patch_body(manifest))
        if ch.snapshot_cronjob(ref, raw_spec) is None:
            # Scheduled snapshots off: suspend a CronJob left from an earlier spec. Not deleted: the
            # operator holds no delete on cronjobs (least privilege); it goes with its owner.
            cronjob_path = api_path("batch/v1", "cronjobs", ref.namespace, ch.snapshot_cronjob_name(ref))
            suspend = {"spec": {"suspend": True}}
            await conditional_patch(
                self.kube, cronjob_path, lambda c: None if (c.get("spec") or {}).get("suspend") else suspend
            )
        return held
