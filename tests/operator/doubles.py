"""Test doubles for the operator tests (each says what it stands in for).

- :class:`WorkerFleet`: an aiohttp server that implements the documented worker control HTTP contract
  (docs/architecture.md "Worker control API") for many workers at ``/w/<name>``, and records every
  call. It is a double of the workers' HTTP interface only: no Kafka, no engine; each worker's side of
  the protocol is a :class:`multilane.testing.fleet.FleetWorker` (the rules the in-process
  ``WorkerFleetDouble`` uses too). Each worker runs the real :class:`multilane.worker.lease.LeaseKeeper`
  against the emulated API server.
- :class:`StatefulSetControllerDouble`: does what Kubernetes' StatefulSet controller and kubelet would
  do for the operator's StatefulSet: creates pods ``NAME-0..N-1`` (labels from the pod template and
  ``controller-revision-hash``) and
  deletes pods above N, starting/stopping a fleet worker per pod.
- :class:`StaticSource`: a ``MetricSource`` returning what the test sets (or raising).
- :class:`RealWorkerFleet`: real ``multilane worker`` processes instead of the HTTP double.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import aiohttp.web

from multilane.operator.decision.planner import format_partition, parse_partition
from multilane.operator.k8s.kube import KubeClient, api_path
from multilane.operator.rollout.workers import WorkerFencedError
from multilane.operator.sources import (
    MetricSample,
    MetricsInvalidError,
    MetricsUnavailableError,
    QueryContext,
)
from multilane.testing.broker import free_port
from multilane.testing.fleet import FleetWorker
from multilane.testing.kube_rules import revision_hash_label
from multilane.worker.lease import LeaseKeeper, LeaseSettings


@dataclass
class FakeWorker(FleetWorker):
    """A :class:`FleetWorker` (the control protocol's rules) behind the HTTP API, with its faults."""

    token: str = ""
    reachable: bool = True
    hang_s: float = 0.0  # delay every answer (a slow or stuck worker)
    processing: bool = True  # False after the LeaseKeeper's on_lost
    lost_at: float | None = None


@dataclass(frozen=True)
class Call:
    worker: str
    path: str
    body: Any
    time: float
    status: int


class WorkerFleet:
    """Control endpoints of many fake workers on one port: ``http://127.0.0.1:PORT/w/<name>``."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.workers: dict[str, FakeWorker] = {}
        self.calls: list[Call] = []
        self.keepers: dict[str, LeaseKeeper] = {}
        self.removed_with: dict[str, set[str]] = {}  # worker -> partitions it held when its pod went
        self.port = free_port()
        self._runner: aiohttp.web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def control_url(self, _ref: object, pod: str) -> str:
        return f"{self.url}/w/{pod}"

    async def start(self) -> None:
        app = aiohttp.web.Application()
        app.router.add_route("*", "/w/{name}/{tail:.*}", self._handle)
        self._runner = aiohttp.web.AppRunner(app)
        await self._runner.setup()
        await aiohttp.web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        for name in list(self.keepers):
            await self.remove(name)
        if self._runner is not None:
            await self._runner.cleanup()

    async def add(self, name: str, api_url: str | None = None, namespace: str = "default") -> FakeWorker:
        worker = self.workers.setdefault(name, FakeWorker(name=name, token=self.token))
        if api_url is not None and name not in self.keepers:

            def lost(w: FakeWorker = worker) -> None:
                w.processing = False
                w.lost_at = time.monotonic()

            keeper = LeaseKeeper(
                LeaseSettings(
                    api_url=api_url,
                    namespace=namespace,
                    name=name,
                    holder=name,
                    lease_duration_s=15.0,
                    stop_margin_s=5.0,
                    renew_interval_s=2.0,
                    request_timeout_s=5.0,
                ),
                on_lost=lost,
            )
            keeper.start()
            self.keepers[name] = keeper
        return worker

    async def remove(self, name: str) -> None:
        keeper = self.keepers.pop(name, None)
        if keeper is not None:
            await keeper.stop()
        worker = self.workers.pop(name, None)
        if worker is not None:
            self.removed_with[name] = set(worker.partitions)

    def assignment(self) -> dict[str, set[str]]:
        return {name: set(w.partitions) for name, w in self.workers.items()}

    def calls_to(self, path: str) -> list[Call]:
        return [c for c in self.calls if c.path == path]

    async def _handle(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        name = request.match_info["name"]
        path = "/" + request.match_info["tail"]
        worker = self.workers.get(name)
        body = await request.json() if request.can_read_body else None

        def answer(status: int, data: Any) -> aiohttp.web.Response:
            self.calls.append(Call(name, path, body, time.monotonic(), status))
            return aiohttp.web.json_response(data, status=status)

        if worker is None or not worker.reachable:
            return answer(503, {"error": "unreachable"})
        if worker.hang_s:
            await asyncio.sleep(worker.hang_s)
        if path == "/healthz":
            return answer(200, {"ok": True})
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return answer(401, {"error": "unauthorized"})
        if path == "/v1/status" and request.method == "GET":
            return answer(200, worker.status())
        if path == "/v1/assignment" and request.method == "POST":
            generation = int(body["generation"])
            try:
                released = worker.push(
                    generation,
                    {format_partition(p["topic"], int(p["partition"])) for p in body["partitions"]},
                )
            except WorkerFencedError:
                return answer(409, {"error": "stale generation", "generation": worker.generation})
            worker.processing = True
            return answer(
                200,
                {
                    "generation": generation,
                    "released": [
                        {"topic": t, "partition": i, "committed_offset": r.committed_offset}
                        for r in released
                        for t, i in [parse_partition(r.partition)]
                    ],
                },
            )
        if path == "/v1/factor" and request.method == "POST":
            worker.factor = int(body["factor"])
            return answer(200, {"factor": worker.factor})
        return answer(404, {"error": f"no route {path}"})


class StatefulSetControllerDouble:
    """Pods for the StatefulSets in ``namespace`` (every second), with a fleet worker each."""

    def __init__(self, kube: KubeClient, fleet: WorkerFleet, api_url: str, namespace: str) -> None:
        self.kube = kube
        self.fleet = fleet
        self.api_url = api_url
        self.namespace = namespace
        self.frozen: set[str] = set()  # pods the double leaves alone (tests kill them by hand)
        self._task: asyncio.Task[None] | None = None

    async def sync_once(self) -> None:
        for sts in await self.kube.list(api_path("apps/v1", "statefulsets", self.namespace)):
            name = sts["metadata"]["name"]
            replicas = int(sts["spec"].get("replicas") or 0)
            # As the StatefulSet controller: the pods carry controller-revision-hash: NAME-<hash>.
            labels = {**sts["spec"]["template"]["metadata"]["labels"], **revision_hash_label(sts)}
            # a pod carries its template's annotations (the operator's template hash among them)
            annotations = sts["spec"]["template"]["metadata"].get("annotations") or {}
            pods_path = api_path("v1", "pods", self.namespace)
            existing = {p["metadata"]["name"] for p in await self.kube.list(pods_path)}
            for i in range(replicas):
                pod = f"{name}-{i}"
                if pod in self.frozen:
                    continue
                if pod not in existing:
                    await self.kube.create(
                        pods_path,
                        {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "metadata": {"name": pod, "labels": labels, "annotations": annotations},
                        },
                    )
                if pod not in self.fleet.workers:
                    await self.fleet.add(pod, self.api_url, self.namespace)
            for pod in existing:
                stem, _, index = pod.rpartition("-")
                if stem == name and index.isdigit() and int(index) >= replicas and pod not in self.frozen:
                    await self.kube.delete(api_path("v1", "pods", self.namespace, pod))
                    await self.fleet.remove(pod)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.sync_once()
            await asyncio.sleep(1.0)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class StaticSource:
    """A ``MetricSource`` double: lag per partition and rates set by the test; or an error."""

    def __init__(self) -> None:
        self.lag: dict[str, int] | None = None  # None: zero lag for every partition
        self.input_rate = 0.0
        self.processing_rate = 0.0
        self.error: Exception | None = None
        self.samples = 0

    def fail(self, unavailable: bool = True) -> None:
        self.error = (
            MetricsUnavailableError("test: down") if unavailable else MetricsInvalidError("test: nonsense")
        )

    async def sample(self, ctx: QueryContext) -> MetricSample:
        self.samples += 1
        if self.error is not None:
            raise self.error
        lag = {p: (self.lag or {}).get(p, 0) for p in ctx.partitions}
        return MetricSample(
            lag=lag, input_rate=self.input_rate, processing_rate=self.processing_rate, time=time.time()
        )


async def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.1, what: str = "") -> Any:  # noqa: ASYNC109
    """Poll ``predicate`` (sync or async) until it returns a truthy value; generous on a loaded machine."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            if os.environ.get("MULTILANE_TEST_TIMING"):
                print(f"[{time.monotonic() - deadline + timeout:6.1f}s] {what}", flush=True)
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}: last={last!r}")


