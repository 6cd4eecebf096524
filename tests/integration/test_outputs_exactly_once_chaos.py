"""Exactly-once outputs with state under kill -9 and a handoff, on Apache Kafka (the embedded broker
leaks aborted transactions to ``read_committed`` readers): real ``multilane worker --outputs exactly-once
--state-dir`` processes counting each key's records in their state and forwarding every input twice,
Zipf keys with a hot key, factor 32, three SIGKILLs while a producer runs, then a scale-up: a second
worker, a learner of partition 1 from the start (it tails the changelog through the kills and their
aborted transactions), takes partition 1 through restore-before-handoff (the first releases it with a
final commit of its open transaction, the second is assigned it with the progress hint: a promotion).

An outside ``read_committed`` client reads the output topic: every input's two outputs appear exactly
once, per key in input order across all incarnations, and the delivery checkers hold. The state equals
the reference (each key's count of inputs) in the final owners' local stores and in an independent
restore from the committed changelog.

Runs in the default suite whatever ``--broker`` says: it starts its own Apache Kafka (skipped when Java
or the jars are missing, failed under ``CI=true``).
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from multilane.testing.apache import ApacheKafka
from multilane.testing.checkers import assert_all, check_delivery
from multilane.testing.loadgen import LoadResult, RateProfile, produce_paced
from multilane.testing.outputs import check_outputs, read_outputs
from multilane.testing.processors import EventLogFollower, read_event_log
from multilane.testing.workers import WorkerProcess, WorkerSpec, wait_until
from multilane.worker.state.examples import decode_count, reference_counts
from multilane.worker.state.manager import StateManager
from multilane.worker.state.store import PartitionStore, partition_dir
from tests.support.apache import require_apache_kafka

PER_INPUT = 2


@pytest.fixture(scope="module")
def kafka() -> Iterator[ApacheKafka]:
    require_apache_kafka()
    with ApacheKafka() as k:
        yield k


def test_exactly_once_outputs_survive_three_kill9s_and_a_handoff(kafka: ApacheKafka, topic_name: str,
                                                                 tmp_path: Path,
                                                                 workers: list[WorkerProcess]) -> None:
    kafka.create_topic(topic_name, 2)
    out_topic = f"{topic_name}-out"
    kafka.create_topic(out_topic, 4)
    log = str(tmp_path / "events.log")
    both = f"{topic_name}:0,{topic_name}:1"
    moved = {"topic": topic_name, "partition": 1}

    group = f"g-{topic_name}"
    dir_a, dir_b = tmp_path / "state-a", tmp_path / "state-b"

    def spec(assign: str, state_dir: Path) -> WorkerSpec:
        return WorkerSpec(
            kafka.bootstrap, group=group, assign=assign,
            processor="multilane.testing.outputs:forwarding_counting_async", factor=32, event_log=log,
            commit_interval_ms=300, extra_args=("--outputs", "exactly-once", "--state-dir", str(state_dir)),
            env={"MULTILANE_TEST_SLEEP_MS": "1", "MULTILANE_TEST_OUTPUT_TOPIC": out_topic,
                 "MULTILANE_TEST_OUTPUTS": str(PER_INPUT)},
        )  # fmt: skip

    def start(assign: str, state_dir: Path = dir_a) -> WorkerProcess:
        w = WorkerProcess(spec(assign, state_dir), tmp_path)
        workers.append(w)
        return w.start().wait_ready(120)

    result: list[LoadResult] = []
    producer = threading.Thread(target=lambda: result.append(
        produce_paced(kafka.bootstrap, topic_name, RateProfile.constant(700, 15), keys=300, zipf_s=1.1,
                      seed=32)))
    follower = EventLogFollower(log)
    a = start(both)
    b = start("", dir_b)  # the scale-up's new worker: a learner of partition 1 until the handoff below
    code, learning = b.request("POST", "/v1/learn", {"partitions": [moved]})
    assert code == 200, learning
    producer.start()  # after both are ready: the handoff below comes while records still arrive
    for kill_at in (1200, 2800, 4200):
        wait_until(lambda k=kill_at: follower.ended_count() >= k, 120, 0.1, f"{kill_at} records processed")
        a.kill()
        a = start(both)
    # the scale-up: A releases partition 1 (its open transaction commits before the answer), B is
    # assigned it with the released progress record
    wait_until(lambda: follower.ended_count() >= 5000, 120, 0.1, "5000 records processed")
    code, promotable = b.request("POST", "/v1/promote", {"partitions": [moved]})  # healthy, caught up
    assert code == 200, promotable
    code, released = a.request("POST", "/v1/release", {"partitions": [moved], "deadline_s": 10})
    assert code == 200, released
    (rel,) = released["released"]
    body: dict[str, object] = {"generation": 1, "partitions": [moved]}
    if rel.get("progress"):
        body["progress"] = [{**moved, "progress": rel["progress"]}]
    code, answer = b.request("POST", "/v1/assignment", body, timeout=60)
    assert code == 200, answer
    print(f"released {rel}; assigned {answer}; ended so far {follower.ended_count()}")
    producer.join(180)
    assert result and result[0].failed == 0
    produced = result[0].records
    want = {(r.topic, r.partition, r.offset) for r in produced}
    wait_until(lambda: (follower.poll(), want <= follower.ended)[1], 180, 0.25, "every input processed")
    assert a.terminate(60) == 0 and b.terminate(60) == 0  # clean stops: their transactions commit
    events = read_event_log(log)
    outputs = read_outputs(kafka.bootstrap, out_topic, 4)  # read_committed, an outside client
    hot_key, hot_count = Counter(r.key for r in produced).most_common(1)[0]
    assert hot_count > len(produced) * 0.05, "the Zipf keys should have a hot key"
    checked = check_outputs(produced, outputs, PER_INPUT, ordered=True, exactly_once=True)
    print(f"{len(produced)} inputs, hot key {hot_key!r} x{hot_count}; {checked}; "
          f"load average {os.getloadavg()}")
    assert_all(check_delivery(produced, events, mode="key"), checked)
    assert len(outputs) == PER_INPUT * len(produced) and checked.counts["duplicates"] == 0
    assert len({e.pid for e in events if e.kind == "start"}) == 5, b.stderr_tail(60)
    assert {o.pid for o in outputs} >= {b.pid}  # the new owner's transactions reached the reader
    assert b.stderr_path is not None
    b_log = b.stderr_path.read_text()
    assert f"promoted {topic_name}[1]" in b_log and "slow promotion" not in b_log  # the learner's store
    # the state equals the reference: the final owners' stores (closed cleanly) and a restore from the
    # committed changelog (read_committed: nothing of the aborted transactions)
    ends = [1 + max(r.offset for r in produced if r.partition == p) for p in (0, 1)]
    for p, directory in ((0, dir_a), (1, dir_b)):
        reference = reference_counts(r.key for r in produced if r.partition == p)
        store = PartitionStore(partition_dir(directory, topic_name, p)).open()
        try:
            assert {k: decode_count(v) for k, v in store.items()} == reference, f"partition {p}: local"
        finally:
            store.close()
        with StateManager(tmp_path / f"verify-{p}", kafka.bootstrap, group) as sm:
            sm.open_partition(topic_name, p, ends[p], None)
            restored = {k: decode_count(v) for k, v in sm.store(topic_name, p).items()}
            sm.close_partition(topic_name, p, clean=False)
        assert restored == reference, f"partition {p}: restored from the committed changelog"
