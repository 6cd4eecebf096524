"""Learner mode: a second worker tails the changelog, holds back uncommitted changes, and takes over
(promotion) fast and with the right state; demote and drop (embedded broker)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from multilane.formats.keyranges import key_hash
from multilane.testing.broker import EmbeddedBroker
from multilane.worker.state import ChangelogCorruptError, StateManager, StatePhaseError
from multilane.worker.state import metrics as state_metrics
from multilane.worker.state.learner import PartitionLearner
from multilane.worker.state.reader import ChangelogReader
from multilane.worker.state.store import partition_dir
from tests.support.state_ops import FULL, DoneSet, apply_ops, random_ops, reference

pytestmark = pytest.mark.broker


def wait_until(pred: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def committer(broker: EmbeddedBroker, group: str) -> Iterator[Callable[[str, int], None]]:
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})

    def commit(topic: str, offset: int) -> None:
        c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)

    yield commit
    c.close()


@pytest.fixture
def managers(broker: EmbeddedBroker, tmp_path: Path, group: str) -> Iterator[Callable[[str], StateManager]]:
    made: list[StateManager] = []

    def make(name: str) -> StateManager:
        sm = StateManager(tmp_path / name, broker.bootstrap, group, committed_poll_interval_s=0.2)
        made.append(sm)
        return sm

    yield make
    for sm in made:
        sm.close()


def _slow_promotions(topic: str) -> float:
    registry = CollectorRegistry()
    for c in state_metrics.COLLECTORS:
        registry.register(c)
    v = registry.get_sample_value("multilane_state_slow_promotions_total", {"topic": topic, "partition": "0"})
    return v or 0.0


def test_learner_tails_buffers_and_promotes_fast(
    broker: EmbeddedBroker,
    topic_name: str,
    managers: Callable[[str], StateManager],
    committer: Callable[[str, int], None],
) -> None:
    broker.create_topic(topic_name, 1)
    owner, learner = managers("owner"), managers("learner")
    ops = random_ops(300, 60, seed=7, first=0, delete_share=0.15)
    owner.open_partition(topic_name, 0, 0, None)
    apply_ops(owner, topic_name, ops)
    owner.before_commit(topic_name, 0, 150)
    committer(topic_name, 150)

    # 1. The learner restores, applying only committed changes and holding back the rest.
    learner.learn(topic_name, 0)
    wait_until(lambda: learner.learner_caught_up(topic_name, 0), what="learner caught up")
    with pytest.raises(StatePhaseError):
        learner.view(topic_name, 0, b"k", FULL, 0, key_hash(b"k"))
    assert dict(learner.store(topic_name, 0).items()) == reference(ops, lambda s: s < 150)
    [status] = learner.learner_status()
    assert status["phase"] == "learning"
    assert isinstance(status["buffered"], int) and status["buffered"] > 0
    assert status["restore_lag"] == status["buffered"]

    # 2. The owner commits further: the learner applies the held-back changes.
    owner.before_commit(topic_name, 0, 300)
    committer(topic_name, 300)
    wait_until(
        lambda: dict(learner.store(topic_name, 0).items()) == reference(ops, lambda s: True),
        timeout=30,
        what="learner applies committed changes",
    )
    wait_until(lambda: learner.learner_status()[0]["buffered"] == 0, timeout=10, what="buffer empty")

    # 3. The owner processes more, then is released mid-flight: its final commit reaches 350 and the
    #    progress record says 370 is done; records 350..399 except 370 will be processed again.
    more = random_ops(100, 60, seed=8, first=300, delete_share=0.15)
    apply_ops(owner, topic_name, more)
    owner.before_commit(topic_name, 0, 350)
    committer(topic_name, 350)
    owner.close_partition(topic_name, 0, clean=False)
    done = DoneSet({(370, key_hash(more[70][1]))})

    # 4. Promotion: fast, and the store equals what a full restore would build.
    slow_before = _slow_promotions(topic_name)
    t0 = time.monotonic()
    learner.open_partition(topic_name, 0, 350, done)
    promotion_s = time.monotonic() - t0
    everything = ops + more
    expected = reference(everything, lambda s: s < 350 or s == 370)
    assert dict(learner.store(topic_name, 0).items()) == expected
    assert _slow_promotions(topic_name) == slow_before
    assert promotion_s < 5.0, f"promotion took {promotion_s:.2f}s"  # ~0.2-0.5s unloaded; the box is shared

    full = managers("full")
    full.open_partition(topic_name, 0, 350, done)
    assert dict(full.store(topic_name, 0).items()) == expected

    # 5. The promoted learner is an ordinary active owner now.
    apply_ops(learner, topic_name, [(350, b"key-1", b"after-promotion")])
    learner.before_commit(topic_name, 0, 351)
    assert learner.store(topic_name, 0).get(b"key-1") == b"after-promotion"


def test_promotion_falls_back_to_full_restore_when_learner_is_ahead(
    broker: EmbeddedBroker,
    topic_name: str,
    managers: Callable[[str], StateManager],
    committer: Callable[[str, int], None],
) -> None:
    broker.create_topic(topic_name, 1)
    owner, learner = managers("owner"), managers("learner")
    ops = random_ops(100, 20, seed=9, first=0, delete_share=0.15)
    owner.open_partition(topic_name, 0, 0, None)
    apply_ops(owner, topic_name, ops)
    owner.before_commit(topic_name, 0, 100)
    committer(topic_name, 100)
    learner.learn(topic_name, 0)
    wait_until(lambda: learner.learner_caught_up(topic_name, 0), what="caught up")
    wait_until(
        lambda: learner.learner_status()[0]["committed_offset"] == 100, timeout=10, what="committed seen"
    )
    # The group's offset is rewound to 40 (an operator reset): the learner's store is ahead of it.
    committer(topic_name, 40)
    slow_before = _slow_promotions(topic_name)
    learner.open_partition(topic_name, 0, 40, None)
    assert _slow_promotions(topic_name) == slow_before + 1
    assert dict(learner.store(topic_name, 0).items()) == reference(ops, lambda s: s < 40)


def test_demote_keeps_the_store_and_drop_removes_it(
    broker: EmbeddedBroker,
    topic_name: str,
    managers: Callable[[str], StateManager],
    committer: Callable[[str, int], None],
) -> None:
    broker.create_topic(topic_name, 1)
    sm = managers("w")
    ops = random_ops(200, 30, seed=10, first=0, delete_share=0.15)
    sm.open_partition(topic_name, 0, 0, None)
    apply_ops(sm, topic_name, ops)
    sm.before_commit(topic_name, 0, 200)
    committer(topic_name, 200)
    with pytest.raises(StatePhaseError, match="release"):
        sm.drop(topic_name, 0)
    with pytest.raises(StatePhaseError, match="demote"):
        sm.learn(topic_name, 0)

    sm.demote(topic_name, 0)
    wait_until(lambda: sm.learner_caught_up(topic_name, 0), what="demoted learner caught up")
    [status] = sm.learner_status()
    assert status["phase"] == "learning"
    assert status["records_read"] == 0  # tailed from its own checkpoint, no re-read
    assert dict(sm.store(topic_name, 0).items()) == reference(ops, lambda s: True)

    directory = partition_dir(sm.state_dir, topic_name, 0)
    assert directory.exists()
    sm.drop(topic_name, 0)
    assert not directory.exists()
    assert sm.learner_status() == []


def test_learner_fails_loudly_on_a_corrupt_record(
    broker: EmbeddedBroker,
    topic_name: str,
    managers: Callable[[str], StateManager],
    committer: Callable[[str, int], None],
) -> None:
    broker.create_topic(topic_name, 1)
    owner, learner = managers("owner"), managers("learner")
    owner.open_partition(topic_name, 0, 0, None)
    apply_ops(owner, topic_name, random_ops(10, 5, seed=11, first=0, delete_share=0.15))
    owner.before_commit(topic_name, 0, 10)
    committer(topic_name, 10)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    offsets: list[int] = []
    p.produce(owner.changelog_topic(topic_name), key=b"x", value=b"not an envelope at all", partition=0,
              on_delivery=lambda err, msg: offsets.append(msg.offset()))  # fmt: skip
    p.flush(10)
    learner.learn(topic_name, 0)

    def failed() -> bool:
        return learner.learner_status()[0]["phase"] == "failed"

    wait_until(failed, what="learner failed")
    [status] = learner.learner_status()
    assert f"@{offsets[0]}" in str(status["error"])
    with pytest.raises(StatePhaseError, match="failed"):
        learner.promote(topic_name, 0)
    with pytest.raises(ChangelogCorruptError):  # the full-restore fallback fails loudly too
        learner.open_partition(topic_name, 0, 10, None)


@pytest.mark.parametrize("handed", ["exact", "beyond"])
def test_promotion_reads_to_the_changelog_end_the_release_handed_over(
    broker: EmbeddedBroker,
    topic_name: str,
    managers: Callable[[str], StateManager],
    committer: Callable[[str, int], None],
    monkeypatch: pytest.MonkeyPatch,
    handed: str,
) -> None:
    """The owner's ``changelog_end`` after its final commit is where the promotion stops reading:
    no fresh fetch (no seek) and the same store as a full restore. An end beyond the changelog (a bad
    hint) falls back to the fresh fetch after ``handed_end_wait_s``, with the same store."""
    broker.create_topic(topic_name, 1)
    owner, learner = managers("owner"), managers("learner")
    ops = random_ops(200, 40, seed=11, first=0, delete_share=0.15)
    owner.open_partition(topic_name, 0, 0, None)
    apply_ops(owner, topic_name, ops[:100])
    owner.before_commit(topic_name, 0, 100)
    committer(topic_name, 100)
    learner.learn(topic_name, 0)
    wait_until(lambda: learner.learner_caught_up(topic_name, 0), what="learner caught up")
    # the owner goes on, then releases: final commit at 180, record 190 done per its progress
    apply_ops(owner, topic_name, ops[100:])
    owner.before_commit(topic_name, 0, 180)
    committer(topic_name, 180)
    end = owner.changelog_end(topic_name, 0)
    assert end is not None and end >= len(ops)  # deletes write two records
    owner.close_partition(topic_name, 0, clean=True)
    assert owner.changelog_end(topic_name, 0) is None  # not active any more
    done = DoneSet({(190, key_hash(ops[190][1]))})

    seeks: list[int] = []
    real_seek = ChangelogReader.seek

    def counting_seek(self: ChangelogReader, offset: int) -> None:
        seeks.append(offset)
        real_seek(self, offset)

    monkeypatch.setattr(ChangelogReader, "seek", counting_seek)
    monkeypatch.setattr(PartitionLearner, "handed_end_wait_s", 0.5)
    learner.open_partition(topic_name, 0, 180, done, changelog_end=end if handed == "exact" else end + 1000)
    expected = reference(ops, lambda s: s < 180 or s == 190)
    assert dict(learner.store(topic_name, 0).items()) == expected
    assert (seeks == []) is (handed == "exact"), seeks
    full = managers("full")
    full.open_partition(topic_name, 0, 180, done)
    assert dict(full.store(topic_name, 0).items()) == expected
