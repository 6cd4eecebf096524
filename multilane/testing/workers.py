"""Run ``multilane worker`` processes from tests: start, wait ready, read metrics/status, kill.

Does I/O: spawns processes, reads their stdout, talks HTTP to their control and metrics ports, reads
``/proc``.

A :class:`WorkerProcess` runs ``python -m multilane worker`` with the test processors of
:mod:`multilane.testing.processors` (configured through the environment), its own metrics and control
ports and a control token file. :meth:`WorkerProcess.kill` SIGKILLs it and appends a ``kill`` marker
to the event log, so the checkers know where its open attempts ended.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from multilane.testing.broker import free_port
from multilane.testing.processors import append_kill_marker

__all__ = [
    "WorkerError",
    "WorkerProcess",
    "WorkerSpec",
    "parse_prometheus_text",
    "rss_kib",
    "wait_until",
]

READY_RE = re.compile(r"^multilane-worker ready worker_id=(\S*) control_port=(\d+) metrics_port=(\d+)")
T = TypeVar("T")

# Consumer settings that make the embedded broker's group joins fast (see FACTS: joins wait
# session.timeout.ms / 2) and heartbeats frequent enough for that session timeout.
FAST_GROUP_CONFIG: dict[str, str] = {"session.timeout.ms": "2000", "heartbeat.interval.ms": "500"}


class WorkerError(RuntimeError):
    """A worker process did not start, did not become ready, or answered unexpectedly."""


def wait_until(cond: Callable[[], T], timeout: float, interval: float = 0.1, what: str = "condition") -> T:
    """Poll ``cond`` until it returns something truthy; TimeoutError naming ``what`` after ``timeout``.

    Other exceptions from ``cond`` count as "not yet" (the last one is named in the TimeoutError),
    except AssertionError, which propagates at once.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = cond()
            if value:
                return value
        except AssertionError:
            raise  # a condition that found a real failure ends the wait at once
        except Exception as exc:  # conditions may fail transiently (HTTP not up yet, ...)
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise TimeoutError(f"{what} not reached within {timeout:.0f}s{detail}")
        time.sleep(interval)


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB, from ``/proc/PID/status`` (VmRSS)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise WorkerError(f"no VmRSS in /proc/{pid}/status")


