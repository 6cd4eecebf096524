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

This module wires the parts and holds the kopf registrations (what the operator reacts to, read at
once). :class:`OperatorHandlers` builds each part with the few inputs it needs, as the worker's
:class:`~multilane.worker.engine.Engine` does; no part reaches another's fields:

- ``memory``: :class:`~multilane.operator.k8s.memory.ConsumerMemory`, every part's memory of each
  consumer (one slot per part), forgotten in one place (``on.delete``);
- ``gate``: :class:`~multilane.operator.k8s.leader_gate.LeaderGate`, the resourceVersion the control
  loop's writes are conditional on (a deposed leader's stale write gets 409);
- ``status``: :class:`~multilane.operator.k8s.status_writer.StatusWriter`, every status write;
- ``environment``: :class:`~multilane.operator.k8s.environment.EnvironmentCheck` (credentials Secret,
  topics);
- ``children``: :class:`~multilane.operator.k8s.reconcile.ChildrenReconciler`, the steps above;
- ``controls``, ``sources``, ``handoffs``, ``admins``: the clients of
  :mod:`~multilane.operator.k8s.clients`;
- ``control_pass``: :class:`~multilane.operator.k8s.control_pass.ControlPass`, the timer's pass around
  the controller.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from multilane.operator.k8s.cache import WatchCache, register_indexes
from multilane.operator.k8s.certs import ControlCertManager
from multilane.operator.k8s.clients import (
    AdminClients,
    HandoffExecutors,
    MetricSources,
    WorkerControls,
    default_source_factory,
    handoff_persist,
)
from multilane.operator.k8s.control_pass import ControlPass
from multilane.operator.k8s.environment import EnvironmentCheck
from multilane.operator.k8s.kube import KubeClient
from multilane.operator.k8s.leader_gate import LeaderGate
from multilane.operator.k8s.memory import ConsumerMemory
from multilane.operator.k8s.platform import KubernetesPlatform
from multilane.operator.k8s.reconcile import ChildrenReconciler
from multilane.operator.k8s.resource import (
    GROUP,
    PAUSED_ANNOTATION,
    PLURAL,
    POLICY_STATE_ANNOTATION,
    VERSION,
    HandlerSettings,
    configure_kopf,
    consumer_ref,
    tick_phase,
)
from multilane.operator.k8s.statefulset import RECREATE_ANNOTATION
from multilane.operator.k8s.status_writer import StatusWriter
from multilane.operator.kafka_admin import KafkaAdminClient
from multilane.operator.metrics import OperatorMetrics
from multilane.operator.platform import Platform
from multilane.operator.rollout.assignment import WorkerControl
from multilane.operator.rollout.handoff import HandoffControlClient
from multilane.operator.sources import MetricSource
from multilane.operator.spec.status_memory import StatusMemory
from multilane.operator.spec.validation import ConsumerSpec

__all__ = [
    "GROUP",
    "PAUSED_ANNOTATION",
    "PLURAL",
    "POLICY_STATE_ANNOTATION",
    "RECREATE_ANNOTATION",
    "HandlerSettings",
    "OperatorHandlers",
    "configure_kopf",
]


