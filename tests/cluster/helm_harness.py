"""The chart installed by the real Helm CLI into the real-cluster tier, and a ParallelConsumer's
workers seen through the process kubelet. Does I/O (helm, the API server, files, Kafka).

- :class:`HelmRelease`: ``helm install``/``uninstall`` of ``charts/multilane`` with
  ``values-process-kubelet.yaml`` (what a process kubelet needs; the chart's defaults otherwise),
  the release's operator pods and their leader Lease.
- :class:`KubeletPods`: the ``double`` of :class:`tests.operator.k8s_harness.K8sHarness` read from the
  process kubelet (a pod's processes, its PID), so the harness's ``balanced``, ``body``, ``create``,
  ``status`` and verdict (every delivery checker) run unchanged on the real tier.
- :func:`drained`: every produced record committed, read from the consumer group's offsets in Kafka
  (the workers' control port is on mutual TLS, which the test's client does not hold).
- From :mod:`benchmarks.k8s_burst_real` (the burst benchmark on this tier uses them too):
  :func:`admin_kube`, :func:`shared_dir`, and :func:`consumer_events`: the Events the operator posted
  on a ParallelConsumer (``ScalingDecision``; ``HandedOff``: each completed move with its pause), read
  back from kube-apiserver, :func:`moves` and :func:`move_table` (move, partition, from -> to, pause).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.k8s_burst_real import (
    ConsumerEvent,
    Move,
    admin_kube,
    consumer_events,
    move_table,
    moves,
    shared_dir,
)
from multilane.testing.cluster import LocalCluster
from multilane.testing.process_kubelet import ProcessKubelet
from tests.operator.k8s_harness import K8sHarness

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "multilane"
VALUES = Path(__file__).with_name("values-process-kubelet.yaml")
RELEASE = "ml"
RELEASE_NS = "multilane-system"
FULLNAME = "ml-multilane"
# the image's ENTRYPOINT ["multilane"] (Dockerfile), as the process kubelet runs it
IMAGE = "ghcr.io/multilane/multilane"

__all__ = ["CHART", "FULLNAME", "IMAGE", "RELEASE", "RELEASE_NS", "ConsumerEvent", "HelmRelease",
           "KubeletPods", "Move", "admin_kube", "consumer_events", "drained", "move_table", "moves",
           "shared_dir"]


@dataclass
class HelmRelease:
    """``helm`` against the cluster's admin kubeconfig, its state (cache, config) in ``home``."""

    helm: Path
    cluster: LocalCluster
    home: Path
    installed: bool = False

    def run(self, *args: str, timeout_s: float = 300.0) -> str:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        done = subprocess.run(
            [str(self.helm), *args], env=env, capture_output=True, text=True, timeout=timeout_s
        )
        if done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)}: exit {done.returncode}\n{done.stderr}{done.stdout}")
        return done.stdout

    def install(self, *extra: str) -> str:
        out = self.run(
            "install", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--values", str(VALUES),
            "--wait", "--timeout", "240s", *extra,
        )  # fmt: skip
        self.installed = True
        return out

    def uninstall(self) -> str:
        out = self.run("uninstall", RELEASE, "--namespace", RELEASE_NS, "--wait", "--timeout", "240s")
        self.installed = False
        return out

    def leader(self) -> str:
        """The holder of the operator's leader Lease ("" when none)."""
        try:
            lease = json.loads(
                self.cluster.kubectl("get", "lease", FULLNAME, "-n", RELEASE_NS, "-o", "json")
            )
        except Exception:
            return ""
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    def operator_pods(self) -> list[dict[str, Any]]:
        out = self.cluster.kubectl(
            "get", "pods", "-n", RELEASE_NS, "-l", "app.kubernetes.io/component=operator", "-o", "json"
        )
        return list(json.loads(out)["items"])


@dataclass
class _Pod:
    kubelet: ProcessKubelet
    namespace: str
    name: str

    @property
    def pid(self) -> int:
        pids = self.kubelet.pids(self.namespace, self.name)
        return pids[0] if pids else 0

    def running(self) -> bool:
        return bool(self.kubelet.pids(self.namespace, self.name))


@dataclass
class KubeletPods:
    """What ``K8sHarness`` reads of its ``double``: ``pods`` (name -> running(), pid)."""

    kubelet: ProcessKubelet
    namespace: str
    stopped: list[str] = field(default_factory=list)

    @property
    def pods(self) -> dict[str, _Pod]:
        workers = [w for w in list(self.kubelet.workers.values()) if w.namespace == self.namespace]
        return {w.name: _Pod(self.kubelet, w.namespace, w.name) for w in workers}

    async def stop(self) -> None:
        """Nothing to stop here: the pods go with their ParallelConsumer."""


def drained(h: K8sHarness) -> bool:
    """The load is over and the group committed each produced partition's end offset."""
    from multilane.worker.state.committed import CommittedOffsetReader

    if not h.load_done():
        return False
    ends: dict[tuple[str, int], int] = {}
    for r in h.produced:
        ends[(r.topic, r.partition)] = max(ends.get((r.topic, r.partition), 0), r.offset + 1)
    reader = CommittedOffsetReader(h.broker.bootstrap, h.group)
    try:
        return all(reader.committed(t, p) >= end for (t, p), end in ends.items())
    finally:
        reader.close()


def wait_for(cond: Any, limit_s: float, what: str) -> Any:
    deadline = time.monotonic() + limit_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {limit_s:.0f}s")
        time.sleep(0.5)

