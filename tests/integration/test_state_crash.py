"""Crash tests with real worker processes (``multilane worker --state-dir``) and the per-key counting
processor: after kill -9 during restore, and between the changelog flush and the commit, the state
equals the reference counts computed from the input (nothing lost, nothing counted twice); the same
under load while the parallelising factor changes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from multilane.testing.broker import EmbeddedBroker, free_port
from multilane.worker.state import StateManager
from multilane.worker.state.examples import decode_count, reference_counts
from multilane.worker.state.store import PartitionStore, partition_dir

ROOT = Path(__file__).resolve().parents[2]  # the repository: ``tests.support.faults`` imports from it

pytestmark = [pytest.mark.broker, pytest.mark.timeout(600)]

PROCESSOR = "multilane.worker.state.examples:count_per_key"
PARTITIONS = 2


class Worker:
    """One ``multilane worker`` process; stderr goes to a log file the test can search."""

    def __init__(self, cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self._log: IO[str] = open(log_path, "a")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._log, text=True, env={**os.environ, **(env or {})}
        )
        self.ready = threading.Event()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("multilane-worker ready"):
                self.ready.set()

    def log(self) -> str:
        return self.log_path.read_text()

    def kill9(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.wait()

    def terminate(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait()

    def wait(self, timeout: float = 120.0) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            self._log.close()
        return code


def wait_until(pred: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def produce(
    broker: EmbeddedBroker, topic: str, n: int, start: int = 0, keys: int = 300
) -> list[tuple[int, int, bytes]]:
    """Produce ``n`` keyed records spread over the partitions; returns delivered (partition, offset, key)."""
    out: list[tuple[int, int, bytes]] = []
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})

    def cb(err: Any, msg: Any) -> None:
        if err is None:
            out.append((msg.partition(), msg.offset(), msg.key()))

    for i in range(start, start + n):
        key = b"key-%d" % (i % keys)
        while True:
            try:
                p.produce(topic, key=key, value=b"v%d" % i, partition=(i % keys) % PARTITIONS, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(60)
    assert len(out) == n, f"only {len(out)} of {n} records delivered"
    return out


class Committed:
    def __init__(self, broker: EmbeddedBroker, group: str, topic: str) -> None:
        self._c = Consumer(
            {"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False}
        )
        self._topic = topic

    def offsets(self) -> list[int]:
        tps = self._c.committed([TopicPartition(self._topic, p) for p in range(PARTITIONS)], timeout=10)
        return [max(0, tp.offset) for tp in tps]

    def close(self) -> None:
        self._c.close()


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def committed(broker: EmbeddedBroker, group: str, topic_name: str) -> Iterator[Committed]:
    c = Committed(broker, group, topic_name)
    yield c
    c.close()


def worker_cmd(broker: EmbeddedBroker, group: str, topic: str, state_dir: Path, *extra: str) -> list[str]:
    return [
        "--bootstrap-servers", broker.bootstrap, "--group", group, "--processor", PROCESSOR,
        "--assign", ",".join(f"{topic}:{p}" for p in range(PARTITIONS)), "--state-dir", str(state_dir),
        "--commit-interval-ms", "200", "--factor", "4", "--drain-timeout-s", "20",
        "--consumer-config", "fetch.queue.backoff.ms=10", *extra,
    ]  # fmt: skip


def start_worker(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> Worker:
    return Worker([sys.executable, "-m", "multilane", "worker", *args], log_path, env)


def ends_of(records: list[tuple[int, int, bytes]]) -> list[int]:
    ends = [0] * PARTITIONS
    for p, off, _ in records:
        ends[p] = max(ends[p], off + 1)
    return ends


def run_to_completion(args: list[str], log_path: Path, committed: Committed, ends: list[int]) -> None:
    w = start_worker(args, log_path)
    try:
        wait_until(lambda: committed.offsets() == ends, 240, "all records committed", interval=0.5)
    finally:
        code = w.terminate()
    assert code == 0, w.log()[-3000:]


def assert_state_matches(
    broker: EmbeddedBroker,
    group: str,
    topic: str,
    state_dir: Path,
    records: list[tuple[int, int, bytes]],
    tmp_path: Path,
) -> None:
    """The worker's local stores and an independent full restore from the changelog both equal the
    reference counts of the input, partition by partition."""
    ends = ends_of(records)
    for p in range(PARTITIONS):
        expected = reference_counts(k for q, _, k in records if q == p)
        store = PartitionStore(partition_dir(state_dir, topic, p)).open()
        try:
            local = {k: decode_count(v) for k, v in store.items()}
        finally:
            store.close()
        assert local == expected, f"partition {p}: local store differs from the reference"
    with StateManager(tmp_path / f"verify-{uuid.uuid4().hex[:6]}", broker.bootstrap, group) as sm:
        for p in range(PARTITIONS):
            sm.open_partition(topic, p, ends[p], None)
            restored = {k: decode_count(v) for k, v in sm.store(topic, p).items()}
            assert restored == reference_counts(k for q, _, k in records if q == p), f"partition {p}: restore"
            sm.close_partition(topic, p, clean=False)


def test_kill9_mid_processing_and_during_restore(
    broker: EmbeddedBroker, topic_name: str, group: str, committed: Committed, tmp_path: Path
) -> None:
    broker.create_topic(topic_name, PARTITIONS)
    records = produce(broker, topic_name, 80_000)
    ends = ends_of(records)
    state_dir = tmp_path / "state"
    args = worker_cmd(broker, group, topic_name, state_dir)

    # 1. kill -9 while processing (a third or so done): the stores hold uncommitted writes.
    w1 = start_worker(args, tmp_path / "w1.log")
    wait_until(lambda: sum(committed.offsets()) >= 15_000, 120, "first commits", interval=0.1)
    w1.kill9()
    after_first = committed.offsets()
    assert sum(after_first) < sum(ends), "the first worker finished before it was killed"
    assert not list((state_dir / f"{topic_name}-0").glob("checkpoint.json"))

    # 2. kill -9 during the restore of the next worker (no checkpoint: wipe + full restore). Each
    #    attempt is a crash; retry (a loaded machine may deschedule this test past a short restore)
    #    until one lands inside the restore.
    landed = False
    for attempt in range(5):
        w2 = start_worker(args, tmp_path / f"w2-{attempt}.log")
        wait_until(lambda w2=w2: "restoring " in w2.log(), 60, "restore start", interval=0.01)  # type: ignore[misc]
        w2.kill9()
        if f"restored {topic_name}[{PARTITIONS - 1}]" not in w2.log():
            landed = True
            break
    assert landed, "no kill landed during a restore in 5 attempts"
    assert sum(committed.offsets()) < sum(ends)

    # 3. a third worker restores and finishes; its SIGTERM close leaves clean checkpoints.
    run_to_completion(args, tmp_path / "w3.log", committed, ends)
    assert (partition_dir(state_dir, topic_name, 0) / "checkpoint.json").exists()
    assert_state_matches(broker, group, topic_name, state_dir, records, tmp_path)


def test_kill9_between_changelog_flush_and_commit(
    broker: EmbeddedBroker, topic_name: str, group: str, committed: Committed, tmp_path: Path
) -> None:
    broker.create_topic(topic_name, PARTITIONS)
    records = produce(broker, topic_name, 60_000)
    ends = ends_of(records)
    state_dir = tmp_path / "state"
    args = worker_cmd(broker, group, topic_name, state_dir)

    for round_, flushes in enumerate((3, 4)):
        before = committed.offsets()
        w = Worker(
            [
                sys.executable,
                "-m",
                "tests.support.faults",
                "--kill-after-flush",
                str(flushes),
                "--",
                *args,
            ],
            tmp_path / f"fault{round_}.log",
            env={"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
        )
        # The worker kills itself after its N-th flush; it must not finish the input first.
        wait_until(
            lambda w=w: w.proc.poll() is not None or committed.offsets() == ends,  # type: ignore[misc]
            180,
            "the faulty worker to die",
            interval=0.2,
        )
        assert w.proc.poll() is not None, "the worker finished the input before its fault triggered"
        code = w.wait(30)
        log = w.log()
        assert code == -signal.SIGKILL, log[-3000:]
        assert "faults: SIGKILL after flush" in log
        assert sum(committed.offsets()) >= sum(before)
    assert committed.offsets() != ends, "the faulty workers must not have finished the input"

    run_to_completion(args, tmp_path / "final.log", committed, ends)
    assert_state_matches(broker, group, topic_name, state_dir, records, tmp_path)


def _post(port: int, token: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as resp:
        result: dict[str, Any] = json.loads(resp.read())
        return result


def test_state_correct_across_factor_changes_under_load(
    broker: EmbeddedBroker, topic_name: str, group: str, committed: Committed, tmp_path: Path
) -> None:
    broker.create_topic(topic_name, PARTITIONS)
    records = produce(broker, topic_name, 20_000)
    state_dir = tmp_path / "state"
    port, token = free_port(), uuid.uuid4().hex
    args = worker_cmd(broker, group, topic_name, state_dir, "--control-port", str(port))
    w = start_worker(args, tmp_path / "w.log", env={"MULTILANE_CONTROL_TOKEN": token})
    try:
        assert w.ready.wait(120), w.log()[-3000:]
        # Load keeps arriving while the factor moves 4 -> 1 -> 16 -> 3 -> 8.
        for i, factor in enumerate((1, 16, 3, 8)):
            records += produce(broker, topic_name, 15_000, start=20_000 + i * 15_000)
            assert _post(port, token, "/v1/factor", {"factor": factor}) == {"factor": factor}
            time.sleep(0.3)
        ends = ends_of(records)
        wait_until(lambda: committed.offsets() == ends, 240, "all records committed", interval=0.5)
    finally:
        code = w.terminate()
    assert code == 0, w.log()[-3000:]
    assert "outside this lane's key range" not in w.log()
    assert_state_matches(broker, group, topic_name, state_dir, records, tmp_path)
