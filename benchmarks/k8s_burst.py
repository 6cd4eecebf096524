"""A 10x step burst through the Kubernetes path: the real kopf operator against the emulated API server
(:mod:`multilane.testing.kube_api`), a real ``multilane worker`` per pod
(:class:`~multilane.testing.pods.StatefulSetProcessDouble`, with what it does and does not emulate in
its docstring), the load generator in its own process, the demo's stateful processor. Used by
``tests/operator/test_k8s_burst.py`` and by ``benchmarks/burst.py``'s ``operator`` variant. Does I/O.

What differs from the local plane's burst (``benchmarks/burst.py``, variant ``multilane``): the
controller runs inside kopf (a timer every ``tick_s``) instead of a loop calling
``LocalControlPlane.tick``; workers are pods of a StatefulSet the operator rendered (args, env, the
token Secret, a volume per claim), reached through the pod network's router; liveness comes from
each pod's own Lease; status lives in the API server; the operator's metric source is its production
default (``KafkaSource``: committed and end offsets through the admin API), where the local plane
reads the workers' ``/v1/status``. The figures are measured as in the local benchmark: 1 s samples
of the workers' ``/v1/status`` (:class:`~multilane.operator.local.WorkerStatusSource`) and the
decisions and handoffs of each controller pass, taken at the operator's metrics seam
(:class:`TickRecorder`).

:func:`run_operator_burst` (steps numbered as in the code):

1. Serve the emulated API server with the CRD; start the StatefulSet double and the operator.
2. Create the ParallelConsumer (one replica at ``minFactor`` 2, state enabled, the demo's scaling
   settings) and wait until ``orders-0`` owns every partition.
3. Start the load generator (lull, burst, lull); every 0.25 s take the passes the operator recorded
   (scale decisions, completed handoffs), every 1 s a sample; stop 3 s after the backlog drained.
4. Stop the operator, then the pods (SIGTERM: drain and final commits); judge
   (:func:`multilane.demo.check.judge`: every delivery checker, state equal to the reference) and
   compute :func:`multilane.demo.report.burst_figures`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multilane.demo.check import Verdict, judge, read_counts
from multilane.demo.processors import SLEEP_ENV
from multilane.demo.report import BurstFigures, DemoSample, Timeline, burst_figures
from multilane.operator.controller import TickResult
from multilane.operator.k8s.handlers import HandlerSettings, OperatorHandlers
from multilane.operator.k8s.kube import KubeClient, KubeSettings, api_path
from multilane.operator.k8s.platform import KubernetesPlatform
from multilane.operator.kafka_admin import KafkaAdminClient
from multilane.operator.local.plane import WorkerStatusSource
from multilane.operator.metrics import OperatorMetrics
from multilane.operator.rollout.handoff import HandoffControlClient, HandoffRecord
from multilane.operator.sources import MetricSample, MetricsUnavailableError, QueryContext
from multilane.operator.spec.children import ConsumerRef
from multilane.operator.spec.control_pki import ControlTlsSettings
from multilane.testing.kopf_runner import OperatorRunner
from multilane.testing.kube_api import emulated_api_server
from multilane.testing.load import LoadgenProcess
from multilane.testing.loadgen import LoadResult
from multilane.testing.pods import StatefulSetProcessDouble
from multilane.testing.processors import read_event_log

__all__ = ["BurstShape", "OperatorBurstRun", "TickRecorder", "run_operator_burst"]

NAMESPACE = "burst"
NAME = "orders"
PROCESSOR = "multilane.demo.processors:stateful_io"


@dataclass(frozen=True)
class BurstShape:
    """The load: ``lull`` rec/s for ``warm_s``, ``burst`` rec/s for ``burst_s``, ``lull`` for
    ``tail_s``, over ``keys`` uniform keys; ``sleep_ms`` of async I/O per record."""

    lull: float
    burst: float
    warm_s: float
    burst_s: float
    tail_s: float
    sleep_ms: float = 50.0
    keys: int = 5000

    @property
    def profile(self) -> str:
        """The load generator's ``--profile``."""
        return f"{self.lull:g}x{self.warm_s:g},{self.burst:g}x{self.burst_s:g},{self.lull:g}x{self.tail_s:g}"


