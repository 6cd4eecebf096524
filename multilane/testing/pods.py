"""``StatefulSetProcessDouble``: the StatefulSet controller and the kubelet for the operator tests and
the burst benchmark's ``operator`` variant, with a real ``multilane worker`` process per pod. A test
double, not a cluster. Does I/O (processes, files, HTTP, TLS).

What it emulates (every ``interval_s``, for the StatefulSets of one namespace); the containers (steps
2, 3 and 5, and the pod status of steps 6 and 7) are :class:`~multilane.testing.kubelet.KubeletDouble`'s:

1. **StatefulSet controller.** Pods ``NAME-0 .. NAME-(replicas-1)`` are created from
   ``spec.template`` (labels, annotations, spec; the label ``controller-revision-hash`` names the
   template's revision; owner reference to the StatefulSet, so the emulator's garbage collector
   removes them with it). ``updateStrategy``: ``OnDelete`` replaces nothing (a pod keeps the
   template it was created from, also across container restarts, until it is deleted);
   ``RollingUpdate`` (the default) deletes one pod of an outdated revision at a time, the highest
   ordinal first, once every pod exists and is ready. ``status``: ``replicas``, ``readyReplicas``,
   ``updatedReplicas``, ``currentRevision``, ``updateRevision``, ``observedGeneration``. A pod that
   would exceed :attr:`StatefulSetProcessDouble.pod_quota` is not created: a ``FailedCreate`` Event on
   the StatefulSet says so, as the controller's does. Pods at or above ``replicas`` are deleted, the
   highest ordinal first: ``metadata.deletionTimestamp`` is set, the process gets SIGTERM, then
   SIGKILL after the template's ``terminationGracePeriodSeconds``, then the pod object is removed. A
   pod deleted through the API (``kubectl delete pod``) loses its process the same way and is created
   again.
2. **kubelet: the container.** ``command``/``args`` of the first container, with ``$(VAR)`` expanded
   from the container's env; the command ``multilane`` runs as ``sys.executable -m multilane`` (the
   "image" is this interpreter and its environment, minus ``KUBERNETES_*``). Env: ``value``,
   ``valueFrom.fieldRef`` (``metadata.name``, ``metadata.namespace``), ``valueFrom.secretKeyRef`` and
   ``envFrom.secretRef`` (with ``prefix``) read from the emulated API server, as the kubelet does.
3. **Volumes.** Each ``volumeMount`` becomes a host directory; arguments that name a path under a
   ``mountPath``, and env values equal to one, are rewritten to it (other env values are left
   alone: the tests pass host paths, such as the processors' event log, in ``spec.workload.env``).
   ``secret`` volumes: the Secret's ``items`` written out (``defaultMode``), and again when the Secret
   changes (:mod:`multilane.testing.pod_network`); ``emptyDir``: a
   directory per pod (kept across container restarts, new for a new pod); a
   ``volumeClaimTemplates`` claim: one directory per claim and ordinal under ``ROOT/pvc/`` that
   outlives its pods, like a PersistentVolumeClaim (the worker's state store).
4. **Pod network.** Pods share the host's loopback, so each ``containerPort`` gets a free host
   port; the value of every ``--...port`` option equal to a container port is rewritten to it. The
   headless Service's DNS names are replaced by a router: ``http://127.0.0.1:ROUTER/NS/POD/...``
   forwards to the pod's control port (502 when its process does not answer), so worker control
   URLs come from the operator's ``MULTILANE_CONTROL_URL_TEMPLATE`` hook (or
   :meth:`control_url`). For TLS to a pod (the certificates name the pods' DNS names), a client
   resolves those names with :meth:`resolver` and connects to the pod's port directly.
5. **Service account.** ``KUBERNETES_SERVICE_HOST``/``PORT`` point at a TLS front of the emulated API
   server (a self-signed certificate for 127.0.0.1, one front per pod so that a test can cut one
   pod's API access: :meth:`cut_api`); the token and ``ca.crt`` are written to a per-pod directory
   named by ``MULTILANE_SERVICE_ACCOUNT_DIR`` (the worker's test-only stand-in for
   ``/var/run/secrets/kubernetes.io/serviceaccount``). So each worker renews its own Lease with its
   own ``LeaseKeeper`` and fences itself when it cannot.
6. **Restarts and readiness.** A container that exits while its pod is not terminating is
   started again after ``restart_delay_s`` (``restartPolicy: Always``; ``restartCount`` counted).
   The ``readinessProbe`` (``httpGet`` path on a named port, on the real worker process) is polled;
   ``status.phase``, ``podIP``, the ``Ready`` condition and ``containerStatuses`` are written to the
   pod's status when they change.
7. **Failures a cluster shows.** An image in :attr:`StatefulSetProcessDouble.unpullable_images` is
   never started: the container waits with ``ErrImagePull``, then ``ImagePullBackOff``. A pod whose
   ``nodeSelector`` the one node's labels (:attr:`StatefulSetProcessDouble.node_labels`) do not
   match stays ``Pending`` with ``PodScheduled=False``, reason ``Unschedulable``.

Not emulated: images (every pod runs this checkout; the image name only decides a pull failure),
resource limits, securityContext (no UID change, writable root filesystem), the liveness probe (no
restarts on a failing probe), init and sidecar containers, scheduling beyond ``nodeSelector``
(affinity, taints), ``OrderedReady`` pod management, ``rollingUpdate.partition``,
CrashLoopBackOff's growing delay, NetworkPolicy, and a pod's own IP (all pods are 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import hashlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web

from multilane.operator.k8s.kube import KubeClient, api_path
from multilane.testing.broker import free_port
from multilane.testing.kubelet import KubeletDouble, PodProcess
from multilane.testing.pod_network import PodDnsResolver
from multilane.testing.tls_front import TlsFront, self_signed_cert

__all__ = ["PodProcess", "StatefulSetProcessDouble"]

REVISION_LABEL = "controller-revision-hash"


def _stamp() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def template_revision(sts_name: str, template: dict[str, Any]) -> str:
    """``NAME-HASH``: the revision of a pod template, as the StatefulSet controller names it."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
    return f"{sts_name}-{digest}"


