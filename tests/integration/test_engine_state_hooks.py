"""The engine's side of the state-hook contract (docs/state.md): durability loss, metrics, status,
learner control routes, clean close after a revoke, parallel opens.

These tests drive the real engine against the embedded broker with :class:`FakeStateHooks`, a test
double of ``PartitionStateHooks`` (the contract ``StateManager`` implements) that records every call
and can inject faults. They check what the *engine* does with the hooks; the real store is covered by
``test_state_*.py``.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge
from test_engine_harness import committed_offset, config, produce, recorder, running, wait_for

from multilane.formats.keyranges import KeyRange
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery
from multilane.worker.config import EngineConfig
from multilane.worker.control import ControlServer
from multilane.worker.state.errors import StateDurabilityError, StatePhaseError

pytestmark = pytest.mark.broker

TOKEN = "hooks-token"


class FakeStateHooks:
    """Test double of the state-hook contract: records calls; optional faults.

    ``fail_commit(topic, partition, offset) -> bool``: ``before_commit`` raises
    :class:`StateDurabilityError` when it returns True, and then on every later call for that
    partition until it is closed, as ``ChangelogWriter.check`` does (a recorded loss is forgotten only
    when the partition closes). ``open_delay_s``: ``open_partition`` sleeps
    this long (to observe parallel opens). ``lag``: the ``restore_lag`` ``learner_status`` reports.
    """

    def __init__(self, fail_commit: Callable[[str, int, int], bool] | None = None,
                 open_delay_s: float = 0.0) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()
        self.fail_commit = fail_commit
        self.open_delay_s = open_delay_s
        self.open_times: list[tuple[float, float]] = []
        self.active: set[tuple[str, int]] = set()
        self.opening: set[tuple[str, int]] = set()
        self.learning: set[tuple[str, int]] = set()
        self.lag = 0
        self.lost: set[tuple[str, int]] = set()  # partitions whose injected loss stands until close
        # contract violations seen by view()/before_commit() (recorded: an exception there would only
        # fail and retry the attempt, hiding the violation); every test asserts this stays empty
        self.violations: list[str] = []
        registry = CollectorRegistry()  # keeps the gauge out of the global registry
        self.gauge = Gauge("multilane_test_restore_remaining", "test gauge", ["topic", "partition"],
                           registry=registry)

    def _add(self, *call: Any) -> None:
        with self.lock:
            self.calls.append(call)

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        with self.lock:
            return [c for c in self.calls if c[0] == kind]

    # -- the hooks -------------------------------------------------------------------------------------

    def open_partition(self, topic: str, partition: int, committed_offset: int | None,
                       progress: Any) -> None:
        t0 = time.monotonic()
        with self.lock:
            self.opening.add((topic, partition))
        if self.open_delay_s:
            time.sleep(self.open_delay_s)
        with self.lock:
            self.open_times.append((t0, time.monotonic()))
            self.opening.discard((topic, partition))
            self.active.add((topic, partition))
            self.learning.discard((topic, partition))
        self._add("open", topic, partition, committed_offset)

    def view(self, topic: str, partition: int, key: bytes | None, key_range: KeyRange,
             source_offset: int, source_key_hash: int) -> Any:
        with self.lock:
            if (topic, partition) not in self.active:
                self.violations.append(f"view of {topic}/{partition}@{source_offset} while not open")
        return ("view", topic, partition, source_offset)

    def before_commit(self, topic: str, partition: int, offset: int) -> None:
        with self.lock:
            if (topic, partition) not in self.active:
                self.violations.append(f"before_commit of {topic}/{partition}@{offset} while not open")
        with self.lock:
            lost = (topic, partition) in self.lost
        if lost or (self.fail_commit is not None and self.fail_commit(topic, partition, offset)):
            with self.lock:
                self.lost.add((topic, partition))
            self._add("before_commit_failed", topic, partition, offset)
            raise StateDurabilityError(f"injected: a changelog record of {topic}[{partition}] was lost")
        self._add("before_commit", topic, partition, offset)

    def close_partition(self, topic: str, partition: int, clean: bool) -> None:
        with self.lock:
            self.active.discard((topic, partition))
            self.lost.discard((topic, partition))
        self._add("close", topic, partition, clean)

    # -- learner calls and observability ---------------------------------------------------------------

    def learn(self, topic: str, partition: int) -> None:
        with self.lock:
            if (topic, partition) in self.active:
                raise StatePhaseError(f"{topic}[{partition}] is active here: use demote()")
            self.learning.add((topic, partition))
        self._add("learn", topic, partition)

    def demote(self, topic: str, partition: int) -> None:
        with self.lock:
            still_active = (topic, partition) in self.active
        self._add("demote", topic, partition, still_active)
        self.learn(topic, partition)

    def promote(self, topic: str, partition: int) -> None:
        self._add("promote", topic, partition)
        raise StatePhaseError(f"learner {topic}[{partition}] has not caught up yet")

    def drop(self, topic: str, partition: int) -> None:
        with self.lock:
            self.learning.discard((topic, partition))
        self._add("drop", topic, partition)

    def metrics_collectors(self) -> tuple[Any, ...]:
        return (self.gauge,)

    def learner_status(self) -> list[dict[str, object]]:
        with self.lock:
            active, learning = sorted(self.active), sorted(self.learning)
            opening = sorted(self.opening)
        return ([{"topic": t, "partition": p, "phase": "active", "restore_lag": self.lag}
                 for t, p in active]
                + [{"topic": t, "partition": p, "phase": "restoring", "restore_lag": 11}
                   for t, p in opening]
                + [{"topic": t, "partition": p, "phase": "learning", "restore_lag": 7, "unread": 7}
                   for t, p in learning])


def _http(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    req.add_header("Authorization", f"Bearer {TOKEN}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_durability_error_reopens_the_partition_without_committing(
    broker: EmbeddedBroker, topic_name: str
) -> None:
    """``before_commit`` raising StateDurabilityError: no commit, unclean close, reopen at the old
    committed offset, and every record from there is processed again, then committed."""
    broker.create_topic(topic_name, 1)
    n = 300
    produced = produce(broker, topic_name, n, keys=10)
    failed: list[int] = []

    def fail_once(topic: str, partition: int, offset: int) -> bool:
        if not failed and offset > 0:
            failed.append(offset)
            return True
        return False

    hooks = FakeStateHooks(fail_commit=fail_once)
    rec = recorder()
    cfg = config(broker, topic_name, f"g-{topic_name}", factor=4)
    with running(cfg, rec.async_processor, hooks):
        wait_for(lambda: len(hooks.of("open")) >= 2, 60, what="the partition reopened")
        wait_for(lambda: committed_offset(broker, cfg.group, topic_name) == n, 60, what="commit of n")
    assert failed, "the fault was never injected"
    bad = failed[0]
    calls = hooks.calls
    i = calls.index(("before_commit_failed", topic_name, 0, bad))
    # the failed partition is closed uncleanly and opened again at the committed offset of before the
    # failure (None: never committed). A commit cycle that runs before the reopen takes the control
    # lock meets the same loss again, so only failed attempts may come in between.
    j = calls.index(("close", topic_name, 0, False), i)
    assert all(c[0] == "before_commit_failed" for c in calls[i + 1:j]), calls[i:j + 2]
    earlier = [c[3] for c in calls[:i] if c[0] == "before_commit"]
    before = max(earlier) if earlier else None
    assert before is None or before < bad
    assert calls[j + 1] == ("open", topic_name, 0, before), calls[i:j + 2]
    # so every record from that offset to the failed commit was processed again after the reopen
    ends: dict[int, int] = {}
    for e in rec.snapshot():
        if e.kind == "end":
            ends[e.offset] = ends.get(e.offset, 0) + 1
    replayed = range(before or 0, bad)
    assert all(ends.get(o, 0) >= 2 for o in replayed), "records below the failed commit not replayed"
    assert hooks.calls[-1] == ("close", topic_name, 0, True)
    assert hooks.violations == []
    assert_all(check_delivery(produced, rec.snapshot(), mode="key", rewind_within_incarnation=True))


def test_metrics_status_and_learner_routes(broker: EmbeddedBroker, topic_name: str) -> None:
    """The hooks' collectors are served by /metrics; restore_lag and learners appear in /v1/status;
    /v1/demote releases (drain, final commit, clean close) before ``hooks.demote``; /v1/promote of a
    learner that is not ready answers 409; learning a partition owned here answers 409."""
    broker.create_topic(topic_name, 2)
    n = 200
    produced = produce(broker, topic_name, n, keys=10) + produce(broker, topic_name, n, keys=10,
                                                                   partition=1)
    hooks = FakeStateHooks()
    hooks.gauge.labels(topic_name, "0").set(42)
    rec = recorder()
    cfg = config(broker, topic_name, f"g-{topic_name}", partitions=[0, 1], factor=2)
    with running(cfg, rec.async_processor, hooks) as (engine, runner):
        server = ControlServer(engine, TOKEN, host="127.0.0.1", port=0)
        port = runner.call(server.start)
        try:
            wait_for(lambda: all(committed_offset(broker, cfg.group, topic_name, p) == n for p in (0, 1)),
                     60, what="both partitions committed")
            # metrics: the hooks' collector is in the engine's registry
            text = runner.sync(engine.metrics.render).decode()
            assert f'multilane_test_restore_remaining{{partition="0",topic="{topic_name}"}} 42.0' in text
            # status: restore_lag from learner_status
            hooks.lag = 5
            code, status = _http(port, "GET", "/v1/status")
            assert code == 200
            assert [p["restore_lag"] for p in status["partitions"]] == [5, 5]
            assert {(e["topic"], e["partition"]) for e in status["learners"]} == {
                (topic_name, 0), (topic_name, 1)}
            # learn of an owned partition: wrong phase -> 409
            code, body = _http(port, "POST", "/v1/learn",
                               {"partitions": [{"topic": topic_name, "partition": 1}]})
            assert code == 409 and "demote" in body["error"], body
            # demote: release first (final commit, clean close), then hooks.demote
            code, body = _http(port, "POST", "/v1/demote",
                               {"partitions": [{"topic": topic_name, "partition": 1}]})
            assert code == 200, body
            assert body["released"][0].pop("progress")  # the final commit's record, for the next owner
            assert body["released"] == [{"topic": topic_name, "partition": 1, "committed_offset": n}]
            closes = [c for c in hooks.calls if c[0] in ("close", "demote") and c[2] == 1]
            assert closes == [("close", topic_name, 1, True), ("demote", topic_name, 1, False)], closes
            code, status = _http(port, "GET", "/v1/status")
            assert [p["partition"] for p in status["partitions"]] == [0]
            learner = [e for e in status["learners"] if e["partition"] == 1]
            assert learner and learner[0]["phase"] == "learning" and learner[0]["restore_lag"] == 7
            # promote: a readiness check; not caught up -> 409
            code, body = _http(port, "POST", "/v1/promote",
                               {"partitions": [{"topic": topic_name, "partition": 1}]})
            assert code == 409 and "caught up" in body["error"], body
            # drop
            code, body = _http(port, "POST", "/v1/drop",
                               {"partitions": [{"topic": topic_name, "partition": 1}]})
            assert code == 200 and ("drop", topic_name, 1) in hooks.calls
        finally:
            runner.call(server.stop)
    assert hooks.violations == []
    assert_all(check_delivery(produced, rec.snapshot(), mode="key"))


def test_parallel_open_and_status_while_opening(broker: EmbeddedBroker, topic_name: str) -> None:
    """Newly assigned partitions open their state in parallel; while opening they are listed in
    status as ``promoting`` with the hooks' restore lag."""
    parts = 4
    broker.create_topic(topic_name, parts)
    hooks = FakeStateHooks(open_delay_s=1.5)
    hooks.lag = 3
    rec = recorder()
    cfg = config(broker, topic_name, f"g-{topic_name}", partitions=[], factor=1)
    with running(cfg, rec.async_processor, hooks) as (engine, runner):
        result: list[Any] = []
        t = threading.Thread(target=lambda: result.append(
            runner.call(engine.assign, [(topic_name, p) for p in range(parts)], 1)))
        t.start()
        seen: list[dict[str, Any]] = []

        def opening() -> bool:
            st = runner.sync(engine.status)["partitions"]
            if st:
                seen.extend(st)
            return any(p["phase"] == "promoting" and p["restore_lag"] == 11 for p in st)

        # (status reads the learner figures the housekeeping loop refreshed, every 0.2 s here)
        wait_for(opening, 30, interval=0.02, what="partitions listed while opening, with restore lag")
        t.join(60)
        assert result == [[]]
    promoting = [p for p in seen if p["phase"] == "promoting" and p["restore_lag"] == 11]
    assert promoting and all(p["state_phase"] == "restoring" for p in promoting), promoting
    assert len(hooks.open_times) == parts
    starts = [s for s, _ in hooks.open_times]
    ends = [e for _, e in hooks.open_times]
    # all four opens overlapped (sequential opens would take 4 x 1.5 s)
    assert max(starts) < min(ends), hooks.open_times


