"""The burst through the operator on the real control plane (``benchmarks.burst --variants operator
--cluster real``): etcd, kube-apiserver and kube-controller-manager
(:class:`~multilane.testing.cluster.LocalCluster`), the process kubelet, the chart installed by the
real Helm CLI (two operator replicas under the chart's ServiceAccount and RBAC), and a
ParallelConsumer whose workers are pods run as local processes. docs/real-cluster.md describes the
tier. Does I/O.

What differs from the double's run (:mod:`benchmarks.k8s_burst`), and why:

- The operator runs in its pods, so its controller passes are not visible to this process. Scaling
  decisions and completed moves are the Events it posts on the ParallelConsumer (``ScalingDecision``;
  ``HandedOff``: ``P: A -> B paused Xs``), read back from kube-apiserver at the end. A move's
  release time is the Event's time minus its pause (the Event is posted after the pass, so the
  rollout's span is an upper bound); its release and promotion calls apart are not reported.
- The workers' control port is on mutual TLS, whose client certificate this process does not hold:
  samples come from Kafka (:class:`~multilane.operator.sources.KafkaSource`, the operator's own
  default: lag from committed and end offsets, processing rate from the committed offsets), so the
  processing rate moves in commit steps.

:func:`run_cluster_burst` (steps numbered as in the code):

1. Start the control plane and the node; make the release's and the consumer's namespaces (PodSecurity
   ``restricted``); ``helm install`` the chart with ``tests/cluster/values-process-kubelet.yaml``.
2. Create the ParallelConsumer (:func:`benchmarks.k8s_burst.consumer_body`: one replica at
   ``minFactor`` 2, state enabled, the demo's scaling settings) and wait until ``orders-0`` owns every
   partition.
3. Start the load generator; every 1 s a sample (Kafka offsets, the consumer's status, its running
   pods); stop 3 s after the load ended and the lag is 0.
4. Read the Events; delete the ParallelConsumer (the pods get SIGTERM: final commits) and wait until
   its pods are gone; judge (every delivery checker, state equal to the reference) and compute the
   figures; the control plane stops with everything on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from benchmarks.k8s_burst import (
    NAME,
    NAMESPACE,
    BurstShape,
    OperatorBurstRun,
    consumer_body,
    judge_run,
    run_figures,
)
from multilane.demo.report import DemoSample, Timeline
from multilane.operator.k8s.kube import KubeClient, KubeSettings, api_path
from multilane.operator.kafka_admin import KafkaAdminClient
from multilane.operator.sources import KafkaSource, MetricSample, MetricsUnavailableError, QueryContext
from multilane.testing.cluster import LocalCluster, resolve_bin_dir
from multilane.testing.load import LoadgenProcess
from multilane.testing.loadgen import LoadResult
from multilane.testing.process_kubelet import ProcessKubelet

__all__ = [
    "ConsumerEvent",
    "Move",
    "admin_kube",
    "consumer_events",
    "move_table",
    "moves",
    "run_cluster_burst",
    "shared_dir",
]

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "multilane"
VALUES = ROOT / "tests" / "cluster" / "values-process-kubelet.yaml"
RELEASE, RELEASE_NS = "multilane", "multilane-system"  # the docs' release (docs/operator-install.md)
IMAGE = "ghcr.io/multilane/multilane"  # the chart's image; the node runs this machine's multilane
CR_API = "multilane.dev/v1alpha1"


@dataclass(frozen=True)
class ConsumerEvent:
    """An Event on the ParallelConsumer: ``at`` its ``eventTime`` (epoch seconds; kopf writes it with
    microseconds), ``reason`` and ``message``."""

    at: float
    reason: str
    message: str


@dataclass(frozen=True)
class Move:
    """One completed move, from its ``HandedOff`` Event (``P: A -> B paused Xs``; ``eager``: the
    fallback without a restored learner, i.e. not restore-before-handoff). ``at``: the Event's time."""

    at: float
    partition: str
    source: str
    target: str
    pause_s: float
    eager: bool
    release_s: float | None = None  # not in the Event
    promote_s: float | None = None  # not in the Event

    @property
    def released_at(self) -> float:
        """At the latest: the Event's time minus the pause."""
        return self.at - self.pause_s

    @property
    def promoted_at(self) -> float:
        """At the latest: the Event's time."""
        return self.at


_HANDED_OFF = re.compile(r"^(\S+): (\S+) -> (\S+) paused ([0-9.]+)s( \(eager fallback\))?$")


