"""The local control plane: workers as subprocesses on 127.0.0.1, driven by the operator's own
``ConsumerController`` and ``HandoffExecutor``. Does I/O (processes, files, HTTP, Kafka via workers).

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
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from multilane.operator.assignment import AssignmentState
from multilane.operator.children import ConsumerRef
from multilane.operator.controller import ConsumerController, DecidingPolicy, TickResult
from multilane.operator.handoff import (
    HandoffConfig,
    HandoffControlClient,
    HandoffExecutor,
    HandoffRecord,
)
from multilane.operator.kafka_admin import KafkaAdminClient, KafkaUnavailableError
from multilane.operator.metrics import OperatorMetrics
from multilane.operator.planner import format_partition
from multilane.operator.platform import WorkerInfo
from multilane.operator.policy import PolicyConfig, PolicyState
from multilane.operator.rollout import Rollout
from multilane.operator.sources import MetricSample, MetricsUnavailableError, QueryContext
from multilane.operator.validation import ConsumerSpec
from multilane.operator.workers import ReleasedPartition, WorkerUnreachableError

__all__ = [
    "LocalControlPlane",
    "LocalPlatform",
    "LocalWorkerControl",
    "LocalWorkerTemplate",
    "WorkerStatusSource",
    "write_json_atomic",
]

log = logging.getLogger(__name__)

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
        self, base_url: str, generation: int, partitions: Iterable[str], release_deadline_s: float
    ) -> list[ReleasedPartition]:
        client = self._client(base_url, slow=True)
        return await client.assign(base_url, generation, partitions, release_deadline_s)

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
    """Metric source over the workers' ``/v1/status`` (see the module docstring).

    Invariants: ``_lag``/``_hwm`` keep the last value seen per partition (a partition in transit
    between owners keeps its last lag); rates come from consecutive samples of this source.
    """

    def __init__(
        self,
        platform: LocalPlatform,
        control: LocalWorkerControl,
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
        replicas = int((self.status.get("lastDecision") or {}).get("replicas") or self.platform.replicas or 0)
        await self.platform.ensure_workers(self.ref, max(replicas, self.spec.min_replicas))

    async def tick(self) -> TickReport:
        """One pass (steps 1-2).

        1. ``ConsumerController.tick`` -- the same pass as on Kubernetes: scaling decision when due,
           scale-up, the ``HandoffExecutor``'s placements and restore-before-handoff rollout over the
           workers that stay, sync and factor, scale-down once the leaving workers own nothing,
           status and conditions.
        2. Persist the status.
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
            self.ref.namespace, self.ref.name, result, self.spec.replicas or self.spec.max_replicas,
            self.spec.max_factor,
        )
        self.status.update(result.status)
        if result.policy_state is not None:
            self.policy_state = result.policy_state
        events = [(e.type, e.reason, e.message) for e in result.events]
        handoffs = self.executor.completed[done_before:] if self.executor is not None else []
        # 2.
        self.save()
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
        self.metrics.stop()
        await self.control.close()
        self.admin.close()
        await self.platform.close(stop_workers=stop_workers)
