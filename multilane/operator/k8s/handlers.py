"""kopf handlers for ParallelConsumer: children, validation, the control loop. Does I/O (Kubernetes
API, Kafka admin, metric sources, worker control endpoints).

:class:`OperatorHandlers` holds the dependencies (injectable for tests) and registers into a kopf
registry:

- ``on.create`` / ``on.update(field="spec")`` / ``on.resume`` -> :meth:`OperatorHandlers.reconcile`:

  1. Paused (annotation ``multilane.dev/paused: "true"``)? Set condition Paused and change nothing.
  2. Validate the spec (pure, :func:`validate_spec`).
  3. Check the environment: the credentials Secret exists (only with ``read_kafka_credentials``);
     the topics exist (Kafka admin, short timeout; an unreachable broker is a problem, not a crash).
  4. On any problem: condition Ready=False / Degraded=True with the reason, a Warning Event per problem,
     and return without touching a child (never a half-applied change). The timer re-checks later.
  5. Apply the children: the control-token Secret only if missing (never overwritten), the
     control-TLS Secret (issued or rotated, :mod:`multilane.operator.k8s.certs`; unless disabled), then
     ServiceAccount, Role, RoleBinding, Service, PodDisruptionBudget, StatefulSet, with a snapshot
     schedule the CronJob NAME-snapshot, and the NetworkPolicy NAME-workers unless disabled
     (create, or merge-patch when they exist; the StatefulSet keeps the replicas the operator
     decided). Without a schedule an existing NAME-snapshot CronJob is suspended (spec.suspend=true),
     not deleted. A spec change that would change an immutable StatefulSet field (``state.enabled``,
     the storage size or class) holds the StatefulSet as it is (:mod:`multilane.operator.k8s.statefulset`)
     unless the annotation ``multilane.dev/recreate-on-immutable-change: "true"`` opts in to recreating it.
  6. Status: observedGeneration, labelSelector, conditions (Degraded=ImmutableFieldChange naming the
     fields while a StatefulSet change is held; the control loop keeps running).

- ``timer`` (every ``tick_s``) -> :meth:`OperatorHandlers.tick`: honours Paused, re-runs
  :meth:`reconcile` when the spec is not yet applied, an environment problem may have gone, or the
  StatefulSet's pod template is not what this operator renders (an upgrade), then runs one
  :class:`ConsumerController` pass (scaling, replicas, assignment, day-2 pod replacement, status) and
  reports pods that cannot run (image pulls, scheduling, quota) as Degraded.

Quiet on the API server (steady state: no request per pass): the object comes from kopf's watch
(the timer's body), pods/Leases/StatefulSets from kopf indexes
(:class:`~multilane.operator.k8s.cache.WatchCache`), the control token and the credentials Secret
from memory (read again by :meth:`reconcile`, or after ``secret_ttl_s``); the status is written only
when its significant part changes or once a minute (:class:`StatusMemory`), the policy's memory in
``status.policy``; Events only for changes.
- ``on.delete`` forgets in-memory caches; the children go with the owner through Kubernetes' garbage
  collector (owner references). kopf puts its finalizer ``multilane.dev/finalizer`` on every
  ParallelConsumer it handles (it needs one to stop the timer), so a ParallelConsumer is deleted only
  while the operator runs, or after the finalizer is removed by hand (docs/runbook.md).

Length (~540 lines): every kopf handler and its wiring in one place, so that what the operator
reacts to is read at once; the logic they call lives in the controller, children and validation.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from multilane.operator.controller import ConsumerController, EventRecord
from multilane.operator.decision.planner import format_partition
from multilane.operator.decision.policy import PolicyState
from multilane.operator.k8s.cache import WatchCache, register_indexes
from multilane.operator.k8s.certs import ControlCertManager
from multilane.operator.k8s.kube import KubeClient, KubeConflictError, KubeError, api_path
from multilane.operator.k8s.platform import KubernetesPlatform
from multilane.operator.k8s.statefulset import RECREATE_ANNOTATION, apply_stateful_set, recreate_allowed
from multilane.operator.k8s.writes import conditional_patch
from multilane.operator.kafka_admin import KafkaAdminClient, KafkaUnavailableError
from multilane.operator.metrics import OperatorMetrics
from multilane.operator.platform import Platform, WorkerReplacer
from multilane.operator.rollout.assignment import AssignmentState, WorkerControl
from multilane.operator.rollout.handoff import (
    HandoffConfig,
    HandoffControl,
    HandoffControlClient,
    HandoffExecutor,
)
from multilane.operator.rollout.protocol import Rollout
from multilane.operator.sources import KafkaSource, MetricSource, PrometheusSource
from multilane.operator.spec import children as ch
from multilane.operator.spec import control_pki
from multilane.operator.spec.conditions import condition, now_iso, set_condition
from multilane.operator.spec.network import NetworkPolicySettings, network_policy
from multilane.operator.spec.status_memory import StatusMemory
from multilane.operator.spec.validation import ConsumerSpec, Problem, check_environment, validate_spec

__all__ = [
    "GROUP",
    "PAUSED_ANNOTATION",
    "PLURAL",
    "POLICY_STATE_ANNOTATION",
    "RECREATE_ANNOTATION",
    "HandlerSettings",
    "OperatorHandlers",
]

log = logging.getLogger(__name__)

GROUP = "multilane.dev"
VERSION = "v1alpha1"
PLURAL = "parallelconsumers"
CR_API = f"{GROUP}/{VERSION}"
PAUSED_ANNOTATION = "multilane.dev/paused"
POLICY_STATE_ANNOTATION = "multilane.dev/policy-state"
# Problems that can go away without a spec change: re-checked on every tick.
TRANSIENT_REASONS = {"KafkaUnreachable", "TopicNotFound", "CredentialsSecretMissing"}


@dataclass(frozen=True)
class HandlerSettings:
    tick_s: float = 5.0  # control-loop period; scaling decisions are further gated by intervalSeconds
    kafka_timeout_s: float = 5.0
    release_deadline_s: float = 30.0
    worker_timeout_s: float = 10.0
    # Read spec.kafka.credentialsSecretRef for the operator's own Kafka admin calls (topic partitions,
    # lag). Off by default: whoever creates a ParallelConsumer names the Secret AND the
    # bootstrapServers, so reading it would send the Secret's credentials where the creator says (a
    # confused deputy). Workers get the Secret by envFrom from their own namespace either way.
    read_kafka_credentials: bool = False
    # The NetworkPolicy child NAME-workers (multilane/operator/spec/network.py); None: not created.
    network_policy: NetworkPolicySettings | None = field(default_factory=NetworkPolicySettings)
    secret_ttl_s: float = 300.0  # the credentials Secret is read again after this (and on reconcile)
    status_heartbeat_s: float = 60.0  # volatile status fields (lag, rates, policy) at least this often
    # mutual TLS on the workers' control port, its certificates and their rotation (k8s/certs.py)
    control_tls: control_pki.ControlTlsSettings = field(default_factory=control_pki.ControlTlsSettings)


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    """kopf's own bookkeeping in annotations (the status schema is structural and would prune it);
    handler log lines become Events only from WARNING up (the operator posts its own Events)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING
    settings.networking.request_timeout = 30
    settings.watching.server_timeout = 300


