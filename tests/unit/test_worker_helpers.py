"""Unit tests of the pure parts of multilane.testing.workers (no worker processes started)."""

from __future__ import annotations

import os
import time

import pytest

from multilane.testing.workers import WorkerSpec, parse_prometheus_text, rss_kib, wait_until


def test_wait_until_returns_the_value_and_times_out_with_the_last_error() -> None:
    calls = {"n": 0}

    def flaky() -> int:
        calls["n"] += 1
        if calls["n"] < 3:
            raise ConnectionError("not up yet")
        return 42

    assert wait_until(flaky, 5, 0.01) == 42
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"thing not reached within 0s \(last error: .*boom"):
        wait_until(lambda: (_ for _ in ()).throw(OSError("boom")), 0.2, 0.01, "thing")
    assert time.monotonic() - t0 < 5


def test_wait_until_propagates_assertion_errors_at_once() -> None:
    def broken() -> bool:
        raise AssertionError("real failure")

    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="real failure"):
        wait_until(broken, 30, 0.01)
    assert time.monotonic() - t0 < 5


def test_parse_prometheus_text() -> None:
    text = (
        "# HELP multilane_in_flight_records records in flight\n"
        "# TYPE multilane_in_flight_records gauge\n"
        'multilane_in_flight_records{partition="0",topic="t"} 3.0\n'
        'multilane_in_flight_records{partition="1",topic="t"} 4.0\n'
        "# TYPE multilane_factor gauge\n"
        "multilane_factor 8.0\n"
    )
    m = parse_prometheus_text(text)
    assert sum(v for _, v in m["multilane_in_flight_records"]) == 7.0
    assert m["multilane_in_flight_records"][0][0] == {"partition": "0", "topic": "t"}
    assert m["multilane_factor"] == [({}, 8.0)]


def test_rss_of_this_process() -> None:
    assert 1000 < rss_kib(os.getpid()) < 10_000_000


def test_spec_argv() -> None:
    spec = WorkerSpec(
        "127.0.0.1:9092",
        "g",
        assign="t:0,t:1",
        max_in_flight=5,
        consumer_config={"session.timeout.ms": "2000"},
        extra_args=["--log-level", "DEBUG"],
    )
    argv = spec.argv(1111, 2222, "/tok")
    joined = " ".join(argv)
    assert "-m multilane worker" in joined
    assert "--assign t:0,t:1" in joined
    assert "--max-in-flight 5" in joined
    assert "--max-in-flight-bytes" not in joined
    assert "--control-port 1111 --metrics-port 2222 --control-token-file /tok" in joined
    assert "--consumer-config session.timeout.ms=2000" in joined
    assert argv[-2:] == ["--log-level", "DEBUG"]
    assert "--topic" not in argv