class OperatorHandlers:
    """Wires the parts (module docstring) and registers them with kopf. Dependencies are injectable:
    ``platform`` (default Kubernetes), ``control_factory(token)``, ``admin_factory(config)``,
    ``source_factory(spec, kafka_config)``, ``token_factory()``."""

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
        s = self.settings = settings or HandlerSettings()
        self.platform = platform or KubernetesPlatform(kube, cache=WatchCache())
        self.metrics = metrics or OperatorMetrics()
        # 1. the memory of each consumer, and what keeps memories outside it
        memory = self.memory = ConsumerMemory()
        self.certs = ControlCertManager(kube, s.control_tls)  # the control port's TLS
        status_memory = StatusMemory(s.status_heartbeat_s)
        memory.on_forget(lambda ref: self.certs.forget(ref.uid))
        memory.on_forget(lambda ref: status_memory.forget(ref.uid))
        forget_platform = getattr(self.platform, "forget", None)
        if forget_platform is not None:
            memory.on_forget(forget_platform)
        memory.on_forget(lambda ref: self.metrics.forget(ref.namespace, ref.name))
        locks = memory.slot("locks")
        # 2. status writes, gated on the view they were decided on
        self.gate = LeaderGate(memory.slot("seen-resource-version"))
        self.status = StatusWriter(kube, self.gate, status_memory, self.metrics.observe_conditions)
        # 3. clients
        self.admins = AdminClients(
            admin_factory or (lambda config: KafkaAdminClient(config, timeout_s=s.kafka_timeout_s))
        )
        certs = self.certs if s.control_tls.enabled else None
        self.controls = WorkerControls(
            kube,
            control_factory or (lambda token: HandoffControlClient(token, timeout_s=s.worker_timeout_s)),
            self.metrics,
            certs,
            memory.slot("controls"),
        )
        memory.on_forget(self.controls.retire)
        self.sources = MetricSources(
            source_factory or default_source_factory(self.admins), memory.slot("sources")
        )
        self.handoffs = HandoffExecutors(
            s.release_deadline_s, lambda ref: handoff_persist(self.status.patch, ref), memory.slot("handoffs")
        )
        # 4. the reconcile handler and the control pass
        self.environment = EnvironmentCheck(
            kube,
            self.admins,
            self.metrics,
            memory.slot("credentials"),
            read_credentials=s.read_kafka_credentials,
            secret_ttl_s=s.secret_ttl_s,
        )
        self.children = ChildrenReconciler(
            kube,
            locks,
            self.environment,
            self.status,
            self.metrics,
            certs=certs,
            token_factory=token_factory,
            network=s.network_policy,
            immutable=memory.slot("immutable-change"),
            rendered=memory.slot("rendered-template"),
        )
        self.control_pass = ControlPass(
            kube,
            self.platform,
            self.children,
            self.environment,
            self.status,
            self.gate,
            self.metrics,
            locks,
            controls=self.controls,
            sources=self.sources,
            handoffs=self.handoffs,
            release_deadline_s=s.release_deadline_s,
            last_errors=memory.slot("last-error"),
            specs=memory.slot("spec"),
        )

    async def reconcile(self, body: Mapping[str, Any]) -> bool:
        """The reconcile handler (steps 1-6 of the module docstring)."""
        return await self.children.reconcile(body)

    async def tick(self, body: Mapping[str, Any], fresh: bool = True) -> None:
        """One control pass (the timer)."""
        await self.control_pass.tick(body, fresh)

    def forget(self, body: Mapping[str, Any]) -> None:
        """The consumer is deleted: everything remembered of it goes (``on.delete``)."""
        self.memory.forget(consumer_ref(body))

    async def close(self) -> None:
        """Close the worker-control clients (HTTP sessions) and the Kafka admin clients."""
        await self.controls.close()
        await self.admins.close()

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

        s = self.settings

        @kopf.timer(*resource, interval=s.tick_s, sharp=True, registry=registry)
        async def _tick(body: kopf.Body, **kwargs: Any) -> None:
            cache = getattr(self.platform, "cache", None)
            if isinstance(cache, WatchCache) and not cache.bound:
                cache.bind(kwargs)  # the kopf indexes (filled before any timer runs)
            phase = tick_phase(str(kwargs.get("uid") or ""), s.tick_s, s.tick_spread)  # kopf passes uid
            stopped = kwargs.get("stopped")
            if phase and stopped is not None and await stopped.wait(phase):
                return  # the object or the operator stops while waiting for this consumer's phase
            await self.tick(body, fresh=False)

        @kopf.on.delete(*resource, optional=True, registry=registry)
        async def _deleted(body: kopf.Body, **_: Any) -> None:
            self.forget(body)

        @kopf.on.cleanup(registry=registry)
        async def _cleanup(**_: Any) -> None:
            await self.close()