def _standalone(broker: EmbeddedBroker, topic: str, group: str, worker: str) -> EngineConfig:
    return EngineConfig(bootstrap_servers=broker.bootstrap, group=group, topics=(topic,),
                        worker_id=worker, commit_interval_ms=200, drain_timeout_s=10.0,
                        consumer_overrides={"session.timeout.ms": "2000",
                                            "heartbeat.interval.ms": "300"})


@pytest.mark.slow  # long scenario: kept out of the default suite's ~15 minutes (run with -m slow)
def test_standalone_revoke_closes_cleanly_after_a_successful_commit(
    broker: EmbeddedBroker, topic_name: str
) -> None:
    """A cooperative revoke whose synchronous commit succeeded, with nothing in flight, closes the
    state cleanly (so the next open can reuse the checkpoint instead of a full restore)."""
    broker.create_topic(topic_name, 4)
    for p in range(4):
        produce(broker, topic_name, 50, keys=5, partition=p)
    group = f"g-{topic_name}"
    ha, hb = FakeStateHooks(), FakeStateHooks()
    rec = recorder()
    with running(_standalone(broker, topic_name, group, "a"), rec.async_processor, ha) as (ea, ra):
        wait_for(lambda: len(ra.sync(ea.status)["partitions"]) == 4, 60, what="a owns 4")
        wait_for(lambda: all(committed_offset(broker, group, topic_name, p) == 50 for p in range(4)),
                 60, what="a committed everything")
        with running(_standalone(broker, topic_name, group, "b"), rec.async_processor, hb) as (eb, rb):
            wait_for(lambda: len(rb.sync(eb.status)["partitions"]) >= 1, 60, what="b got partitions")
            revoked = ha.of("close")
            assert revoked, "a closed nothing"
            assert all(c[3] is True for c in revoked), revoked
    assert ha.violations == [] and hb.violations == []


