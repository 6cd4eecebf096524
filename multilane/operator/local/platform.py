"""The local platform: ``multilane worker`` subprocesses on 127.0.0.1 standing in for a StatefulSet's
pods. Does I/O (processes, files, HTTP health checks).

- :class:`LocalPlatform` implements :class:`~multilane.operator.platform.Platform`: worker ``NAME-i``
  runs ``python -m multilane worker --assign ... --control-port P --metrics-port P
  --control-token-file F --state-dir D``, each with its own random token (file mode 0600) and ports.
  The registry (name, PID, ports, token file) is persisted in ``ROOT/workers.json``, so a restarted
  control plane adopts running workers by PID. Like a StatefulSet it restarts workers that died.
- Liveness, fencing like Kubernetes' Leases: a worker is *alive* while its process runs, it printed
  its ready line, and its ``/healthz`` answered within ``lease_s`` (the lease-equivalent heartbeat).
  A worker whose heartbeat expired is SIGKILLed by PID before it is reported dead, so "known dead"
  always means "cannot process any more": a partition goes to a new owner only after the old owner
  released it or is dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.workers import WorkerUnreachableError
from multilane.operator.spec.children import ConsumerRef

__all__ = ["READY_RE", "LocalPlatform", "LocalWorkerTemplate", "write_json_atomic"]

log = logging.getLogger("multilane.operator.local.plane")


READY_RE = re.compile(r"multilane-worker ready worker_id=(\S*) control_port=(\d+) metrics_port=(\d+)")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temp file + fsync + rename). Does file I/O."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LocalWorkerTemplate:
    """How every local worker runs (the pod template of the local platform)."""

    bootstrap_servers: str
    group: str
    processor: str
    ordering: str = "key"
    factor: int = 1
    state: bool = True
    commit_interval_ms: int = 500
    drain_timeout_s: float = 10.0
    consumer_config: Mapping[str, str] = field(default_factory=dict)
    extra_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def argv(
        self, name: str, control_port: int, metrics_port: int, token_file: Path, state_dir: Path
    ) -> list[str]:
        a = [
            sys.executable, "-m", "multilane", "worker",
            "--bootstrap-servers", self.bootstrap_servers,
            "--group", self.group,
            "--processor", self.processor,
            "--ordering", self.ordering,
            "--factor", str(self.factor),
            "--assign", "",
            "--worker-id", name,
            "--commit-interval-ms", str(self.commit_interval_ms),
            "--drain-timeout-s", str(self.drain_timeout_s),
            "--control-port", str(control_port),
            "--metrics-port", str(metrics_port),
            "--control-token-file", str(token_file),
        ]  # fmt: skip
        if self.state:
            a += ["--state-dir", str(state_dir)]
        for k, v in self.consumer_config.items():
            a += ["--consumer-config", f"{k}={v}"]
        return a + list(self.extra_args)


@dataclass
class _WorkerRecord:
    """One worker in the registry. Invariant: ``pid`` is the process started for this incarnation;
    ``control_port``/``metrics_port`` are the ports it was told to bind."""

    name: str
    ordinal: int
    pid: int
    control_port: int
    metrics_port: int
    token_file: str
    workdir: str
    started_at: float
    last_heartbeat: float = 0.0  # wall time of the last /healthz answer (not persisted meaningfully)
    restarts: int = 0


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (zombies of our own children are reaped and count as dead)."""
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class LocalPlatform:
    """Workers as subprocesses; see the module docstring. ``root``: registry, tokens, logs, state."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        template: LocalWorkerTemplate,
        name: str = "local",
        lease_s: float = 6.0,
        stop_grace_s: float = 30.0,
        restart: bool = True,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.template = template
        self.name = name
        self.lease_s = lease_s
        self.stop_grace_s = stop_grace_s
        self.restart = restart
        self.replicas = 0
        self._workers: dict[str, _WorkerRecord] = {}
        self._stopping: dict[str, asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self.on_fence: Callable[[str], None] | None = None  # called with the name of a fenced worker
        self._load()

    # -- registry --------------------------------------------------------------------------------------

    @property
    def _registry(self) -> Path:
        return self.root / "workers.json"

    def _load(self) -> None:
        if not self._registry.exists():
            return
        data = json.loads(self._registry.read_text())
        self.replicas = int(data.get("replicas", 0))
        for w in data.get("workers", []):
            rec = _WorkerRecord(**w)
            rec.last_heartbeat = time.time()  # adopted: give it one lease to answer
            self._workers[rec.name] = rec
        log.info("adopted %d worker(s) from %s", len(self._workers), self._registry)

    def _save(self) -> None:
        write_json_atomic(
            self._registry,
            {"replicas": self.replicas, "workers": [asdict(w) for w in self._workers.values()]},
        )

    def worker_name(self, ordinal: int) -> str:
        return f"{self.name}-{ordinal}"

    def token_for(self, control_url: str) -> str:
        """The control token of the worker behind ``control_url`` (reads its token file)."""
        for w in self._workers.values():
            if control_url == self._url(w):
                return Path(w.token_file).read_text().strip()
        raise WorkerUnreachableError(f"{control_url}: no such local worker")

    @staticmethod
    def _url(w: _WorkerRecord) -> str:
        return f"http://127.0.0.1:{w.control_port}"

    def pid_of(self, name: str) -> int:
        return self._workers[name].pid

    def workers(self) -> dict[str, int]:
        """Name -> PID of every registered worker (tests, the demo)."""
        return {n: w.pid for n, w in self._workers.items()}

    def metrics_ports(self) -> dict[str, int]:
        """Name -> metrics port of every registered worker (Prometheus scrape targets)."""
        return {n: w.metrics_port for n, w in self._workers.items()}

    # -- processes -------------------------------------------------------------------------------------

    def _spawn(self, ordinal: int, restarts: int = 0) -> _WorkerRecord:
        """Start worker ``ordinal`` (steps 1-3). 1. Token file (0600). 2. Ports. 3. Spawn with stdout and
        stderr to files in its workdir (the ready line is read from the stdout file)."""
        name = self.worker_name(ordinal)
        workdir = self.root / name
        workdir.mkdir(parents=True, exist_ok=True)
        # 1.
        token_file = workdir / "control-token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
        os.chmod(token_file, 0o600)
        # 2.
        control_port, metrics_port = _free_port(), _free_port()
        # 3.
        argv = self.template.argv(name, control_port, metrics_port, token_file, workdir / "state")
        env = dict(os.environ)
        env.update(self.template.env)
        with open(workdir / "stdout.log", "wb") as out, open(workdir / "stderr.log", "ab") as err:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        rec = _WorkerRecord(
            name=name,
            ordinal=ordinal,
            pid=proc.pid,
            control_port=control_port,
            metrics_port=metrics_port,
            token_file=str(token_file),
            workdir=str(workdir),
            started_at=time.time(),
            last_heartbeat=time.time(),
            restarts=restarts,
        )
        self._workers[name] = rec
        self._save()
        log.info("started %s (pid %d, control port %d)", name, proc.pid, control_port)
        return rec

    def _ready(self, w: _WorkerRecord) -> bool:
        try:
            text = (Path(w.workdir) / "stdout.log").read_text(errors="replace")
        except OSError:
            return False
        m = READY_RE.search(text)
        return m is not None and int(m.group(2)) == w.control_port

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the worker by PID (tests, fencing)."""
        w = self._workers.get(name)
        if w is not None and _pid_alive(w.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, sig)

    async def _stop(self, w: _WorkerRecord) -> None:
        """SIGTERM (drain + final commit), SIGKILL after ``stop_grace_s``."""
        self.kill(w.name, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        while _pid_alive(w.pid) and time.monotonic() < deadline:  # noqa: ASYNC110 - another process
            await asyncio.sleep(0.1)
        self.kill(w.name, signal.SIGKILL)

    # -- Platform --------------------------------------------------------------------------------------

    async def ensure_workers(self, ref: ConsumerRef, replicas: int) -> None:
        """Run ordinals ``0 .. replicas-1``: start the missing ones, stop (by PID) the others."""
        self.replicas = replicas
        for ordinal in range(replicas):
            name = self.worker_name(ordinal)
            w = self._workers.get(name)
            if w is None or (not _pid_alive(w.pid) and name not in self._stopping):
                self._spawn(ordinal, restarts=0 if w is None else w.restarts + 1)
        for name, w in list(self._workers.items()):
            if w.ordinal >= replicas and name not in self._stopping:
                self._stopping[name] = asyncio.create_task(self._stop(w))
        self._save()

    async def current_workers(self, ref: ConsumerRef) -> int:
        return self.replicas

    async def list_workers(self, ref: ConsumerRef) -> list[WorkerInfo]:
        """Every registered worker with liveness (steps 1-4).

        1. Reap stopped workers of removed ordinals (they leave the list once their process ended).
        2. Restart dead workers of wanted ordinals (StatefulSet behaviour); the new incarnation is not
           alive until it printed its ready line.
        3. Heartbeat: ``/healthz`` of every running, ready worker.
        4. A worker whose heartbeat is older than ``lease_s`` is SIGKILLed (fenced), then reported dead.
        """
        now = time.time()
        # 1.
        for name, task in list(self._stopping.items()):
            if task.done():
                del self._stopping[name]
                w = self._workers.get(name)
                if w is not None and w.ordinal >= self.replicas and not _pid_alive(w.pid):
                    del self._workers[name]
                    self._save()
        # 2.
        if self.restart:
            for w in list(self._workers.values()):
                if w.ordinal < self.replicas and not _pid_alive(w.pid) and w.name not in self._stopping:
                    log.warning("%s (pid %d) died; restarting it", w.name, w.pid)
                    self._spawn(w.ordinal, restarts=w.restarts + 1)
        # 3.
        records = sorted(self._workers.values(), key=lambda w: w.ordinal)
        running = [w for w in records if _pid_alive(w.pid) and self._ready(w)]
        beats = await asyncio.gather(*(self._healthz(w) for w in running))
        for w, ok in zip(running, beats, strict=True):
            if ok:
                w.last_heartbeat = now
        out = []
        for w in records:
            alive, reason = _pid_alive(w.pid), ""
            if not alive:
                reason = "process ended"
            elif not self._ready(w):
                alive, reason = False, "starting"
            elif now - w.last_heartbeat > self.lease_s:
                # 4. fence before declaring it dead
                log.error("%s: no heartbeat for %.1fs; killing pid %d", w.name, now - w.last_heartbeat, w.pid)
                self.kill(w.name)
                if self.on_fence is not None:
                    self.on_fence(w.name)
                alive, reason = False, "heartbeat expired (killed)"
            out.append(
                WorkerInfo(
                    name=w.name,
                    ordinal=w.ordinal,
                    alive=alive,
                    control_url=self._url(w),
                    terminating=w.name in self._stopping or w.ordinal >= self.replicas,
                    reason=reason,
                )
            )
        return out

    async def _healthz(self, w: _WorkerRecord) -> bool:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0))
        try:
            async with self._session.get(f"{self._url(w)}/healthz") as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def close(self, stop_workers: bool = True) -> None:
        """Stop every worker (SIGTERM, then SIGKILL) unless ``stop_workers`` is False; close HTTP."""
        if stop_workers:
            await asyncio.gather(*(self._stop(w) for w in self._workers.values()))
            for task in self._stopping.values():
                task.cancel()
            self.replicas = 0
            self._workers.clear()
            self._save()
        if self._session is not None:
            await self._session.close()
            self._session = None
