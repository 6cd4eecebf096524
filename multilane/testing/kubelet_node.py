"""The node side of the process kubelet on a real kube-apiserver: the Node and its heartbeat, the pod
binder that stands in for kube-scheduler, and a local-path volume provisioner. Does I/O (API calls,
directories).

Each part is a ``sync()`` coroutine that :class:`~multilane.testing.process_kubelet.ProcessKubelet`
calls in a loop, each with its own client (its own identity):

- :class:`NodeAgent` (``system:node:NAME``, the Node authorizer and NodeRestriction apply):
  1. creates the Node (labels ``kubernetes.io/hostname``, ``kubernetes.io/os``) if it is missing;
  2. writes its status: capacity and allocatable of this machine, addresses (InternalIP 127.0.0.1,
     Hostname), ``nodeInfo``, the Ready/MemoryPressure/DiskPressure/PIDPressure conditions with a fresh
     ``lastHeartbeatTime`` every ``status_every_s``;
  3. creates and renews its Lease in ``kube-node-lease`` (``leaseDurationSeconds`` 40, renewed every
     ``lease_every_s``): node-lifecycle-controller marks the node Unknown when neither is fresh
     within ``--node-monitor-grace-period`` (50 s).
- :class:`PodBinder` (``system:kube-scheduler``): binds each pod that has no ``spec.nodeName`` and
  asks for ``default-scheduler`` to the node (``pods/binding``), once its ``nodeSelector`` matches the
  node's labels and its claims are Bound; otherwise it writes ``PodScheduled=False`` with reason
  ``Unschedulable`` and the scheduler's message.
- :class:`LocalPathProvisioner` (the admin): the ``local-path`` StorageClass (the default class,
  ``Immediate`` binding, reclaim ``Delete``); a PersistentVolume (a directory under ``ROOT/pv``,
  ``hostPath``, pre-bound through ``claimRef``) for each Pending claim of that class; a Released
  volume of its own is removed with its directory.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multilane.operator.k8s.kube import KubeClient, KubeConflictError, KubeError, api_path

__all__ = ["PROVISIONER", "STORAGE_CLASS", "LocalPathProvisioner", "NodeAgent", "PodBinder", "now_rfc3339"]

STORAGE_CLASS = "local-path"
PROVISIONER = "multilane.dev/local-path"


def now_rfc3339(micro: bool = False) -> str:
    now = dt.datetime.now(dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def _memory_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


@dataclass
class NodeAgent:
    """The Node object and its heartbeats (see the module docstring).

    Invariant: ``_status_at``/``_lease_at`` are the monotonic times of the last successful writes.
    """

    kube: KubeClient
    name: str
    kubelet_version: str
    status_every_s: float = 10.0
    lease_every_s: float = 10.0
    max_pods: int = 110
    _uid: str = ""
    _status_at: float = -1e9
    _lease_at: float = -1e9
    _ready_since: str = field(default_factory=now_rfc3339)

    def labels(self) -> dict[str, str]:
        return {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": {"x86_64": "amd64", "aarch64": "arm64"}.get(
                platform.machine(), platform.machine()
            ),
        }

    async def sync(self, now: float) -> None:
        # 1. the Node
        if not self._uid:
            path = api_path("v1", "nodes", name=self.name)
            node = await self.kube.get(path)
            if node is None:
                body = {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": self.name, "labels": self.labels()},
                }
                node = await self.kube.create(api_path("v1", "nodes"), body)
            self._uid = node["metadata"]["uid"]
        # 2. its status
        if now - self._status_at >= self.status_every_s:
            await self.kube.patch(
                api_path("v1", "nodes", name=self.name, subresource="status"), {"status": self.status()}
            )
            self._status_at = now
        # 3. its Lease
        if now - self._lease_at >= self.lease_every_s:
            await self._renew_lease()
            self._lease_at = now

    def status(self) -> dict[str, Any]:
        resources = {
            "cpu": str(os.cpu_count() or 1),
            "memory": str(_memory_bytes()),
            "pods": str(self.max_pods),
            "ephemeral-storage": str(shutil.disk_usage("/").total),
        }
        beat = now_rfc3339()

        def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": beat,
                "lastTransitionTime": self._ready_since,
            }

        uname = os.uname()
        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                condition(
                    "DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"
                ),
                condition(
                    "PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"
                ),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.name},
            ],
            "nodeInfo": {
                "machineID": self.name,
                "systemUUID": self.name,
                "bootID": self._uid,
                "kernelVersion": uname.release,
                "osImage": f"multilane process kubelet on {uname.sysname}",
                "containerRuntimeVersion": "process://1",
                "kubeletVersion": self.kubelet_version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": self.labels()["kubernetes.io/arch"],
            },
        }

    async def _renew_lease(self) -> None:
        path = api_path("coordination.k8s.io/v1", "leases", "kube-node-lease", self.name)
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": now_rfc3339(micro=True)}
        lease = await self.kube.get(path)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.name,
                    "namespace": "kube-node-lease",
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self._uid}
                    ],
                },
                "spec": spec,
            }
            await self.kube.create(api_path("coordination.k8s.io/v1", "leases", "kube-node-lease"), body)
        else:
            await self.kube.patch(path, {"spec": spec})


def _claims(pod: dict[str, Any]) -> list[str]:
    return [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"].get("volumes") or []
        if "persistentVolumeClaim" in v
    ]


@dataclass
class PodBinder:
    """kube-scheduler's part: binds the unscheduled pods to the one node (see the module docstring)."""

    kube: KubeClient
    node: str
    node_labels: dict[str, str]
    unschedulable: dict[str, str] = field(default_factory=dict)  # pod uid -> message last written
    bound: int = 0  # pods bound so far

    async def sync(self) -> None:
        pods = await self.kube.list(api_path("v1", "pods"), fields={"spec.nodeName": ""})
        for pod in pods:
            meta, spec = pod["metadata"], pod["spec"]
            if (
                meta.get("deletionTimestamp")
                or spec.get("schedulerName", "default-scheduler") != "default-scheduler"
            ):
                continue
            why = await self._unfit(pod)
            try:
                if why:
                    await self._mark_unschedulable(pod, why)
                    continue
                binding = {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
                }
                await self.kube.create(
                    api_path("v1", "pods", meta["namespace"], meta["name"], "binding"), binding
                )
                self.unschedulable.pop(meta["uid"], None)
                self.bound += 1
            except KubeConflictError:
                continue  # bound meanwhile (or deleted and made again): the next round sees it
            except KubeError as exc:
                if exc.status != 404:
                    raise

    async def _unfit(self, pod: dict[str, Any]) -> str:
        selector = pod["spec"].get("nodeSelector") or {}
        if any(self.node_labels.get(k) != v for k, v in selector.items()):
            return "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
        ns = pod["metadata"]["namespace"]
        for claim in _claims(pod):
            pvc = await self.kube.get(api_path("v1", "persistentvolumeclaims", ns, claim))
            if pvc is None:
                return f'persistentvolumeclaim "{claim}" not found'
            if (pvc.get("status") or {}).get("phase") != "Bound":
                return "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims."
        return ""

    async def _mark_unschedulable(self, pod: dict[str, Any], message: str) -> None:
        meta = pod["metadata"]
        if self.unschedulable.get(meta["uid"]) == message:
            return
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": now_rfc3339(),
        }
        path = api_path("v1", "pods", meta["namespace"], meta["name"], "status")
        await self.kube.patch(path, {"status": {"conditions": [condition]}})
        self.unschedulable[meta["uid"]] = message


