"""Chaos tests: real ``multilane worker`` processes, SIGKILL, hangs, memory bounds, broker link cuts.

Every test applies the delivery checkers of :mod:`multilane.testing.checkers` to the processors' event
log and the produced set from delivery reports. Timing is polled, never slept for a fixed time, and
deadlines are generous: the machine is shared.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from multilane.testing.broker import EmbeddedBroker, KafkaBroker
from multilane.testing.checkers import ProducedRecord, ReplayCounter, assert_all, check_delivery
from multilane.testing.loadgen import LoadResult, RateProfile, produce_paced, produce_records
from multilane.testing.processors import EventLogFollower, read_event_log
from multilane.testing.proxy import ProxiedBroker
from multilane.testing.workers import WorkerProcess, WorkerSpec, wait_until

pytestmark = pytest.mark.broker

PROCESS_TIMEOUT = 150.0  # seconds for a worker to process everything (loaded 2-core machine)


def _start(workers: list[WorkerProcess], spec: WorkerSpec, workdir: Path) -> WorkerProcess:
    w = WorkerProcess(spec, workdir)
    workers.append(w)
    return w.start().wait_ready(90)


def _wait_all_ended(
    follower: EventLogFollower,
    produced: list[ProducedRecord],
    worker: WorkerProcess | list[WorkerProcess],
    stall_s: float = 60.0,
) -> None:
    """Wait until every produced record has ended; fail early if a worker dies or progress stops."""
    want = {(r.topic, r.partition, r.offset) for r in produced}
    group = worker if isinstance(worker, list) else [worker]
    progress = {"n": -1, "at": time.monotonic()}

    def tails() -> str:
        return "\n".join(f"--- worker {m.pid}:\n{m.stderr_tail(20)}" for m in group)

    def done() -> bool:
        for member in group:
            if not member.alive:
                raise AssertionError(f"worker {member.pid} died:\n{member.stderr_tail()}")
        follower.poll()
        if len(follower.events) != progress["n"]:
            progress["n"], progress["at"] = len(follower.events), time.monotonic()
        elif time.monotonic() - progress["at"] > stall_s:
            missing = len(want - follower.ended)
            raise AssertionError(
                f"no processing progress for {stall_s:.0f}s, {missing} of {len(want)} missing:\n{tails()}"
            )
        return want <= follower.ended

    try:
        wait_until(done, PROCESS_TIMEOUT, 0.25, "every produced record processed")
    except TimeoutError as exc:
        missing = len(want - follower.ended)
        raise AssertionError(f"{exc}: {missing} of {len(want)} still missing\n{tails()}") from exc


def _wait_quiet(follower: EventLogFollower, quiet_s: float, timeout: float) -> int:
    """Wait until no new event arrives for ``quiet_s``; return the number of ended records."""
    last_change = time.monotonic()
    last_len = -1
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        follower.poll()
        if len(follower.events) != last_len:
            last_len = len(follower.events)
            last_change = time.monotonic()
        elif time.monotonic() - last_change >= quiet_s:
            return len(follower.ended)
        time.sleep(0.2)
    raise AssertionError(f"events kept arriving for {timeout}s")


# -- (a) kill -9 mid-stream under load ----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["assign", pytest.param("subscribe", marks=pytest.mark.matrix)])
def test_kill9_mid_stream_under_load_loses_nothing(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path, workers: list[WorkerProcess], mode: str
) -> None:
    """SIGKILL a worker while a producer is still producing; a restarted worker finishes: nothing lost,
    per-key order kept (rewinds only across incarnations), no key processed concurrently."""
    broker.create_topic(topic_name, 2)
    log = str(tmp_path / "events.log")
    spec = WorkerSpec(
        broker.bootstrap,
        group=f"g-{topic_name}",
        topics=[topic_name] if mode == "subscribe" else (),
        assign=None if mode == "subscribe" else f"{topic_name}:0,{topic_name}:1",
        factor=4,
        event_log=log,
        env={"MULTILANE_TEST_SLEEP_MS": "1"},
    )
    w1 = _start(workers, spec, tmp_path)
    # a producer thread: 3000 rec/s for 5 s
    result: list[LoadResult] = []
    producer = threading.Thread(
        target=lambda: result.append(
            produce_paced(broker.bootstrap, topic_name, RateProfile.constant(3000, 5), keys=200, seed=11)
        )
    )
    producer.start()
    follower = EventLogFollower(log)
    wait_until(lambda: follower.ended_count() >= 3000, 60, 0.1, "3000 records processed before the kill")
    w1.kill()
    killed_at = follower.ended_count()
    w2 = _start(workers, spec, tmp_path)
    producer.join(120)
    assert result, "producer thread failed"
    produced = result[0].records
    assert result[0].failed == 0
    assert killed_at < len(produced), "the kill came too late to be mid-stream"
    _wait_all_ended(follower, produced, w2)
    assert w2.terminate(60) == 0
    events = read_event_log(log)
    results = check_delivery(produced, events, mode="key")
    assert_all(results)
    assert {e.pid for e in events if e.kind == "start"} == {w1.pid, w2.pid}


# -- (b) replay bound -------------------------------------------------------------------------------


PROGRESS_INTERVAL_MS = 50


@pytest.mark.serial  # a descheduled worker writes its progress late: the window it measures grows
def test_replays_after_kill9_are_bounded_by_the_newest_progress_record(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """SIGKILL a worker while completions continue (a backlog, 1 ms per record), with one key hanging
    so that the committed offset stays far behind; restart without the hang. Progress is written every
    50 ms (commits every second): the records redone are at most the records running at the kill plus
    those completed and not called done by the newest progress record the broker held (read back from
    the progress topic: its snapshot is about one interval old when the worker ran on time) -- not
    everything above the committed offset, nor everything since the last commit. Prints the figures."""
    broker.create_topic(topic_name, 1)
    hang_key = b"key-000003"
    res = produce_records(broker.bootstrap, topic_name, 20_000, keys=50, seed=5, partition=0)
    produced = res.records
    assert res.delivered == 20_000
    first_hang = min(r.offset for r in produced if r.key == hang_key)
    log = str(tmp_path / "events.log")
    base = {
        "bootstrap": broker.bootstrap,
        "group": f"g-{topic_name}",
        "assign": f"{topic_name}:0",
        "factor": 8,
        "event_log": log,
        "commit_interval_ms": 1000,
        "extra_args": ("--progress-interval-ms", str(PROGRESS_INTERVAL_MS)),
    }
    env = {"MULTILANE_TEST_SLEEP_MS": "1"}
    w1 = _start(workers, WorkerSpec(**base, env={**env, "MULTILANE_TEST_HANG_KEY": hang_key.decode()}),  # type: ignore[arg-type]
                tmp_path)
    follower = EventLogFollower(log)
    wait_until(lambda: follower.ended_count() > 6000, 90, 0.05, "6000 records processed")
    status = w1.status()
    in_flight = int(status["partitions"][0]["in_flight"])  # fetched, not completed (just before)
    killed_at = time.time()
    w1.kill()

    events_a = [e for e in read_event_log(log) if e.pid == w1.pid]
    ends_a = {e.tpo: e.time for e in events_a if e.kind == "end"}
    running_at_kill = {e.tpo for e in events_a if e.kind == "start"} - set(ends_a)
    kill_instant = max([killed_at, *(e.time for e in events_a)])
    window = _ProgressWindow.at_kill(_progress_records(broker.bootstrap, f"g-{topic_name}"),
                                     min(e.time for e in events_a), kill_instant)
    unclaimed = window.unclaimed({e.tpo: e.key for e in events_a if e.kind == "end"})
    since_progress = len(unclaimed)
    # on time, that is about the last interval (shown for comparison; not the bound)
    last_interval = sum(1 for t in ends_a.values() if t > kill_instant - PROGRESS_INTERVAL_MS / 1000.0)

    w2 = _start(workers, WorkerSpec(**base, env=env), tmp_path)  # type: ignore[arg-type]
    _wait_all_ended(follower, produced, w2)
    assert w2.terminate(60) == 0
    events = read_event_log(log)
    started_b = {e.tpo for e in events if e.kind == "start" and e.pid == w2.pid}
    replayed = started_b & set(ends_a)  # completed before the kill, run again
    restarted = started_b & (set(ends_a) | running_at_kill)
    # the first offset not completed at the kill: the most a watermark-only commit could reach
    first_unfinished = min(r.offset for r in produced if (r.topic, r.partition, r.offset) not in ends_a)
    above_watermark = sum(1 for o in ends_a if o[2] >= first_unfinished)
    bound = len(running_at_kill) + since_progress
    oldest_replayed_ms = max((kill_instant - ends_a[t] for t in replayed), default=0.0) * 1000
    print(
        f"replayed {len(replayed)} (completed before the kill, run again; the oldest completed "
        f"{oldest_replayed_ms:.0f} ms before it), running at kill {len(running_at_kill)}, in flight at "
        f"kill ~{in_flight}; the newest progress record {window.age_ms(kill_instant):.0f} ms old at the "
        f"kill (median gap {window.median_gap_ms:.0f} ms), {since_progress} completed after it "
        f"({last_interval} in the last {PROGRESS_INTERVAL_MS} ms); bound (running + those) {bound}; "
        f"redone in all {len(restarted)}; completed above the first unfinished offset {above_watermark}"
    )
    assert first_unfinished <= first_hang
    assert above_watermark > 10 * bound, "the hang must hold the committed offset far behind"
    # on time ~40 ms apart; only at commits, 1 s apart
    assert window.median_gap_ms <= 4 * PROGRESS_INTERVAL_MS, "progress was not written every interval"
    assert replayed <= unclaimed, (
        f"{len(replayed - unclaimed)} of {len(replayed)} completed records that ran again were called done "
        f"by the newest progress record (the oldest replayed {oldest_replayed_ms:.0f} ms before the kill)"
    )
    assert len(restarted) <= bound
    assert len(replayed) + len(running_at_kill) <= in_flight + since_progress  # as documented
    assert_all(
        check_delivery(produced, events, mode="key"),
        ReplayCounter(max_replays=since_progress, max_restarted=bound).check(events),
    )


# -- (c) memory bound under a slow processor and a fast producer -----------------------------------


@pytest.mark.slow  # long scenario: kept out of the default suite's ~15 minutes (run with -m slow)
def test_rss_stays_bounded_with_slow_processor_and_fast_producer(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """A slow processor facing a large backlog: back-pressure (records and bytes in flight, and the
    librdkafka prefetch queue sized from the byte bound) keeps the worker's RSS bounded.

    Bound, derived: idle baseline (measured) + the in-flight byte bound B (values held by the engine)
    + per-record overhead of the records B admits (B / value_size records x 2 KiB for the Record,
    Context, message and bookkeeping objects) + librdkafka's prefetch queue (B / 2) and one fetch
    response being decoded (fetch.max.bytes = B / 2) + 32 MiB for allocator slack. The backlog is
    produced well above that bound, so a consumer buffering it would fail.
    """
    broker.create_topic(topic_name, 1)
    value_size = 4000
    n_records = 30_000
    bound_bytes = 4 * 1024 * 1024
    log = str(tmp_path / "events.log")
    spec = WorkerSpec(
        broker.bootstrap,
        group=f"g-{topic_name}",
        assign=f"{topic_name}:0",
        factor=8,
        max_in_flight=100_000,  # the byte bound governs
        max_in_flight_bytes=bound_bytes,
        event_log=log,
        env={"MULTILANE_TEST_SLEEP_MS": "20"},
    )
    w1 = _start(workers, spec, tmp_path)
    idle: list[int] = []
    for _ in range(5):  # idle baseline: ready, assigned, nothing to fetch yet
        idle.append(w1.rss_kib())
        time.sleep(0.2)
    baseline_kib = max(idle)
    res = produce_records(
        broker.bootstrap, topic_name, n_records, keys=500, value_size=value_size, seed=3, partition=0
    )
    assert res.delivered == n_records
    backlog_bytes = n_records * value_size
    records_admitted = bound_bytes // value_size
    bound_kib = (
        baseline_kib
        + (bound_bytes + records_admitted * 2048 + bound_bytes // 2 + bound_bytes // 2 + 32 * 1024 * 1024)
        // 1024
    )
    assert backlog_bytes > 2 * (bound_kib - baseline_kib) * 1024  # buffering the backlog would break it
    follower = EventLogFollower(log)
    samples: list[int] = []
    in_flight_bytes: list[int] = []
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        samples.append(w1.rss_kib())
        in_flight_bytes.append(w1.in_flight() * value_size)
        time.sleep(0.2)
    assert follower.ended_count() < n_records // 2, "processor was not slow enough to leave a backlog"
    print(
        f"baseline {baseline_kib} KiB, peak {max(samples)} KiB, bound {bound_kib} KiB; "
        f"in-flight bytes peak {max(in_flight_bytes)}, RSS samples {samples[::10]}"
    )
    # back-pressure really engaged: the worker held a good share of its byte bound while processing
    assert max(in_flight_bytes) >= bound_bytes // 4, (
        f"in-flight bytes never reached B/4 (fetching stalled?): {in_flight_bytes}"
    )
    assert max(in_flight_bytes) <= bound_bytes + value_size, (
        f"in-flight bytes above the bound: {in_flight_bytes}"
    )
    assert max(samples) <= bound_kib, f"RSS peaked at {max(samples)} KiB, bound {bound_kib} KiB"
    # drain everything fast, then check the guarantees over both incarnations
    w1.kill()
    w2 = _start(workers, WorkerSpec(**{**spec.__dict__, "env": {}}), tmp_path)
    _wait_all_ended(follower, res.records, w2)
    assert w2.terminate(60) == 0
    assert_all(check_delivery(res.records, read_event_log(log), mode="key"))


# -- (d) broker link cut ----------------------------------------------------------------------------


@pytest.fixture
def proxied_broker() -> Iterator[ProxiedBroker]:
    pb = ProxiedBroker().start()
    try:
        yield pb
    finally:
        pb.stop()


@pytest.mark.slow  # long scenario: kept out of the default suite's ~15 minutes (run with -m slow)
def test_broker_link_cut_20s_resumes_without_loss(
    proxied_broker: ProxiedBroker, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """Cut every connection between the worker and the broker for ~20 s mid-stream (fetches and
    commits fail, connections are refused); after the link returns, the same worker process resumes
    by itself and processes everything, including records produced after the cut."""
    pb = proxied_broker
    topic = "cut-topic"
    pb.create_topic(topic, 2)
    first = produce_records(pb.bootstrap, topic, 6000, keys=100, seed=21)
    assert first.delivered == 6000
    log = str(tmp_path / "events.log")
    spec = WorkerSpec(
        pb.bootstrap,
        group="g-cut",
        assign=f"{topic}:0,{topic}:1",
        factor=4,
        max_in_flight=300,  # most of the backlog stays unfetched until after the cut
        event_log=log,
        env={"MULTILANE_TEST_SLEEP_MS": "2"},
    )
    w = _start(workers, spec, tmp_path)
    follower = EventLogFollower(log)
    wait_until(lambda: follower.ended_count() >= 500, 60, 0.1, "500 records processed before the cut")
    pb.proxy.cut()
    cut_at = follower.ended_count()
    t_cut = time.monotonic()
    while time.monotonic() - t_cut < 20:
        assert w.alive, f"worker died during the cut:\n{w.stderr_tail()}"
        time.sleep(0.5)
    during = follower.ended_count() - cut_at
    assert follower.ended_count() < 6000, "everything finished before the cut ended: cut came too late"
    pb.proxy.restore()
    second = produce_records(pb.bootstrap, topic, 2000, keys=100, seed=22)
    assert second.delivered == 2000
    produced = first.records + second.records
    _wait_all_ended(follower, produced, w)
    assert w.alive
    print(f"processed before cut {cut_at}, during the 20 s cut {during}")
    assert w.terminate(60) == 0
    events = read_event_log(log)
    assert {e.pid for e in events} == {w.pid}  # the same process throughout
    assert_all(check_delivery(produced, events, mode="key"))


# -- (e) control API authentication -----------------------------------------------------------------


def test_control_requests_need_the_token(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    broker.create_topic(topic_name, 1)
    res = produce_records(broker.bootstrap, topic_name, 200, keys=10, seed=1, partition=0)
    log = str(tmp_path / "events.log")
    w = _start(
        workers,
        WorkerSpec(broker.bootstrap, group=f"g-{topic_name}", assign=f"{topic_name}:0", event_log=log),
        tmp_path,
    )
    assert w.request("GET", "/healthz", token=None)[0] == 200
    for path, method, body in [
        ("/v1/status", "GET", None),
        ("/v1/pause", "POST", {}),
        ("/v1/factor", "POST", {"factor": 2}),
        ("/v1/assignment", "POST", {"generation": 99, "partitions": [], "release_deadline_s": 1}),
    ]:
        assert w.request(method, path, body, token=None)[0] == 401, path
        assert w.request(method, path, body, token="wrong-token")[0] == 401, path
    status = w.status()  # with the token
    assert status["factor"] == 8  # the unauthenticated factor change did nothing
    assert status["paused"] is False
    follower = EventLogFollower(log)
    _wait_all_ended(follower, res.records, w)
    assert w.terminate(60) == 0
    assert_all(check_delivery(res.records, read_event_log(log), mode="key"))


# -- back-pressure on a partition's very first record ------------------------------------------------


@pytest.mark.parametrize("run", [1, 2])
def test_back_pressure_before_a_partitions_first_record_loses_nothing(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path, workers: list[WorkerProcess], run: int
) -> None:
    """Two fresh partitions (no committed offset) with a backlog each and an in-flight bound (300)
    far below it: the first fetched batch fills the bound, every partition is paused for flow, and
    a record that consume() still returns for a partition with nothing taken yet is skipped. When that
    partition resumes, fetching must restart at the skipped record; a worker that seeks back only to
    a position it already knows loses it and commits past it (measured on the engine of 07:20 UTC:
    offset 0 of partition 1 lost in 3 of 8 and 1 of 6 runs). A race: each run catches it sometimes."""
    broker.create_topic(topic_name, 2)
    res = produce_records(broker.bootstrap, topic_name, 6000, keys=100, seed=31)
    log = str(tmp_path / "events.log")
    spec = WorkerSpec(
        broker.bootstrap,
        group=f"g-{topic_name}",
        assign=f"{topic_name}:0,{topic_name}:1",
        factor=4,
        max_in_flight=300,
        event_log=log,
        env={"MULTILANE_TEST_SLEEP_MS": "2"},
    )
    w = _start(workers, spec, tmp_path)
    follower = EventLogFollower(log)
    _wait_all_ended(follower, res.records, w, stall_s=20)
    ends = {(topic_name, p): sum(1 for r in res.records if r.partition == p) for p in (0, 1)}
    wait_until(lambda: w.committed() == ends, 30, 0.2, "committed to the ends")
    assert w.terminate(60) == 0
    assert_all(check_delivery(res.records, read_event_log(log), mode="key"))


# -- rebalance while records of a key are running ------------------------------------------------


def _produce_keyed(bootstrap: str, topic: str, items: list[tuple[int, bytes]]) -> list[ProducedRecord]:
    """Produce one record per (partition, key); return them from the delivery reports."""
    from confluent_kafka import Producer

    out: list[ProducedRecord] = []

    def report(err: object, msg: object) -> None:
        assert err is None, err
        out.append(ProducedRecord(topic, msg.partition(), msg.offset(), msg.key()))  # type: ignore[attr-defined]

    p = Producer({"bootstrap.servers": bootstrap, "on_delivery": report})
    for partition, key in items:
        p.produce(topic, value=b"slow-record", key=key, partition=partition)
    assert p.flush(30) == 0
    return out


JOIN_S = 10.0  # the long records outlast the second worker's ready line by this much


@pytest.mark.parametrize(
    "processor", [pytest.param("logging_sync", marks=pytest.mark.matrix),
                  pytest.param("logging_async", marks=pytest.mark.slow)]
)
def test_rebalance_mid_record_keeps_keys_exclusive(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path, workers: list[WorkerProcess], processor: str
) -> None:
    """A second standalone worker joins while the first runs a long record on each partition; the
    cooperative rebalance (several seconds on the embedded broker) moves one partition. The new owner
    must not start the slow key while the old owner still runs it. An async attempt can be cancelled
    at the revoke (logged as ``cancel``); a sync attempt keeps running in its thread, so the revoke
    has to wait for it (or the handoff overlaps).

    The long records last until the second worker has been ready for ``JOIN_S`` (a release file), not
    a fixed 15 s: on a loaded machine the second worker's start alone can take longer than that, and
    the rebalance would then find nothing running."""
    broker.create_topic(topic_name, 2)
    slow = _produce_keyed(broker.bootstrap, topic_name, [(0, b"slow-0"), (1, b"slow-1")])
    rest = produce_records(broker.bootstrap, topic_name, 200, keys=8, seed=4)
    produced = slow + rest.records
    log = str(tmp_path / "events.log")
    release = tmp_path / "release-slow-records"
    spec = WorkerSpec(
        broker.bootstrap,
        group=f"g-{topic_name}",
        topics=[topic_name],
        processor=f"multilane.testing.processors:{processor}",
        factor=2,
        event_log=log,
        env={
            "MULTILANE_TEST_SLEEP_MS": "5",
            "MULTILANE_TEST_HANG_KEY": "slow-0,slow-1",
            "MULTILANE_TEST_HANG_RELEASE_FILE": str(release),
        },
    )
    w1 = _start(workers, spec, tmp_path / "w1")
    follower = EventLogFollower(log)

    def both_slow_running() -> bool:
        follower.poll()
        return {e.key for e in follower.events if e.kind == "start"} >= {b"slow-0", b"slow-1"}

    wait_until(both_slow_running, 60, 0.05, "both slow records running in the first worker")
    # the second worker runs the slow keys fast: only the first worker's attempts are long
    w2 = _start(
        workers, WorkerSpec(**{**spec.__dict__, "env": {"MULTILANE_TEST_SLEEP_MS": "5"}}), tmp_path / "w2"
    )
    time.sleep(JOIN_S)  # the second worker joins; the first one's revoke then waits for its attempt
    release.touch()
    _wait_all_ended(follower, produced, [w1, w2])
    events = read_event_log(log)
    assert {e.pid for e in events if e.kind == "start"} == {w1.pid, w2.pid}, "the partitions never moved"
    assert w1.terminate(60) == 0
    assert w2.terminate(60) == 0
    assert_all(check_delivery(produced, read_event_log(log), mode="key"))


# -- soak variants (slow) ---------------------------------------------------------------------------


@pytest.mark.slow
def test_soak_repeated_kill9_in_a_group_of_three(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """Three standalone workers share 4 partitions while a producer runs for 40 s; every ~6 s one of
    them is SIGKILLed and restarted. Nothing is lost; order and exclusivity hold. (Partitions move
    between live workers here, so a rewind within one incarnation is legitimate: a partition can come
    back to a worker from an older committed offset after another worker died with it.)"""
    import random

    broker.create_topic(topic_name, 4)
    log = str(tmp_path / "events.log")
    spec = WorkerSpec(
        broker.bootstrap,
        group=f"g-{topic_name}",
        topics=[topic_name],
        factor=4,
        event_log=log,
        env={"MULTILANE_TEST_SLEEP_MS": "1"},
    )
    group = [_start(workers, spec, tmp_path / f"w{i}") for i in range(3)]
    result: list[LoadResult] = []
    producer = threading.Thread(
        target=lambda: result.append(
            produce_paced(broker.bootstrap, topic_name, RateProfile.constant(1500, 40), keys=300, seed=99)
        )
    )
    producer.start()
    rng = random.Random(5)
    kills = 0
    while producer.is_alive():
        time.sleep(6)
        i = rng.randrange(3)
        group[i].kill()
        kills += 1
        group[i] = _start(workers, spec, tmp_path / f"w{i}")
    producer.join()
    produced = result[0].records
    _wait_all_ended(EventLogFollower(log), produced, group)
    for w in group:
        assert w.terminate(60) == 0
    events = read_event_log(log)
    results = check_delivery(produced, events, mode="key", rewind_within_incarnation=True)
    print(f"{kills} kills; " + "; ".join(f"{r.name} {r.counts}" for r in results))
    assert_all(results)


@pytest.mark.slow
def test_soak_broker_blackhole_45s(
    proxied_broker: ProxiedBroker, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """The link goes silent (packets dropped, connections kept open) for 45 s instead of being cut:
    the worker must notice through its own timeouts, reconnect and finish without a restart."""
    pb = proxied_broker
    topic = "blackhole-topic"
    pb.create_topic(topic, 2)
    first = produce_records(pb.bootstrap, topic, 6000, keys=100, seed=31)
    log = str(tmp_path / "events.log")
    spec = WorkerSpec(
        pb.bootstrap,
        group="g-blackhole",
        assign=f"{topic}:0,{topic}:1",
        factor=4,
        max_in_flight=300,
        event_log=log,
        env={"MULTILANE_TEST_SLEEP_MS": "2"},
    )
    w = _start(workers, spec, tmp_path)
    follower = EventLogFollower(log)
    wait_until(lambda: follower.ended_count() >= 500, 60, 0.1, "500 records processed")
    pb.proxy.blackhole()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 45:
        assert w.alive, f"worker died during the black hole:\n{w.stderr_tail()}"
        time.sleep(0.5)
    pb.proxy.restore()
    second = produce_records(pb.bootstrap, topic, 2000, keys=100, seed=32)
    produced = first.records + second.records
    _wait_all_ended(follower, produced, w, stall_s=120)
    assert w.terminate(60) == 0
    events = read_event_log(log)
    assert {e.pid for e in events} == {w.pid}
    assert_all(check_delivery(produced, events, mode="key"))


# -- the replay bound at every kill (issue 31, item 4) ------------------------------------------------


@dataclass(frozen=True)
class _KillFigures:
    """One kill -9 and its restart (see :func:`_replays_per_kill`)."""

    replayed: int  # records done before the kill (by any earlier incarnation) the restart ran again
    running: int  # records the killed worker had started and not finished
    in_flight: int  # records the killed worker had fetched and not finished (its status, just before)
    recent: int  # records the killed worker completed in the last progress interval before the kill
    oldest_ms: float  # how long before the kill the oldest replayed record had completed
    since_progress: int  # records completed before the kill that the newest progress records leave out
    progress_age_ms: float  # the oldest, over partitions, of those newest records at the kill
    progress_gap_ms: float  # median gap between the killed worker's consecutive records of a partition
    replayed_claimed: int  # replayed records that the newest progress record called done (must be 0)

    @property
    def bound(self) -> int:
        """README's promise: the records in flight plus those completed after the snapshot of the newest
        progress record the broker held at the kill (one interval old when the worker runs on time)."""
        return self.in_flight + self.since_progress


def _progress_records(bootstrap: str, group: str) -> list[tuple[float, int, Any]]:
    """Every record of the group's progress topic: ``(produce time, progress partition, record)``,
    in topic order per partition (read after the run; the producer stamps its wall clock)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from multilane.formats.progress import ProgressCodec

    topic = f"multilane-progress.{group}"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{group}.test-reader",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        parts = list(c.list_topics(topic, timeout=10).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[tuple[float, int, Any]] = []
        eof: set[int] = set()
        deadline = time.monotonic() + 30
        while len(eof) < len(parts) and time.monotonic() < deadline:
            for m in c.consume(500, 0.2):
                err, value, partition = m.error(), m.value(), m.partition()
                if partition is None:
                    continue
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof.add(partition)
                    continue
                if value:
                    out.append((m.timestamp()[1] / 1000.0, partition, ProgressCodec.decode(value)))
        assert len(eof) == len(parts), "progress topic not read to its end"
        return out
    finally:
        c.close()


