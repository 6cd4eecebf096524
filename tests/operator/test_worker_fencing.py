"""Worker side of fencing: a worker that cannot renew its Lease stops processing and committing at
once, and resumes only with an assignment of a higher generation.

Emulated: the API server (multilane/testing/kube_api.py), which is made to fail the worker's Lease
calls. Real: the embedded Kafka broker, the engine, ``LeaseKeeper`` and the CLI's wiring of the two
(``multilane.worker.cli.start_lease_keeper``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import kmock
import pytest

from multilane.operator.decision.planner import AssignmentPlanner, format_partition, parse_partition
from multilane.operator.k8s.kube import KubeClient, api_path
from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.assignment import AssignmentCoordinator, AssignmentState
from multilane.operator.rollout.workers import ReleasedPartition, WorkerFencedError
from multilane.operator.spec.children import ConsumerRef, lease_manifest
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery
from multilane.testing.kube_api import ApiServerEmulator
from multilane.testing.processors import EventRecorder, ProcessorConfig
from multilane.worker.cli import lease_settings, start_lease_keeper
from multilane.worker.config import ConfigError
from multilane.worker.engine import Engine, FencingError
from multilane.worker.lease import LeaseSettings
from tests.integration.test_engine_harness import committed_offset, config, produce
from tests.operator.conftest import NS
from tests.operator.doubles import wait_for

REF = ConsumerRef(name="app", namespace=NS, uid="uid-1")
N = 6000


class InProcessControl:
    """The operator's ``WorkerControl`` over an engine in this process (what ``/v1/...`` maps to)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def status(self, base_url: str) -> dict[str, Any]:
        return self.engine.status()

    async def assign(self, base_url: str, generation: int, partitions: Any,
                     release_deadline_s: float) -> list[ReleasedPartition]:
        try:
            released = await self.engine.assign([parse_partition(p) for p in partitions], generation,
                                                 release_deadline_s)
        except FencingError as exc:
            raise WorkerFencedError(str(exc)) from exc
        return [ReleasedPartition(format_partition(r.topic, r.partition), r.committed_offset)
                for r in released]

    async def set_factor(self, base_url: str, factor: int) -> int:
        return await self.engine.set_factor(factor)


class CommitSpy:
    """Stands in for the engine's consumer inside its commit cycle: records each commit request sent,
    with whether the engine was fenced then. (A fresh partition's first commit is not left to the
    commit interval: the progress cycle sends it as soon as an offset is committable, so a commit
    before the fence is expected; none may be sent while fenced.)"""

    def __init__(self, consumer: Any, engine: Engine) -> None:
        self._consumer = consumer
        self._engine = engine
        self.commits: list[tuple[float, bool, int]] = []  # (time.monotonic(), fenced, highest offset)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        offsets = kwargs.get("offsets") or []
        top = max((tp.offset for tp in offsets), default=-1)
        self.commits.append((time.monotonic(), self._engine.fenced, top))
        return self._consumer.commit(*args, **kwargs)

    def sent_while_fenced(self) -> list[tuple[float, bool, int]]:
        return [c for c in self.commits if c[1]]

    def last_sent(self) -> int | None:
        """The offset of the last commit request sent (None: none)."""
        return self.commits[-1][2] if self.commits else None


