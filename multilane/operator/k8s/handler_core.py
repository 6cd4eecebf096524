"""What the operator's kopf handlers share: settings, the per-consumer caches and the status writes.
Does I/O (Kubernetes API, Kafka admin clients).

:class:`HandlerCore` owns every cache of :class:`~multilane.operator.k8s.handlers.OperatorHandlers`
(the fields are set in its ``__init__``, each with the invariant on it); the reconcile steps
(:mod:`multilane.operator.k8s.reconcile`) and the control loop
(:mod:`multilane.operator.k8s.control_pass`) build on it, and ``handlers`` registers them with kopf.
Also here: ``configure_kopf`` and the small body helpers every handler uses.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from multilane.operator.controller import EventRecord
from multilane.operator.k8s.cache import WatchCache
from multilane.operator.k8s.certs import ControlCertManager
from multilane.operator.k8s.kube import KubeClient, api_path
from multilane.operator.k8s.platform import KubernetesPlatform
from multilane.operator.kafka_admin import KafkaAdminClient
from multilane.operator.metrics import OperatorMetrics
from multilane.operator.platform import Platform
from multilane.operator.rollout.assignment import WorkerControl
from multilane.operator.rollout.handoff import HandoffConfig, HandoffControlClient, HandoffExecutor
from multilane.operator.sources import KafkaSource, MetricSource, PrometheusSource
from multilane.operator.spec import children as ch
from multilane.operator.spec import control_pki
from multilane.operator.spec.network import NetworkPolicySettings
from multilane.operator.spec.status_memory import StatusMemory
from multilane.operator.spec.validation import ConsumerSpec

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
    # Each consumer's pass runs at its own fixed phase of the tick, in [0, tick_spread * tick_s)
    # (tick_phase): kopf starts the timers of the consumers it finds together (at start-up, after a
    # leader change), and passes that all start at once queue on the one event loop. 0: no spread.
    tick_spread: float = 0.8
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
    handler log lines become Events only from WARNING up (the operator posts its own Events); a
    stopped timer is noticed within a second (deletion)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING
    settings.networking.request_timeout = 30
    settings.watching.server_timeout = 300
    # A deleted consumer's timer stops after its running pass; kopf checks whether it has exited every
    # cancellation_polling seconds (60 by default) and only then releases its finalizer, so a delete
    # waited up to a minute. Check every second.
    settings.background.cancellation_polling = 1.0


def tick_phase(uid: str, tick_s: float, spread: float) -> float:
    """The fixed delay of a consumer's pass after its timer fires: a point of ``[0, spread * tick_s)``
    given by the uid (CRC-32, the same in every operator replica and across restarts). Pure."""
    if spread <= 0 or not uid:
        return 0.0
    return zlib.crc32(uid.encode()) / 2**32 * min(spread, 1.0) * tick_s


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


class HandlerCore:
    """The dependencies (injectable, see :class:`~multilane.operator.k8s.handlers.OperatorHandlers`)
    and the per-consumer caches, each field with its invariant; the status writes."""

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

    def _default_source(self, spec: ConsumerSpec, kafka_config: Mapping[str, str]) -> MetricSource:
        if spec.metrics.source == "prometheus":
            return PrometheusSource(
                spec.metrics.prometheus_url, spec.metrics.lag_query, spec.metrics.rate_query
            )
        return KafkaSource(self.admin_factory(kafka_config))

    # ---- status helpers ---------------------------------------------------------------------------

    def _with_tls(self, ref: ch.ConsumerRef, manifest: dict[str, Any]) -> dict[str, Any]:
        if manifest["kind"] != "StatefulSet" or not self.settings.control_tls.enabled:
            return manifest
        return control_pki.with_control_tls(ref, manifest)

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
        # the condition metric follows every write (the answer: the whole status as stored)
        written = ((answer or {}).get("status") or {}).get("conditions") or status.get("conditions")
        if written:
            self.metrics.observe_conditions(ref.namespace, ref.name, written)