class StatefulSetProcessDouble:
    """See the module docstring. ``start()``/``stop()`` from the test's event loop."""

    def __init__(
        self,
        kube: KubeClient,
        api_url: str,
        namespace: str,
        root: Path,
        interval_s: float = 0.5,
        restart_delay_s: float = 1.0,
        grace_cap_s: float = 30.0,
    ) -> None:
        self.kube = kube
        self.api_url = api_url
        self.namespace = namespace
        self.root = root
        self.interval_s = interval_s
        self.restart_delay_s = restart_delay_s
        self.grace_cap_s = grace_cap_s  # bound on terminationGracePeriodSeconds (tests stay short)
        self.pods: dict[str, PodProcess] = {}
        self.removed: list[str] = []  # pods deleted, in order
        self.unpullable_images: set[str] = set()  # images whose pull fails (ErrImagePull)
        self.node_labels: dict[str, str] = {"kubernetes.io/os": "linux", "kubernetes.io/hostname": "node-0"}
        self.pod_quota: int | None = None  # pods the namespace may hold (a ResourceQuota); None: no limit
        self._failed_create: set[str] = set()  # pods whose FailedCreate Event was posted
        self.router_port = free_port()
        self._cert, self._key = self_signed_cert(root)
        self.kubelet = KubeletDouble(kube, namespace, root, self._cert)  # steps 2, 3 and 5
        self._task: asyncio.Task[None] | None = None
        self._runner: aiohttp.web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._deleting: dict[str, asyncio.Task[None]] = {}
        self.secret_sync_s = 2.0  # mounted Secrets are refreshed this often (the kubelet: ~1 min)
        self._secrets_synced = 0.0

    # ---- public ----------------------------------------------------------------------------------

    @property
    def control_url_template(self) -> str:
        """The value for the operator's ``MULTILANE_CONTROL_URL_TEMPLATE``."""
        return f"http://127.0.0.1:{self.router_port}/{{namespace}}/{{pod}}"

    def control_url(self, ref: Any, pod: str) -> str:
        """``KubernetesPlatform(control_url=...)``: the router URL of ``pod``."""
        return f"http://127.0.0.1:{self.router_port}/{getattr(ref, 'namespace', self.namespace)}/{pod}"

    def resolver(self) -> PodDnsResolver:
        """The pods' DNS names under their headless Service -> this host's port of the pod (for a
        client that calls the pods by name: TLS with the names' certificates)."""

        def host_port(pod: str, port: int) -> int | None:
            p = self.pods.get(pod)
            return p.ports.get(port) if p is not None and p.running() else None

        return PodDnsResolver(host_port)

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
        app = aiohttp.web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{namespace}/{pod}/{tail:.*}", self._route)
        self._runner = aiohttp.web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await aiohttp.web.TCPSite(self._runner, "127.0.0.1", self.router_port).start()
        self._task = asyncio.create_task(self._run())

    async def stop(self, task_grace_s: float = 10.0) -> None:
        """Stop the loop and every pod; idempotent, and bounded (about ``task_grace_s`` plus
        ``grace_cap_s``) also when the loop's task died of an error or does not end, as after a test
        timed out inside it: the pods are signalled by PID before anything is awaited.

        1. The loop and the pod deletions are cancelled: no pod is started after this.
        2. SIGTERM to every pod process (final commits).
        3. The cancelled tasks get ``task_grace_s`` to end; an error they ended with is not raised
           here (it belongs to the test that was running, which reported it).
        4. Each pod is reaped: SIGKILL after ``grace_cap_s``; its TLS front is stopped.
        5. Whatever still runs (this coroutine was cancelled or failed in 3-4) gets SIGKILL.
        """
        tasks = [t for t in (self._task, *self._deleting.values()) if t is not None]
        self._task = None
        self._deleting.clear()
        for task in tasks:  # 1.
            task.cancel()
        signalled: set[int] = set()

        def term_all() -> None:
            for pod in list(self.pods.values()):
                pod.terminating = True
                if pod.proc is not None and pod.proc.pid not in signalled:
                    signalled.add(pod.proc.pid)
                    self._kill(pod, signal.SIGTERM)

        try:
            term_all()  # 2.
            if tasks:  # 3.
                done, _ = await asyncio.wait(tasks, timeout=task_grace_s)
                for task in done:
                    if not task.cancelled():
                        task.exception()  # retrieved: reported by the test, not by the loop's GC
            term_all()  # a pod a cancelled task was starting
            for pod in list(self.pods.values()):  # 4.
                await self._reap(pod, self.grace_cap_s)
                await pod.front.stop()
        finally:
            for pod in list(self.pods.values()):  # 5.
                self._kill(pod, signal.SIGKILL)
            self.pods.clear()
            runner, self._runner = self._runner, None
            session, self._session = self._session, None
            if runner is not None:
                await runner.cleanup()
            if session is not None:
                await session.close()

    def kill9(self, pod: str) -> int:
        """SIGKILL the pod's current process (the kubelet starts it again); returns its PID."""
        p = self.pods[pod]
        pid = p.pid
        os.kill(pid, signal.SIGKILL)
        return pid

    def cut_api(self, pod: str) -> None:
        self.pods[pod].front.cut()

    def heal_api(self, pod: str) -> None:
        self.pods[pod].front.heal()

    def logs(self, pod: str) -> str:
        files = sorted((self.root / "pods" / pod).glob("log-*"))
        return "".join(p.read_text(errors="replace") for p in files)

    # ---- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self.sync_once()
                if time.monotonic() - self._secrets_synced >= self.secret_sync_s:
                    self._secrets_synced = time.monotonic()
                    for pod in list(self.pods.values()):
                        for volume in pod.secret_volumes:
                            await volume.sync(self.kube)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the next pass retries; say why
                print(f"statefulset double: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            await asyncio.sleep(self.interval_s)

    async def sync_once(self) -> None:
        pods_path = api_path("v1", "pods", self.namespace)
        objects = {p["metadata"]["name"]: p for p in await self.kube.list(pods_path)}
        # Pods deleted through the API: their process goes.
        for name, pod in list(self.pods.items()):
            if name not in objects and name not in self._deleting:
                self._kill(pod, signal.SIGTERM)
                await self._reap(pod, self.grace_cap_s)
                await pod.front.stop()
                del self.pods[name]
                self.removed.append(name)
        for sts in await self.kube.list(api_path("apps/v1", "statefulsets", self.namespace)):
            await self._sync_statefulset(sts, objects)
        # Containers: restart the exited ones, report readiness.
        for pod in list(self.pods.values()):
            if pod.terminating:
                continue
            if not pod.running():
                now = time.monotonic()
                if pod.exited_at is None:
                    pod.exited_at = now
                elif now - pod.exited_at >= self.restart_delay_s and not pod.blocked:
                    pod.restarts += 1
                    await self._launch(pod, {"spec": pod.spec})  # the pod's own spec, not the StatefulSet's
            await self._report(pod, objects.get(pod.name))

    async def _sync_statefulset(self, sts: dict[str, Any], objects: dict[str, dict[str, Any]]) -> None:
        """Step 1 of the module docstring for one StatefulSet."""
        name = sts["metadata"]["name"]
        replicas = int((sts.get("spec") or {}).get("replicas") or 0)
        template = sts["spec"]["template"]
        revision = template_revision(name, template)
        for i in range(replicas):
            pod_name = f"{name}-{i}"
            if pod_name in self._deleting:
                continue
            if pod_name not in objects:
                created = await self._create_pod(sts, pod_name, revision, len(objects))
                if created is None:
                    continue
                objects[pod_name] = created
            if pod_name not in self.pods:
                await self._start_pod(sts, objects[pod_name], i)
        mine = {
            int(n.rpartition("-")[2]): n
            for n in objects
            if n.rpartition("-")[0] == name and n.rpartition("-")[2].isdigit()
        }
        grace = float(template["spec"].get("terminationGracePeriodSeconds", 30))
        for _, pod_name in sorted(((i, n) for i, n in mine.items() if i >= replicas), reverse=True):
            if pod_name not in self._deleting:  # the highest ordinal first
                self._deleting[pod_name] = asyncio.create_task(self._delete_pod(pod_name, grace))
        current = [objects[mine[i]] for i in sorted(mine) if i < replicas]
        revisions = {
            o["metadata"]["name"]: (o["metadata"].get("labels") or {}).get(REVISION_LABEL) for o in current
        }
        strategy = ((sts["spec"].get("updateStrategy") or {}).get("type")) or "RollingUpdate"
        if strategy == "RollingUpdate" and len(current) == replicas and not self._deleting:
            ready = all(self.pods.get(n) is not None and self.pods[n].ready for n in revisions)
            outdated = [n for n in revisions if revisions[n] != revision]
            if ready and outdated:  # one pod at a time, the highest ordinal first
                victim = max(outdated, key=lambda n: int(n.rpartition("-")[2]))
                self._deleting[victim] = asyncio.create_task(self._delete_pod(victim, grace))
        status = {
            "observedGeneration": int(sts["metadata"].get("generation") or 1),
            "replicas": len(current),
            "readyReplicas": sum(1 for n in revisions if self.pods.get(n) is not None and self.pods[n].ready),
            "updatedReplicas": sum(1 for r in revisions.values() if r == revision),
            "currentReplicas": sum(1 for r in revisions.values() if r == revision),
            "updateRevision": revision,
            "currentRevision": revision
            if all(r == revision for r in revisions.values())
            else ((sts.get("status") or {}).get("currentRevision") or revision),
        }
        if any((sts.get("status") or {}).get(k) != v for k, v in status.items()):
            with contextlib.suppress(Exception):
                path = api_path("apps/v1", "statefulsets", self.namespace, name, "status")
                await self.kube.patch(path, {"status": status})

    # ---- pods ------------------------------------------------------------------------------------

    async def _create_pod(
        self, sts: dict[str, Any], name: str, revision: str, existing: int
    ) -> dict[str, Any] | None:
        """The pod object (None: refused by the quota, a FailedCreate Event posted once)."""
        template = sts["spec"]["template"]
        if self.pod_quota is not None and existing >= self.pod_quota:
            if name not in self._failed_create:
                self._failed_create.add(name)
                await self._event(
                    sts,
                    "FailedCreate",
                    f"create Pod {name} in StatefulSet {sts['metadata']['name']} failed error: pods "
                    f'"{name}" is forbidden: exceeded quota: pods, requested: pods=1, used: '
                    f"pods={existing}, limited: pods={self.pod_quota}",
                )
            return None
        self._failed_create.discard(name)
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {
                    **((template.get("metadata") or {}).get("labels") or {}),
                    REVISION_LABEL: revision,
                },
                "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "StatefulSet",
                        "name": sts["metadata"]["name"],
                        "uid": sts["metadata"].get("uid", ""),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": template.get("spec") or {},
        }
        return await self.kube.create(api_path("v1", "pods", self.namespace), body) or body

    async def _event(self, sts: dict[str, Any], reason: str, message: str) -> None:
        meta = sts["metadata"]
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": self.namespace},
            "involvedObject": {
                "apiVersion": "apps/v1", "kind": "StatefulSet", "name": meta["name"],
                "namespace": self.namespace, "uid": meta.get("uid", ""),
            },
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": "statefulset-controller"},
            "firstTimestamp": _stamp(),
            "lastTimestamp": _stamp(),
            "count": 1,
        }  # fmt: skip
        with contextlib.suppress(Exception):
            await self.kube.create(api_path("v1", "events", self.namespace), event)

    def _blocked(self, spec: dict[str, Any]) -> str:
        """Step 7: why this pod's container cannot start ("" when it can)."""
        selector = spec.get("nodeSelector") or {}
        if any(self.node_labels.get(k) != v for k, v in selector.items()):
            return "Unschedulable"
        if (spec.get("containers") or [{}])[0].get("image") in self.unpullable_images:
            return "ErrImagePull"
        return ""

    async def _start_pod(self, sts: dict[str, Any], obj: dict[str, Any], ordinal: int) -> None:
        name = obj["metadata"]["name"]
        pod_spec = dict(obj.get("spec") or sts["spec"]["template"]["spec"])
        container = pod_spec["containers"][0]
        named = {str(p.get("name")): int(p["containerPort"]) for p in container.get("ports") or []}
        front = TlsFront(self._api_port(), self._cert, self._key)
        await front.start()
        pod_dir = self.root / "pods" / name
        if pod_dir.exists():  # a new pod of the same name: new emptyDirs
            for old in sorted(pod_dir.glob("emptydir-*")):
                shutil.rmtree(old, ignore_errors=True)
        pod_dir.mkdir(parents=True, exist_ok=True)
        pod = PodProcess(
            name=name,
            ordinal=ordinal,
            sts=sts["metadata"]["name"],
            dir=pod_dir,
            ports={port: free_port() for port in named.values()},
            named_ports=named,
            front=front,
            spec=pod_spec,
            revision=str((obj["metadata"].get("labels") or {}).get(REVISION_LABEL) or ""),
            blocked=self._blocked(pod_spec),
        )
        self.pods[name] = pod
        if not pod.blocked:
            await self._launch(pod, {"spec": pod_spec})

    def _api_port(self) -> int:
        return int(self.api_url.rsplit(":", 1)[1].split("/")[0])

    async def _report(self, pod: PodProcess, obj: dict[str, Any] | None) -> None:
        """Readiness probe (GET of the probe's path on its port) -> the pod's status, when it changed."""
        if obj is None:
            return
        ready = False
        if pod.running():
            container = (obj.get("spec") or {}).get("containers", [{}])[0]
            probe = (container.get("readinessProbe") or {}).get("httpGet") or {}
            port = probe.get("port", "control")
            try:
                host_port = pod.host_port(port if isinstance(port, str) else int(port))
                assert self._session is not None
                async with self._session.get(
                    f"http://127.0.0.1:{host_port}{probe.get('path', '/healthz')}",
                    timeout=aiohttp.ClientTimeout(total=2),
                ) as resp:
                    ready = resp.status == 200
            except (aiohttp.ClientError, TimeoutError, KeyError):
                ready = False
        pod.ready = ready
        status = KubeletDouble.pod_status(pod, ready)
        if status == pod.reported:
            return
        pod.reported = status
        stamp = _stamp()
        status = copy.deepcopy(status)
        for cond in status["conditions"]:
            cond["lastTransitionTime"] = stamp
        with contextlib.suppress(Exception):
            path = api_path("v1", "pods", self.namespace, pod.name, "status")
            await self.kube.patch(path, {"status": status})

    async def _delete_pod(self, name: str, grace_s: float) -> None:
        """Graceful deletion: deletionTimestamp, SIGTERM, SIGKILL after the grace period, object gone."""
        path = api_path("v1", "pods", self.namespace, name)
        try:
            stamp = _stamp()
            with contextlib.suppress(Exception):
                meta = {"deletionTimestamp": stamp, "deletionGracePeriodSeconds": int(grace_s)}
                await self.kube.patch(path, {"metadata": meta})
            pod = self.pods.get(name)
            if pod is not None:
                pod.terminating = True
                self._kill(pod, signal.SIGTERM)
                await self._reap(pod, min(grace_s, self.grace_cap_s))
                await pod.front.stop()
            with contextlib.suppress(Exception):
                await self.kube.delete(path)
            self.pods.pop(name, None)
            self.removed.append(name)
        finally:
            self._deleting.pop(name, None)

    async def _launch(self, pod: PodProcess, template: dict[str, Any]) -> None:
        await self.kubelet.launch(pod, template)

    @staticmethod
    def _kill(pod: PodProcess, sig: int) -> None:
        KubeletDouble.kill(pod, sig)

    async def _reap(self, pod: PodProcess, grace_s: float) -> None:
        await KubeletDouble.reap(pod, grace_s)

    # ---- the pod network -------------------------------------------------------------------------

    async def _route(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        pod = self.pods.get(request.match_info["pod"])
        if pod is None or request.match_info["namespace"] != self.namespace or not pod.running():
            return aiohttp.web.json_response({"error": "no route to pod"}, status=502)
        url = f"http://127.0.0.1:{pod.host_port('control')}/{request.match_info['tail']}"
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        assert self._session is not None
        try:
            async with self._session.request(
                request.method, url, data=await request.read(), headers=headers
            ) as resp:
                body = await resp.read()
                return aiohttp.web.Response(
                    status=resp.status, body=body, content_type=resp.content_type or "application/json"
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            return aiohttp.web.json_response({"error": f"pod unreachable: {exc}"}, status=502)