def admin_kube(cluster: LocalCluster) -> KubeClient:
    """A client of the cluster as its administrator."""
    assert cluster.admin is not None and cluster.pki is not None
    return KubeClient(
        KubeSettings(
            host=cluster.server,
            ca_file=str(cluster.pki.ca_cert),
            cert_file=str(cluster.admin.cert),
            key_file=str(cluster.admin.key),
        )
    )


def shared_dir(prefix: str) -> Path:
    """A directory the pods' users can write (mode 0777) and see: not under ``/tmp``, which each
    container has its own emptyDir over."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o777)
    return path


async def consumer_events(kube: KubeClient, namespace: str, name: str) -> list[ConsumerEvent]:
    """Every Event kube-apiserver holds on the ParallelConsumer ``namespace/name``, oldest first."""
    items = await kube.list(
        api_path("v1", "events", namespace),
        fields={"involvedObject.kind": "ParallelConsumer", "involvedObject.name": name},
    )
    out = []
    for e in items:
        involved = e.get("involvedObject") or {}
        if involved.get("kind") != "ParallelConsumer" or involved.get("name") != name:
            continue
        stamp = e.get("eventTime") or e.get("firstTimestamp") or e["metadata"]["creationTimestamp"]
        at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        out.append(ConsumerEvent(at, str(e.get("reason", "")), str(e.get("message", ""))))
    return sorted(out, key=lambda ev: ev.at)


def moves(events: list[ConsumerEvent]) -> list[Move]:
    """The ``HandedOff`` Events as moves; an Event of that reason the pattern does not read raises
    AssertionError (the operator's message format changed)."""
    out = []
    for ev in events:
        if ev.reason != "HandedOff":
            continue
        m = _HANDED_OFF.match(ev.message)
        if m is None:
            raise AssertionError(f"a HandedOff Event this reader cannot read: {ev.message!r}")
        out.append(Move(ev.at, m[1], m[2], m[3], float(m[4]), m[5] is not None))
    return out


def move_table(rows: list[Move], t0: float) -> str:
    """The moves as a table: move, t (s after ``t0``), partition, from -> to, pause s."""
    ways = [f"{mv.source} -> {mv.target}" + (" (eager)" if mv.eager else "") for mv in rows]
    pw = max([len("partition"), *(len(mv.partition) for mv in rows)])
    ww = max([len("from -> to"), *(len(w) for w in ways)])
    lines = [f"{'move':>4}  {'t s':>6}  {'partition':<{pw}}  {'from -> to':<{ww}}  {'pause s':>7}"]
    for i, (mv, way) in enumerate(zip(rows, ways, strict=True), 1):
        lines.append(f"{i:>4}  {mv.at - t0:>6.1f}  {mv.partition:<{pw}}  {way:<{ww}}  {mv.pause_s:>7.3f}")
    return "\n".join(lines)


def _restricted_namespace(cluster: LocalCluster, name: str) -> None:
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")


def _helm_install(cluster: LocalCluster, home: Path) -> None:
    """``helm install`` of the chart into ``RELEASE_NS`` (Secrets of ``NAMESPACE`` granted)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "KUBECONFIG": str(cluster.kubeconfig),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    argv = [
        str(cluster.bin_dir / "helm"), "install", RELEASE, str(CHART), "--namespace", RELEASE_NS,
        "--values", str(VALUES), "--set", f"rbac.secretNamespaces={{{NAMESPACE}}}",
        "--wait", "--timeout", "240s",
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"helm install: exit {done.returncode}\n{done.stderr}{done.stdout}")


def _pods_running(kubelet: ProcessKubelet) -> int:
    return sum(
        1
        for w in list(kubelet.workers.values())
        if w.namespace == NAMESPACE and w.name.startswith(f"{NAME}-") and kubelet.pids(w.namespace, w.name)
    )


async def run_cluster_burst(
    bootstrap: str,
    topic: str,
    partitions: int,
    workdir: Path,
    shape: BurstShape,
    max_replicas: int = 3,
    drain_limit_s: float = 120.0,
) -> tuple[OperatorBurstRun, list[Move]]:
    """Steps 1-4 of the module docstring on an existing ``topic`` of ``partitions`` partitions (the
    group is named like the topic). Raises ClusterError without the binaries, TimeoutError when the
    start or the drain takes too long. Returns the run (its ``handoffs`` empty: the moves are the
    second value)."""
    run = uuid.uuid4().hex[:6]
    root = workdir / f"real-{run}"
    root.mkdir(parents=True, exist_ok=True)
    shared = shared_dir(f"multilane-burst-{run}-")
    events_log = shared / "events.log"
    names = [f"{topic}/{i}" for i in range(partitions)]
    cr = api_path(CR_API, "parallelconsumers", NAMESPACE, NAME)
    entrypoints = {IMAGE: [sys.executable, "-m", "multilane"]}
    loadgen: LoadgenProcess | None = None
    result: LoadResult | None = None
    try:
        # 1.
        with (
            LocalCluster(resolve_bin_dir(), start_timeout_s=240) as cluster,
            ProcessKubelet(cluster, backoff_s=1.0, entrypoints=entrypoints) as kubelet,
        ):
            for ns in (RELEASE_NS, NAMESPACE):
                _restricted_namespace(cluster, ns)
            await asyncio.to_thread(_helm_install, cluster, root / "helm")
            admin = KafkaAdminClient({"bootstrap.servers": bootstrap}, timeout_s=3.0)
            async with admin_kube(cluster) as kube:
                try:
                    # 2.
                    body = consumer_body(bootstrap, topic, events_log, shape, max_replicas)
                    await kube.create(api_path(CR_API, "parallelconsumers", NAMESPACE), body)
                    deadline = time.monotonic() + 180
                    while True:
                        status = ((await kube.get(cr)) or {}).get("status") or {}
                        members = (status.get("assignment") or {}).get("members") or []
                        owned = {p for m in members for p in m["partitions"]}
                        if len(owned) == partitions and not status.get("rollout"):
                            break
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"orders-0 did not take the partitions: {status}")
                        await asyncio.sleep(0.5)
                    source = KafkaSource(admin)
                    ctx = QueryContext(NAMESPACE, NAME, topic, names)
                    timeline = Timeline()
                    # 3.
                    t0, wall0 = time.monotonic(), time.time()
                    loadgen = LoadgenProcess(
                        bootstrap, topic, shape.profile, str(root), keys=shape.keys, name=f"load-{run}"
                    )
                    drained_at: float | None = None
                    peak = [1, 1]
                    limit = shape.warm_s + shape.burst_s + shape.tail_s + drain_limit_s
                    while True:
                        now = time.monotonic() - t0
                        try:
                            m: MetricSample | None = await source.sample(ctx)
                        except MetricsUnavailableError:
                            m = None
                        status = ((await kube.get(cr)) or {}).get("status") or {}
                        smp = DemoSample.from_status(now, m, status, _pods_running(kubelet), names, "burst")
                        timeline.samples.append(smp)
                        peak = [max(peak[0], smp.replicas), max(peak[1], smp.factor)]
                        if result is None and not loadgen.running():
                            result, _rates = await asyncio.to_thread(loadgen.finish, 60.0)
                        if result is not None and m is not None and m.total_lag == 0 and drained_at is None:
                            drained_at = now
                        if drained_at is not None and now - drained_at > 3:
                            break
                        if now > limit:
                            raise TimeoutError(
                                f"the backlog did not drain within {drain_limit_s:.0f}s of the load's end"
                            )
                        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - t0 - now)))
                    # 4.
                    events = await consumer_events(kube, NAMESPACE, NAME)
                    for ev in events:
                        if ev.reason == "HandedOff" or (
                            ev.reason == "ScalingDecision" and ev.message.startswith("scale ")
                        ):
                            timeline.events.append((ev.at - wall0, ev.reason, ev.message))
                    moved = [mv for mv in moves(events) if mv.released_at >= wall0]
                    await kube.delete(cr)
                    for _ in range(240):  # up to 120 s: the pods' grace period and final commits
                        if not _pods_running(kubelet):
                            break
                        await asyncio.sleep(0.5)
                finally:
                    if loadgen is not None and result is None:
                        with contextlib.suppress(RuntimeError):
                            result, _rates = await asyncio.to_thread(loadgen.finish, 60.0, True)
                    admin.close()
        assert result is not None and loadgen is not None
        verdict = await judge_run(bootstrap, topic, partitions, events_log, result)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    figures = run_figures(timeline, shape, result, loadgen.started - t0)
    return OperatorBurstRun(figures, verdict, timeline, wall0, result, [], peak[0], peak[1]), moved

