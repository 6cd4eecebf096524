"""The Kubernetes path end to end: the real kopf operator against the emulated API server, the
:class:`~multilane.testing.pods.StatefulSetProcessDouble` (a real ``multilane worker`` per pod, each
renewing its own Lease through TLS), the embedded broker, and the demo's stateful processor under
paced load. The verdict is :func:`multilane.demo.check.judge`: every delivery checker, and the state
restored from the changelogs equal to the reference counts of the produced records.

Faults are injected at the operator's one public seam for worker calls, ``control_factory``:
:class:`FaultyControl` is the production ``HandoffControlClient`` with a hook called before each
``learn`` and before each assignment push that releases (the worker loses partitions) or promotes
(it gains a partition it was learning).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest_asyncio

from multilane.demo.check import Verdict, judge, read_counts
from multilane.demo.processors import SLEEP_ENV
from multilane.formats.handover import Handover
from multilane.operator.k8s.handlers import HandlerSettings
from multilane.operator.k8s.kube import KubeClient, api_path
from multilane.operator.rollout.handoff import HandoffControlClient
from multilane.operator.rollout.workers import ReleasedPartition
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import ProducedRecord
from multilane.testing.loadgen import RateProfile, produce_paced
from multilane.testing.pods import StatefulSetProcessDouble
from multilane.testing.processors import append_kill_marker, read_event_log
from tests.operator.conftest import CR_COLLECTION, NO_TLS, NS, TOKEN, OperatorRunner, cr_path

PARTITIONS = 4
PROCESSOR = "multilane.demo.processors:stateful_io"
NAME = "orders"

Hook = Callable[[str, str, list[str]], Awaitable[None]]  # (kind, pod, partitions)


class FaultyControl(HandoffControlClient):
    """``HandoffControlClient`` calling ``hook(kind, pod, partitions)`` first, ``kind`` one of
    ``learn``, ``release`` (an assignment push that drops partitions) and ``promote`` (one that adds a
    partition this client asked the worker to learn)."""

    def __init__(self, token: str, hook: Hook | None, timeout_s: float = 10.0) -> None:
        super().__init__(token, timeout_s=timeout_s)
        self.hook = hook
        self._assigned: dict[str, set[str]] = {}
        self._learning: dict[str, set[str]] = {}

    async def _fire(self, kind: str, url: str, partitions: Iterable[str]) -> None:
        if self.hook is not None:
            await self.hook(kind, url.rstrip("/").rsplit("/", 1)[1], sorted(partitions))

    async def learn(self, base_url: str, partitions: Iterable[str]) -> None:
        parts = list(partitions)
        await self._fire("learn", base_url, parts)
        self._learning.setdefault(base_url, set()).update(parts)
        await super().learn(base_url, parts)

    async def assign(
        self,
        base_url: str,
        generation: int,
        partitions: Iterable[str],
        release_deadline_s: float,
        handovers: Mapping[str, Handover] | None = None,
    ) -> list[ReleasedPartition]:
        new = set(partitions)
        old = self._assigned.get(base_url)
        if old is not None and old - new:
            await self._fire("release", base_url, old - new)
        elif new & self._learning.get(base_url, set()):
            await self._fire("promote", base_url, new & self._learning[base_url])
        released = await super().assign(base_url, generation, new, release_deadline_s, handovers)
        self._assigned[base_url] = new
        self._learning.get(base_url, set()).difference_update(new)
        return released


@dataclass
class K8sHarness:
    api_url: str
    kube: KubeClient
    broker: EmbeddedBroker
    topic: str
    root: Path
    double: StatefulSetProcessDouble
    make_operator: Callable[..., OperatorRunner]
    group: str = field(default_factory=lambda: f"g-{uuid.uuid4().hex[:8]}")
    produced: list[ProducedRecord] = field(default_factory=list)
    load_thread: threading.Thread | None = None
    killed: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, pod, pid)
    calls: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)  # (kind, pod, partitions)
    load_started_at: float | None = None
    load_result: Any = None
    partition_count: int = PARTITIONS

    @property
    def events(self) -> Path:
        return self.root / "events.log"

    @property
    def partitions(self) -> list[str]:
        return [f"{self.topic}/{i}" for i in range(self.partition_count)]

    def body(self, replicas: int | None = 1, **scaling: Any) -> dict[str, Any]:
        pinned = {"replicas": replicas} if replicas is not None else {}
        return {
            "apiVersion": "multilane.dev/v1alpha1",
            "kind": "ParallelConsumer",
            "metadata": {"name": NAME, "namespace": NS},
            "spec": {
                "kafka": {
                    "bootstrapServers": self.broker.bootstrap,
                    "topics": [self.topic],
                    "consumerGroup": self.group,
                },
                "workload": {
                    "image": "local",
                    "processor": PROCESSOR,
                    "env": [
                        {"name": "MULTILANE_TEST_LOG", "value": str(self.events)},
                        {"name": SLEEP_ENV, "value": "2"},
                    ],
                },
                "scaling": {
                    "minReplicas": 1,
                    "maxReplicas": 2,
                    "minFactor": 4,
                    "maxFactor": 4,
                    "intervalSeconds": 5,
                    "stabilisationSeconds": 0,
                    **pinned,
                    **scaling,
                },
                "state": {"enabled": True, "acceptableRecoveryLag": 500, "learnerTimeoutSeconds": 20},
            },
        }

    # ---- operator --------------------------------------------------------------------------------

    def operator(self, hook: Hook | None = None, **kwargs: Any) -> OperatorRunner:
        """An operator (not started) whose worker calls are recorded in ``calls`` and go through
        ``hook`` first."""

        async def record(kind: str, pod: str, partitions: list[str]) -> None:
            self.calls.append((kind, pod, tuple(partitions)))
            if hook is not None:
                await hook(kind, pod, partitions)

        kwargs.setdefault("control_factory", lambda token: FaultyControl(token, record))
        kwargs.setdefault(
            "settings",
            # plain HTTP: the pods' router speaks no TLS (test_control_tls_k8s.py runs mutual TLS)
            HandlerSettings(tick_s=0.5, kafka_timeout_s=3.0, release_deadline_s=10.0, control_tls=NO_TLS),
        )
        return self.make_operator(tick_s=0.5, control_url=self.double.control_url, **kwargs)

    async def create(self, body: dict[str, Any] | None = None) -> None:
        await self.kube.create(CR_COLLECTION, body or self.body())

    async def scale(self, replicas: int) -> None:
        """What ``kubectl scale pcon/orders --replicas=N`` writes (spec.scaling.replicas)."""
        await self.kube.patch(cr_path(NAME), {"spec": {"scaling": {"replicas": replicas}}})

    async def status(self) -> dict[str, Any]:
        return dict(((await self.kube.get(cr_path(NAME))) or {}).get("status") or {})

    async def owners(self) -> dict[str, str]:
        members = ((await self.status()).get("assignment") or {}).get("members") or []
        return {p: m["worker"] for m in members for p in m["partitions"]}

    async def balanced(self, workers: int) -> bool:
        status = await self.status()
        assignment = status.get("assignment") or {}
        owners = {p: m["worker"] for m in assignment.get("members") or [] for p in m["partitions"]}
        counts = [sum(1 for w in owners.values() if w == f"{NAME}-{i}") for i in range(workers)]
        return (
            len(owners) == self.partition_count
            and min(counts) >= self.partition_count // workers
            and status.get("rollout") is None
            and assignment.get("pending") is None
            and all(w in self.double.pods and self.double.pods[w].running() for w in set(owners.values()))
        )

    # ---- load and verdict ------------------------------------------------------------------------

    def start_load(self, rate: float, seconds: float, profile: RateProfile | None = None) -> None:
        def produce() -> None:
            result = produce_paced(
                self.broker.bootstrap,
                self.topic,
                profile or RateProfile.constant(rate, seconds),
                keys=300,
                zipf_s=0.0,
                seed=3,
            )
            self.load_result = result
            self.produced.extend(result.records)

        self.load_started_at = time.time()
        self.load_thread = threading.Thread(target=produce, daemon=True)
        self.load_thread.start()

    def load_done(self) -> bool:
        return self.load_thread is not None and not self.load_thread.is_alive()

    async def token(self) -> str:
        """The control token the operator generated (its Secret ``orders-control-token``)."""
        secret = await self.kube.get(api_path("v1", "secrets", NS, f"{NAME}-control-token")) or {}
        if "token" in (secret.get("data") or {}):
            return base64.b64decode(secret["data"]["token"]).decode()
        return str((secret.get("stringData") or {}).get("token") or TOKEN)

    async def committed(self, client: Any = None, url: Callable[[str], str] | None = None,
                        skip: type[BaseException] = Exception) -> dict[tuple[str, int], int]:
        """Committed offsets of the active partitions, from the workers' /v1/status (through the
        pod network). ``client`` (closed here) and ``url`` (pod -> control URL): e.g. mutual TLS;
        by default a plain client to the double's control URLs. A pod whose call raises ``skip``
        is left out."""
        out: dict[tuple[str, int], int] = {}
        if client is None:
            client = HandoffControlClient(await self.token(), timeout_s=5)
        if url is None:
            url = lambda pod: self.double.control_url(None, pod)  # noqa: E731
        try:
            for pod in list(self.double.pods):
                with contextlib.suppress(skip):
                    st = await client.status(url(pod))
                    for p in st.get("partitions") or []:
                        if p.get("committed") is not None and p.get("phase") == "active":
                            out[(p["topic"], int(p["partition"]))] = int(p["committed"])
        finally:
            await client.close()
        return out

    async def drained(self) -> bool:
        if not self.load_done():
            return False
        ends: dict[tuple[str, int], int] = {}
        for r in self.produced:
            ends[(r.topic, r.partition)] = max(ends.get((r.topic, r.partition), 0), r.offset + 1)
        committed = await self.committed()
        return all(committed.get(tp, -1) >= end for tp, end in ends.items())

    def kill_hook(self, kind: str, delay_s: float) -> Hook:
        """On the first ``kind`` call: SIGKILL that call's pod process after ``delay_s`` (in a thread,
        so the kill lands while the call runs); the kill marker goes to the event log."""

        async def hook(k: str, pod: str, partitions: list[str]) -> None:
            if k != kind or self.killed:
                return
            pid = self.double.pods[pod].pid
            self.killed.append((kind, pod, pid))

            def kill() -> None:
                time.sleep(delay_s)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                append_kill_marker(str(self.events), pid)

            threading.Thread(target=kill, daemon=True).start()

        return hook

    def verdict(self) -> Verdict:
        counts, _ = read_counts(self.broker.bootstrap, self.group, self.topic, range(self.partition_count))
        return judge(self.produced, read_event_log(self.events), counts)

    def assert_ok(self) -> Verdict:
        v = self.verdict()
        problems = [str(c) for c in v.checks if not c.ok]
        assert v.lost == 0, f"lost {v.lost} records; {problems}"
        assert not problems, "\n".join(problems)
        assert v.state_ok, v.state_detail
        assert v.processed == v.produced > 0
        return v


async def wait_until(cond: Callable[[], Any], limit_s: float, what: str, h: K8sHarness | None = None) -> Any:
    deadline = time.monotonic() + limit_s
    while True:
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"; status={await h.status()}" if h is not None else ""
            raise AssertionError(f"{what} not reached within {limit_s:.0f}s{detail}")
        await asyncio.sleep(0.3)


async def finish(h: K8sHarness, runner: OperatorRunner, limit_s: float = 90.0) -> Verdict:
    """Wait until the load was produced and every partition committed its end, then stop the operator
    and the pods (SIGTERM: final commits) and judge the run."""
    await wait_until(h.drained, limit_s, "every produced record committed", h)
    status = await h.status()
    assert status.get("rollout") is None, f"the rollout did not complete: {status.get('rollout')}"
    await runner.stop()
    await h.double.stop()
    return h.assert_ok()


@pytest_asyncio.fixture
async def k8s(
    api: tuple[Any, str],
    kube: KubeClient,
    broker: EmbeddedBroker,
    topic_name: str,
    operator_factory: Callable[..., OperatorRunner],
    tmp_path: Path,
) -> AsyncIterator[K8sHarness]:
    """The harness with the StatefulSet double running (no operator yet: ``h.operator().start()``)."""
    broker.create_topic(topic_name, PARTITIONS)
    double = StatefulSetProcessDouble(kube, api[1], NS, tmp_path)
    await double.start()
    h = K8sHarness(api[1], kube, broker, topic_name, tmp_path, double, operator_factory)
    try:
        yield h
    finally:
        await double.stop()  # idempotent: SIGKILL whatever still runs, by PID