@pytest.mark.parametrize("sync", [False, True])
def test_no_committed_offset_first_records_under_back_pressure(
    broker: EmbeddedBroker, topic_name: str, sync: bool
) -> None:
    """Item of the state tests' intermittent loss (the first record of a partition with no committed
    offset): many partitions start without a committed offset under a small process-wide bound (the
    fetch loop pauses every partition, refuses and drops records); every record, in particular each
    partition's first, is processed after its state was opened, and everything is committed."""
    parts = 8
    n = 300
    broker.create_topic(topic_name, parts)
    produced = []
    for p in range(parts):
        produced += produce(broker, topic_name, n, keys=7, partition=p)
    hooks = FakeStateHooks(open_delay_s=0.2)
    rec = recorder(sleep_ms=0.5)
    cfg = config(broker, topic_name, f"g-{topic_name}", partitions=range(parts), factor=4,
                 max_in_flight=16)
    proc = rec.sync_processor if sync else rec.async_processor
    with running(cfg, proc, hooks) as (engine, runner):
        wait_for(lambda: all(committed_offset(broker, cfg.group, topic_name, p) == n
                             for p in range(parts)), 120, interval=0.5, what="every partition committed")
        pauses = runner.sync(engine.status)["back_pressure_pauses"]
    assert pauses > 0, "the bound never paused a partition: the test did not exercise back-pressure"
    assert hooks.violations == []
    firsts = {(e.partition, e.offset) for e in rec.snapshot() if e.kind == "end" and e.offset == 0}
    assert firsts == {(p, 0) for p in range(parts)}
    assert_all(check_delivery(produced, rec.snapshot(), mode="key"))