def partitions_of(assignment: dict[str, set[str]]) -> list[str]:
    return sorted(p for ps in assignment.values() for p in ps)


def names(items: Iterable[dict[str, Any]]) -> set[str]:
    return {i["metadata"]["name"] for i in items}


class RealWorkerFleet:
    """Real ``multilane worker`` processes (engine + control endpoint) in place of the pods'
    containers, on the embedded broker; the Lease of each is kept by a ``LeaseKeeper`` run by the
    test on the worker's behalf (the worker wires its own keeper in the engine issue).
    Same interface as :class:`WorkerFleet` for the StatefulSet double."""

    def __init__(
        self,
        token: str,
        bootstrap: str,
        group: str,
        tmp: Any,
        processor: str = "multilane.demo.examples:noop",
        extra_args: Sequence[str] = (),
    ) -> None:
        self.token = token
        self.bootstrap = bootstrap
        self.group = group
        self.tmp = tmp
        self.processor = processor
        self.extra_args = list(extra_args)  # more ``multilane worker`` options, e.g. the breaker's
        self.workers: dict[str, tuple[asyncio.subprocess.Process, int]] = {}
        self.keepers: dict[str, LeaseKeeper] = {}
        self.removed_with: dict[str, set[str]] = {}
        self._control: Any = None

    def control_url(self, _ref: object, pod: str) -> str:
        return f"http://127.0.0.1:{self.workers[pod][1]}" if pod in self.workers else "http://127.0.0.1:1"

    async def add(self, name: str, api_url: str | None = None, namespace: str = "default") -> None:
        if name in self.workers:
            return
        token_file = self.tmp / "token"
        token_file.write_text(self.token)
        port = free_port()
        log = (self.tmp / f"{name}.log").open("a")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "multilane", "worker",
            "--bootstrap-servers", self.bootstrap, "--group", self.group,
            "--processor", self.processor, "--assign", "", "--worker-id", name,
            "--control-port", str(port), "--control-token-file", str(token_file), *self.extra_args,
            stdout=log, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        self.workers[name] = (proc, port)
        if api_url is not None:
            keeper = LeaseKeeper(
                LeaseSettings(
                    api_url=api_url, namespace=namespace, name=name, holder=name,
                    lease_duration_s=15.0, stop_margin_s=5.0, renew_interval_s=2.0, request_timeout_s=5.0,
                ),
                on_lost=lambda: None,
            )  # fmt: skip
            keeper.start()
            self.keepers[name] = keeper

    async def status(self, name: str) -> dict[str, Any]:
        from multilane.operator.rollout.workers import WorkerControlClient

        if self._control is None:
            self._control = WorkerControlClient(self.token, timeout_s=5)
        return await self._control.status(self.control_url(None, name))

    async def remove(self, name: str) -> None:
        keeper = self.keepers.pop(name, None)
        if keeper is not None:
            await keeper.stop()
        entry = self.workers.pop(name, None)
        if entry is None:
            return
        proc, port = entry
        with contextlib.suppress(Exception):
            from multilane.operator.rollout.workers import WorkerControlClient

            client = WorkerControlClient(self.token, timeout_s=3)
            try:
                status = await client.status(f"http://127.0.0.1:{port}")
                self.removed_with[name] = {f"{p['topic']}/{p['partition']}" for p in status["partitions"]}
            finally:
                await client.close()
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def stop(self) -> None:
        for name in list(self.workers):
            await self.remove(name)
        if self._control is not None:
            await self._control.close()
