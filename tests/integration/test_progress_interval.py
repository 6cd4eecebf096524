"""Progress records between commits (``progress_interval_ms``) and how a new owner picks one
(embedded broker).

- ``ProgressStore.read_progress`` reads the progress topic backwards and uses the newest record whose
  base equals the committed offset; newer records for a commit that never landed are passed over,
  older bases end the search.
- With commits far apart, the engine's progress cycle keeps the progress topic fresh: a record for the
  committed offset shows every completed record as done and the running one as not done.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from test_engine_harness import config, ended, produce, running, wait_for

from multilane.api import OrderingMode
from multilane.formats.progress import ProgressCodec, ProgressRecord
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery
from multilane.testing.processors import EventRecorder, ProcessorConfig
from multilane.worker.progress_store import ProgressStore, progress_key

pytestmark = [pytest.mark.broker, pytest.mark.matrix]


def _unordered(group: str, base: int, done_to: int) -> bytes:
    done = ((base + 1, done_to),) if done_to > base + 1 else ()
    return ProgressCodec.encode(ProgressRecord(group, "in", 0, base, "w", OrderingMode.UNORDERED,
                                               done_offsets=done))


def test_read_progress_uses_the_newest_record_for_the_committed_base(broker: EmbeddedBroker) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    store = ProgressStore(broker.bootstrap, group, f"multilane-progress.{group}", producer, {})
    store.ensure_topic(1)
    key = progress_key("in", 0)
    values = [
        _unordered(group, 80, 85),
        _unordered(group, 90, 95),
        _unordered(group, 100, 150),
        _unordered(group, 100, 160),  # the newest for base 100 ...
        _unordered(group, 120, 170),  # ... then a commit of 120 was sent (it may never have landed)
        b"MLP\x01garbage!!",  # undecodable: passed over with a warning
        _unordered(group, 120, 180),
        _unordered("another-group", 100, 500),  # another client's record under the same key
    ]
    for v in values:
        producer.produce(store.topic, key=key, value=v, partition=0)
        producer.produce(store.topic, key=progress_key("other", 0), value=_unordered(group, 100, 999),
                         partition=0)
    producer.flush(10)

    def done_to(committed: int) -> int | None:
        rec = store.read_progress("in", 0, committed, chunk=3)  # small chunks: several backward reads
        return None if rec is None else rec.high

    assert done_to(100) == 160  # the commit of 120 did not land: the newest record for 100
    assert done_to(120) == 180  # it did
    assert done_to(130) is None  # nothing for 130, and the newest base (120) is older: stop
    assert done_to(90) == 95  # two newer bases (100, 120) are passed over (foreign records ignored)
    # base 80 lies behind three newer bases: only commits still unanswered at a crash leave newer
    # bases behind, so the search stops before it
    assert done_to(80) is None
    assert done_to(95) is None  # 90 < 95: everything further back is older
    assert store.read_progress("in", 0, None) is None
    assert store.read_progress("absent", 0, 100) is None


def test_progress_between_commits_keeps_the_topic_fresh(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path
) -> None:
    """Commits every hour, progress every 50 ms: a record for the committed offset appears that
    says every completed record is done and the hung one is not; nothing above the committed offset
    is skipped or lost once the hang ends."""
    broker.create_topic(topic_name, 1)
    n = 400
    hang_key = b"hang"  # one record, above the committed offset
    produced = produce(broker, topic_name, n, key_of=lambda i: hang_key if i == 17 else b"k%d" % (i % 40))
    group = f"g-{topic_name}"
    committed = 10
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic_name, 0, committed)], asynchronous=False)
    c.close()
    release = str(tmp_path / "release")
    cfg = config(broker, topic_name, group, ordering=OrderingMode.UNORDERED, factor=8,
                 commit_interval_ms=3_600_000, progress_interval_ms=50)
    rec = EventRecorder(ProcessorConfig(sleep_s=0.001, hang=frozenset({hang_key}),
                                        hang_release_file=release))
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    store = ProgressStore(broker.bootstrap, group, cfg.progress_topic_name, producer, {})
    with running(cfg, rec.async_processor) as (engine, runner):
        hung = {r.offset for r in produced if r.key == hang_key and r.offset >= committed}
        want = {r.offset for r in produced if r.offset >= committed} - hung
        wait_for(lambda: want <= ended(rec.snapshot()), 60, what="every record but the hung ones ended")
        store.ensure_topic(1)

        def fresh() -> ProgressRecord | None:
            got = store.read_progress(topic_name, 0, committed, quiet_s=0.1)
            if got is None:
                return None
            done = {o for o in range(committed, n) if got.is_done(o, 0)}
            return got if done == want else None

        wait_for(lambda: fresh() is not None, 30, 0.2, "a progress record showing every completed record")
        assert runner.sync(engine.status)["partitions"][0]["committed"] == committed, "no commit may have run"
        open(release, "w").close()
        wait_for(lambda: want | hung <= ended(rec.snapshot()), 60, what="the hung records ended")
    events = rec.snapshot()
    assert ended(events) == set(range(committed, n)), "nothing above the committed offset skipped"
    assert_all(check_delivery([r for r in produced if r.offset >= committed], events, mode="unordered"))
    assert os.path.exists(release)
