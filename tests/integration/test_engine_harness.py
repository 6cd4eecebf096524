"""Helpers shared by the engine integration tests (``from test_engine_harness import ...``).

Also one smoke test of the helpers themselves.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from multilane.api import OrderingMode
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import ProducedRecord
from multilane.testing.processors import EventRecorder, ProcessingEvent, ProcessorConfig, read_event_log
from multilane.worker.config import EngineConfig
from multilane.worker.engine import Engine
from multilane.worker.runner import EngineRunner

pytestmark = pytest.mark.broker


def produce(
    broker: EmbeddedBroker,
    topic: str,
    n: int,
    keys: int = 20,
    partition: int = 0,
    key_of: Callable[[int], bytes | None] | None = None,
    start: int = 0,
) -> list[ProducedRecord]:
    """Produce ``n`` records (value ``v<i>``) and return those whose delivery report succeeded."""
    out: list[ProducedRecord] = []
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})

    def cb(err: Any, msg: Any) -> None:
        if err is None:
            out.append(ProducedRecord(msg.topic(), msg.partition(), msg.offset(), msg.key()))

    for i in range(start, start + n):
        key = key_of(i) if key_of is not None else f"k{i % keys}".encode()
        while True:
            try:
                p.produce(topic, key=key, value=f"v{i}".encode(), partition=partition, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    p.flush(30)
    assert len(out) == n, f"only {len(out)} of {n} records were delivered"
    return sorted(out, key=lambda r: r.offset)


def config(broker: EmbeddedBroker, topic: str, group: str, partitions: Sequence[int] = (0,),
           **kw: Any) -> EngineConfig:
    """Operator-mode config with test-friendly timings."""
    defaults: dict[str, Any] = {
        "commit_interval_ms": 200,
        "retry_backoff_ms": 20,
        "drain_timeout_s": 10.0,
        "consumer_overrides": {"session.timeout.ms": "2000", "heartbeat.interval.ms": "300"},
    }
    defaults.update(kw)
    return EngineConfig(bootstrap_servers=broker.bootstrap, group=group, operator_mode=True,
                        assign=tuple((topic, p) for p in partitions), **defaults)


def wait_for(cond: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05,
             what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextmanager
def running(cfg: EngineConfig, processor: Any, hooks: Any = None) -> Iterator[tuple[Engine, EngineRunner]]:
    engine = Engine(cfg, processor, hooks)
    runner = EngineRunner(engine).start()
    try:
        yield engine, runner
    finally:
        runner.stop()


def recorder(sleep_ms: float = 0.0, **kw: Any) -> EventRecorder:
    return EventRecorder(ProcessorConfig(sleep_s=sleep_ms / 1000.0, **kw))


def ended(events: Sequence[ProcessingEvent]) -> set[int]:
    return {e.offset for e in events if e.kind == "end"}


def ended_in_log(log_path: Path, at_least: int) -> Callable[[], bool]:
    """A ``wait_for`` condition: the event log shows ``at_least`` distinct offsets ended."""
    return lambda: log_path.exists() and len(ended(read_event_log(log_path))) >= at_least


@contextmanager
def worker_process(argv: Sequence[str], **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """A worker subprocess (stdout and stderr piped, text), killed on the way out if it still runs."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def sigterm(proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """SIGTERM, then wait for the exit; its stderr."""
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=timeout)
    return err


def committed_offset(broker: EmbeddedBroker, group: str, topic: str, partition: int = 0) -> int | None:
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        tp = c.committed([TopicPartition(topic, partition)], timeout=10)[0]
        return tp.offset if tp.offset >= 0 else None
    finally:
        c.close()


def test_harness_produce_and_commit_lookup(broker: EmbeddedBroker, topic_name: str) -> None:
    broker.create_topic(topic_name, 1)
    recs = produce(broker, topic_name, 10)
    assert [r.offset for r in recs] == list(range(10))
    assert committed_offset(broker, "nobody", topic_name) is None
    assert OrderingMode.KEY.value == "key"
