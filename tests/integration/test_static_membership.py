"""What each broker does with static group membership (``--group-instance-id``).

A standalone worker is SIGKILLed and replaced by a new process; the replacement's time from its ready
line to its first processed record is measured with and without a ``group.instance.id`` (session timeout
6 s). The assertion records what the session's broker does (docs/worker-health.md quotes it): Tansu
waits out the killed static member's session; Apache Kafka hands its partitions to the new process with
the same ``group.instance.id`` at once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery
from multilane.testing.loadgen import produce_records
from multilane.testing.processors import EventLogFollower, read_event_log
from multilane.testing.workers import WorkerProcess, WorkerSpec, wait_until

pytestmark = [pytest.mark.broker, pytest.mark.matrix]

SESSION = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}


def _takeover_s(broker: EmbeddedBroker, topic: str, tmp: Path, workers: list[WorkerProcess],
                instance_id: str | None) -> float:
    """Seconds from the replacement's ready line to its first processed record."""
    broker.create_topic(topic, 2)
    log = str(tmp / "events.log")
    extra = ["--group-instance-id", instance_id] if instance_id else []
    spec = WorkerSpec(broker.bootstrap, group=f"g-{topic}", topics=[topic], factor=2, event_log=log,
                      consumer_config=SESSION, extra_args=extra)
    first = WorkerProcess(spec, tmp / "a")
    workers.append(first)
    first.start().wait_ready(90)
    produced = produce_records(broker.bootstrap, topic, 100, keys=10).records
    follower = EventLogFollower(log)
    wait_until(lambda: follower.ended_count() >= 100, 90, 0.1, "first batch processed")
    first.kill()
    second = WorkerProcess(spec, tmp / "b")
    workers.append(second)
    second.start().wait_ready(90)
    ready_at = time.time()
    produced += produce_records(broker.bootstrap, topic, 100, keys=10, seed=1).records
    wait_until(lambda: follower.ended_count() >= 200, 90, 0.1, "second batch processed")
    took = min(e.time for e in read_event_log(log) if e.kind == "start" and e.pid == second.pid) - ready_at
    assert second.terminate(60) == 0
    assert_all(check_delivery(produced, read_event_log(log), mode="key"))
    return took


def test_static_membership_takeover(broker: EmbeddedBroker, topic_name: str, tmp_path: Path,
                                   workers: list[WorkerProcess], broker_kind: str) -> None:
    dynamic = _takeover_s(broker, f"{topic_name}-d", tmp_path / "d", workers, None)
    static = _takeover_s(broker, f"{topic_name}-s", tmp_path / "s", workers, "pod-0")
    print(f"replacement's first record after its ready line: dynamic {dynamic:.1f}s, static {static:.1f}s "
          f"(session timeout {int(SESSION['session.timeout.ms']) / 1000:.0f}s)")
    # Measured (2026-11-26): static 6.1-6.2 s in three runs (the broker waits for the killed static
    # member's session to expire instead of handing its partitions at once to the new process with the
    # same group.instance.id); dynamic 3.2 s to 11.1 s (the join waits half the session timeout, more
    # when the killed member is still counted). The stable fact: a static member is not replaced at
    # once, so static membership does not make a takeover fast here and the worker sets it only when
    # asked.
    # Apache Kafka 4.4.0 (measured 2026-11-28, load average ~30 on 2 cores): static 0.1 s, dynamic 4.3 s.
    session_s = int(SESSION["session.timeout.ms"]) / 1000
    if broker_kind == "apache":
        assert static < 0.5 * session_s, f"Apache Kafka waited {static:.1f}s to replace a static member"
        return
    assert static >= 0.5 * session_s, "the broker now replaces a static member at once: revisit the docs"
