"""``KubeletDouble``: the container side of the pod double -- a pod's ``multilane worker`` process,
its env, volumes and service account, and the pod status a kubelet reports. Does I/O (processes,
files, the emulated API server).

Steps 2, 3 and 5 of :mod:`multilane.testing.pods` (the StatefulSet controller there decides which
pods exist; this starts, stops and describes their containers):

1. Volumes: each ``volumeMount`` becomes a host directory (``secret`` items written out, and again
   when the Secret changes, :mod:`multilane.testing.pod_network`;
   ``emptyDir`` per pod, a claim per ordinal under ``ROOT/pvc/`` that outlives its pods).
2. Env: ``value``, ``fieldRef``, ``secretKeyRef`` and ``envFrom.secretRef`` (read from the API
   server); a value naming a mount path is rewritten to its host directory.
3. Service account: token, ``ca.crt`` and namespace in a per-pod directory; the API server through
   the pod's TLS front.
4. Command: ``$(VAR)`` expanded, container ports and mount paths in arguments rewritten, ``multilane``
   run as ``sys.executable -m multilane``; the process started in its own session.

Against a real kube-apiserver the pods run on :class:`multilane.testing.process_kubelet.ProcessKubelet`
instead (a registered Node, real bindings, tokens and claims, mount namespaces in place of the path
rewriting here; docs/real-cluster.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multilane.operator.k8s.kube import KubeClient, api_path
from multilane.testing.cluster import die_with_parent
from multilane.testing.pod_network import SecretVolume
from multilane.testing.pod_network import secret_data as _secret_data
from multilane.testing.tls_front import TlsFront

__all__ = ["KubeletDouble", "PodProcess"]

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.]*)\)")


@dataclass
class PodProcess:
    """One pod: its object's name and the (current) container process."""

    name: str
    ordinal: int
    sts: str
    dir: Path
    ports: dict[int, int]  # containerPort -> host port
    named_ports: dict[str, int]  # port name -> containerPort
    front: TlsFront
    proc: subprocess.Popen[bytes] | None = None
    pids: list[int] = field(default_factory=list)  # every incarnation, in order
    restarts: int = 0
    terminating: bool = False
    exited_at: float | None = None
    ready: bool | None = None
    started_at: float = 0.0
    spec: dict[str, Any] = field(default_factory=dict)  # the pod's own spec (the template it was made from)
    revision: str = ""  # its controller-revision-hash
    blocked: str = ""  # why no process is started: "ErrImagePull" or "Unschedulable" ("" = none)
    reported: dict[str, Any] | None = None  # the status last written
    secret_volumes: list[SecretVolume] = field(default_factory=list)  # refreshed while it runs

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def host_port(self, name_or_port: str | int) -> int:
        container = self.named_ports[name_or_port] if isinstance(name_or_port, str) else name_or_port
        return self.ports[container]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class KubeletDouble:
    """The containers of the pods of one namespace (see the module docstring)."""

    def __init__(self, kube: KubeClient, namespace: str, root: Path, cert: Path) -> None:
        self.kube = kube
        self.namespace = namespace
        self.root = root  # ROOT/pvc/: the claims' directories
        self._cert = cert  # the API server front's certificate (the service account's ca.crt)

    async def launch(self, pod: PodProcess, template: dict[str, Any]) -> None:
        """Start the pod's container from ``template`` (its spec), steps 1-4 of the module docstring."""
        spec = template["spec"]
        container = spec["containers"][0]
        # 1. volumes
        mounts = await self._volumes(pod, spec, container)
        # 2. env
        env = await self._env(pod, container)

        def rewrite(value: str) -> str:
            for mount, host in sorted(mounts.items(), key=lambda m: -len(m[0])):
                if value == mount or value.startswith(mount.rstrip("/") + "/"):
                    return host + value[len(mount) :]
            return value

        env = {k: mounts.get(v, v) for k, v in env.items()}  # only a value that names a mount itself
        # 3. The kubelet's service-account and API-server wiring (step 5 of pods' module docstring).
        sa_dir = pod.dir / "serviceaccount"
        sa_dir.mkdir(exist_ok=True)
        (sa_dir / "token").write_text(f"token-of-{pod.name}")
        (sa_dir / "ca.crt").write_text(self._cert.read_text())
        (sa_dir / "namespace").write_text(self.namespace)
        env.update(
            KUBERNETES_SERVICE_HOST="127.0.0.1",
            KUBERNETES_SERVICE_PORT=str(pod.front.port),
            MULTILANE_SERVICE_ACCOUNT_DIR=str(sa_dir),
        )
        # 4. command
        argv = [*container.get("command", []), *container.get("args", [])]
        argv = [_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), a) for a in argv]
        out: list[str] = []
        for i, arg in enumerate(argv):
            if i > 0 and argv[i - 1].startswith("--") and argv[i - 1].endswith("port") and arg.isdigit():
                arg = str(pod.ports.get(int(arg), int(arg)))
            out.append(rewrite(arg))
        if out and out[0] == "multilane":
            out = [sys.executable, "-m", "multilane", *out[1:]]
        base = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        log = (pod.dir / f"log-{pod.restarts:03d}").open("ab")
        pod.proc = subprocess.Popen(  # noqa: ASYNC220 (returns at once; the test's loop owns it)
            out, env={**base, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=str(pod.dir),
            # SIGKILL when the launching thread (the test's event loop) ends: a test process that
            # dies or is ended by a timeout leaves no pod process behind (its session is its own)
            preexec_fn=die_with_parent,
        )  # fmt: skip
        log.close()
        pod.pids.append(pod.proc.pid)
        pod.exited_at = None
        pod.ready = None
        pod.started_at = time.monotonic()

    async def _volumes(
        self, pod: PodProcess, spec: dict[str, Any], container: dict[str, Any]
    ) -> dict[str, str]:
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        mounts: dict[str, str] = {}
        for m in container.get("volumeMounts") or []:
            vol = volumes.get(m["name"])
            if vol is not None and "secret" in vol:
                host = pod.dir / f"secret-{m['name']}"
                volume = SecretVolume(
                    host, self.namespace, vol["secret"]["secretName"], vol["secret"].get("items"),
                    int(vol["secret"].get("defaultMode", 0o644)),
                )  # fmt: skip
                await volume.sync(self.kube)
                pod.secret_volumes = [v for v in pod.secret_volumes if v.host != host] + [volume]
            elif vol is not None and "emptyDir" in vol:
                host = pod.dir / f"emptydir-{m['name']}"
                host.mkdir(exist_ok=True)
            else:  # a claim of volumeClaimTemplates: outlives the pod
                host = self.root / "pvc" / f"{m['name']}-{pod.name}"
                host.mkdir(parents=True, exist_ok=True)
            mounts[m["mountPath"]] = str(host)
        return mounts

    async def _env(self, pod: PodProcess, container: dict[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        secrets: dict[str, dict[str, str]] = {}

        async def secret(name: str) -> dict[str, str]:
            if name not in secrets:
                obj = await self.kube.get(api_path("v1", "secrets", self.namespace, name))
                secrets[name] = {k: v.decode() for k, v in _secret_data(obj).items()}
            return secrets[name]

        for source in container.get("envFrom") or []:
            if "secretRef" in source:
                for k, v in (await secret(source["secretRef"]["name"])).items():
                    env[source.get("prefix", "") + k] = v
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), str(item["value"]))
                continue
            ref = item.get("valueFrom") or {}
            if "fieldRef" in ref:
                path = ref["fieldRef"]["fieldPath"]
                env[item["name"]] = {"metadata.name": pod.name, "metadata.namespace": self.namespace,
                                      "status.podIP": "127.0.0.1"}[path]  # fmt: skip
            elif "secretKeyRef" in ref:
                key = ref["secretKeyRef"]
                env[item["name"]] = (await secret(key["name"]))[key["key"]]
        return env

    @staticmethod
    def pod_status(pod: PodProcess, ready: bool) -> dict[str, Any]:
        """The pod's status as a kubelet (and, for Unschedulable, the scheduler) reports it."""
        container: dict[str, Any] = {"name": "worker", "ready": ready, "restartCount": pod.restarts}
        conditions: list[dict[str, Any]] = []
        if pod.blocked == "Unschedulable":
            message = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
            conditions.append(
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            )
            return {"phase": "Pending", "conditions": conditions}
        conditions.append({"type": "PodScheduled", "status": "True"})
        if pod.blocked:  # a pull failure: ErrImagePull first, then the back-off
            reason = "ErrImagePull" if pod.reported is None else "ImagePullBackOff"
            image = (pod.spec.get("containers") or [{}])[0].get("image")
            container["state"] = {
                "waiting": {"reason": reason, "message": f'Back-off pulling image "{image}"'}
            }
            container["started"] = False
        else:
            container["started"] = pod.running()
            container["state"] = (
                {"running": {}} if pod.running() else {"waiting": {"reason": "ContainerCreating"}}
            )
        conditions.append({"type": "Ready", "status": "True" if ready else "False"})
        return {
            "phase": "Running" if pod.running() else "Pending",
            "podIP": "127.0.0.1",
            "conditions": conditions,
            "containerStatuses": [container],
        }

    @staticmethod
    def kill(pod: PodProcess, sig: int) -> None:
        if pod.proc is not None and pod.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pod.proc.pid, sig)

    @staticmethod
    async def reap(pod: PodProcess, grace_s: float) -> None:
        if pod.proc is None:
            return
        deadline = time.monotonic() + grace_s
        while pod.proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 (a process)
            await asyncio.sleep(0.1)
        if pod.proc.poll() is None:
            KubeletDouble.kill(pod, signal.SIGKILL)
            await asyncio.to_thread(pod.proc.wait)
