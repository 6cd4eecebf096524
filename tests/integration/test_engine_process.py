"""The engine as a process and its extension points: ``multilane worker`` (ready line, SIGTERM ->
drain + final commit + exit 0), standalone group mode, the state-hook call contract, the watchdog."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from test_engine_harness import (
    committed_offset,
    config,
    ended,
    ended_in_log,
    produce,
    recorder,
    running,
    sigterm,
    wait_for,
    worker_process,
)

from multilane.api import Context, Record
from multilane.formats.keyranges import KeyRange
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery
from multilane.testing.processors import read_event_log
from multilane.worker.config import EngineConfig

pytestmark = pytest.mark.broker


def test_cli_worker_ready_line_and_sigterm(broker: EmbeddedBroker, topic_name: str, tmp_path: Path) -> None:
    broker.create_topic(topic_name, 1)
    n = 300
    produced = produce(broker, topic_name, n, keys=15)
    log_path = tmp_path / "events.log"
    token_file = tmp_path / "token"
    token_file.write_text("tok\n")
    group = f"g-{topic_name}"
    env = {**os.environ, "MULTILANE_TEST_LOG": str(log_path), "MULTILANE_TEST_SLEEP_MS": "2"}
    argv = [sys.executable, "-m", "multilane", "worker", "--bootstrap-servers", broker.bootstrap,
            "--group", group, "--processor", "multilane.testing.processors:logging_async",
            "--assign", f"{topic_name}:0", "--factor", "4", "--commit-interval-ms", "300",
            "--control-port", "0", "--control-token-file", str(token_file),
            "--consumer-config", "session.timeout.ms=2000"]
    with worker_process(argv, env=env) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("multilane-worker ready worker_id="), line
        assert "control_port=0" in line and "metrics_port=0" in line
        wait_for(ended_in_log(log_path, n // 2), 60, what="half the records processed")
        err = sigterm(proc)
    assert proc.returncode == 0, err[-3000:]
    events = read_event_log(log_path)
    done = {e.offset for e in events if e.kind == "end"}
    committed = committed_offset(broker, group, topic_name)
    assert committed is not None
    # the final commit covers every record that finished contiguously from the start; records queued
    # at the SIGTERM were not started (they are left to the next owner), so some stay undone
    first_missing = next((o for o in range(n) if o not in done), n)
    assert committed == first_missing
    started = {e.offset for e in events if e.kind == "start"}
    assert started <= done, "a record started before the stop did not finish"
    assert_all(check_delivery([r for r in produced if r.offset in done], events, mode="key"))


def test_cli_refuses_bad_arguments(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "multilane", "worker", "--bootstrap-servers", "127.0.0.1:1",
            "--group", "g"]
    env = {k: v for k, v in os.environ.items() if k != "MULTILANE_CONTROL_TOKEN"}
    cases = [
        (["--processor", "nope", "--topic", "t"], "module:function"),
        (["--processor", "multilane.demo.examples:noop"], "--topic"),
        (["--processor", "multilane.demo.examples:noop", "--assign", "t:x"], "not an int"),
        (["--processor", "multilane.demo.examples:noop", "--assign", "t:0", "--control-port", "1"], "token"),
        (["--processor", "multilane.demo.examples:noop", "--assign", "t:0", "--factor", "0"], "factor"),
    ]
    for extra, needle in cases:
        r = subprocess.run(base + extra, capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 2, (extra, r.stderr)
        assert needle in r.stderr, (extra, r.stderr)


def test_standalone_group_mode_two_workers(broker: EmbeddedBroker, topic_name: str) -> None:
    """subscribe() + cooperative-sticky: a second worker joins, partitions move, revoked ones are
    committed in the revoke callback; everything is processed."""
    broker.create_topic(topic_name, 4)
    produced = []
    for p in range(4):
        produced += produce(broker, topic_name, 150, keys=10, partition=p)
    rec = recorder(sleep_ms=5.0)
    group = f"g-{topic_name}"

    def cfg(worker: str) -> EngineConfig:
        return EngineConfig(bootstrap_servers=broker.bootstrap, group=group, topics=(topic_name,),
                            factor=4, commit_interval_ms=200, worker_id=worker,
                            consumer_overrides={"session.timeout.ms": "2000",
                                                "heartbeat.interval.ms": "300"})

    with running(cfg("a"), rec.async_processor) as (ea, ra):
        wait_for(lambda: len(ra.sync(ea.status)["partitions"]) == 4, 30, what="worker a owns 4")
        wait_for(lambda: len(rec.snapshot()) > 100, 30, what="some processing")
        with running(cfg("b"), rec.async_processor) as (eb, rb):
            wait_for(lambda: len(rb.sync(eb.status)["partitions"]) >= 1 and
                     len(ra.sync(ea.status)["partitions"]) <= 3, 60, what="rebalance to two workers")
            wait_for(lambda: len({(e.partition, e.offset) for e in rec.snapshot() if e.kind == "end"})
                     >= len(produced), 90, what="everything processed")
            for p in range(4):
                wait_for(lambda p=p: committed_offset(broker, group, topic_name, p) == 150, 30,
                         what=f"partition {p} committed")
    # replays after a revoke are allowed (at-least-once); order per key holds within each worker's run
    events = rec.snapshot()
    from multilane.testing.checkers import AtLeastOnceChecker
    assert_all(AtLeastOnceChecker(produced).check(events))


class _HookRecorder:
    """A fake PartitionStateHooks that records the calls (hook-contract test only)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()

    def _add(self, *call: Any) -> None:
        with self.lock:
            self.calls.append(call)

    def open_partition(self, topic: str, partition: int, committed_offset: int | None, progress: Any) -> None:
        self._add("open", topic, partition, committed_offset)

    def view(self, topic: str, partition: int, key: bytes | None, key_range: KeyRange, source_offset: int,
             source_key_hash: int) -> Any:
        assert key_range.contains(source_key_hash)
        return ("view", topic, partition, source_offset)

    def before_commit(self, topic: str, partition: int, offset: int) -> None:
        self._add("before_commit", topic, partition, offset)

    def close_partition(self, topic: str, partition: int, clean: bool) -> None:
        self._add("close", topic, partition, clean)


