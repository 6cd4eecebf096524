"""Start-up and health of ``multilane worker`` on the embedded broker: an unreachable broker exits after
``--broker-timeout-s`` with one clear line (and the client's log rate-limited), a missing topic exits 2,
``/readyz`` and the health metrics (with the consumer group as a label), JSON log lines."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multilane.testing.broker import EmbeddedBroker, free_port
from multilane.testing.checkers import ProducedRecord, assert_all, check_delivery
from multilane.testing.loadgen import produce_records
from multilane.testing.processors import EventLogFollower, read_event_log
from multilane.testing.workers import WorkerProcess, WorkerSpec, wait_until

pytestmark = pytest.mark.broker


def _worker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "multilane", "worker", "--group", "g-health",
            "--processor", "multilane.testing.processors:logging_async", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def _start_and_process(workers: list[WorkerProcess], spec: WorkerSpec, tmp_path: Path, broker: EmbeddedBroker,
                       topic: str, n: int, keys: int) -> tuple[WorkerProcess, list[ProducedRecord]]:
    """Start a worker, produce ``n`` records and wait until its event log shows them all processed."""
    w = WorkerProcess(spec, tmp_path)
    workers.append(w)
    w.start().wait_ready(90)
    produced = produce_records(broker.bootstrap, topic, n, keys=keys).records
    follower = EventLogFollower(str(spec.event_log))
    wait_until(lambda: follower.ended_count() >= n, 60, 0.1, f"{n} records processed")
    return w, produced


def _stop_and_check(w: WorkerProcess, produced: list[ProducedRecord], log: str) -> None:
    """SIGTERM: a clean exit, and every record processed (key order)."""
    assert w.terminate(60) == 0
    assert_all(check_delivery(produced, read_event_log(log), mode="key"))


def test_unreachable_broker_exits_after_the_timeout_with_one_clear_line() -> None:
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    done = _worker("--bootstrap-servers", f"127.0.0.1:{port}", "--topic", "t", "--broker-timeout-s", "4")
    took = time.monotonic() - t0
    assert done.returncode == 1, done.stderr[-2000:]
    assert "multilane-worker ready" not in done.stdout
    assert f"broker 127.0.0.1:{port} unreachable" in done.stderr
    assert took < 30
    refused = [line for line in done.stderr.splitlines() if "Connection refused" in line]
    assert len(refused) <= 6, f"{len(refused)} client log lines in {took:.0f}s: not rate-limited"


def test_missing_topic_exits_2_naming_it(broker: EmbeddedBroker, topic_name: str) -> None:
    done = _worker("--bootstrap-servers", broker.bootstrap, "--topic", topic_name, "--log-format", "json")
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"input topic(s) {topic_name} do not exist" in done.stderr
    assert "multilane-worker ready" not in done.stdout
    # the topic was not auto-created by the check
    done2 = _worker("--bootstrap-servers", broker.bootstrap, "--topic", topic_name)
    assert done2.returncode == 2
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert any(d["level"] == "ERROR" and topic_name in d["message"] for d in lines), done.stderr[-2000:]


def test_readyz_and_health_metrics(broker: EmbeddedBroker, topic_name: str, tmp_path: Path,
                                   workers: list[WorkerProcess]) -> None:
    broker.create_topic(topic_name, 2)
    log = str(tmp_path / "events.log")
    spec = WorkerSpec(broker.bootstrap, group=f"g-{topic_name}", assign=f"{topic_name}:0,{topic_name}:1",
                      event_log=log)
    w, produced = _start_and_process(workers, spec, tmp_path, broker, topic_name, 200, keys=20)
    code, body = w.request("GET", "/readyz", token=None)
    assert code == 200 and body == {"ready": True, "reasons": []}
    m = w.metrics()
    assert ({"group": spec.group, "worker_id": w.worker_id}, 1.0) in m["multilane_worker_info"]
    count = [v for labels, v in m["multilane_end_to_end_latency_seconds_count"]
             if labels == {"group": spec.group}]
    assert count and count[0] >= 200
    assert m["multilane_breaker_open"] == [({"group": spec.group}, 0.0)]
    assert m["multilane_broker_reachable"] == [({"group": spec.group}, 1.0)]
    assert "python_info" in m, "prometheus_client's default registry (app metrics) is not served"
    _stop_and_check(w, produced, log)


def test_a_processor_blocking_the_loop_is_named(broker: EmbeddedBroker, topic_name: str, tmp_path: Path,
                                                workers: list[WorkerProcess]) -> None:
    """``time.sleep`` inside ``async def``: one WARNING names the function, its file and the record."""
    broker.create_topic(topic_name, 1)
    log = str(tmp_path / "events.log")
    spec = WorkerSpec(broker.bootstrap, group=f"g-{topic_name}", assign=f"{topic_name}:0",
                      processor="multilane.testing.faulty:blocks_the_loop", event_log=log,
                      env={"MULTILANE_TEST_SLEEP_MS": "800"})
    w, produced = _start_and_process(workers, spec, tmp_path, broker, topic_name, 3, keys=3)
    wait_until(lambda: w.metric_sum("multilane_loop_blocked_total") >= 1, 10, 0.2, "the blocking counted")
    tail = w.stderr_tail(300)
    assert "event loop blocked" in tail and "blocks_the_loop" in tail and f"{topic_name}/0@" in tail, tail
    _stop_and_check(w, produced, log)