@dataclass(frozen=True)
class _ProgressWindow:
    """What the progress topic held for a worker at its kill (see :func:`_progress_records`)."""

    newest: dict[tuple[str, int], tuple[float, Any]]  # input partition -> (produce time, record)
    median_gap_ms: float  # between consecutive records of a partition written in the worker's lifetime

    @classmethod
    def at_kill(cls, progress: list[tuple[float, int, Any]], born: float, kill_instant: float
                ) -> _ProgressWindow:
        newest: dict[tuple[str, int], tuple[float, Any]] = {}
        gaps: list[float] = []
        for at, _pp, rec in progress:  # topic order per input partition
            if at > kill_instant:
                continue
            tp = (rec.topic, rec.partition)
            if at >= born and tp in newest and newest[tp][0] >= born:
                gaps.append(at - newest[tp][0])
            newest[tp] = (at, rec)
        gaps.sort()
        return cls(newest, 1000 * gaps[len(gaps) // 2] if gaps else float("inf"))

    def age_ms(self, kill_instant: float) -> float:
        return 1000 * max((kill_instant - at for at, _rec in self.newest.values()), default=float("inf"))

    def unclaimed(self, done: dict[tuple[str, int, int], bytes | None]) -> set[tuple[str, int, int]]:
        """The records of ``done`` (record -> key; key mode) that the newest records do not call done:
        what completed after their snapshots, including completions still on their way to the tracker
        when it was taken (the processor logs ``end`` before it hands the completion over)."""
        from multilane.formats.keyranges import key_hash

        out = set()
        for (t, p, o), key in done.items():
            newest = self.newest.get((t, p))
            kh = key_hash(key if key is not None else o.to_bytes(8, "big", signed=True))
            if newest is None or not newest[1].is_done(o, kh):
                out.add((t, p, o))
        return out


def _replays_per_kill(events: list[Any], pids: list[int], kill_times: list[float], in_flight: list[int],
                      window_s: float, progress: list[tuple[float, int, Any]]) -> list[_KillFigures]:
    """The figures of each kill (of ``pids[i]``, restarted as ``pids[i + 1]``)."""
    out = []
    done_at: dict[tuple[str, int, int], float] = {}
    keys: dict[tuple[str, int, int], bytes | None] = {}
    for i, pid in enumerate(pids[:-1]):
        mine = [e for e in events if e.pid == pid]
        ends = {e.tpo: e.time for e in mine if e.kind == "end"}
        done_at.update(ends)
        keys.update({e.tpo: e.key for e in mine if e.kind == "end"})
        running = {e.tpo for e in mine if e.kind == "start"} - set(ends)
        kill_instant = max([kill_times[i], *(e.time for e in mine)])
        recent = sum(1 for t in ends.values() if t > kill_instant - window_s)
        restarted = {e.tpo for e in events if e.pid == pids[i + 1] and e.kind == "start"}
        replayed = restarted & set(done_at)
        oldest = max((kill_instant - done_at[t] for t in replayed), default=0.0) * 1000
        window = _ProgressWindow.at_kill(progress, min(e.time for e in mine), kill_instant)
        unclaimed = window.unclaimed(keys)
        out.append(_KillFigures(len(replayed), len(running), in_flight[i], recent, oldest,
                                len(unclaimed), window.age_ms(kill_instant), window.median_gap_ms,
                                len(replayed - unclaimed)))
    return out


def _kill9_three_times_under_a_hot_key(broker: KafkaBroker, topic: str, tmp_path: Path,
                                       workers: list[WorkerProcess], seed: int) -> None:
    """4 partitions, key mode, factor 32, Zipf keys with a ~20% hot key, a paced producer, three
    SIGKILLs. After each, README's bound holds: the restart replays at most the records in flight at
    the kill plus those completed that the newest progress record on the broker leaves out (read back
    from the progress topic), and none that it calls done; the killed worker wrote progress records
    every few intervals (their median gap); and no replayed record had completed more than two commit
    intervals before the kill (what a missing progress record replays: everything completed above the
    committed offset). The on-time window (completed in the last interval) is printed beside it: the
    newest record is older than one interval when its acknowledgement lagged or the worker was
    descheduled, and that window was too tight (issue 31). Delivery checkers over all incarnations."""
    from collections import Counter

    broker.create_topic(topic, 4)
    log = str(tmp_path / "events.log")
    commit_interval_ms = 500
    spec = WorkerSpec(broker.bootstrap, group=f"g-{topic}", assign=",".join(f"{topic}:{p}" for p in range(4)),
                      factor=32, event_log=log, env={"MULTILANE_TEST_SLEEP_MS": "1"},
                      commit_interval_ms=commit_interval_ms,
                      extra_args=("--progress-interval-ms", str(PROGRESS_INTERVAL_MS)))
    result: list[LoadResult] = []
    producer = threading.Thread(target=lambda: result.append(
        produce_paced(broker.bootstrap, topic, RateProfile.constant(1500, 10), keys=100, zipf_s=1.1,
                      seed=seed, producer_config={"enable.idempotence": True})))
    # (idempotent: on a loaded Apache Kafka a produce request timed out after 60 s and its retry wrote
    # 10 records twice, which the checkers count as records never produced)
    producer.start()
    follower = EventLogFollower(log)
    w = _start(workers, spec, tmp_path / "w0")
    pids = [w.pid]
    kill_times: list[float] = []
    in_flight: list[int] = []
    for n, kill_at in enumerate((1500, 4500, 7500)):
        def reached(k: int = kill_at) -> bool:
            return follower.ended_count() >= k

        wait_until(reached, 120, 0.02, f"{kill_at} records processed")
        in_flight.append(w.in_flight())
        kill_times.append(time.time())
        w.kill()
        w = _start(workers, spec, tmp_path / f"w{n + 1}")
        pids.append(w.pid)
    producer.join(180)
    assert result and result[0].failed == 0
    produced = result[0].records
    _wait_all_ended(follower, produced, w)
    assert w.terminate(60) == 0
    events = read_event_log(log)
    hot_share = Counter(r.key for r in produced).most_common(1)[0][1] / len(produced)
    figures = _replays_per_kill(events, pids, kill_times, in_flight, PROGRESS_INTERVAL_MS / 1000,
                                _progress_records(broker.bootstrap, f"g-{topic}"))
    print(f"seed {seed}: hot key {hot_share:.0%}; per kill: {figures}")
    assert hot_share > 0.15
    for i, f in enumerate(figures):
        why = f"kill {i + 1} of {figures}; the restart's log:\n{workers[i + 1].stderr_tail(30)}"
        assert f.replayed + f.running <= f.bound, why
        # no replayed record was called done by the newest progress record (one not found or not used)
        assert f.replayed_claimed == 0, why
        assert f.oldest_ms <= 2 * commit_interval_ms, why
        # and the snapshots kept coming (on time ~40 ms apart; a cycle that stopped writes only at
        # commits, 500 ms apart; 4 intervals leave room for a worker starved of CPU). No gap (inf): the
        # worker wrote fewer than two records of any partition (killed before its first commits
        # landed, at load average 12-15); the bound above still held, and another kill must show one
        assert f.progress_gap_ms <= 4 * PROGRESS_INTERVAL_MS or f.progress_gap_ms == float("inf"), why
    assert any(f.progress_gap_ms != float("inf") for f in figures), f"no progress cadence: {figures}"
    assert_all(check_delivery(produced, events, mode="key"))


@pytest.mark.matrix
def test_replay_bound_holds_at_every_kill(broker: KafkaBroker, topic_name: str, tmp_path: Path,
                                          workers: list[WorkerProcess]) -> None:
    """One run in the default suite (three kills); the slow variant below runs eight."""
    _kill9_three_times_under_a_hot_key(broker, topic_name, tmp_path, workers, seed=41)


@pytest.mark.slow
@pytest.mark.matrix  # on Apache Kafka: -m "matrix and slow" --broker=apache
@pytest.mark.parametrize("seed", range(8))
def test_replay_bound_holds_at_every_kill_repeated(broker: KafkaBroker, topic_name: str, tmp_path: Path,
                                                   workers: list[WorkerProcess], seed: int) -> None:
    """Eight runs of three kills: a failure in one run of three (the issue's rate) escapes all eight
    with probability (2/3)^8 < 4%."""
    _kill9_three_times_under_a_hot_key(broker, topic_name, tmp_path, workers, seed=100 + seed)