@dataclass
class LocalPathProvisioner:
    """PersistentVolumes as directories under ``root`` (see the module docstring)."""

    kube: KubeClient
    root: Path
    provisioned: int = 0  # volumes made so far
    removed: int = 0

    async def ensure_class(self) -> None:
        body = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }
        try:
            await self.kube.create(api_path("storage.k8s.io/v1", "storageclasses"), body)
        except KubeConflictError:
            pass

    async def sync(self) -> None:
        for pvc in await self.kube.list(api_path("v1", "persistentvolumeclaims")):
            spec, meta = pvc["spec"], pvc["metadata"]
            if (pvc.get("status") or {}).get("phase") != "Pending" or spec.get("volumeName"):
                continue
            if spec.get("storageClassName") != STORAGE_CLASS or meta.get("deletionTimestamp"):
                continue
            await self._provision(pvc)
        for pv in await self.kube.list(api_path("v1", "persistentvolumes")):
            annotations = pv["metadata"].get("annotations") or {}
            if annotations.get("pv.kubernetes.io/provisioned-by") != PROVISIONER:
                continue
            if (pv.get("status") or {}).get("phase") == "Released" and pv["spec"].get(
                "persistentVolumeReclaimPolicy"
            ) == "Delete":
                shutil.rmtree(pv["spec"]["hostPath"]["path"], ignore_errors=True)
                if await self.kube.delete(api_path("v1", "persistentvolumes", name=pv["metadata"]["name"])):
                    self.removed += 1

    async def _provision(self, pvc: dict[str, Any]) -> None:
        meta, spec = pvc["metadata"], pvc["spec"]
        name = f"pvc-{meta['uid']}"
        directory = self.root / name
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o777)  # as local-path provisioners do: any pod user may write its claim
        body = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
            "spec": {
                "capacity": {
                    "storage": ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
                },
                "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": STORAGE_CLASS,
                "volumeMode": spec.get("volumeMode", "Filesystem"),
                "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        try:
            await self.kube.create(api_path("v1", "persistentvolumes"), body)
            self.provisioned += 1
        except KubeConflictError:
            pass  # made in an earlier round; the binder controller binds it
