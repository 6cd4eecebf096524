"""Unit tests of multilane.testing.processors: event log format, knobs, concurrent appends."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest

from multilane.api import Context, Record
from multilane.testing import processors as tp
from multilane.testing.checkers import ProducedRecord, assert_all, check_delivery
from multilane.testing.processors import (
    EventLogError,
    EventLogFollower,
    EventRecorder,
    FlakyRecordError,
    PoisonRecordError,
    ProcessorConfig,
    append_kill_marker,
    parse_event_line,
    read_event_log,
)


def ctx(offset: int, key: bytes | None = b"k", attempt: int = 1) -> tuple[Record, Context]:
    rec = Record("t", 2, offset, key, b"v")
    return rec, Context("t", 2, offset, key, [], lane=3, attempt=attempt)


@pytest.fixture(autouse=True)
def _isolated_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests reload the module's config; monkeypatch restores the previous one afterwards."""
    monkeypatch.setattr(tp, "_runtime", None)


@pytest.fixture
def env_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "events.log"
    for k in list(os.environ):
        if k.startswith("MULTILANE_TEST_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("MULTILANE_TEST_LOG", str(path))
    return path


def test_sync_processor_logs_start_and_end(env_log: Path) -> None:
    tp.reload_config()
    tp.logging_sync(*ctx(5, b"\x00\xff"))
    tp.logging_sync(*ctx(6, None))
    events = read_event_log(env_log)
    assert [e.kind for e in events] == ["start", "end", "start", "end"]
    e = events[0]
    assert (e.topic, e.partition, e.offset, e.key, e.attempt, e.lane, e.pid) == (
        "t",
        2,
        5,
        b"\x00\xff",
        1,
        3,
        os.getpid(),
    )
    assert events[2].key is None
    assert [e.seq for e in events] == [0, 1, 2, 3]
    assert abs(e.time - time.time()) < 60


def test_async_processor_sleeps_and_logs(env_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MULTILANE_TEST_SLEEP_MS", "30")
    tp.reload_config()

    async def main() -> float:
        t0 = time.monotonic()
        await asyncio.gather(*(tp.logging_async(*ctx(i)) for i in range(20)))
        return time.monotonic() - t0

    elapsed = asyncio.run(main())
    assert 0.03 <= elapsed < 2.0  # concurrent sleeps, not 20 x 30 ms
    events = read_event_log(env_log)
    assert sum(e.kind == "end" for e in events) == 20


def test_poison_and_flaky_keys(env_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MULTILANE_TEST_POISON", "bad,hex:00ff")
    monkeypatch.setenv("MULTILANE_TEST_FLAKY", "flaky")
    monkeypatch.setenv("MULTILANE_TEST_FLAKY_ATTEMPTS", "2")
    tp.reload_config()
    with pytest.raises(PoisonRecordError):
        tp.logging_sync(*ctx(1, b"bad"))
    with pytest.raises(PoisonRecordError):
        tp.logging_sync(*ctx(2, b"\x00\xff"))
    with pytest.raises(FlakyRecordError):
        tp.logging_sync(*ctx(3, b"flaky", attempt=1))
    with pytest.raises(FlakyRecordError):
        asyncio.run(tp.logging_async(*ctx(3, b"flaky", attempt=2)))
    tp.logging_sync(*ctx(3, b"flaky", attempt=3))
    kinds = [(e.kind, e.offset, e.attempt) for e in read_event_log(env_log)]
    assert kinds == [
        ("start", 1, 1),
        ("fail", 1, 1),
        ("start", 2, 1),
        ("fail", 2, 1),
        ("start", 3, 1),
        ("fail", 3, 1),
        ("start", 3, 2),
        ("fail", 3, 2),
        ("start", 3, 3),
        ("end", 3, 3),
    ]


def test_hang_until_release_file(env_log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = tmp_path / "release"
    monkeypatch.setenv("MULTILANE_TEST_HANG_KEY", "stuck")
    monkeypatch.setenv("MULTILANE_TEST_HANG_RELEASE_FILE", str(release))
    tp.reload_config()
    t = threading.Thread(target=tp.logging_sync, args=ctx(1, b"stuck"), daemon=True)
    t.start()
    t.join(0.3)
    assert t.is_alive()
    assert [e.kind for e in read_event_log(env_log)] == ["start"]
    release.touch()
    t.join(10)
    assert not t.is_alive()
    assert [e.kind for e in read_event_log(env_log)] == ["start", "end"]


def test_no_log_configured_records_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MULTILANE_TEST_LOG", raising=False)
    monkeypatch.chdir(tmp_path)
    tp.reload_config()
    tp.logging_sync(*ctx(1))
    assert list(tmp_path.iterdir()) == []


def test_config_env_round_trip_and_errors() -> None:
    cfg = ProcessorConfig(
        log_path="/x",
        sleep_s=0.0125,
        poison=frozenset({b"a", b"\x00"}),
        hang=frozenset({b"h"}),
        slow=frozenset({b"s"}),
        slow_s=1.5,
        flaky=frozenset({b"f"}),
        flaky_attempts=3,
        hang_release_file="/r",
    )
    assert ProcessorConfig.from_env(cfg.to_env()) == cfg
    with pytest.raises(ValueError, match="bad number"):
        ProcessorConfig.from_env({"MULTILANE_TEST_SLEEP_MS": "fast"})
    with pytest.raises(ValueError, match="bad hex key"):
        ProcessorConfig.from_env({"MULTILANE_TEST_POISON": "hex:zz"})
    with pytest.raises(ValueError, match="sleep"):
        ProcessorConfig(sleep_s=-1)


def test_parse_errors_are_clear() -> None:
    with pytest.raises(EventLogError, match="9 tab-separated"):
        parse_event_line("start\t1.0\t2", 7)
    with pytest.raises(EventLogError, match="unknown kind"):
        parse_event_line("begin\t1\t2\tt\t0\t0\t-\t1\t0", 0)
    with pytest.raises(EventLogError, match="line 3"):
        parse_event_line("start\t1\tpid\tt\t0\t0\t-\t1\t0", 3)


def test_kill_marker(tmp_path: Path) -> None:
    path = tmp_path / "log"
    append_kill_marker(path, 4242)
    (e,) = read_event_log(path)
    assert (e.kind, e.pid, e.topic, e.offset, e.key) == ("kill", 4242, "", -1, None)
    assert read_event_log(tmp_path / "absent") == []


def _writer(path: str, n: int) -> None:
    os.environ["MULTILANE_TEST_LOG"] = path
    tp.reload_config()
    for i in range(n):
        tp.logging_sync(*ctx(i, b"k" * 200))  # long lines make interleaving likelier if it could happen


def test_concurrent_processes_never_interleave_lines(tmp_path: Path) -> None:
    path = str(tmp_path / "events.log")
    mp = multiprocessing.get_context("spawn")
    procs = [mp.Process(target=_writer, args=(path, 2000)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    events = read_event_log(path)  # raises on any torn line
    assert len(events) == 4 * 2000 * 2
    by_pid: dict[int, int] = {}
    for e in events:
        by_pid[e.pid] = by_pid.get(e.pid, 0) + 1
    assert sorted(by_pid.values()) == [4000] * 4


def test_in_process_recorder_with_checkers() -> None:
    rec = EventRecorder(ProcessorConfig(sleep_s=0.001, poison=frozenset({b"p"})))

    async def main() -> None:
        # key "a" in order, key "b" concurrently with it
        async def lane(key: bytes, offsets: list[int]) -> None:
            for o in offsets:
                await rec.async_processor(*ctx(o, key))

        await asyncio.gather(lane(b"a", [0, 2, 4]), lane(b"b", [1, 3]))

    asyncio.run(main())
    with pytest.raises(PoisonRecordError):
        rec.sync_processor(*ctx(5, b"p"))
    rec.mark_incarnation_end()
    produced = [
        ProducedRecord("t", 2, o, k) for o, k in [(0, b"a"), (1, b"b"), (2, b"a"), (3, b"b"), (4, b"a")]
    ]
    produced.append(ProducedRecord("t", 2, 5, b"p"))
    events = rec.snapshot()
    assert [e.seq for e in events] == list(range(len(events)))
    assert_all(check_delivery(produced, events, mode="key", exempt_keys=[b"p"]))
    results = check_delivery(produced, events, mode="key")
    assert not results[0].ok  # the poison record never ended


def test_event_log_follower_reads_incrementally_and_waits_for_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "log"
    follower = EventLogFollower(path)
    assert follower.poll() == []
    line = b"start\t1.0\t7\tt\t0\t5\t6b\t1\t0\n"
    end = b"end\t1.1\t7\tt\t0\t5\t6b\t1\t0\n"
    path.write_bytes(line + end[:10])  # a writer mid-line (cannot happen with O_APPEND, but be safe)
    assert [e.kind for e in follower.poll()] == ["start"]
    assert follower.ended_count() == 0
    with path.open("ab") as f:
        f.write(end[10:])
    assert [(e.kind, e.seq) for e in follower.poll()] == [("end", 1)]
    assert follower.ended_count() == 1
    assert follower.events == read_event_log(path)


def test_async_cancellation_is_logged(env_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MULTILANE_TEST_SLEEP_MS", "10000")
    tp.reload_config()

    async def main() -> None:
        task = asyncio.ensure_future(tp.logging_async(*ctx(4)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert [(e.kind, e.offset) for e in read_event_log(env_log)] == [("start", 4), ("cancel", 4)]


def test_slow_keys_take_longer(env_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MULTILANE_TEST_SLOW_KEYS", "slow")
    monkeypatch.setenv("MULTILANE_TEST_SLOW_MS", "300")
    tp.reload_config()
    t0 = time.monotonic()
    tp.logging_sync(*ctx(1, b"fast"))
    fast = time.monotonic() - t0
    tp.logging_sync(*ctx(2, b"slow"))
    slow = time.monotonic() - t0 - fast
    assert fast < 0.25
    assert slow >= 0.3