class TickRecorder(OperatorMetrics):
    """The operator's metrics, also keeping what each controller pass did: ``(monotonic time, events,
    handoffs)``. ``observe_tick`` runs on the operator's thread; :meth:`take` from another."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._passes: list[tuple[float, list[tuple[str, str, str]], list[HandoffRecord]]] = []

    def observe_tick(
        self,
        namespace: str,
        consumer: str,
        result: TickResult,
        max_replicas: int | None = None,
        max_factor: int | None = None,
    ) -> None:
        events = [(e.type, e.reason, e.message) for e in result.events]
        with self._lock:
            self._passes.append((time.monotonic(), events, list(result.handoffs)))
        super().observe_tick(namespace, consumer, result, max_replicas, max_factor)

    def take(self) -> list[tuple[float, list[tuple[str, str, str]], list[HandoffRecord]]]:
        """The passes recorded since the last call."""
        with self._lock:
            out, self._passes = self._passes, []
        return out


@dataclass
class OperatorBurstRun:
    """The outcome of :func:`run_operator_burst`. ``wall0``: wall time (epoch) of t = 0 of the
    timeline; ``handoffs``: every completed move of the run."""

    figures: BurstFigures
    verdict: Verdict
    timeline: Timeline
    wall0: float
    load: LoadResult
    handoffs: list[HandoffRecord] = field(default_factory=list)
    peak_replicas: int = 1
    peak_factor: int = 1


def consumer_body(
    bootstrap: str, topic: str, events_log: Path, shape: BurstShape, max_replicas: int
) -> dict[str, Any]:
    """The ParallelConsumer of the run: the local plane's settings (``DEMO_SCALING``, the demo's
    handoff settings) in CR form."""
    from multilane.demo.run import DEMO_SCALING

    return {
        "apiVersion": "multilane.dev/v1alpha1",
        "kind": "ParallelConsumer",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "kafka": {"bootstrapServers": bootstrap, "topics": [topic], "consumerGroup": topic},
            "workload": {
                "image": "local",
                "processor": PROCESSOR,
                "maxInFlightRecords": 10_000,
                "env": [
                    {"name": "MULTILANE_TEST_LOG", "value": str(events_log)},
                    {"name": SLEEP_ENV, "value": f"{shape.sleep_ms:g}"},
                ],
            },
            "scaling": {**DEMO_SCALING, "maxReplicas": max_replicas, "maxFactor": 32},
            "state": {"enabled": True, "acceptableRecoveryLag": 2000, "learnerTimeoutSeconds": 30},
        },
    }


def _sample(
    now: float, m: MetricSample | None, status: dict[str, Any], alive: int, partitions: Sequence[str]
) -> DemoSample:
    return DemoSample.from_status(now, m, status, alive, partitions, "burst")


def _drained(statuses: dict[str, dict[str, Any]], records: Sequence[Any]) -> bool:
    """Every partition's committed offset (as the active owners report it) reached the end of what
    was produced to it."""
    ends: dict[tuple[str, int], int] = {}
    for r in records:
        ends[(r.topic, r.partition)] = max(ends.get((r.topic, r.partition), 0), r.offset + 1)
    committed: dict[tuple[str, int], int] = {}
    for st in statuses.values():
        for p in st.get("partitions") or []:
            if p.get("committed") is not None and p.get("phase") == "active":
                committed[(str(p["topic"]), int(p["partition"]))] = int(p["committed"])
    return all(committed.get(tp, -1) >= end for tp, end in ends.items())


async def _token(kube: KubeClient) -> str:
    """The control token the operator generated (its Secret ``NAME-control-token``)."""
    secret = await kube.get(api_path("v1", "secrets", NAMESPACE, f"{NAME}-control-token")) or {}
    if "token" in (secret.get("data") or {}):
        return base64.b64decode(secret["data"]["token"]).decode()
    return str((secret.get("stringData") or {}).get("token") or "")


async def run_operator_burst(
    bootstrap: str,
    topic: str,
    partitions: int,
    workdir: Path,
    shape: BurstShape,
    crd_path: Path,
    max_replicas: int = 3,
    tick_s: float = 0.25,
    drain_limit_s: float = 90.0,
) -> OperatorBurstRun:
    """Steps 1-4 of the module docstring on an existing ``topic`` of ``partitions`` partitions (the
    group is named like the topic). Raises TimeoutError when the start or the drain takes too long."""
    run = uuid.uuid4().hex[:6]
    root = workdir / f"k8s-{run}"
    root.mkdir(parents=True, exist_ok=True)
    events_log = root / "events.log"
    names = [f"{topic}/{i}" for i in range(partitions)]
    cr = api_path("multilane.dev/v1alpha1", "parallelconsumers", NAMESPACE, NAME)
    recorder = TickRecorder()
    # 1.
    async with emulated_api_server(crd_path) as (_emu, url), KubeClient(KubeSettings(host=url)) as kube:
        double = StatefulSetProcessDouble(kube, url, NAMESPACE, root)
        await double.start()

        def handlers(k: KubeClient) -> OperatorHandlers:
            return OperatorHandlers(
                k,
                platform=KubernetesPlatform(k, control_url=double.control_url),
                settings=HandlerSettings(  # plain HTTP: the pods' router speaks no TLS
                    tick_s=tick_s,
                    kafka_timeout_s=3.0,
                    release_deadline_s=2.0,
                    control_tls=ControlTlsSettings(enabled=False),
                ),
                metrics=recorder,
            )

        operator = OperatorRunner(url, handlers)
        admin = KafkaAdminClient({"bootstrap.servers": bootstrap}, timeout_s=3.0)
        client: HandoffControlClient | None = None
        loadgen: LoadgenProcess | None = None
        result: LoadResult | None = None
        try:
            await operator.start()
            # 2.
            body = consumer_body(bootstrap, topic, events_log, shape, max_replicas)
            await kube.create(api_path("multilane.dev/v1alpha1", "parallelconsumers", NAMESPACE), body)
            deadline = time.monotonic() + 90
            while True:
                status = ((await kube.get(cr)) or {}).get("status") or {}
                members = (status.get("assignment") or {}).get("members") or []
                if len({p for m in members for p in m["partitions"]}) == partitions and not status.get(
                    "rollout"
                ):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"orders-0 did not take the partitions: {status}")
                await asyncio.sleep(0.25)
            obj = await kube.get(cr) or {}
            ref = ConsumerRef(NAME, NAMESPACE, str((obj.get("metadata") or {}).get("uid", "")))
            client = HandoffControlClient(await _token(kube), timeout_s=5.0)
            platform = KubernetesPlatform(kube, control_url=double.control_url)
            sampler = WorkerStatusSource(platform, client, ref, admin)
            ctx = QueryContext(NAMESPACE, NAME, topic, names)
            timeline = Timeline()
            recorder.take()  # the passes before t0 are not part of the run
            # 3.
            t0, wall0 = time.monotonic(), time.time()
            loadgen = LoadgenProcess(
                bootstrap, topic, shape.profile, str(root), keys=shape.keys, name=f"load-{run}"
            )
            handoffs: list[HandoffRecord] = []
            last_sample = -1.0
            drained_at: float | None = None
            peak = [1, 1]
            limit = shape.warm_s + shape.burst_s + shape.tail_s + drain_limit_s
            while True:
                now = time.monotonic() - t0
                for at, events, done in recorder.take():
                    for _kind, reason, message in events:
                        if reason != "ScalingDecision" or message.startswith("scale "):
                            timeline.events.append((at - t0, reason, message))
                    handoffs.extend(done)
                if now - last_sample >= 1.0:
                    last_sample = now
                    try:
                        m: MetricSample | None = await sampler.sample(ctx)
                    except MetricsUnavailableError:
                        m = None
                    status = ((await kube.get(cr)) or {}).get("status") or {}
                    alive = sum(1 for w in await platform.list_workers(ref) if w.alive)
                    smp = _sample(now, m, status, alive, names)
                    timeline.samples.append(smp)
                    peak = [max(peak[0], smp.replicas), max(peak[1], smp.factor)]
                    if result is None and not loadgen.running():
                        result, _rates = await asyncio.to_thread(loadgen.finish, 60.0)
                    if result is not None:
                        if drained_at is None and _drained(sampler.last_statuses, result.records):
                            drained_at = now
                        if drained_at is not None and now - drained_at > 3:
                            break
                if now > limit:
                    raise TimeoutError(
                        f"the backlog did not drain within {drain_limit_s:.0f}s of the end of the load"
                    )
                await asyncio.sleep(0.25)
        finally:
            # 4.
            if loadgen is not None and result is None:
                with contextlib.suppress(RuntimeError):
                    result, _rates = await asyncio.to_thread(loadgen.finish, 60.0, True)
            await operator.stop()
            await double.stop()
            if client is not None:
                await client.close()
            admin.close()
    assert result is not None and loadgen is not None
    verdict = await judge_run(bootstrap, topic, partitions, events_log, result)
    figures = run_figures(timeline, shape, result, loadgen.started - t0)
    return OperatorBurstRun(figures, verdict, timeline, wall0, result, handoffs, peak[0], peak[1])


async def judge_run(bootstrap: str, topic: str, partitions: int, events_log: Path,
                    result: LoadResult) -> Verdict:
    """Step 4's verdict: every delivery checker over the pods' event log, and the state (the counts
    the processor committed) against the reference of what the load generator landed."""
    counts, _committed = await asyncio.to_thread(read_counts, bootstrap, topic, topic, range(partitions))
    return judge(result.records, read_event_log(events_log), counts)


def run_figures(timeline: Timeline, shape: BurstShape, result: LoadResult, offset: float) -> BurstFigures:
    """Step 4's figures; ``offset``: the load generator's start on the run's clock (its second 0)."""
    return burst_figures(
        timeline.samples,
        timeline.events,
        shape.warm_s + offset,
        shape.warm_s + shape.burst_s + offset,
        result.offered_per_s,
        result.delivered_per_s,
        clock_offset_s=offset,
    )