def parse_prometheus_text(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by name: ``{name: [(labels, value), ...]}`` (histogram/counter sample names as exposed)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


@dataclass
class WorkerSpec:
    """How to run one worker. ``topics`` = standalone mode; ``assign`` ("T:P,...") = operator mode."""

    bootstrap: str
    group: str
    topics: Sequence[str] = ()
    assign: str | None = None
    processor: str = "multilane.testing.processors:logging_async"
    ordering: str = "key"
    factor: int = 8
    max_in_flight: int | None = None
    max_in_flight_bytes: int | None = None
    max_retries: int | None = None
    retry_backoff_ms: int | None = None
    commit_interval_ms: int = 500
    consumer_config: Mapping[str, str] = field(default_factory=lambda: dict(FAST_GROUP_CONFIG))
    extra_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # MULTILANE_TEST_* knobs etc.
    event_log: str | None = None  # sets MULTILANE_TEST_LOG
    worker_id: str | None = None

    def argv(self, control_port: int, metrics_port: int, token_file: str) -> list[str]:
        a = [
            sys.executable, "-m", "multilane", "worker",
            "--bootstrap-servers", self.bootstrap,
            "--group", self.group,
            "--processor", self.processor,
            "--ordering", self.ordering,
            "--factor", str(self.factor),
            "--commit-interval-ms", str(self.commit_interval_ms),
            "--control-port", str(control_port),
            "--metrics-port", str(metrics_port),
            "--control-token-file", token_file,
        ]  # fmt: skip
        for t in self.topics:
            a += ["--topic", t]
        if self.assign is not None:
            a += ["--assign", self.assign]
        for flag, value in (
            ("--max-in-flight", self.max_in_flight),
            ("--max-in-flight-bytes", self.max_in_flight_bytes),
            ("--max-retries", self.max_retries),
            ("--retry-backoff-ms", self.retry_backoff_ms),
            ("--worker-id", self.worker_id),
        ):
            if value is not None:
                a += [flag, str(value)]
        for k, v in self.consumer_config.items():
            a += ["--consumer-config", f"{k}={v}"]
        return a + list(self.extra_args)


class WorkerProcess:
    """One ``multilane worker`` process owned by a test.

    Invariant: ``proc`` (once started) is a child of this process; ``stop``/``kill`` reap it. A reader
    thread drains its stdout so it never blocks on a full pipe; stderr goes to ``stderr_path``.
    """

    def __init__(self, spec: WorkerSpec, workdir: str | os.PathLike[str], token: str = "test-token") -> None:
        self.spec = spec
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.token_file = self.workdir / "control-token"
        self.token_file.write_text(token)
        self.proc: subprocess.Popen[str] | None = None
        self.control_port = 0
        self.metrics_port = 0
        self.worker_id: str | None = None
        self.stdout_lines: list[str] = []
        self._ready = threading.Event()
        self.stderr_path: Path | None = None

    # -- lifecycle ----------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise WorkerError("worker not started")
        return self.proc.pid

    def start(self) -> WorkerProcess:
        """Spawn the worker (steps 1-2). 1. Pick ports, build argv and env. 2. Spawn; read stdout."""
        # 1.
        control_port, metrics_port = free_port(), free_port()
        argv = self.spec.argv(control_port, metrics_port, str(self.token_file))
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("MULTILANE_TEST_"):
                del env[k]
        env.update(self.spec.env)
        if self.spec.event_log:
            env["MULTILANE_TEST_LOG"] = self.spec.event_log
        env.setdefault("MULTILANE_LOG_LEVEL", "INFO")
        # 2.
        n = len(list(self.workdir.glob("worker-*.stderr")))
        self.stderr_path = self.workdir / f"worker-{n}.stderr"
        self._ready.clear()
        self.stdout_lines = []
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env, text=True
            )
        threading.Thread(target=self._read_stdout, args=(self.proc,), daemon=True).start()
        return self

    def _read_stdout(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.stdout_lines.append(line.rstrip("\n"))
            m = READY_RE.match(line)
            if m:
                self.worker_id = m.group(1)
                self.control_port = int(m.group(2))
                self.metrics_port = int(m.group(3))
                self._ready.set()

    def wait_ready(self, timeout: float = 60.0) -> WorkerProcess:
        """Wait for the ready line; WorkerError (with the stderr tail) if it exits or times out."""
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            if self.proc is not None and self.proc.poll() is not None:
                raise WorkerError(
                    f"worker exited with {self.proc.returncode} before ready:\n{self.stderr_tail()}"
                )
            if time.monotonic() > deadline:
                raise WorkerError(f"worker not ready after {timeout}s:\n{self.stderr_tail()}")
        return self

    def kill(self) -> None:
        """SIGKILL the worker, reap it, and append a kill marker to the event log."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        if self.spec.event_log:
            append_kill_marker(self.spec.event_log, self.proc.pid)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM (graceful drain + final commit); SIGKILL after ``timeout``. Returns the exit code."""
        if self.proc is None:
            raise WorkerError("worker not started")
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return int(self.proc.returncode)

    def stop(self) -> None:
        """Best-effort cleanup for fixtures: kill if still running."""
        with contextlib.suppress(Exception):
            self.kill()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stderr_tail(self, lines: int = 40) -> str:
        if self.stderr_path is None or not self.stderr_path.exists():
            return "(no stderr)"
        return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])

    def rss_kib(self) -> int:
        return rss_kib(self.pid)

    # -- HTTP ---------------------------------------------------------------------------------------

    def request(
        self, method: str, path: str, body: Any = None, token: str | None = "", timeout: float = 10.0
    ) -> tuple[int, Any]:
        """Call the control API. ``token=""`` uses the worker's token; ``None`` sends no Authorization."""
        if not self.control_port:
            raise WorkerError("worker has no control port (not ready?)")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.control_port}{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        tok = self.token if token == "" else token
        if tok is not None:
            req.add_header("Authorization", f"Bearer {tok}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                payload = json.loads(raw) if raw else None
            except ValueError:
                payload = raw.decode(errors="replace")
            return exc.code, payload

    def status(self) -> dict[str, Any]:
        code, body = self.request("GET", "/v1/status")
        if code != 200 or not isinstance(body, dict):
            raise WorkerError(f"GET /v1/status answered {code}: {body!r}")
        return body

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        if not self.metrics_port:
            raise WorkerError("worker has no metrics port (not ready?)")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as resp:
            return parse_prometheus_text(resp.read().decode())

    def metric_sum(self, name: str) -> float:
        """Sum of a metric's samples over all label sets (0 when absent)."""
        return sum(v for _, v in self.metrics().get(name, []))

    def in_flight(self) -> int:
        """Records in flight, from ``/v1/status`` (sum over partitions)."""
        return sum(int(p.get("in_flight", 0)) for p in self.status().get("partitions", []))

    def committed(self) -> dict[tuple[str, int], int]:
        return {
            (p["topic"], int(p["partition"])): int(p["committed"])
            for p in self.status().get("partitions", [])
        }