@pytest.mark.broker
@pytest.mark.asyncio(loop_scope="function")
async def test_lost_lease_stops_processing_and_commits_until_a_higher_generation(
    api: tuple[ApiServerEmulator, str], kube: KubeClient, broker: EmbeddedBroker, topic_name: str
) -> None:
    emu, url = api
    await kube.create(api_path("coordination.k8s.io/v1", "leases", NS), lease_manifest(REF, "app-0"))
    await asyncio.to_thread(broker.create_topic, topic_name, 1)
    produced = await asyncio.to_thread(produce, broker, topic_name, N, 50)
    group = f"g-{topic_name}"
    # Periodic commits only after an hour: every commit in this test is a release's final commit, so
    # a fenced worker that committed on release would show up in the committed offset.
    cfg = config(broker, topic_name, group, partitions=[0], factor=4, commit_interval_ms=3_600_000)
    rec = EventRecorder(ProcessorConfig(sleep_s=0.004))
    engine = Engine(cfg, rec.async_processor)
    await engine.start()
    assert engine._commits is not None
    spy = CommitSpy(engine._commits._consumer, engine)
    engine._commits._consumer = spy
    keeper = start_lease_keeper(engine, LeaseSettings(
        api_url=url, namespace=NS, name="app-0", holder="app-0",
        lease_duration_s=3.0, stop_margin_s=1.0, renew_interval_s=0.3))
    api_down = False

    def fail_leases(request: Any) -> Any:
        if api_down and request.name == "app-0" and request.resource is not None \
                and request.resource.group == "coordination.k8s.io":
            raise kmock.KubernetesError(status=503, reason="ServiceUnavailable", message="test: API down")
        raise NotImplementedError  # fall through to the emulator

    emu["get"] << fail_leases
    try:
        await wait_for(lambda: keeper.renewals >= 2, what="lease renewed")
        await wait_for(lambda: len({e.offset for e in rec.snapshot() if e.kind == "end"}) >= 300,
                       what="300 records processed")
        # busy lanes (for the operator's per-lane rate): 4 lanes, each running 4 ms records
        await wait_for(lambda: engine.status()["busy_lanes"] >= 1.0, timeout=10, what="busy lanes")
        assert engine.status()["busy_lanes"] <= 4.4

        # 1. The worker cannot renew: fenced before the Lease expires.
        api_down = True
        await wait_for(lambda: engine.fenced, timeout=20, what="fenced")
        fenced_at = time.time()
        assert keeper.lost
        status = engine.status()
        assert status["fenced"] is True and status["generation"] == 0
        assert [p["phase"] for p in status["partitions"]] == ["fenced"]
        done_before = {e.offset for e in rec.snapshot() if e.kind == "end"}
        assert 300 <= len(done_before) < N, "processing must have been cut short by the fence"

        # 2. No processor call starts after the fence and nothing is committed, renewal or not.
        await asyncio.sleep(1.5)
        api_down = False
        await wait_for(lambda: not keeper.lost, timeout=10, what="lease renewed again")
        await asyncio.sleep(0.5)
        assert [e for e in rec.snapshot() if e.kind == "start" and e.time > fenced_at] == []
        assert engine.fenced, "a renewal alone must not resume processing"
        assert spy.sent_while_fenced() == []
        at_fence = spy.last_sent()  # a fresh partition's first commit may precede the fence
        assert at_fence is None or at_fence < N, at_fence
        assert await asyncio.to_thread(committed_offset, broker, group, topic_name) == at_fence

        # 3. The generation held when fenced (or lower) is refused.
        with pytest.raises(FencingError):
            await engine.assign([(topic_name, 0)], generation=0)
        assert engine.fenced

        # 4. The operator's sync sees the worker fenced (it never saw the Lease expire, so nothing
        #    moved) and pushes a higher generation with the same partitions: the fenced partition is
        #    dropped without a commit and taken again from the committed offset (the first commit's,
        #    if it came before the fence).
        rec.mark_incarnation_end()  # for the checkers: the fenced ownership ended here (a replay follows)
        resumed_at = time.time()
        resumed_mono = time.monotonic()
        persisted: list[AssignmentState] = []

        async def persist(state: AssignmentState) -> None:
            persisted.append(AssignmentState.from_status(state.to_status()))

        coordinator = AssignmentCoordinator(InProcessControl(engine), AssignmentPlanner(), persist)
        state = AssignmentState(generation=0, members={"app-0": (format_partition(topic_name, 0),)})
        report = await coordinator.sync(state, [WorkerInfo("app-0", 0, True, "in-process")], None)
        assert report.problems == []
        assert state.generation == 1 and [s.generation for s in persisted] == [1]
        assert persisted[0].members == state.members
        assert engine.generation == 1
        assert not engine.fenced and engine.status()["partitions"][0]["phase"] == "active"
        assert spy.sent_while_fenced() == [] and spy.last_sent() == at_fence
        await wait_for(lambda: {e.offset for e in rec.snapshot() if e.kind == "end"} >= set(range(N)),
                       timeout=120, what="every record processed after the fence was lifted")
        replayed = {e.offset for e in rec.snapshot() if e.kind == "start" and e.time > resumed_at}
        # The new ownership starts from the committed offset (a fresh partition's first commit is sent
        # early, so it may lie above 0), never below it; records completed above it are skipped only
        # where a progress record written before the fence covers them. That nothing is lost is the
        # checkers' claim below.
        first = at_fence or 0
        assert replayed, "records of the fenced ownership must run again"
        assert min(replayed) >= first, (min(replayed), first)
        assert not done_before >= set(range(first, N)), "the fence cut the work short above the commit"
    finally:
        await keeper.stop()
        await engine.stop()

    # 5. Commits work again after the fence was lifted: the final commit covers everything.
    assert [c for c in spy.commits if c[0] > resumed_mono], "the final commit after the lifted fence: none"
    assert spy.sent_while_fenced() == []
    assert await asyncio.to_thread(committed_offset, broker, group, topic_name) == N
    assert_all(check_delivery(produced, rec.snapshot(), mode="key"))


