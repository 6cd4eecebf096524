"""Against real ``multilane worker`` processes (engine + control endpoint) on the embedded broker.

1. The assignment protocol through the operator's client and the workers' HTTP server (liveness
   given directly).
2. End to end: the real kopf operator against the emulated API server; the StatefulSet double starts
   a real worker process per pod; each worker's Lease is renewed by a LeaseKeeper the test runs for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from confluent_kafka import Producer

from multilane.operator.decision.planner import AssignmentPlanner
from multilane.operator.k8s.kube import KubeClient
from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.assignment import AssignmentCoordinator, AssignmentState
from multilane.operator.rollout.workers import WorkerControlClient, WorkerFencedError
from multilane.testing.broker import EmbeddedBroker, free_port
from tests.operator.conftest import CR_COLLECTION, NS, consumer_body, cr_path
from tests.operator.conftest import TOKEN as CONTROL_TOKEN
from tests.operator.doubles import RealWorkerFleet, StatefulSetControllerDouble, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="function")]

TOKEN = "w" * 40


@pytest_asyncio.fixture
async def workers(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path
) -> AsyncIterator[tuple[str, str, list[WorkerInfo]]]:
    broker.create_topic(topic_name, partitions=4)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    procs: list[asyncio.subprocess.Process] = []
    infos = []
    for i in range(2):
        port = free_port()
        log = (tmp_path / f"worker-{i}.log").open("w")
        procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable, "-m", "multilane", "worker",
                "--bootstrap-servers", broker.bootstrap, "--group", f"{topic_name}-g",
                "--processor", "multilane.demo.examples:noop", "--assign", "", "--worker-id", f"app-{i}",
                "--control-port", str(port), "--control-token-file", str(token_file),
                stdout=log, stderr=asyncio.subprocess.STDOUT, env={**os.environ},
            )
        )  # fmt: skip
        infos.append(
            WorkerInfo(name=f"app-{i}", ordinal=i, alive=True, control_url=f"http://127.0.0.1:{port}")
        )
    try:
        yield broker.bootstrap, topic_name, infos
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                await asyncio.wait_for(p.wait(), 30)
            except TimeoutError:
                p.kill()
                await p.wait()


async def test_coordinator_assigns_releases_and_is_fenced_by_real_workers(
    workers: tuple[str, str, list[WorkerInfo]],
) -> None:
    bootstrap, topic, infos = workers
    client = WorkerControlClient(TOKEN, timeout_s=10)

    async def up() -> bool:
        # Ready, not only listening: the control port answers before the engine has started (the
        # worker checks the broker and its topics first); /readyz says when it has.
        try:
            async with aiohttp.ClientSession() as session:
                for w in infos:
                    async with session.get(f"{w.control_url}/readyz") as resp:
                        if resp.status != 200:
                            return False
        except aiohttp.ClientError:
            return False
        return True

    try:
        await wait_for(up, timeout=60, what="worker control endpoints")
        parts = [f"{topic}/{i}" for i in range(4)]
        states: list[dict[str, Any]] = []

        async def persist(state: AssignmentState) -> None:
            states.append(state.to_status())

        coord = AssignmentCoordinator(
            client, AssignmentPlanner(max_moves=None), persist, release_deadline_s=5
        )
        first = await coord.step(AssignmentState(), infos[:1], parts)
        assert first.committed
        status = await client.status(infos[0].control_url)
        assert status["generation"] == first.state.generation
        assert sorted(f"{p['topic']}/{p['partition']}" for p in status["partitions"]) == parts

        # Records processed and committed by app-0: 3 per partition.
        producer = Producer({"bootstrap.servers": bootstrap})
        for i in range(12):
            producer.produce(topic, value=b"v", key=str(i).encode(), partition=i % 4)
            producer.flush(10)

        async def committed_all() -> bool:
            s = await client.status(infos[0].control_url)
            return all(p.get("committed") == 3 for p in s["partitions"])

        await wait_for(committed_all, timeout=60, what="app-0 committed every record")

        # A second worker: two partitions are released by app-0 (with their committed offsets) first.
        second = await coord.step(first.state, infos, parts)
        assert second.committed and second.moves == 2
        released = [p for p in states if p.get("pending")][-1]["pending"]["released"]
        moved = sorted(set(parts) - set(second.state.members["app-0"]))
        assert sorted(r["partition"] for r in released) == moved
        assert all(r["committedOffset"] == 3 for r in released)
        have = {}
        for w in infos:
            s = await client.status(w.control_url)
            assert s["generation"] == second.state.generation
            have[w.name] = sorted(f"{p['topic']}/{p['partition']}" for p in s["partitions"])
        assert sorted(have["app-0"] + have["app-1"]) == parts and len(have["app-1"]) == 2

        # Fencing: a push with an older generation is refused.
        with pytest.raises(WorkerFencedError):
            await client.assign(infos[1].control_url, second.state.generation - 1, [], 1.0)
        # The factor endpoint.
        assert await client.set_factor(infos[0].control_url, 3) == 3
        assert (await client.status(infos[0].control_url))["factor"] == 3
    finally:
        await client.close()


async def test_operator_drives_real_workers_end_to_end(
    api: Any, kube: KubeClient, broker: EmbeddedBroker, topic: str, operator_factory: Any, tmp_path: Path
) -> None:
    """The real kopf operator, real worker processes (one per pod of the StatefulSet double), the
    embedded broker: partitions assigned, records processed, a scale-down releases before removal."""
    real = RealWorkerFleet(CONTROL_TOKEN, broker.bootstrap, "e2e-group", tmp_path)
    sts = StatefulSetControllerDouble(kube, real, api[1], NS)  # type: ignore[arg-type]
    sts.start()
    try:
        await operator_factory(control_url=real.control_url).start()
        await kube.create(
            CR_COLLECTION, consumer_body("e2e", broker.bootstrap, topic, replicas=2, maxReplicas=2)
        )
        parts = [f"{topic}/{i}" for i in range(4)]

        seen: list[Any] = []

        async def owned() -> dict[str, list[str]] | None:
            out: dict[str, list[str]] = {}
            seen[:] = [out]
            for name in ("e2e-0", "e2e-1"):
                if name not in real.workers:
                    return None
                try:
                    s = await real.status(name)
                except Exception:
                    return None
                out[name] = sorted(f"{p['topic']}/{p['partition']}" for p in s["partitions"])
            balanced = len(out["e2e-0"]) == len(out["e2e-1"]) == 2  # a worker may come up first and get all
            return out if sorted(out["e2e-0"] + out["e2e-1"]) == parts and balanced else None

        try:
            await wait_for(owned, timeout=90, what="real workers own every partition, two each")
        except AssertionError as exc:
            status = (await kube.get(cr_path("e2e")) or {}).get("status")
            raise AssertionError(f"{exc}; workers: {seen}; status: {status}") from None

        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(20):
            producer.produce(topic, value=b"v", key=str(i).encode(), partition=i % 4)
            producer.flush(10)

        async def processed() -> bool:
            total = 0
            for name in ("e2e-0", "e2e-1"):
                total += sum(int(p.get("committed") or 0) for p in (await real.status(name))["partitions"])
            return total == 20

        await wait_for(processed, timeout=60, what="20 records committed by the real workers")

        # Scale down through the spec: e2e-1 releases its partitions before its pod goes.
        await kube.patch(cr_path("e2e"), {"spec": {"scaling": {"replicas": 1, "minReplicas": 1}}})
        await wait_for(lambda: "e2e-1" not in real.workers, timeout=90, what="e2e-1 removed")
        assert real.removed_with.get("e2e-1") == set()

        async def all_on_zero() -> bool:
            s = await real.status("e2e-0")
            return sorted(f"{p['topic']}/{p['partition']}" for p in s["partitions"]) == parts

        await wait_for(all_on_zero, timeout=60, what="every partition on e2e-0")
        async def settled() -> dict[str, Any] | None:
            status = (await kube.get(cr_path("e2e")) or {}).get("status") or {}
            return status if status.get("replicas") == 1 else None

        status = await wait_for(settled, timeout=30, what="status.replicas 1")
        assert status["assignment"].get("pending") is None
    finally:
        await sts.stop()
        await real.stop()