def test_durability_error_reopens_in_standalone_mode(broker: EmbeddedBroker, topic_name: str) -> None:
    """Standalone (group) mode: the partition stays in the group's assignment; the engine drops and
    retakes it locally, and replays from the committed offset."""
    broker.create_topic(topic_name, 1)
    n = 200
    produced = produce(broker, topic_name, n, keys=10)
    failed: list[int] = []

    def fail_once(topic: str, partition: int, offset: int) -> bool:
        if not failed and offset > 0:
            failed.append(offset)
            return True
        return False

    hooks = FakeStateHooks(fail_commit=fail_once)
    rec = recorder()
    group = f"g-{topic_name}"
    with running(_standalone(broker, topic_name, group, "a"), rec.async_processor, hooks):
        wait_for(lambda: len(hooks.of("open")) >= 2, 60, what="the partition reopened")
        wait_for(lambda: committed_offset(broker, group, topic_name) == n, 60, what="commit of n")
    assert failed
    calls = hooks.calls
    i = calls.index(("before_commit_failed", topic_name, 0, failed[0]))
    j = calls.index(("close", topic_name, 0, False), i)
    assert all(c[0] == "before_commit_failed" for c in calls[i + 1:j]), calls[i:j + 2]
    assert calls[j + 1][:3] == ("open", topic_name, 0)
    assert hooks.violations == []
    assert_all(check_delivery(produced, rec.snapshot(), mode="key", rewind_within_incarnation=True))
