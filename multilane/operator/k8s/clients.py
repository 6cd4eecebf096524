"""The clients the control pass calls through, one part each, kept per consumer while their inputs
stay the same. Does I/O (Kafka admin clients, metric sources, worker control endpoints).

- :class:`AdminClients`: one Kafka admin client per distinct client config (librdkafka clients are
  expensive to create and destroy), shared by every consumer with that config;
- :class:`MetricSources`: each consumer's metric source (Kafka lag or Prometheus);
- :class:`WorkerControls`: each consumer's worker-control client with its token (metered; its TLS
  context from the certificate manager);
- :class:`HandoffExecutors`: each consumer's restore-before-handoff executor (state enabled).

Each keeps its per-consumer memory in its own :class:`~multilane.operator.k8s.memory.Slot`, forgotten
with the consumer.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Mapping
from typing import Any

from multilane.operator.k8s.certs import ControlCertManager
from multilane.operator.k8s.kube import KubeClient, api_path
from multilane.operator.k8s.memory import Slot
from multilane.operator.kafka_admin import KafkaAdminClient
from multilane.operator.metrics import OperatorMetrics
from multilane.operator.rollout.assignment import AssignmentState, WorkerControl
from multilane.operator.rollout.handoff import HandoffConfig, HandoffControl, HandoffExecutor, PersistHandoff
from multilane.operator.rollout.protocol import Rollout
from multilane.operator.sources import KafkaSource, MetricSource, PrometheusSource
from multilane.operator.spec.child_meta import ConsumerRef
from multilane.operator.spec.validation import ConsumerSpec

__all__ = ["AdminClients", "HandoffExecutors", "MetricSources", "WorkerControls"]

AdminFactory = Callable[[Mapping[str, str]], KafkaAdminClient]
SourceFactory = Callable[[ConsumerSpec, Mapping[str, str]], MetricSource]


class AdminClients:
    """One admin client per distinct client config, reused across passes and consumers."""

    def __init__(self, make: AdminFactory) -> None:
        self._make = make
        self._clients: dict[tuple[tuple[str, str], ...], KafkaAdminClient] = {}  # config -> client

    def __call__(self, config: Mapping[str, str]) -> KafkaAdminClient:
        key = tuple(sorted(config.items()))
        if key not in self._clients:
            self._clients[key] = self._make(config)
        return self._clients[key]

    async def close(self) -> None:
        for admin in self._clients.values():
            closer = getattr(admin, "close", None)
            if closer is not None:
                await asyncio.to_thread(closer)
        self._clients.clear()


def default_source_factory(admins: AdminClients) -> SourceFactory:
    """The metric source of a spec: Prometheus when it says so, else Kafka lag through ``admins``."""

    def make(spec: ConsumerSpec, kafka_config: Mapping[str, str]) -> MetricSource:
        if spec.metrics.source == "prometheus":
            return PrometheusSource(
                spec.metrics.prometheus_url, spec.metrics.lag_query, spec.metrics.rate_query
            )
        return KafkaSource(admins(kafka_config))

    return make


class MetricSources:
    def __init__(self, make: SourceFactory, sources: Slot[tuple[Any, MetricSource]]) -> None:
        self._make = make
        # uid -> (the inputs it was made of, the source); made again when they change
        self._sources = sources

    def of(self, ref: ConsumerRef, spec: ConsumerSpec, config: Mapping[str, str]) -> MetricSource:
        key = (spec.metrics, spec.bootstrap_servers, spec.consumer_group, tuple(sorted(config.items())))
        cached = self._sources.get(ref.uid)
        if cached is None or cached[0] != key:
            cached = self._sources.set(ref.uid, (key, self._make(spec, config)))
        return cached[1]


class WorkerControls:
    """Each consumer's worker-control client. The token Secret is never overwritten, so it is read once
    per consumer (and again only while it is missing); a control forgotten with its consumer (or made
    again for a new token) is closed at the next call or at :meth:`close`."""

    def __init__(
        self,
        kube: KubeClient,
        make: Callable[[str], WorkerControl],
        metrics: OperatorMetrics,
        certs: ControlCertManager | None,
        controls: Slot[tuple[str, WorkerControl, WorkerControl]],
    ) -> None:
        self._kube = kube
        self._make = make
        self._metrics = metrics
        self._certs = certs  # None: plain HTTP to the workers (no client certificates)
        # uid -> (token, metered control, the control it wraps)
        self._controls = controls
        self._retired: list[WorkerControl] = []  # dropped controls, closed at the next call

    def retire(self, ref: ConsumerRef) -> None:
        """The consumer is forgotten (called before its slot is emptied): close its client later."""
        cached = self._controls.get(ref.uid)
        if cached is not None:
            self._retired.append(cached[1])

    async def of(self, ref: ConsumerRef) -> WorkerControl | None:
        """The consumer's control (None while its token Secret is missing or empty)."""
        await self._close_retired()
        cached = self._controls.get(ref.uid)
        if cached is None:
            token = await self._token(ref)
            if not token:
                return None
            inner = self._make(token)
            cached = self._controls.set(
                ref.uid, (token, self._metrics.control(inner, ref.namespace, ref.name), inner)
            )
        if self._certs is not None:
            await self._certs.wire(ref, cached[2])  # a due rotation step; the current client context
        return cached[1]

    async def _token(self, ref: ConsumerRef) -> str:
        secret = await self._kube.get(api_path("v1", "secrets", ref.namespace, ref.token_secret))
        if secret is None:
            return ""
        data = secret.get("data") or {}
        if "token" in data:
            return base64.b64decode(data["token"]).decode()
        return str((secret.get("stringData") or {}).get("token", ""))

    async def _close_retired(self) -> None:
        retired, self._retired = self._retired, []
        for control in retired:
            closer = getattr(control, "close", None)
            if closer is not None:
                await closer()

    async def close(self) -> None:
        """Close every worker-control client (HTTP sessions)."""
        for _, control, _ in self._controls.values():
            self._retired.append(control)
        self._controls.clear()
        await self._close_retired()


