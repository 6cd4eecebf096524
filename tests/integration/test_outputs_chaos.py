"""The outputs goal under kill -9: real ``multilane worker`` processes forwarding every input to an output
topic (``ctx.produce``), Zipf keys with a hot key, factor 32, three SIGKILLs while a producer runs.

Every input must have all its outputs in the output topic (duplicates allowed, none missing), with
``ordering=key`` no key's outputs go backwards within one incarnation, and the delivery checkers hold.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest

from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery
from multilane.testing.loadgen import LoadResult, RateProfile, produce_paced
from multilane.testing.outputs import check_outputs, read_outputs
from multilane.testing.processors import EventLogFollower, read_event_log
from multilane.testing.workers import WorkerProcess, WorkerSpec, wait_until

pytestmark = [pytest.mark.broker, pytest.mark.matrix]

PER_INPUT = 2


def test_outputs_survive_three_kill9s(broker: EmbeddedBroker, topic_name: str, tmp_path: Path,
                                      workers: list[WorkerProcess]) -> None:
    broker.create_topic(topic_name, 2)
    out_topic = f"{topic_name}-out"
    broker.create_topic(out_topic, 4)
    log = str(tmp_path / "events.log")
    spec = WorkerSpec(
        broker.bootstrap,
        group=f"g-{topic_name}",
        assign=f"{topic_name}:0,{topic_name}:1",
        processor="multilane.testing.outputs:forwarding_async",
        factor=32,
        event_log=log,
        env={"MULTILANE_TEST_SLEEP_MS": "1", "MULTILANE_TEST_OUTPUT_TOPIC": out_topic,
             "MULTILANE_TEST_OUTPUTS": str(PER_INPUT)},
    )

    def start() -> WorkerProcess:
        w = WorkerProcess(spec, tmp_path)
        workers.append(w)
        return w.start().wait_ready(90)

    result: list[LoadResult] = []
    producer = threading.Thread(target=lambda: result.append(
        produce_paced(broker.bootstrap, topic_name, RateProfile.constant(1500, 10), keys=300, zipf_s=1.1,
                      seed=21)))
    producer.start()
    follower = EventLogFollower(log)
    w = start()
    for kill_at in (1500, 4500, 7500):
        wait_until(lambda k=kill_at: follower.ended_count() >= k, 120, 0.1, f"{kill_at} records processed")
        w.kill()
        w = start()
    producer.join(180)
    assert result and result[0].failed == 0
    produced = result[0].records
    want = {(r.topic, r.partition, r.offset) for r in produced}
    wait_until(lambda: (follower.poll(), want <= follower.ended)[1], 180, 0.25, "every input processed")
    assert w.terminate(60) == 0  # clean stop: final commit after the outputs' acknowledgements
    events = read_event_log(log)
    assert len({e.pid for e in events if e.kind == "start"}) == 4
    outputs = read_outputs(broker.bootstrap, out_topic, 4)
    hot_key, hot_count = Counter(r.key for r in produced).most_common(1)[0]
    assert hot_count > len(produced) * 0.05, "the Zipf keys should have a hot key"
    result_outputs = check_outputs(produced, outputs, PER_INPUT, ordered=True)
    print(f"{len(produced)} inputs, hot key {hot_key!r} x{hot_count}; {result_outputs}")
    assert_all(check_delivery(produced, events, mode="key"), result_outputs)