def _ref(body: Mapping[str, Any]) -> ch.ConsumerRef:
    meta = body.get("metadata") or {}
    return ch.ConsumerRef(
        name=str(meta["name"]), namespace=str(meta["namespace"]), uid=str(meta.get("uid", ""))
    )


def _paused(body: Mapping[str, Any]) -> bool:
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(PAUSED_ANNOTATION, "")).lower() == "true"


def _event(body: Mapping[str, Any], record: EventRecord) -> None:
    # kopf accepts any mapping with apiVersion/kind/metadata; its annotation says Body.
    target: Any = dict(body)
    kopf.event(target, type=record.type, reason=record.reason, message=record.message[:1000])


class OperatorHandlers:
    """Dependencies are injectable: ``platform`` (default Kubernetes), ``control_factory(token)``,
    ``admin_factory(config)``, ``source_factory(spec, kafka_config)``, ``token_factory()``."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        platform: Platform | None = None,
        settings: HandlerSettings | None = None,
        metrics: OperatorMetrics | None = None,
        control_factory: Callable[[str], WorkerControl] | None = None,
        admin_factory: Callable[[Mapping[str, str]], KafkaAdminClient] | None = None,
        source_factory: Callable[[ConsumerSpec, Mapping[str, str]], MetricSource] | None = None,
        token_factory: Callable[[], str] = lambda: secrets.token_urlsafe(32),
    ) -> None:
        self.kube = kube
        self.settings = settings or HandlerSettings()
        self.platform = platform or KubernetesPlatform(kube, cache=WatchCache())
        self.metrics = metrics or OperatorMetrics()
        self.control_factory = control_factory or (
            lambda token: HandoffControlClient(token, timeout_s=self.settings.worker_timeout_s)
        )
        self._admin_factory = admin_factory or (
            lambda config: KafkaAdminClient(config, timeout_s=self.settings.kafka_timeout_s)
        )
        self._admins: dict[tuple[tuple[str, str], ...], KafkaAdminClient] = {}
        self.source_factory = source_factory or self._default_source
        self.token_factory = token_factory
        self._locks: dict[str, asyncio.Lock] = {}
        self._sources: dict[str, tuple[Any, MetricSource]] = {}
        # uid -> (token, metered control, the control it wraps)
        self._controls: dict[str, tuple[str, WorkerControl, WorkerControl]] = {}
        # uid -> (control, config, executor): one executor per consumer while its inputs stay the same
        self._handoffs: dict[str, tuple[WorkerControl, HandoffConfig, HandoffExecutor]] = {}
        self._last_errors: dict[str, str] = {}  # uid -> last control-loop error (Events only on change)
        # uid -> message naming the immutable StatefulSet fields a spec change would change: set by
        # reconcile while that change is held, removed when a reconcile applies the StatefulSet.
        self._immutable: dict[str, str] = {}
        # uid -> resourceVersion of the object as this operator last read (tick) or wrote it; the
        # control loop's status writes are conditional on it (see _patch_status)
        self._seen_rv: dict[str, str] = {}
        self.status_memory = StatusMemory(self.settings.status_heartbeat_s)
        self.certs = ControlCertManager(kube, self.settings.control_tls)  # the control port's TLS
        # uid -> (monotonic time read, Secret or None): the credentials Secret between reconciles
        self._secrets: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._rendered: dict[str, tuple[Any, str]] = {}  # uid -> (spec, its template hash)
        self._specs: dict[str, tuple[Any, ConsumerSpec | None]] = {}  # uid -> (raw spec, validated)

    # ---- kopf wiring ------------------------------------------------------------------------------

    def register(self, registry: kopf.OperatorRegistry) -> None:
        resource = (GROUP, VERSION, PLURAL)

        @kopf.on.startup(registry=registry)
        async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
            configure_kopf(settings)

        @kopf.on.create(*resource, registry=registry)
        @kopf.on.update(*resource, field="spec", registry=registry)
        @kopf.on.resume(*resource, registry=registry)
        async def _reconcile(body: kopf.Body, **_: Any) -> None:
            await self.reconcile(body)

        register_indexes(registry)

        @kopf.timer(*resource, interval=self.settings.tick_s, sharp=True, registry=registry)
        async def _tick(body: kopf.Body, **kwargs: Any) -> None:
            cache = getattr(self.platform, "cache", None)
            if isinstance(cache, WatchCache) and not cache.bound:
                cache.bind(kwargs)  # the kopf indexes (filled before any timer runs)
            await self.tick(body, fresh=False)

        @kopf.on.delete(*resource, optional=True, registry=registry)
        async def _deleted(body: kopf.Body, **_: Any) -> None:
            self.forget(body)

        @kopf.on.cleanup(registry=registry)
        async def _cleanup(**_: Any) -> None:
            await self.close()

    async def close(self) -> None:
        """Close the worker-control clients (HTTP sessions)."""
        for _, control, _ in list(self._controls.values()):
            closer = getattr(control, "close", None)
            if closer is not None:
                await closer()
        self._controls.clear()
        for admin in self._admins.values():
            closer = getattr(admin, "close", None)
            if closer is not None:
                await asyncio.to_thread(closer)
        self._admins.clear()

    def _lock(self, uid: str) -> asyncio.Lock:
        return self._locks.setdefault(uid, asyncio.Lock())

    def forget(self, body: Mapping[str, Any]) -> None:
        ref = _ref(body)
        self._locks.pop(ref.uid, None)
        self._sources.pop(ref.uid, None)
        self._controls.pop(ref.uid, None)
        self._immutable.pop(ref.uid, None)
        self._secrets.pop(ref.uid, None)
        self._rendered.pop(ref.uid, None)
        self._specs.pop(ref.uid, None)
        self.certs.forget(ref.uid)
        self.status_memory.forget(ref.uid)
        forget = getattr(self.platform, "forget", None)
        if forget is not None:
            forget(ref)
        self.metrics.forget(ref.namespace, ref.name)
        log.info("forgot %s/%s (children go with it through owner references)", ref.namespace, ref.name)

    def admin_factory(self, config: Mapping[str, str]) -> KafkaAdminClient:
        """One admin client per distinct client config, reused across passes (librdkafka clients are
        expensive to create and destroy)."""
        key = tuple(sorted(config.items()))
        if key not in self._admins:
            self._admins[key] = self._admin_factory(config)
        return self._admins[key]

    # ---- status helpers ---------------------------------------------------------------------------

    def _cr_path(self, ref: ch.ConsumerRef, subresource: str | None = None) -> str:
        return api_path(CR_API, PLURAL, ref.namespace, ref.name, subresource)

    def _seen(self, ref: ch.ConsumerRef, obj: Mapping[str, Any] | None) -> None:
        rv = ((obj or {}).get("metadata") or {}).get("resourceVersion")
        if rv:
            self._seen_rv[ref.uid] = str(rv)

    async def _patch_status(
        self, ref: ch.ConsumerRef, status: Mapping[str, Any], *, conditional: bool = False
    ) -> None:
        """Every status write; the answer is what the next pass reads until the watch delivers it.

        ``conditional`` (the control loop's writes: assignment, rollout, scaling): the patch carries the
        resourceVersion this operator last read or wrote, so a write based on a stale view gets 409
        (:class:`KubeConflictError`; the tick fails and the next one re-reads) and never overwrites
        another writer's status."""
        body: dict[str, Any] = {"status": dict(status)}
        if conditional and ref.uid in self._seen_rv:
            body["metadata"] = {"resourceVersion": self._seen_rv[ref.uid]}
        answer = await self.kube.patch(self._cr_path(ref, "status"), body)
        self._seen(ref, answer)
        if answer:
            self.status_memory.written(ref.uid, answer)

    # ---- reconcile --------------------------------------------------------------------------------

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

    def _with_tls(self, ref: ch.ConsumerRef, manifest: dict[str, Any]) -> dict[str, Any]:
        if manifest["kind"] != "StatefulSet" or not self.settings.control_tls.enabled:
            return manifest
        return control_pki.with_control_tls(ref, manifest)

    # ---- the control loop -------------------------------------------------------------------------

    def _default_source(self, spec: ConsumerSpec, kafka_config: Mapping[str, str]) -> MetricSource:
        if spec.metrics.source == "prometheus":
            return PrometheusSource(
                spec.metrics.prometheus_url, spec.metrics.lag_query, spec.metrics.rate_query
            )
        return KafkaSource(self.admin_factory(kafka_config))

    def _source(self, ref: ch.ConsumerRef, spec: ConsumerSpec, config: Mapping[str, str]) -> MetricSource:
        key = (spec.metrics, spec.bootstrap_servers, spec.consumer_group, tuple(sorted(config.items())))
        cached = self._sources.get(ref.uid)
        if cached is None or cached[0] != key:
            cached = (key, self.source_factory(spec, config))
            self._sources[ref.uid] = cached
        return cached[1]

    async def _control(self, ref: ch.ConsumerRef) -> WorkerControl | None:
        """The worker-control client with the consumer's token. The token Secret is never overwritten,
        so it is read once per consumer (and again only while it is missing)."""
        if ref.uid in self._controls:
            _, control, inner = self._controls[ref.uid]
            if self.settings.control_tls.enabled:
                await self.certs.wire(ref, inner)  # a due rotation step; the current client context
            return control
        secret = await self.kube.get(api_path("v1", "secrets", ref.namespace, ref.token_secret))
        if secret is None:
            return None
        data = secret.get("data") or {}
        token = (
            base64.b64decode(data["token"]).decode()
            if "token" in data
            else (secret.get("stringData") or {}).get("token", "")
        )
        if not token:
            return None
        cached = self._controls.get(ref.uid)
        if cached is None or cached[0] != token:
            inner = self.control_factory(token)
            cached = (token, self.metrics.control(inner, ref.namespace, ref.name), inner)
            self._controls[ref.uid] = cached
        if self.settings.control_tls.enabled:
            await self.certs.wire(ref, cached[2])  # a due rotation step; the current client context
        return cached[1]

    async def tick(self, body: Mapping[str, Any], fresh: bool = True) -> None:
        """One pass. ``fresh``: GET the object first; kopf's timer passes False (its body is the
        watched object, as new as a GET)."""
        ref = _ref(body)
        self.metrics.ticks.inc()
        current = await self.kube.get(self._cr_path(ref)) if fresh else body
        if current is None or (current.get("metadata") or {}).get("deletionTimestamp"):
            return
        await self._pass(ref, current)

    async def _pass(self, ref: ch.ConsumerRef, fresh: Mapping[str, Any]) -> None:
        status = self.status_memory.view(ref.uid, fresh)
        generation = int((fresh.get("metadata") or {}).get("generation") or 1)
        degraded = condition(status.get("conditions"), "Degraded") or {}
        paused = _paused(fresh)
        # Hold everything while paused; re-apply when the spec is not yet applied or may now apply.
        if (
            paused
            or status.get("observedGeneration") != generation
            or (degraded.get("status") == "True" and degraded.get("reason") in TRANSIENT_REASONS)
            or (ref.uid in self._immutable and recreate_allowed(fresh))
            or await self._template_stale(ref, fresh)
        ):
            if not await self.reconcile(fresh):
                return
            fresh = await self.kube.get(self._cr_path(ref)) or fresh
            status = dict(fresh.get("status") or {})
        elif (condition(status.get("conditions"), "Paused") or {}).get("status") == "True":
            stamp = now_iso()
            conditions = set_condition(status.get("conditions"), "Paused", False, "NotPaused", "", now=stamp)
            await self._patch_status(ref, {"conditions": conditions})
            status["conditions"] = conditions
            _event(fresh, EventRecord("Normal", "Resumed", "pause annotation removed"))
        spec = self._valid_spec(ref, fresh.get("spec"))
        if spec is None:
            return
        self._seen(ref, fresh)  # the control loop's writes are conditional on this read
        async with self._lock(ref.uid):
            started = time.monotonic()
            try:
                with self.metrics.timed("tick"):
                    await self._tick(ref, fresh, spec, status)
            except KubeError as exc:
                self.metrics.errors.labels("kubernetes").inc()
                log.warning("%s/%s: Kubernetes API error in control loop: %s", ref.namespace, ref.name, exc)
                if self._last_errors.get(ref.uid) != str(exc):  # one Event per distinct error
                    self._last_errors[ref.uid] = str(exc)
                    _event(fresh, EventRecord("Warning", "ControlLoopError", f"Kubernetes API: {exc}"))
            except Exception as exc:
                self.metrics.errors.labels("internal").inc()
                log.exception("%s/%s: control loop failed; retrying next tick", ref.namespace, ref.name)
                if self._last_errors.get(ref.uid) != repr(exc):
                    self._last_errors[ref.uid] = repr(exc)
                    _event(fresh, EventRecord("Warning", "ControlLoopError", f"internal error: {exc!r}"))
            else:
                self._last_errors.pop(ref.uid, None)
            finally:
                log.debug("%s/%s: pass took %.2fs", ref.namespace, ref.name, time.monotonic() - started)

    def _valid_spec(self, ref: ch.ConsumerRef, raw: Any) -> ConsumerSpec | None:
        """:func:`validate_spec` of the pass, kept while the spec stays the same."""
        cached = self._specs.get(ref.uid)
        if cached is None or cached[0] != raw:
            cached = (copy.deepcopy(raw), validate_spec(raw)[0])
            self._specs[ref.uid] = cached
        return cached[1]

    async def _template_stale(self, ref: ch.ConsumerRef, body: Mapping[str, Any]) -> bool:
        """The StatefulSet's pod template is not what this operator renders for the spec (an operator
        upgrade whose ``on.resume`` did not apply yet): re-apply, so the pods are replaced."""
        if not isinstance(self.platform, WorkerReplacer):
            return False
        applied = await self.platform.desired_revision(ref)
        if applied is None:
            return False
        raw = body.get("spec")
        cached = self._rendered.get(ref.uid)
        if cached is None or cached[0] != raw:
            spec, _ = validate_spec(raw)
            if spec is None:
                return False
            template = self._with_tls(ref, ch.stateful_set(ref, dict(raw or {}), 0))["spec"]["template"]
            cached = (copy.deepcopy(raw), template["metadata"]["annotations"][ch.TEMPLATE_HASH_ANNOTATION])
            self._rendered[ref.uid] = cached
        return applied != cached[1]

    async def _workload_degraded(
        self,
        ref: ch.ConsumerRef,
        before: Mapping[str, Any],
        status: dict[str, Any],
        events: list[EventRecord],
    ) -> None:
        """Pods that cannot run (:mod:`multilane.operator.spec.pod_health`) -> Degraded, naming each pod
        and reason, unless the pass degraded for its own reason; a Warning Event when they change."""
        problems_of = getattr(self.platform, "workload_problems", None)
        if problems_of is None:
            return
        problems: list[tuple[str, str]] = await problems_of(ref)
        conditions = list(status.get("conditions") or [])
        if not problems or (condition(conditions, "Degraded") or {}).get("status") == "True":
            return
        reason = problems[0][0]
        message = "; ".join(m for _, m in problems)[:1000]
        previous = condition(before.get("conditions"), "Degraded") or {}
        if previous.get("reason") != reason or previous.get("message") != message:
            events.append(EventRecord("Warning", reason, message))
        status["conditions"] = set_condition(conditions, "Degraded", True, reason, message, now=now_iso())

    def _handoff(
        self, ref: ch.ConsumerRef, spec: ConsumerSpec, control: WorkerControl
    ) -> HandoffExecutor | None:
        """The restore-before-handoff executor of a consumer with state enabled (None otherwise, or
        when the control client cannot make workers learn). It persists ``status.assignment`` and
        ``status.rollout`` together before every ownership change."""
        if not spec.state_enabled or not isinstance(control, HandoffControl):
            self._handoffs.pop(ref.uid, None)
            return None
        config = HandoffConfig(
            acceptable_recovery_lag=spec.acceptable_recovery_lag,
            learner_timeout_s=spec.learner_timeout_s,
            max_concurrent_warmups=spec.max_moves,
            release_deadline_s=self.settings.release_deadline_s,
        )
        cached = self._handoffs.get(ref.uid)
        if cached is not None and cached[0] is control and cached[1] == config:
            return cached[2]

        async def persist(state: AssignmentState, rollout: Rollout | None) -> None:
            await self._patch_status(
                ref,
                {"assignment": state.to_status(), "rollout": rollout.to_dict() if rollout else None},
                conditional=True,
            )

        executor = HandoffExecutor(control, persist, config)
        self._handoffs[ref.uid] = (control, config, executor)
        return executor

    async def _tick(
        self, ref: ch.ConsumerRef, body: Mapping[str, Any], spec: ConsumerSpec, status: dict[str, Any]
    ) -> None:
        problems, config, topic_partitions = await self._check_environment(ref, spec, fresh=False)
        if problems or topic_partitions is None:
            await self._degrade(ref, body, list(status.get("conditions") or []), problems, 0)
            return
        partitions = [format_partition(t, i) for t, n in sorted(topic_partitions.items()) for i in range(n)]
        control = await self._control(ref)
        if control is None:
            return  # the token Secret is created by reconcile; next tick
        policy_state = _policy_state(ref, body, status)

        async def persist(state: AssignmentState) -> None:
            await self._patch_status(ref, {"assignment": state.to_status()}, conditional=True)

        controller = ConsumerController(
            self.platform,
            control,
            release_deadline_s=self.settings.release_deadline_s,
            handoff=self._handoff(ref, spec, control),
        )
        result = await controller.tick(
            ref, spec, status, policy_state, partitions, self._source(ref, spec, config), persist
        )
        if result.policy_state is not None:
            result.status["policy"] = result.policy_state.to_dict()
        held = self._immutable.get(ref.uid)
        degraded_now = condition(result.status.get("conditions"), "Degraded") or {}
        if held and degraded_now.get("status") != "True":  # the control loop knows nothing of it
            result.status["conditions"] = set_condition(
                result.status.get("conditions"), "Degraded", True, "ImmutableFieldChange", held
            )
        await self._workload_degraded(ref, status, result.status, result.events)
        patch = self.status_memory.to_write(ref.uid, body, result.status)
        if patch is not None:
            await self._patch_status(ref, patch, conditional=True)
        for record in result.events:
            _event(body, record)
        self.metrics.observe_tick(
            ref.namespace, ref.name, result, spec.replicas or spec.max_replicas, spec.max_factor
        )


def _policy_state(ref: ch.ConsumerRef, body: Mapping[str, Any], status: Mapping[str, Any]) -> PolicyState:
    """The policy's memory: ``status.policy``; from the annotation an older operator wrote when the
    status has none yet; afresh when unreadable."""
    try:
        if status.get("policy"):
            return PolicyState.from_dict(dict(status["policy"]))
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        return PolicyState.from_dict(json.loads(annotations.get(POLICY_STATE_ANNOTATION) or "{}"))
    except (ValueError, TypeError, KeyError, AttributeError):
        log.warning("%s/%s: unreadable policy state; starting afresh", ref.namespace, ref.name)
        return PolicyState()
