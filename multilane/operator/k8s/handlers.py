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

This module holds the kopf registrations (what the operator reacts to, read at once); the code they
call is split by role: :mod:`~multilane.operator.k8s.handler_core` (settings, caches, status
writes), :mod:`~multilane.operator.k8s.reconcile` (the steps above),
:mod:`~multilane.operator.k8s.control_pass` (the timer's pass around the controller).
"""

from __future__ import annotations

from typing import Any

import kopf

from multilane.operator.k8s.cache import WatchCache, register_indexes
from multilane.operator.k8s.control_pass import ControlPass
from multilane.operator.k8s.handler_core import (
    GROUP,
    PAUSED_ANNOTATION,
    PLURAL,
    POLICY_STATE_ANNOTATION,
    VERSION,
    HandlerSettings,
    configure_kopf,
    tick_phase,
)
from multilane.operator.k8s.statefulset import RECREATE_ANNOTATION

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


class OperatorHandlers(ControlPass):
    """Dependencies are injectable: ``platform`` (default Kubernetes), ``control_factory(token)``,
    ``admin_factory(config)``, ``source_factory(spec, kafka_config)``, ``token_factory()``.

    Built in layers, each file one role: :class:`~multilane.operator.k8s.handler_core.HandlerCore`
    (the caches and status writes) < :class:`~multilane.operator.k8s.reconcile.ReconcileSteps` <
    :class:`~multilane.operator.k8s.control_pass.ControlPass` < this (the kopf registrations)."""

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
