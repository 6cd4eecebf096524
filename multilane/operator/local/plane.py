"""The local control plane: workers as subprocesses on 127.0.0.1, driven by the operator's own
``ConsumerController`` and ``HandoffExecutor``. Does I/O (processes, files, HTTP, Kafka via workers).

- :class:`~multilane.operator.local_platform.LocalPlatform` (its own module): the worker processes,
  their registry, liveness and fencing by heartbeat.
- :class:`WorkerStatusSource` is the metric source: lag and high watermarks per partition and the
  processing rate from the workers' own ``/v1/status`` (lag from fetch responses, which is exact on
  brokers that under-report end offsets through the admin API), combined with the admin API's end
  and committed offsets (a partition paused by back-pressure fetches nothing, so its fetch-based
  high watermark stops moving): per partition the larger of the two.
- :class:`LocalControlPlane` runs the same ``ConsumerController.tick`` as the Kubernetes handlers,
  given a ``HandoffExecutor`` (restore-before-handoff), every ``tick_s``; status (assignment,
  rollout, decisions, policy state) is persisted in ``ROOT/status.json`` after every change, so a
  killed control plane resumes the rollout it was running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multilane.formats.handover import Handover
from multilane.operator.controller import ConsumerController, DecidingPolicy, TickResult
from multilane.operator.decision.planner import format_partition
from multilane.operator.decision.policy import PolicyConfig, PolicyState
from multilane.operator.kafka_admin import KafkaAdminClient, KafkaUnavailableError
from multilane.operator.local.platform import LocalPlatform, LocalWorkerTemplate, write_json_atomic
from multilane.operator.metrics import OperatorMetrics
from multilane.operator.platform import Platform, WorkerInfo
from multilane.operator.rollout.assignment import AssignmentState, WorkerControl
from multilane.operator.rollout.handoff import (
    HandoffConfig,
    HandoffControlClient,
    HandoffExecutor,
    HandoffRecord,
)
from multilane.operator.rollout.protocol import Rollout
from multilane.operator.rollout.workers import ReleasedPartition, WorkerUnreachableError
from multilane.operator.sources import MetricSample, MetricsUnavailableError, QueryContext
from multilane.operator.spec.children import ConsumerRef
from multilane.operator.spec.validation import ConsumerSpec

__all__ = [
    "LocalControlPlane",
    "LocalPlatform",
    "LocalWorkerControl",
    "LocalWorkerTemplate",
    "WorkerStatusSource",
    "write_json_atomic",
]

log = logging.getLogger(__name__)


class LocalWorkerControl:
    """The worker control calls with each local worker's own token (HTTP clients per token).

    ``timeout_s`` bounds the assignment call, which may include a restore (a promotion that finishes
    an eager handoff, a placement); every other call gets ``call_timeout_s``, so a hung worker stalls
    a control-plane pass for seconds, not minutes, until its heartbeat expires and it is fenced.
    """

    def __init__(
        self, platform: LocalPlatform, timeout_s: float = 120.0, call_timeout_s: float = 5.0
    ) -> None:
        self.platform = platform
        self.timeout_s = timeout_s
        self.call_timeout_s = call_timeout_s
        self._clients: dict[tuple[str, bool], HandoffControlClient] = {}

    def _client(self, base_url: str, slow: bool = False) -> HandoffControlClient:
        token = self.platform.token_for(base_url)
        client = self._clients.get((token, slow))
        if client is None:
            timeout = self.timeout_s if slow else self.call_timeout_s
            client = self._clients[(token, slow)] = HandoffControlClient(token, timeout_s=timeout)
        return client

    async def status(self, base_url: str) -> dict[str, Any]:
        return await self._client(base_url).status(base_url)

    async def assign(
        self,
        base_url: str,
        generation: int,
        partitions: Iterable[str],
        release_deadline_s: float,
        handovers: Mapping[str, Handover] | None = None,
    ) -> list[ReleasedPartition]:
        client = self._client(base_url, slow=True)
        return await client.assign(base_url, generation, partitions, release_deadline_s, handovers)

    async def set_factor(self, base_url: str, factor: int) -> int:
        return await self._client(base_url).set_factor(base_url, factor)

    async def learn(self, base_url: str, partitions: Iterable[str]) -> None:
        await self._client(base_url).learn(base_url, partitions)

    async def drop(self, base_url: str, partitions: Iterable[str]) -> None:
        await self._client(base_url).drop(base_url, partitions)

    async def resume(self, base_url: str) -> bool:
        return await self._client(base_url).resume(base_url)

    async def pause(self, base_url: str) -> bool:
        return await self._client(base_url).pause(base_url)

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()
        self._clients.clear()


class WorkerStatusSource:
    """Metric source over the workers' ``/v1/status`` (see the module docstring). Any platform and
    worker control will do: the burst benchmark samples the Kubernetes path's pods with it too.

    Invariants: ``_lag``/``_hwm`` keep the last value seen per partition (a partition in transit
    between owners keeps its last lag); rates come from consecutive samples of this source.
    """

    def __init__(
        self,
        platform: Platform,
        control: WorkerControl,
        ref: ConsumerRef,
        admin: KafkaAdminClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.platform = platform
        self.control = control
        self.ref = ref
        self.admin = admin
        self.clock = clock
        self._lag: dict[str, int] = {}
        self._hwm: dict[str, int] = {}
        self._previous: tuple[float, int] | None = None
        self.last_statuses: dict[str, dict[str, Any]] = {}

    async def statuses(self) -> dict[str, dict[str, Any]]:
        """``/v1/status`` of every alive worker (unreachable ones left out)."""
        workers = [w for w in await self.platform.list_workers(self.ref) if w.alive]

        async def one(w: WorkerInfo) -> tuple[str, dict[str, Any] | None]:
            try:
                return w.name, await self.control.status(w.control_url)
            except WorkerUnreachableError:
                return w.name, None

        found = await asyncio.gather(*(one(w) for w in workers))
        self.last_statuses = {n: s for n, s in found if s is not None}
        return self.last_statuses

    async def sample(self, ctx: QueryContext) -> MetricSample:
        statuses = await self.statuses()
        if not statuses:
            raise MetricsUnavailableError("no worker answered /v1/status")
        rate = 0.0
        for st in statuses.values():
            rate += float(st.get("processing_rate") or 0.0)
            for p in st.get("partitions") or []:
                key = format_partition(str(p["topic"]), int(p["partition"]))
                if p.get("lag") is not None:
                    self._lag[key] = int(p["lag"])
                if p.get("high_watermark") is not None and int(p["high_watermark"]) >= 0:
                    self._hwm[key] = max(self._hwm.get(key, 0), int(p["high_watermark"]))
        lag = {p: self._lag.get(p, 0) for p in ctx.partitions}
        if self.admin is not None:
            counts: dict[str, int] = {}
            for p in ctx.partitions:
                topic, _, index = p.rpartition("/")
                counts[topic] = max(counts.get(topic, 0), int(index) + 1)
            try:
                for o in await self.admin.offsets(ctx.group, counts):
                    self._hwm[o.partition] = max(self._hwm.get(o.partition, 0), o.high)
                    if o.partition in lag:
                        lag[o.partition] = max(lag[o.partition], o.lag)
            except KafkaUnavailableError as exc:
                log.info("admin offsets unavailable: %s", exc)
        now = self.clock()
        ends = sum(self._hwm.get(p, 0) for p in ctx.partitions)
        input_rate: float | None = None
        if self._previous is not None and now > self._previous[0]:
            input_rate = max(0.0, (ends - self._previous[1]) / (now - self._previous[0]))
        self._previous = (now, ends)
        if input_rate is not None and not math.isfinite(input_rate):
            input_rate = None
        return MetricSample(
            lag=lag,
            input_rate=input_rate,
            processing_rate=rate if input_rate is not None else None,
            time=now,
        )


@dataclass
class TickReport:
    """What one control-plane tick did (for the demo's display and tests)."""

    status: dict[str, Any]
    events: list[tuple[str, str, str]]
    handoffs: list[HandoffRecord]  # moves completed in this pass
    workers: list[WorkerInfo]


class LocalControlPlane:
    """Runs ``ConsumerController.tick`` (with a ``HandoffExecutor``) against a :class:`LocalPlatform`.

    State in ``ROOT/status.json``: ``status`` (the ParallelConsumer status: assignment, rollout,
    lastDecision, factor, conditions, ...) and ``policyState``. Invariant: the file is rewritten
    atomically before every worker call that changes ownership (through the persist callbacks).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        spec: ConsumerSpec,
        template: LocalWorkerTemplate,
        partitions: Sequence[str],
        handoff: HandoffConfig = HandoffConfig(),
        name: str = "local",
        tick_s: float = 0.5,
        lease_s: float = 6.0,
        restore_before_handoff: bool = True,
        policy_factory: Callable[[PolicyConfig], DecidingPolicy] | None = None,
        metrics: OperatorMetrics | None = None,
        metrics_port: int | None = None,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.spec = spec
        self.partitions = list(partitions)
        self.tick_s = tick_s
        self.ref = ConsumerRef(name=name, namespace="local", uid="local")
        self.platform = LocalPlatform(self.root / "workers", template, name=name, lease_s=lease_s)
        self.control = LocalWorkerControl(self.platform)
        self.admin = KafkaAdminClient({"bootstrap.servers": template.bootstrap_servers})
        self.source = WorkerStatusSource(self.platform, self.control, self.ref, self.admin)
        # The operator's metrics (served by start() when metrics_port is not None; 0: a free port).
        self.metrics = metrics or OperatorMetrics()
        self.metrics_port = metrics_port
        metered = self.metrics.control(self.control, self.ref.namespace, name)
        self.platform.on_fence = lambda _w: self.metrics.fencing("local", name, "heartbeat_expired")
        # restore_before_handoff=False: the controller's eager release-then-grant moves (the new owner
        # restores after it took the partition over); used by the handoff benchmark as the baseline.
        self.executor: HandoffExecutor | None = None
        if restore_before_handoff:
            self.executor = HandoffExecutor(metered, self._persist_handoff, handoff)
        self.controller = ConsumerController(
            self.platform,
            metered,
            release_deadline_s=handoff.release_deadline_s,
            handoff=self.executor,
            policy_factory=policy_factory,
        )
        self.status: dict[str, Any] = {}
        self.policy_state = PolicyState()
        self.events: list[tuple[float, str, str, str]] = []
        self._load()

    # -- persistence -----------------------------------------------------------------------------------

    @property
    def status_path(self) -> Path:
        return self.root / "status.json"

    def _load(self) -> None:
        if self.status_path.exists():
            data = json.loads(self.status_path.read_text())
            self.status = dict(data.get("status") or {})
            self.policy_state = PolicyState.from_dict(data.get("policyState"))
            log.info("resuming from %s (rollout: %s)", self.status_path, bool(self.status.get("rollout")))

    def save(self) -> None:
        write_json_atomic(
            self.status_path, {"status": self.status, "policyState": self.policy_state.to_dict()}
        )

    async def _persist_assignment(self, state: AssignmentState) -> None:
        self.status["assignment"] = state.to_status()
        self.save()

    async def _persist_handoff(self, state: AssignmentState, rollout: Rollout | None) -> None:
        self.status["assignment"] = state.to_status()
        self.status["rollout"] = rollout.to_dict() if rollout is not None else None
        self.save()

    # -- loop ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the progress topic with one partition per input partition (so workers started with
        an empty assignment do not create a smaller one), then make sure the decided replica count
        runs (at least ``min_replicas``)."""
        await asyncio.to_thread(self._ensure_progress_topic)
        if self.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.metrics_port, addr="127.0.0.1")
        self.metrics.set_leader(True)  # the one control plane of its consumer
        replicas = int((self.status.get("lastDecision") or {}).get("replicas") or self.platform.replicas or 0)
        await self.platform.ensure_workers(self.ref, max(replicas, self.spec.min_replicas))

    async def tick(self) -> TickReport:
        """One pass (steps 1-2).

        1. ``ConsumerController.tick`` -- the same pass as on Kubernetes: scaling decision when due,
           scale-up, the ``HandoffExecutor``'s placements and restore-before-handoff rollout over the
           workers that stay, sync and factor, scale-down once the leaving workers own nothing,
           status and conditions.
        2. Persist the status; the condition metric follows it.
        """
        done_before = len(self.executor.completed) if self.executor is not None else 0
        # 1.
        self.metrics.ticks.inc()
        with self.metrics.timed("tick"):
            result: TickResult = await self.controller.tick(
                self.ref,
                self.spec,
                self.status,
                self.policy_state,
                self.partitions,
                self.source,
                self._persist_assignment,
            )
        self.metrics.observe_tick(
            self.ref.namespace,
            self.ref.name,
            result,
            self.spec.replicas or self.spec.max_replicas,
            self.spec.max_factor,
        )
        self.status.update(result.status)
        if result.policy_state is not None:
            self.policy_state = result.policy_state
        events = [(e.type, e.reason, e.message) for e in result.events]
        handoffs = self.executor.completed[done_before:] if self.executor is not None else []
        # 2.
        self.save()
        conditions = self.status.get("conditions") or ()
        self.metrics.observe_conditions(self.ref.namespace, self.ref.name, conditions)
        now = time.time()
        for e in events:
            self.events.append((now, *e))
            log.info("%s %s: %s", e[0], e[1], e[2])
        return TickReport(self.status, events, handoffs, await self.platform.list_workers(self.ref))

    def _ensure_progress_topic(self) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        template = self.platform.template
        topic = f"multilane-progress.{template.group}"
        admin = AdminClient({"bootstrap.servers": template.bootstrap_servers})
        futures = admin.create_topics(
            [
                NewTopic(
                    topic,
                    num_partitions=max(1, len(self.partitions)),
                    replication_factor=-1,
                    config={"cleanup.policy": "compact"},
                )
            ]
        )
        with contextlib.suppress(Exception):  # it exists already: the workers share what is there
            futures[topic].result(10)

    async def run(self, stop: asyncio.Event, on_tick: Callable[[TickReport], None] | None = None) -> None:
        """Tick every ``tick_s`` until ``stop`` is set (a failing tick is logged and retried)."""
        await self.start()
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                report = await self.tick()
            except Exception:
                log.exception("control-plane tick failed")
            else:
                if on_tick is not None:
                    on_tick(report)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.05, self.tick_s - (time.monotonic() - t0)))

    async def close(self, stop_workers: bool = True) -> None:
        self.metrics.set_leader(False)
        self.metrics.stop()
        await self.control.close()
        self.admin.close()
        await self.platform.close(stop_workers=stop_workers)