@pytest.mark.broker
@pytest.mark.asyncio(loop_scope="function")
async def test_a_fenced_worker_does_not_commit_on_stop(broker: EmbeddedBroker, topic_name: str) -> None:
    await asyncio.to_thread(broker.create_topic, topic_name, 1)
    await asyncio.to_thread(produce, broker, topic_name, 500, 20)
    group = f"g-{topic_name}"
    cfg = config(broker, topic_name, group, partitions=[0], commit_interval_ms=3_600_000)
    rec = EventRecorder(ProcessorConfig())
    engine = Engine(cfg, rec.async_processor)
    await engine.start()
    try:
        # A fresh partition's first commit comes early (the progress cycle's step 0); after it, with
        # an hour's commit interval, only a release commits: 500 more records stay uncommitted.
        await wait_for(lambda: engine.status()["partitions"][0].get("committed") is not None,
                       timeout=60, what="the first commit")
        await asyncio.to_thread(produce, broker, topic_name, 500, 20)
        await wait_for(lambda: len({e.offset for e in rec.snapshot() if e.kind == "end"}) >= 1000,
                       what="all processed")
        first = engine.status()["partitions"][0]["committed"]
        assert first < 1000
        engine.fence()
        engine.resume()  # a user resume does not lift the fence
        assert engine.status()["partitions"][0]["phase"] == "fenced"
    finally:
        await engine.stop()
    # Without the fence, stop() would commit 1000 (its release's final commit).
    assert await asyncio.to_thread(committed_offset, broker, group, topic_name) == first


def _args(lease: str, assign: str | None = "") -> argparse.Namespace:
    return argparse.Namespace(lease=lease, assign=assign)


def test_lease_flag_and_pod_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    pod_env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "MULTILANE_POD_NAME": "app-3",
               "MULTILANE_POD_NAMESPACE": NS}
    # auto: only in operator mode with the pod environment
    assert lease_settings(_args("auto"), environ={}) is None
    assert lease_settings(_args("auto", assign=None), environ=pod_env) is None
    assert lease_settings(_args("off"), environ=pod_env) is None
    with pytest.raises(ConfigError, match="MULTILANE_POD_NAME"):
        lease_settings(_args("on"), environ={"KUBERNETES_SERVICE_HOST": "x", "MULTILANE_POD_NAMESPACE": NS})
    with pytest.raises(ConfigError, match="operator mode"):
        lease_settings(_args("on", assign=None), environ=pod_env)
    # with the environment: the settings of LeaseSettings.from_environment()
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("tok\n")
    (sa / "ca.crt").write_text("")
    monkeypatch.setattr("multilane.worker.lease.SA_DIR", sa)
    for k, v in {**pod_env, "MULTILANE_LEASE_DURATION_SECONDS": "30"}.items():
        monkeypatch.setenv(k, v)
    s = lease_settings(_args("auto"), environ=pod_env)
    assert s is not None
    assert (s.api_url, s.namespace, s.name, s.holder, s.token) == ("https://10.0.0.1:443", NS, "app-3",
                                                                   "app-3", "tok")
    assert (s.lease_duration_s, s.stop_margin_s, s.renew_interval_s) == (30.0, 10.0, 6.0)
