"""Bulk restores (store bulk mode) and closes that run after the engine answered a release: the bulk
path restores what the plain path restores, learners hand over a flushed and compacted store, an
interrupted bulk load is never reused, and an open of a partition waits for its running close
(embedded broker)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from multilane.testing.broker import EmbeddedBroker
from multilane.worker.state import StateManager
from multilane.worker.state.checkpoint import CheckpointStore
from multilane.worker.state.store import BULK_MARKER, PartitionStore, partition_dir
from tests.support.state_ops import apply_ops, random_ops, reference

pytestmark = pytest.mark.broker


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def writer(broker: EmbeddedBroker, tmp_path: Path, group: str) -> Iterator[StateManager]:
    sm = StateManager(tmp_path / "writer", broker.bootstrap, group)
    yield sm
    sm.close()


def commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        c.close()


def test_bulk_and_plain_restores_and_a_bulk_learner_equal_the_reference(
    broker: EmbeddedBroker, topic_name: str, writer: StateManager, tmp_path: Path, group: str
) -> None:
    broker.create_topic(topic_name, 1)
    ops = random_ops(20_000, 3_000, seed=5)
    writer.open_partition(topic_name, 0, 0, None)
    apply_ops(writer, topic_name, ops)
    writer.before_commit(topic_name, 0, len(ops))
    expected = reference(ops)
    assert dict(writer.store(topic_name, 0).items()) == expected
    commit(broker.bootstrap, group, topic_name, len(ops))

    for bulk in (False, True):
        sm = StateManager(tmp_path / f"restore-{bulk}", broker.bootstrap, group, bulk_restore=bulk)
        try:
            sm.open_partition(topic_name, 0, len(ops), None)
            store = sm.store(topic_name, 0)
            assert dict(store.items()) == expected, f"bulk_restore={bulk}"
            assert not store.bulk and not store.marker_path.exists()  # the bulk load ended, flushed
            sm.close_partition(topic_name, 0, clean=True)
        finally:
            sm.close()

    learner = StateManager(tmp_path / "learner", broker.bootstrap, group)
    try:
        learner.learn(topic_name, 0)
        deadline = time.monotonic() + 60
        while not learner.learner_caught_up(topic_name, 0):
            assert time.monotonic() < deadline, "learner did not catch up"
            time.sleep(0.02)
        store = learner.store(topic_name, 0)
        # Caught up means the bulk load is over: nothing left to flush or compact at promotion.
        assert not store.bulk and not store.marker_path.exists() and not store.compaction_pending()
        assert learner.learner_status()[0]["unread"] == 0
        learner.open_partition(topic_name, 0, len(ops), None)
        assert learner.store(topic_name, 0) is store  # handed over open, no reopen
        assert dict(store.items()) == expected
    finally:
        learner.close()


def test_an_interrupted_bulk_load_is_never_reused(
    broker: EmbeddedBroker, topic_name: str, writer: StateManager, tmp_path: Path, group: str
) -> None:
    broker.create_topic(topic_name, 1)
    ops = random_ops(2_000, 200, seed=6)
    writer.open_partition(topic_name, 0, 0, None)
    apply_ops(writer, topic_name, ops)
    writer.before_commit(topic_name, 0, len(ops))
    writer.close_partition(topic_name, 0, clean=True)
    directory = partition_dir(writer.state_dir, topic_name, 0)
    assert CheckpointStore(directory).read() is not None
    # What a kill -9 during a later bulk load leaves: the marker (and here a checkpoint beside it).
    (directory / BULK_MARKER).touch()
    assert PartitionStore(directory).bulk_interrupted
    writer.open_partition(topic_name, 0, len(ops), None)
    [status] = writer.learner_status()
    assert isinstance(status["records_read"], int)
    assert status["records_read"] >= len(ops)  # wiped and restored from offset 0, checkpoint ignored
    assert dict(writer.store(topic_name, 0).items()) == reference(ops)
    assert not (directory / BULK_MARKER).exists()


def test_open_waits_for_a_close_still_running_after_the_release_answer(
    broker: EmbeddedBroker,
    topic_name: str,
    writer: StateManager,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker.create_topic(topic_name, 1)
    ops = random_ops(2_000, 200, seed=7)
    writer.open_partition(topic_name, 0, 0, None)
    apply_ops(writer, topic_name, ops)
    writer.before_commit(topic_name, 0, len(ops))

    # Hold the close in its flush of the memtables (step 2), as a close after the answer would be.
    release_close = threading.Event()
    in_close = threading.Event()
    original_close = PartitionStore.close

    def slow_close(self: PartitionStore) -> None:
        in_close.set()
        release_close.wait(30)
        original_close(self)

    monkeypatch.setattr(PartitionStore, "close", slow_close)
    closer = threading.Thread(target=writer.close_partition, args=(topic_name, 0, True))
    closer.start()
    assert in_close.wait(10)
    opened = threading.Event()
    errors: list[BaseException] = []

    def reopen() -> None:
        try:
            writer.open_partition(topic_name, 0, len(ops), None)
            opened.set()
        except BaseException as exc:  # reported below
            errors.append(exc)

    opener = threading.Thread(target=reopen)
    opener.start()
    time.sleep(0.5)
    assert not opened.is_set() and not errors, "open_partition ran beside the close of the same partition"
    release_close.set()
    closer.join(30)
    opener.join(60)
    monkeypatch.setattr(PartitionStore, "close", original_close)
    assert not errors, errors
    assert opened.is_set()
    [status] = writer.learner_status()
    assert status["records_read"] == 0  # the close's checkpoint was written first, and reused
    assert dict(writer.store(topic_name, 0).items()) == reference(ops)


def test_manager_close_waits_for_a_close_still_running(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker.create_topic(topic_name, 1)
    sm = StateManager(tmp_path / "m", broker.bootstrap, group)
    ops = random_ops(500, 50, seed=8)
    sm.open_partition(topic_name, 0, 0, None)
    apply_ops(sm, topic_name, ops)
    sm.before_commit(topic_name, 0, len(ops))
    in_close = threading.Event()
    original_close = PartitionStore.close

    def slow_close(self: PartitionStore) -> None:
        in_close.set()
        time.sleep(0.5)
        original_close(self)

    monkeypatch.setattr(PartitionStore, "close", slow_close)
    closer = threading.Thread(target=sm.close_partition, args=(topic_name, 0, True))
    closer.start()
    assert in_close.wait(10)
    sm.close()  # must not close the Kafka clients under the running close, nor return before it
    assert CheckpointStore(partition_dir(sm.state_dir, topic_name, 0)).read() is not None
    closer.join(10)
    assert not closer.is_alive()