class HandoffExecutors:
    """Each consumer's restore-before-handoff executor, one while its control and config stay the same.
    It persists ``status.assignment`` and ``status.rollout`` together before every ownership change
    (through ``persist_for(ref)``)."""

    def __init__(
        self,
        release_deadline_s: float,
        persist_for: Callable[[ConsumerRef], PersistHandoff],
        executors: Slot[tuple[WorkerControl, HandoffConfig, HandoffExecutor]],
    ) -> None:
        self._release_deadline_s = release_deadline_s
        self._persist_for = persist_for
        # uid -> (control, config, executor)
        self._executors = executors

    def of(self, ref: ConsumerRef, spec: ConsumerSpec, control: WorkerControl) -> HandoffExecutor | None:
        """The executor of a consumer with state enabled (None otherwise, or when the control client
        cannot make workers learn)."""
        if not spec.state_enabled or not isinstance(control, HandoffControl):
            self._executors.pop(ref.uid)
            return None
        config = HandoffConfig(
            acceptable_recovery_lag=spec.acceptable_recovery_lag,
            learner_timeout_s=spec.learner_timeout_s,
            max_concurrent_warmups=spec.max_moves,
            release_deadline_s=self._release_deadline_s,
        )
        cached = self._executors.get(ref.uid)
        if cached is not None and cached[0] is control and cached[1] == config:
            return cached[2]
        executor = HandoffExecutor(control, self._persist_for(ref), config)
        self._executors.set(ref.uid, (control, config, executor))
        return executor

    def executors(self) -> list[HandoffExecutor]:
        """Every consumer's executor (tests read the moves each completed)."""
        return [executor for _, _, executor in self._executors.values()]


def handoff_persist(patch: Callable[..., Any], ref: ConsumerRef) -> PersistHandoff:
    """The handoff's status write: assignment and rollout together, conditional on the gate."""

    async def persist(state: AssignmentState, rollout: Rollout | None) -> None:
        await patch(
            ref,
            {"assignment": state.to_status(), "rollout": rollout.to_dict() if rollout else None},
            conditional=True,
        )

    return persist
