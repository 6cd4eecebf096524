"""The worker's guard (circuit breaker, record timeout, latency), readiness, the rate-limited client log,
the loop-blocking warning and the JSON log format; no broker."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import pytest

from multilane.api import Context, NonRetryable, Record
from multilane.worker.breaker import BreakerClosedError, CircuitBreaker
from multilane.worker.guard import EndToEndLatency, RecordTimeoutError, guarded
from multilane.worker.health import HealthCollector, RateLimitFilter
from multilane.worker.loopwatch import LoopBlockWatch
from multilane.worker.readiness import ReadinessFacts, readiness
from multilane.worker.retry import RetryPolicy
from multilane.worker.supervision import JsonLogFormatter


def _rec(offset: int = 0) -> tuple[Record, Context]:
    return Record("t", 0, offset, b"k", b"v", [], int(time.time() * 1000)), Context("t", 0, offset, b"k", [],
                                                                                    0, 1)


def _breaker(n: int, max_retries: int = 0) -> CircuitBreaker:
    policy = RetryPolicy(max_retries=max_retries)
    return CircuitBreaker(n, lambda attempt, exc: not policy.should_retry(attempt, exc), poll_s=0.01)


def test_breaker_counts_consecutive_final_failures_and_holds_after_n() -> None:
    b = _breaker(3, max_retries=1)
    exc = RuntimeError("bug")
    assert not b.failed(("t", 0, 0), 1, exc)  # retried: not counted
    assert b.consecutive == 0
    assert not b.failed(("t", 0, 0), 2, exc)  # final: counted (dead-lettered)
    b.succeeded()  # a success starts the count again
    assert b.consecutive == 0
    for o in range(3):
        assert not b.failed(("t", 0, o), 2, exc)
    assert b.is_open and "3 consecutive" in b.reason
    assert b.failed(("t", 0, 9), 1, exc), "a failure while open is held"
    assert b.reset() and not b.is_open and b.consecutive == 0
    assert not b.failed(("t", 0, 1), 1, NonRetryable("x")) and b.consecutive == 1  # final at once


def test_breaker_takes_back_a_count_when_the_record_runs_again() -> None:
    b = _breaker(5)
    b.failed(("t", 0, 4), 1, RuntimeError())
    assert b.consecutive == 1
    b.entered(("t", 0, 4))  # the engine retried it after all: it was not dead-lettered
    assert b.consecutive == 0


def test_breaker_zero_never_opens() -> None:
    b = _breaker(0)
    for o in range(50):
        assert not b.failed(("t", 0, o), 1, RuntimeError())
    assert not b.is_open


def test_guarded_async_holds_while_open_and_runs_again_after_reset() -> None:
    async def main() -> None:
        b = _breaker(1)
        calls: list[int] = []
        fail = {"on": True}

        async def proc(record: Record, ctx: Context) -> None:
            calls.append(record.offset)
            if fail["on"]:
                raise RuntimeError("bug")

        run = guarded(proc, b)
        with pytest.raises(RuntimeError):
            await run(*_rec(0))  # the first final failure: dead-lettered, the breaker opens
        assert b.is_open
        held = asyncio.ensure_future(run(*_rec(1)))  # held before its processor runs
        await asyncio.sleep(0.1)
        assert not held.done() and calls == [0] and b.held == 1
        fail["on"] = False
        b.reset()
        await asyncio.wait_for(held, 2)
        assert calls == [0, 1]

    asyncio.run(main())


def test_guarded_sync_hold_gives_up_on_stop() -> None:
    b = _breaker(1)

    def proc(record: Record, ctx: Context) -> None:
        raise RuntimeError("bug")

    run = guarded(proc, b)
    with pytest.raises(RuntimeError):
        run(*_rec(0))
    errors: list[BaseException] = []

    def held() -> None:
        try:
            run(*_rec(1))
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=held)
    t.start()
    time.sleep(0.1)
    assert t.is_alive()
    b.stop()
    t.join(2)
    assert errors and isinstance(errors[0], BreakerClosedError)


def test_record_timeout_async_and_sync() -> None:
    async def slow(record: Record, ctx: Context) -> None:
        await asyncio.sleep(5)

    async def quick(record: Record, ctx: Context) -> None:
        raise TimeoutError("the processor's own")

    async def main() -> None:
        with pytest.raises(RecordTimeoutError, match=r"record-timeout-s 0\.1"):
            await guarded(slow, timeout_s=0.1)(*_rec())
        with pytest.raises(TimeoutError, match="the processor's own"):
            await guarded(quick, timeout_s=5)(*_rec())

    asyncio.run(main())

    def slow_sync(record: Record, ctx: Context) -> None:
        time.sleep(1.0)

    t0 = time.monotonic()
    with pytest.raises(RecordTimeoutError):
        guarded(slow_sync, timeout_s=0.1)(*_rec())
    assert time.monotonic() - t0 < 0.9


def test_end_to_end_latency_is_observed_on_success() -> None:
    lat = EndToEndLatency()

    async def proc(record: Record, ctx: Context) -> None:
        return None

    rec, ctx = _rec()
    rec.timestamp_ms -= 2000  # produced two seconds ago
    asyncio.run(guarded(proc, latency=lat)(rec, ctx))
    assert lat.histogram.total == 1 and 1.9 < lat.histogram.sum < 10


def test_readiness_names_every_reason() -> None:
    ok = ReadinessFacts(started=True, stopping=False, broker_reachable=True, broker_unreachable_s=0,
                        partitions=2, expects_partitions=True)
    assert readiness(ok).ready
    bad = ReadinessFacts(started=True, stopping=False, broker_reachable=False, broker_unreachable_s=12,
                         partitions=0, expects_partitions=True, restoring=("t/1",), breaker_open=True,
                         breaker_reason="5 consecutive", missing_topics=("t",))
    r = readiness(bad)
    assert not r.ready
    text = " | ".join(r.reasons)
    for part in ("broker unreachable for 12s", "no partitions", "restoring state of t/1",
                 "circuit breaker open: 5 consecutive", "topic(s) missing: t"):
        assert part in text


def test_rate_limit_filter_drops_repeats_and_counts_them() -> None:
    now = [0.0]
    f = RateLimitFilter(10.0, clock=lambda: now[0])

    def rec(msg: str) -> logging.LogRecord:
        return logging.LogRecord("multilane.kafka", logging.ERROR, "", 0, msg, None, None)

    assert f.filter(rec("Connect to 127.0.0.1:1 failed: Connection refused (after 0ms)"))
    passed = sum(f.filter(rec(f"Connect to 127.0.0.1:1 failed: Connection refused (after {i}ms)"))
                 for i in range(40))
    assert passed == 0
    now[0] = 11.0
    r = rec("Connect to 127.0.0.1:1 failed: Connection refused (after 3ms)")
    assert f.filter(r) and "40 more like it" in str(r.msg)


def test_loop_blocking_processor_is_named(caplog: pytest.LogCaptureFixture) -> None:
    def blocking_handler(record: Record, ctx: Context) -> None:
        time.sleep(0.8)

    async def handler(record: Record, ctx: Context) -> None:
        blocking_handler(record, ctx)

    run: Any = guarded(handler)
    watch = LoopBlockWatch(0.3, run.__code__)

    async def main() -> None:
        watch.start()
        await asyncio.sleep(0.2)
        await run(*_rec(42))
        await asyncio.sleep(0.3)
        watch.stop()

    with caplog.at_level(logging.WARNING, logger="multilane.worker.loopwatch"):
        asyncio.run(main())
    assert watch.blocked_total == 1
    text = caplog.text
    assert "event loop blocked" in text and "blocking_handler" in text and "t/0@42" in text, text


def test_json_log_lines() -> None:
    rec = logging.LogRecord("multilane.worker", logging.ERROR, "", 0, "circuit breaker open: %s", ("x",),
                            None)
    doc = json.loads(JsonLogFormatter().format(rec))
    assert doc["level"] == "ERROR" and doc["message"] == "circuit breaker open: x"
    assert doc["logger"] == "multilane.worker" and doc["time"].endswith("Z")


def test_broker_probe_gives_up_once_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from multilane.worker import health
    from multilane.worker.health import BrokerProbe

    # the probe's clock, stepped by the test: a loaded machine cannot stretch the first record (its
    # warning included) past the timeout
    now = [1000.0]
    monkeypatch.setattr(health, "time", SimpleNamespace(monotonic=lambda: now[0]))
    reasons: list[str] = []
    probe = BrokerProbe(lambda: None, ("t",), timeout_s=0.05, on_give_up=reasons.append)
    probe.record(False, ())
    assert not probe.reachable and not reasons
    now[0] += 0.049
    probe.record(False, ())
    assert not reasons, "gave up before the timeout"
    now[0] += 0.002
    probe.record(False, ())
    probe.record(False, ())
    assert len(reasons) == 1 and "--broker-timeout-s" in reasons[0]
    probe.record(True, ("t",))
    assert probe.reachable and probe.missing == ("t",)


def test_health_collector_samples_each_part_with_the_group_label() -> None:
    class _Parts:
        is_open, opened_total, blocked_total, reachable = True, 3, 7, False

    parts: Any = _Parts()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in HealthCollector("g1", "w0", breaker=parts, loopwatch=parts, probe=parts).collect()
               for s in fam.samples}
    g = (("group", "g1"),)
    assert samples[("multilane_worker_info", (("group", "g1"), ("worker_id", "w0")))] == 1.0
    assert samples[("multilane_breaker_open", g)] == 1.0
    assert samples[("multilane_breaker_opened_total", g)] == 3.0
    assert samples[("multilane_loop_blocked_total", g)] == 7.0
    assert samples[("multilane_broker_reachable", g)] == 0.0
    only_info = list(HealthCollector("g1", "w0").collect())
    assert [fam.name for fam in only_info] == ["multilane_worker_info"]
