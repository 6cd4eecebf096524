"""One pod of the process kubelet on a real kube-apiserver: its volumes as directories
(:mod:`multilane.testing.kubelet_volumes`), its containers as local processes, its probes, restarts
and status. Does I/O (processes, files, API calls as the node).

:class:`PodWorker` follows the kubelet's steps:

1. Volumes (``start``), each a directory under ``DIR/volumes``: ``emptyDir``; ``secret`` and
   ``configMap`` (items, ``defaultMode``; a missing non-optional object keeps the pod Pending);
   ``downwardAPI``; ``projected`` (those three, plus ``serviceAccountToken``: a TokenRequest bound to
   the pod, renewed at 80 % of its life); ``persistentVolumeClaim`` (the bound PV's ``hostPath`` or
   ``local`` directory). Files are owned by ``runAsUser``/``fsGroup`` when the kubelet is root.
2. Env, per container: ``KUBERNETES_SERVICE_HOST``/``PORT`` (the API server on loopback), then
   ``envFrom`` (Secret, ConfigMap), then ``env`` (``value`` with ``$(VAR)``, ``fieldRef``,
   ``resourceFieldRef``, ``secretKeyRef``, ``configMapKeyRef``). The "image" is this machine: ``PATH``
   is the host's, with the running Python's directory first.
3. Containers (``tick``): each process runs in its own mount namespace (``unshare``) where every
   ``volumeMount`` is bind-mounted at its ``mountPath`` (``subPath``, ``readOnly``), so paths in the
   spec work unchanged; as root, then ``setpriv`` to ``runAsUser``/``runAsGroup`` (65534 when only
   ``runAsNonRoot`` is set: the host has no image user). ``command`` + ``args`` with ``$(VAR)``
   expanded; without ``command``, the image's entrypoint from ``entrypoints`` (image repository ->
   argv, the test bed's stand-in for an image's ``ENTRYPOINT``). The node's hosts file (when given)
   is bind-mounted read-only at ``/etc/hosts``: the pods' DNS names (see ``ProcessKubelet``).
   stdout and stderr in ``DIR/logs/CONTAINER-N.log``.
4. Probes: startup, then readiness and liveness (:mod:`multilane.testing.kubelet_probes`); a failed
   liveness or startup probe restarts the container.
5. Restarts by ``restartPolicy`` (``Always``, ``OnFailure``, ``Never``) with the kubelet's back-off
   (``backoff_s`` doubling to 300 s), shown as ``CrashLoopBackOff``.
6. Delete (``terminate``): SIGTERM to each container's process, SIGKILL to its process group after
   the pod's ``deletionGracePeriodSeconds``.
7. Status (``status``): phase, conditions, IPs, ``startTime``, ``containerStatuses``.

Mount points are created on the host as empty directories (a bind mount needs one). Init containers,
lifecycle hooks, ``hostPath`` volumes and resource limits are not applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multilane.operator.k8s.kube import KubeClient, KubeError
from multilane.testing.child_process import die_with_parent
from multilane.testing.kubelet_node import now_rfc3339
from multilane.testing.kubelet_probes import ProbeState, run_probe
from multilane.testing.kubelet_volumes import PodFiles, VolumeError, expand, run_as

__all__ = ["ContainerRun", "PodWorker", "image_repository", "mount_order"]

# argv: WORKDIR HIDDEN KEEP STASH (SOURCE TARGET rw|ro)... -- COMMAND...; run by `sh -c` in the new
# mount namespace. HIDDEN (when set) is a directory other users cannot cross that holds KEEP (this
# Python's installation, e.g. under /root): an empty tmpfs covers HIDDEN and KEEP is mounted back
# inside it, so a container running as runAsUser can start the interpreter.
_MOUNT_SCRIPT = (
    'set -e\nwd="$1"; hidden="$2"; keep="$3"; stash="$4"; shift 4\n'
    'if [ -n "$hidden" ]; then mkdir -p "$stash"; mount --bind "$keep" "$stash"; '
    'mount -t tmpfs -o mode=0755 tmpfs "$hidden"; mkdir -p "$keep"; mount --bind "$stash" "$keep"; fi\n'
    'while [ "$1" != "--" ]; do if [ -f "$1" ]; then [ -e "$2" ] || : >"$2"; else mkdir -p "$2"; fi; '
    'mount --bind "$1" "$2"; '
    'if [ "$3" = ro ]; then mount -o remount,bind,ro "$2"; fi; shift 3; done; shift\n'
    'if [ -n "$wd" ]; then cd "$wd"; fi\nexec "$@"'
)


def image_repository(image: str) -> str:
    """``REGISTRY/REPO`` of an image reference: without its ``@digest`` and ``:tag`` (a ``:`` in the
    registry's host:port is kept)."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def mount_order(binds: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """``binds`` (source, target, mode) in the order to mount them: a target that covers another
    bind's source (an emptyDir at ``/tmp`` while the kubelet's directories are under ``/tmp``) would
    hide that source once mounted, so it goes after the others, together with every target nested in
    it (kept in their order: a parent before its children)."""

    def under(path: str, parent: str) -> bool:
        return path == parent or path.startswith(parent.rstrip("/") + "/")

    covering = [t for _, t, _ in binds if any(under(s, t) for s, _, _ in binds)]
    return sorted(binds, key=lambda b: any(under(b[1], t) for t in covering))


def _hidden_python() -> tuple[str, str]:
    """(the first directory above this Python's installation that others cannot cross, the
    installation), or ("", "") when every user can reach it."""
    keep = Path(sys.base_prefix).resolve()
    for parent in reversed(keep.parents):
        if parent != Path("/") and not parent.stat().st_mode & 0o001:
            return str(parent), str(keep)
    return "", ""


@dataclass
class ContainerRun:
    """One container: its current process and its history (restarts, last termination)."""

    spec: dict[str, Any]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: str = ""
    started_mono: float = 0.0
    last_state: dict[str, Any] = field(default_factory=dict)
    backoff_until: float = 0.0
    waiting_reason: str = "ContainerCreating"
    done: bool = False  # exited and not to be restarted
    exit_code: int | None = None
    probes: dict[str, ProbeState] = field(default_factory=dict)  # kind -> state, this incarnation
    env: dict[str, str] = field(default_factory=dict)  # this incarnation's environment

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        if not self.running():
            return False
        startup = self.probes.get("startup")
        if startup is not None and not startup.ok:
            return False
        readiness = self.probes.get("readiness")
        return readiness.ok if readiness is not None else True


class PodWorker:
    """One pod bound to this node (see the module docstring).

    Invariants: ``containers`` follows ``spec.containers``' order; ``terminating`` never goes back to
    False; a container is started only after every volume exists.
    """

    def __init__(
        self,
        kube: KubeClient,
        pod: dict[str, Any],
        dir: Path,
        pod_ip: str,
        api_port: int,
        backoff_s: float = 10.0,
        entrypoints: Mapping[str, Sequence[str]] | None = None,
        hosts_file: Path | None = None,
    ) -> None:
        self.kube = kube
        self.entrypoints = dict(entrypoints or {})
        self.hosts_file = hosts_file
        self.pod = pod
        self.dir = dir
        self.pod_ip = pod_ip
        self.api_port = api_port
        self.backoff_s = backoff_s
        self.uid = str(pod["metadata"]["uid"])
        self.namespace = str(pod["metadata"]["namespace"])
        self.name = str(pod["metadata"]["name"])
        self.spec: dict[str, Any] = pod["spec"]
        self.containers = [ContainerRun(c) for c in self.spec["containers"]]
        self.start_time = now_rfc3339()
        self.terminating = False
        self._transitions: dict[str, tuple[str, str]] = {}  # condition -> (status, since)
        self.files = PodFiles(kube, pod, dir, pod_ip, api_port)  # steps 1 and 2
        self._kills: set[asyncio.Future[None]] = set()  # containers being stopped after a failed probe

    # -- 3. containers -----------------------------------------------------------------------------

    def exec_prefix(self, run: ContainerRun) -> list[str]:
        """How a probe's command enters ``run``'s mount namespace (and user)."""
        if run.proc is None or os.geteuid() != 0:
            return []
        prefix = ["nsenter", f"--target={run.proc.pid}", "--mount", "--"]
        user = run_as(self.spec, run.spec)
        if user:
            prefix += ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", "--"]
        return prefix

    async def start_container(self, run: ContainerRun) -> None:
        c = run.spec
        env = run.env = await self.files.env(c)
        command = c.get("command") or self.entrypoints.get(image_repository(str(c.get("image", ""))))
        if not command:
            raise VolumeError(
                f"container {c['name']}: no command, and no entrypoint for image {c.get('image')!r}"
                " (this kubelet runs no images)"
            )
        # $(VAR) is expanded in the spec's command and args, never in the image's entrypoint
        spec_command = [expand(a, env) for a in c.get("command") or []]
        argv = [*(spec_command or command), *(expand(a, env) for a in c.get("args") or [])]
        binds: list[tuple[str, str, str]] = []  # (source, target, rw|ro)
        if self.hosts_file is not None:
            binds.append((str(self.hosts_file), "/etc/hosts", "ro"))
        for m in c.get("volumeMounts") or []:
            src = self.files.volumes[m["name"]] / m.get("subPath", "")
            if not src.exists():
                src.mkdir(parents=True)
            binds.append((str(src), m["mountPath"], "ro" if m.get("readOnly") else "rw"))
        mounts = [item for bind in mount_order(binds) for item in bind]
        root = os.geteuid() == 0
        wrapper = (
            ["unshare", "--mount", "--propagation=private"]
            if root
            else ["unshare", "--user", "--map-root-user", "--mount", "--propagation=private"]
        )
        user = run_as(self.spec, c) if root else None
        hidden, keep = _hidden_python() if user else ("", "")
        stash = str(self.dir / "python") if hidden else ""
        wrapper += [
            "sh",
            "-c",
            _MOUNT_SCRIPT,
            "mount",
            c.get("workingDir", ""),
            hidden,
            keep,
            stash,
            *mounts,
            "--",
        ]
        if user:
            fs_group = self.files.fs_group
            groups = f"--groups={fs_group}" if fs_group is not None else "--clear-groups"
            wrapper += ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", groups, "--"]
        logs = self.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = (logs / f"{c['name']}-{run.restarts}.log").open("ab")
        with log:
            run.proc = subprocess.Popen(  # noqa: ASYNC220 (returns at once)
                [*wrapper, *argv],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=str(self.dir),
                preexec_fn=die_with_parent,
            )
        run.started_at, run.started_mono = now_rfc3339(), time.monotonic()
        run.waiting_reason = ""
        run.probes = {
            kind: ProbeState(c[f"{kind}Probe"], run.started_mono)
            for kind in ("startup", "readiness", "liveness")
            if c.get(f"{kind}Probe")
        }

    async def tick(self, now: float) -> None:
        """Steps 3-5: start what is due, notice exits, restart by policy, run due probes."""
        if self.terminating:
            return
        if not await self.files.prepare_volumes():
            return
        await self.files.renew_tokens(now)
        await self.files.refresh(now)
        policy = self.spec.get("restartPolicy", "Always")
        for run in self.containers:
            if run.proc is not None and not run.running() and not run.done:
                self._exited(run, policy, now)
            if run.proc is None and not run.done and now >= run.backoff_until:
                try:
                    await self.start_container(run)
                except (VolumeError, KubeError) as exc:
                    run.waiting_reason = "CreateContainerConfigError"
                    self.files.volume_error = str(exc)
            if run.running():
                await self._probe(run, now)

    def _exited(self, run: ContainerRun, policy: str, now: float) -> None:
        assert run.proc is not None
        code = run.proc.returncode
        code = 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a container runtime says
        run.exit_code = code
        run.last_state = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": run.started_at,
                "finishedAt": now_rfc3339(),
                "containerID": f"process://{run.proc.pid}",
            }
        }
        run.proc = None
        run.probes = {}
        if policy == "Never" or (policy == "OnFailure" and code == 0):
            run.done = True
            return
        ran_s = now - run.started_mono
        delay = 0.0 if ran_s > 600 else min(300.0, self.backoff_s * 2 ** min(run.restarts, 10))
        run.backoff_until = now + delay
        run.restarts += 1
        run.waiting_reason = "CrashLoopBackOff"

    async def _probe(self, run: ContainerRun, now: float) -> None:
        named = {p["name"]: int(p["containerPort"]) for p in run.spec.get("ports") or [] if p.get("name")}
        startup = run.probes.get("startup")
        kinds = ["startup"] if startup is not None and not startup.ok else ["readiness", "liveness"]
        for kind in kinds:
            state = run.probes.get(kind)
            if state is None or not state.due(now):
                continue
            state.running = True
            try:
                ok, why = await run_probe(state.probe, self.pod_ip, named, self.exec_prefix(run), run.env)
            finally:
                state.running = False
            state.record(time.monotonic(), ok, why)
            if kind in ("liveness", "startup") and state.failed:
                # the next tick sees the exit and restarts by policy; no more probes for this one
                run.probes = {}
                grace = float(self.spec.get("terminationGracePeriodSeconds", 30))
                kill = asyncio.ensure_future(self._kill(run, grace))
                self._kills.add(kill)
                kill.add_done_callback(self._kills.discard)
                return

    async def _kill(self, run: ContainerRun, grace_s: float) -> None:
        """A failed liveness or startup probe: SIGTERM, SIGKILL after the grace period."""
        proc = run.proc
        self.signal(run, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while proc is not None and proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        if proc is not None and proc is run.proc:
            self.signal(run, signal.SIGKILL)

    # -- 6. delete ---------------------------------------------------------------------------------

    @staticmethod
    def signal(run: ContainerRun, sig: int) -> None:
        if run.proc is None or run.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if sig == signal.SIGKILL:
                os.killpg(run.proc.pid, sig)  # the container's every process, as its cgroup would
            else:
                os.kill(run.proc.pid, sig)

    async def terminate(self, grace_s: float) -> None:
        """SIGTERM to every container, SIGKILL to what still runs after ``grace_s``."""
        self.terminating = True
        for run in self.containers:
            self.signal(run, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(r.running() for r in self.containers) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        for run in self.containers:
            self.signal(run, signal.SIGKILL)
            if run.proc is not None:
                await asyncio.to_thread(run.proc.wait)
                self._exited(run, "Never", time.monotonic())

    # -- 7. status ---------------------------------------------------------------------------------

    def _condition(self, kind: str, ok: bool, reason: str = "") -> dict[str, Any]:
        status = "True" if ok else "False"
        old = self._transitions.get(kind)
        since = old[1] if old and old[0] == status else now_rfc3339()
        self._transitions[kind] = (status, since)
        out = {"type": kind, "status": status, "lastTransitionTime": since, "lastProbeTime": None}
        if reason:
            out["reason"] = reason
        return out

    def status(self) -> dict[str, Any]:
        statuses = []
        for run in self.containers:
            if run.running():
                assert run.proc is not None
                state: dict[str, Any] = {"running": {"startedAt": run.started_at}}
            elif run.done:
                state = run.last_state
            else:
                waiting = {"reason": run.waiting_reason or "ContainerCreating"}
                if run.waiting_reason == "CrashLoopBackOff":
                    waiting["message"] = f"back-off restarting failed container={run.name} pod={self.name}"
                elif self.files.volume_error:
                    waiting["message"] = self.files.volume_error
                state = {"waiting": waiting}
            statuses.append(
                {
                    "name": run.name,
                    "image": run.spec.get("image", ""),
                    "imageID": f"process://{run.spec.get('image', '')}",
                    **({"containerID": f"process://{run.proc.pid}"} if run.proc is not None else {}),
                    "ready": run.ready(),
                    "started": run.running(),
                    "restartCount": run.restarts,
                    "state": state,
                    "lastState": run.last_state if not run.done else {},
                }
            )
        done = all(r.done for r in self.containers)
        phase = "Pending"
        if done:
            phase = "Succeeded" if all(r.exit_code == 0 for r in self.containers) else "Failed"
        elif any(r.running() or r.restarts for r in self.containers):
            phase = "Running"
        ready = not done and all(r.ready() for r in self.containers)
        volume_error = self.files.volume_error
        not_ready = "" if ready else ("PodCompleted" if done else "ContainersNotReady")
        return {
            "phase": phase,
            "conditions": [
                self._condition("PodReadyToStartContainers", not volume_error or phase != "Pending"),
                self._condition("Initialized", True),
                self._condition("ContainersReady", ready, not_ready),
                self._condition("Ready", ready, not_ready),
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": self.start_time,
                },
            ],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "startTime": self.start_time,
            "containerStatuses": statuses,
        }
