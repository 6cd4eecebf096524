"""``ProcessKubelet``: a node of a real kube-apiserver whose pods run as local processes -- the
kubelet, the scheduler's binding and a local-path provisioner in one loop thread. Does I/O.

Its parts (each with its own client certificate, so the API server's Node authorizer, NodeRestriction
and RBAC decide what each may do, as on a cluster):

- :class:`~multilane.testing.kubelet_node.NodeAgent` as ``system:node:NAME``: the Node, its status
  and Lease;
- :class:`~multilane.testing.kubelet_node.PodBinder` as ``system:kube-scheduler``: binds pods;
- :class:`~multilane.testing.kubelet_node.LocalPathProvisioner` as the cluster admin: volumes;
- :class:`~multilane.testing.kubelet_pods.PodWorker` as the node, one per pod bound here.

Each round (every ``period_s``), in order:

1. the node's heartbeats; the binder; the provisioner;
2. the pods bound to the node (``spec.nodeName=NAME``): a new pod gets a worker and a loopback IP of
   its own (``127.A.B.N``, one random ``A.B`` per kubelet, so two clusters on one machine do not
   share pod IPs); a pod with a ``deletionTimestamp`` is terminated (SIGTERM, SIGKILL after its
   grace) and then deleted for good (``gracePeriodSeconds: 0``, precondition on its UID); a pod gone
   from the API server has its processes killed;
3. each worker's ``tick`` (containers, probes, restarts) and its status, written when it changed;
4. the node's hosts file, bind-mounted at every container's ``/etc/hosts``: each running pod's
   ``HOSTNAME.SUBDOMAIN.NAMESPACE.svc`` (and ``.svc.cluster.local``) -> its pod IP, the names cluster
   DNS gives a StatefulSet's pods under its headless Service (there is no cluster DNS here). It is
   rewritten in place (a bind mount pins the inode), and glibc reads it on every lookup.

Images: none are pulled. ``entrypoints`` maps an image repository (``ghcr.io/multilane/multilane``)
to the argv that stands in for its ``ENTRYPOINT``, for containers without ``command`` (the chart's
operator Deployment sets only ``args``).

A round's failure is logged and counted (``errors``) and the next round goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from multilane.operator.k8s.kube import KubeClient, KubeError, KubeSettings, api_path
from multilane.testing.cluster import K8S_VERSION, LocalCluster
from multilane.testing.cluster_pki import ClientCert
from multilane.testing.kubelet_node import LocalPathProvisioner, NodeAgent, PodBinder
from multilane.testing.kubelet_pods import PodWorker

__all__ = ["ProcessKubelet"]

log = logging.getLogger(__name__)


class ProcessKubelet:
    """One node (see the module docstring). ``start()``/``stop()`` or a context manager.

    Invariants: ``workers`` holds one worker per pod UID bound here and not yet deleted for good; it
    is touched only on the kubelet's loop thread.
    """

    def __init__(
        self,
        cluster: LocalCluster,
        name: str = "multilane-node-0",
        root: Path | None = None,
        *,
        period_s: float = 0.5,
        backoff_s: float = 10.0,
        entrypoints: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.cluster = cluster
        self.name = name
        self.root = root or cluster.dir / "nodes" / name
        self.period_s = period_s
        self.backoff_s = backoff_s
        self.entrypoints = dict(entrypoints or {})
        self.workers: dict[str, PodWorker] = {}
        self.errors = 0
        self.last_error = ""
        self.rounds = 0
        self._ips = (random.randint(2, 254), random.randint(0, 255))
        self._next_ip = 1
        self._hosts = ""  # the hosts file's content as last written
        self._reported: dict[str, str] = {}  # pod uid -> JSON of the status last written
        self._terminations: dict[str, asyncio.Task[None]] = {}  # pod uid -> its running terminate()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> ProcessKubelet:
        """Start the loop thread; returns once the Node is registered (raises if it could not be)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_hosts()
        self._thread = threading.Thread(target=self._main, name=f"kubelet-{self.name}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._failure is not None:
            self.stop()
            raise RuntimeError(f"process kubelet {self.name} did not register: {self._failure or 'timeout'}")
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the loop; every pod's processes are killed (the node goes away with them)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def __enter__(self) -> ProcessKubelet:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the loop ----------------------------------------------------------------------------------

    def _client(self, cert: ClientCert) -> KubeClient:
        assert self.cluster.pki is not None
        return KubeClient(
            KubeSettings(
                host=self.cluster.server,
                ca_file=str(self.cluster.pki.ca_cert),
                cert_file=str(cert.cert),
                key_file=str(cert.key),
            )
        )

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:
            self._failure = exc
            self._ready.set()

    async def _run(self) -> None:
        certs = self.cluster
        node_kube = self._client(
            certs.client_cert(f"node-{self.name}", f"system:node:{self.name}", ("system:nodes",))
        )
        binder_kube = self._client(certs.client_cert("scheduler", "system:kube-scheduler"))
        admin = self.cluster.admin
        assert admin is not None
        admin_kube = self._client(admin)
        node = NodeAgent(node_kube, self.name, f"v{K8S_VERSION}")
        binder = PodBinder(binder_kube, self.name, node.labels())
        provisioner = LocalPathProvisioner(admin_kube, self.root / "pv")
        try:
            await node.sync(time.monotonic())
            await provisioner.ensure_class()
            self._ready.set()
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    await self._round(node, binder, provisioner, node_kube)  # steps 1-3
                except (TimeoutError, KubeError, OSError) as exc:
                    self.errors += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    log.warning("process kubelet %s: round failed: %s", self.name, self.last_error)
                self.rounds += 1
                await asyncio.sleep(max(0.0, self.period_s - (time.monotonic() - started)))
        finally:
            await asyncio.gather(*(w.terminate(0.0) for w in self.workers.values()), return_exceptions=True)
            for kube in (node_kube, binder_kube, admin_kube):
                await kube.close()

    async def _round(
        self, node: NodeAgent, binder: PodBinder, provisioner: LocalPathProvisioner, kube: KubeClient
    ) -> None:
        now = time.monotonic()
        # 1. heartbeats, binding, volumes
        await node.sync(now)
        await binder.sync()
        await provisioner.sync()
        # 2. the pods bound here
        pods = await kube.list(api_path("v1", "pods"), fields={"spec.nodeName": self.name})
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            worker = self.workers.get(uid)
            if worker is None:
                if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue  # finished before this kubelet knew it (a restarted kubelet)
                worker = self.workers[uid] = PodWorker(
                    kube, pod, self.root / "pods" / uid, self._pod_ip(), self._api_port(), self.backoff_s,
                    entrypoints=self.entrypoints, hosts_file=self.hosts_file,
                )  # fmt: skip
            worker.pod = pod
            if pod["metadata"].get("deletionTimestamp"):
                await self._delete(kube, worker)
                continue
            # 3. containers, probes, status (one pod's failure does not hold up the others)
            try:
                await worker.tick(time.monotonic())
                await self._report(kube, worker)
            except (KubeError, OSError) as exc:
                self.errors += 1
                self.last_error = f"{worker.namespace}/{worker.name}: {type(exc).__name__}: {exc}"
                log.warning("process kubelet %s: %s", self.name, self.last_error)
        for uid in set(self.workers) - seen:  # deleted for good (force) or by this kubelet
            gone = self.workers[uid]
            self._forget(uid)
            await gone.terminate(0.0)
        self._write_hosts()  # 4.

    @property
    def hosts_file(self) -> Path:
        return self.root / "hosts"

    def _write_hosts(self) -> None:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        for w in sorted(self.workers.values(), key=lambda w: (w.namespace, w.name)):
            host, sub = w.spec.get("hostname") or w.name, w.spec.get("subdomain")
            if sub and not w.terminating:
                fqdn = f"{host}.{sub}.{w.namespace}.svc"
                lines.append(f"{w.pod_ip}\t{fqdn}.cluster.local {fqdn}")
        text = "\n".join(lines) + "\n"
        if text == self._hosts:
            return
        with self.hosts_file.open("a+") as f:  # in place: containers have this inode bind-mounted
            f.seek(0)
            f.truncate()
            f.write(text)
        self.hosts_file.chmod(0o644)
        self._hosts = text

    async def _delete(self, kube: KubeClient, worker: PodWorker) -> None:
        """Terminate in the background (other pods go on meanwhile); once done, delete for good."""
        task = self._terminations.get(worker.uid)
        if task is None:
            grace = float(worker.pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            self._terminations[worker.uid] = asyncio.create_task(worker.terminate(grace))
            return
        if not task.done():
            return
        await self._report(kube, worker)
        await kube.delete(
            api_path("v1", "pods", worker.namespace, worker.name),
            {"gracePeriodSeconds": 0, "preconditions": {"uid": worker.uid}},
        )
        self._forget(worker.uid)
        shutil.rmtree(worker.dir / "volumes", ignore_errors=True)

    def _forget(self, uid: str) -> None:
        self.workers.pop(uid, None)
        self._reported.pop(uid, None)
        self._terminations.pop(uid, None)

    async def _report(self, kube: KubeClient, worker: PodWorker) -> None:
        status = worker.status()
        text = json.dumps(status, sort_keys=True)
        if self._reported.get(worker.uid) == text:
            return
        path = api_path("v1", "pods", worker.namespace, worker.name, "status")
        with contextlib.suppress(KubeError):  # a pod deleted meanwhile: the next round forgets it
            await kube.patch(path, {"status": status})
            self._reported[worker.uid] = text

    def _pod_ip(self) -> str:
        n = self._next_ip
        self._next_ip = n % 254 + 1
        return f"127.{self._ips[0]}.{self._ips[1]}.{n}"

    def _api_port(self) -> int:
        return int(self.cluster.server.rsplit(":", 1)[1])

    # -- what tests read ---------------------------------------------------------------------------

    def worker(self, namespace: str, name: str) -> PodWorker | None:
        return next(
            (w for w in list(self.workers.values()) if (w.namespace, w.name) == (namespace, name)), None
        )

    def pids(self, namespace: str, name: str) -> list[int]:
        worker = self.worker(namespace, name)
        if worker is None:
            return []
        return [r.proc.pid for r in worker.containers if r.proc is not None and r.running()]

    def describe(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "errors": self.errors,
            "last_error": self.last_error,
            "pods": {f"{w.namespace}/{w.name}": w.files.volume_error or "ok" for w in self.workers.values()},
        }