def test_state_hooks_are_called_in_contract_order(broker: EmbeddedBroker, topic_name: str) -> None:
    broker.create_topic(topic_name, 1)
    n = 200
    produced = produce(broker, topic_name, n, keys=8)
    hooks = _HookRecorder()
    seen_state: list[Any] = []

    async def proc(record: Record, ctx: Context) -> None:
        seen_state.append(ctx.state)

    cfg = config(broker, topic_name, f"g-{topic_name}", factor=4)
    with running(cfg, proc, hooks):
        wait_for(lambda: len(seen_state) >= n, 30, what="all processed")
        wait_for(lambda: ("before_commit", topic_name, 0, n) in hooks.calls, 30, what="commit of n")
    assert hooks.calls[0] == ("open", topic_name, 0, None)
    assert hooks.calls[-1] == ("close", topic_name, 0, True)
    commits = [c[3] for c in hooks.calls if c[0] == "before_commit"]
    assert commits == sorted(commits) and commits[-1] == n
    assert all(s[0] == "view" and s[1] == topic_name for s in seen_state)
    assert sorted(s[3] for s in seen_state) == [r.offset for r in produced]


def test_stall_watchdog_reports_long_running_record(broker: EmbeddedBroker, topic_name: str,
                                                    caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    broker.create_topic(topic_name, 1)
    produce(broker, topic_name, 20, keys=4)
    release = tmp_path / "go"
    rec = recorder(hang=frozenset({b"k2"}), hang_release_file=str(release))
    cfg = config(broker, topic_name, f"g-{topic_name}", stall_threshold_s=0.5)
    with caplog.at_level(logging.WARNING, logger="multilane"), running(cfg, rec.async_processor) as (e, r):
        wait_for(lambda: r.sync(e.status)["stalled"] >= 1, 30, what="a stalled record")
        text = e.metrics.render().decode()
        assert "multilane_stalled_records 1.0" in text
        release.write_text("go")
        wait_for(lambda: len(ended(rec.snapshot())) == 20, 30, what="all done after release")
        wait_for(lambda: r.sync(e.status)["stalled"] == 0, 30, what="no stall")
    msgs = [rec_.getMessage() for rec_ in caplog.records if "stalled record" in rec_.getMessage()]
    assert msgs and f"{topic_name}/0@2" in msgs[0]
