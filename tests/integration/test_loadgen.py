"""Tests of multilane.testing.loadgen: the produced set is exact, keys are Zipf, pacing follows the
profile."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from multilane.testing.broker import EmbeddedBroker
from multilane.testing.load import LoadgenProcess
from multilane.testing.loadgen import (
    RateProfile,
    RateStep,
    ZipfKeySampler,
    produce_paced,
    produce_records,
    read_produced,
)


def consume_all(
    bootstrap: str, topic: str, partitions: int, expected: int, timeout: float = 90.0
) -> list[tuple]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{topic}",
            "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 10,
        }
    )
    out: list[tuple] = []
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(out) < expected and time.monotonic() < deadline:
            for m in c.consume(10_000, 0.5):
                if m.error() is None:
                    out.append((m.partition(), m.offset(), m.key()))
    finally:
        c.close()
    return out


# -- pure parts -------------------------------------------------------------------------------------


def test_rate_profile() -> None:
    p = RateProfile.parse("1000x2, 0x1,500x2")
    assert p.steps == (RateStep(1000, 2), RateStep(0, 1), RateStep(500, 2))
    assert p.duration_s == 5
    assert p.total_records == 3000
    assert p.due(0) == 0
    assert p.due(1) == 1000
    assert p.due(2.5) == 2000
    assert p.due(4) == 2500
    assert p.due(100) == 3000
    for bad in ("1000", "ax2", "-1x2", ""):
        with pytest.raises(ValueError):
            RateProfile.parse(bad)


def test_zipf_sampler_is_skewed_and_reproducible() -> None:
    s = ZipfKeySampler(1000, zipf_s=1.1, seed=7)
    idx = s.indices(100_000)
    assert idx == ZipfKeySampler(1000, zipf_s=1.1, seed=7).indices(100_000)
    assert idx != ZipfKeySampler(1000, zipf_s=1.1, seed=8).indices(100_000)
    counts = collections.Counter(idx)
    # P(key 0) = 1 / H(1000, 1.1); H ~ 6.0 for these parameters -> ~16.6 %; allow a wide margin
    h = sum(1 / (i + 1) ** 1.1 for i in range(1000))
    assert abs(counts[0] / 100_000 - 1 / h) < 0.01
    assert counts[0] > counts[1] > counts[9] > counts[99]
    assert max(idx) < 1000
    assert min(idx) >= 0
    uniform = collections.Counter(ZipfKeySampler(10, zipf_s=0.0, seed=1).indices(50_000))
    assert all(4500 < c < 5500 for c in uniform.values())
    assert list(ZipfKeySampler(0).key_stream(3)) == [None, None, None]
    with pytest.raises(ValueError):
        ZipfKeySampler(-1)


# -- against the broker -----------------------------------------------------------------------------


@pytest.mark.broker
def test_produced_set_is_exact(broker: EmbeddedBroker, topic_name: str) -> None:
    broker.create_topic(topic_name, 3)
    result = produce_records(broker.bootstrap, topic_name, 30_000, keys=500, value_size=100, seed=3)
    assert result.failed == 0
    assert result.delivered == 30_000
    by_partition = collections.defaultdict(list)
    for r in result.records:
        assert r.topic == topic_name
        by_partition[r.partition].append(r.offset)
    assert set(by_partition) == {0, 1, 2}  # 500 keys spread over all partitions
    for offs in by_partition.values():
        assert sorted(offs) == list(range(len(offs)))  # exact, dense offsets per partition
    # keys live in one partition each (keyed partitioner)
    parts_of_key = collections.defaultdict(set)
    for r in result.records:
        parts_of_key[r.key].add(r.partition)
    assert all(len(ps) == 1 for ps in parts_of_key.values())
    consumed = consume_all(broker.bootstrap, topic_name, 3, 30_000)
    assert sorted(consumed) == sorted((r.partition, r.offset, r.key) for r in result.records)


@pytest.mark.broker
def test_paced_profile_follows_rates(broker: EmbeddedBroker, topic_name: str) -> None:
    broker.create_topic(topic_name, 1)
    profile = RateProfile.parse("2000x1.5,0x1,4000x0.5")
    t0 = time.monotonic()
    result = produce_paced(broker.bootstrap, topic_name, profile, keys=10, seed=1)
    elapsed = time.monotonic() - t0
    assert result.failed == 0
    assert result.delivered == profile.total_records == 5000
    assert elapsed >= 2.9  # it did pace (3 s profile), and did not run away
    assert elapsed < 30


@pytest.mark.broker
def test_a_stalled_generator_skips_instead_of_spiking(broker: EmbeddedBroker, topic_name: str) -> None:
    """Starved for 2 s (as a generator thread beside a busy control plane was), the generator skips
    what fell more than ``max_behind_s`` behind and counts it, instead of producing it in one spike."""
    broker.create_topic(topic_name, 1)
    rate = 1000.0
    profile = RateProfile.constant(rate, 4.0)
    t0 = time.monotonic()
    stalled = []

    def stall_once() -> bool:
        if not stalled and time.monotonic() - t0 > 0.5:
            stalled.append(True)
            time.sleep(2.0)
        return False

    result = produce_paced(
        broker.bootstrap, topic_name, profile, keys=10, should_stop=stall_once, max_behind_s=1.0
    )
    assert stalled
    assert result.failed == 0
    assert result.skipped >= 0.8 * rate  # about one second of the two fell beyond the bound
    assert result.delivered + result.skipped == profile.total_records
    assert max(result.delivered_per_s) <= 2.3 * rate  # at most one second of catch-up at once
    assert result.offered_per_s == [rate] * 4


@pytest.mark.broker
def test_loadgen_process_reports_offered_and_delivered(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path
) -> None:
    broker.create_topic(topic_name, 2)
    gen = LoadgenProcess(broker.bootstrap, topic_name, "500x2,0x1", str(tmp_path), keys=20)
    result, timeline = gen.finish(timeout_s=60)
    assert result.delivered == 1000 and result.skipped == 0
    assert len({(r.partition, r.offset) for r in result.records}) == 1000
    assert result.offered_per_s == [500.0, 500.0, 0.0]
    assert sum(result.delivered_per_s) == 1000
    assert timeline["summary"]["delivered"] == 1000


@pytest.mark.broker
def test_cli_writes_the_produced_set(broker: EmbeddedBroker, topic_name: str, tmp_path: Path) -> None:
    out = tmp_path / "produced.tsv"
    proc = subprocess.run(
        [
            sys.executable, "-m", "multilane", "loadgen",
            "--bootstrap-servers", broker.bootstrap, "--topic", topic_name, "--create-partitions", "2",
            "--records", "2000", "--keys", "0", "--value-size", "10", "--output", str(out),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["delivered"] == 2000
    produced = read_produced(str(out), topic_name)
    assert len(produced) == 2000
    assert all(r.key is None for r in produced)
    assert len({(r.partition, r.offset) for r in produced}) == 2000


def test_cli_rejects_bad_arguments() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "multilane", "loadgen", "--bootstrap-servers", "127.0.0.1:1", "--topic", "x",
         "--rate", "10"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--rate needs --duration" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "multilane", "loadgen", "--bootstrap-servers", "127.0.0.1:1", "--topic", "x",
         "--records", "1", "--value-size", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "value size must be >= 1" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "multilane", "loadgen", "--bootstrap-servers", "127.0.0.1:1", "--topic", "x",
         "--records", "-5"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == "multilane loadgen: --records must be >= 0, got -5"


@pytest.mark.slow
@pytest.mark.broker
def test_one_million_records_speed(broker: EmbeddedBroker, topic_name: str) -> None:
    broker.create_topic(topic_name, 1)
    result = produce_records(
        broker.bootstrap, topic_name, 1_000_000, keys=10_000, value_size=100, partition=0
    )
    assert result.delivered == 1_000_000
    print(result.summary())
    assert result.elapsed_s < 30  # ~1-4 s here on an idle machine; generous for a loaded one


def test_an_unknown_load_option_is_refused_before_anything_is_produced() -> None:
    for call in (lambda: produce_records("127.0.0.1:1", "t", 5, kyes=3),  # type: ignore[call-arg]
                 lambda: produce_paced("127.0.0.1:1", "t", RateProfile.constant(1, 1), kyes=3)):  # type: ignore[call-arg]
        with pytest.raises(TypeError, match=r"unknown load option\(s\) kyes \(known: keys, value_size"):
            call()
