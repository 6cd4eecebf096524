"""Changelog -> restore equals the store; restore skips changes of uncommitted records and applies
done ones; checkpoints; corrupt records (embedded broker)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from multilane.formats.keyranges import key_hash
from multilane.testing.broker import EmbeddedBroker
from multilane.worker.state import ChangelogCorruptError, StateManager
from multilane.worker.state import metrics as state_metrics
from multilane.worker.state.checkpoint import Checkpoint, CheckpointStore
from multilane.worker.state.store import partition_dir
from tests.support.state_ops import DoneSet, apply_ops, random_ops, reference

pytestmark = pytest.mark.broker


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def manager(broker: EmbeddedBroker, tmp_path: Path, group: str) -> Iterator[StateManager]:
    sm = StateManager(tmp_path / "a", broker.bootstrap, group, restore_stall_timeout_s=60)
    yield sm
    sm.close()


def snapshot(sm: StateManager, topic: str, p: int) -> dict[bytes, bytes]:
    return dict(sm.store(topic, p).items())


def test_changelog_restore_equals_store_with_deletes(
    broker: EmbeddedBroker, topic_name: str, manager: StateManager, tmp_path: Path, group: str
) -> None:
    broker.create_topic(topic_name, 2)
    ops = random_ops(3000, 300, seed=1)
    manager.open_partition(topic_name, 1, 0, None)
    apply_ops(manager, topic_name, ops, partition=1)
    manager.before_commit(topic_name, 1, len(ops))
    live = snapshot(manager, topic_name, 1)
    assert live == reference(ops)
    deleted = {k for _, k, v in ops if v is None} - set(live)
    assert deleted, "the workload must leave some keys deleted"
    manager.close_partition(topic_name, 1, clean=False)  # no checkpoint: a full restore follows

    other = StateManager(tmp_path / "b", broker.bootstrap, group)
    try:
        other.open_partition(topic_name, 1, len(ops), None)
        restored = snapshot(other, topic_name, 1)
        [status] = other.learner_status()
        assert status["records_read"] >= len(ops)  # read from the start
    finally:
        other.close()
    assert restored == live
    assert not deleted & set(restored)
    md = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
    assert len(md.topics[f"{group}.{topic_name}.changelog"].partitions) == 2


def test_restore_skips_uncommitted_and_applies_done(
    broker: EmbeddedBroker, topic_name: str, manager: StateManager, tmp_path: Path, group: str
) -> None:
    broker.create_topic(topic_name, 1)
    ops = random_ops(400, 40, seed=2)
    manager.open_partition(topic_name, 0, 0, None)
    apply_ops(manager, topic_name, ops, partition=0)
    manager.before_commit(topic_name, 0, 200)
    manager.close_partition(topic_name, 0, clean=False)  # crash after the commit of offset 200

    done_above = {250, 260, 399}
    progress = DoneSet({(o, key_hash(ops[o][1])) for o in done_above})
    expected = reference(ops, (set(range(200)) | done_above).__contains__)
    assert expected != reference(ops)
    restorer = StateManager(tmp_path / "b", broker.bootstrap, group)
    try:
        restorer.open_partition(topic_name, 0, 200, progress)
        assert snapshot(restorer, topic_name, 0) == expected
    finally:
        restorer.close()


def test_clean_close_checkpoint_is_reused_and_dirty_one_is_not(
    broker: EmbeddedBroker, topic_name: str, manager: StateManager
) -> None:
    broker.create_topic(topic_name, 1)
    ops = random_ops(500, 50, seed=3)
    manager.open_partition(topic_name, 0, 0, None)
    apply_ops(manager, topic_name, ops[:450], partition=0)
    manager.before_commit(topic_name, 0, 450)
    manager.close_partition(topic_name, 0, clean=True)
    ckpts = CheckpointStore(partition_dir(manager.state_dir, topic_name, 0))
    ck = ckpts.read()
    assert ck is not None and ck.committed_offset == 450 and ck.changelog_offset >= 450
    assert ck.above_commit_sources == ()

    # Reopen: tails from the checkpoint (reads nothing old) and the checkpoint file is gone.
    manager.open_partition(topic_name, 0, 450, None)
    assert ckpts.read() is None
    [status] = manager.learner_status()
    assert status["records_read"] == 0
    assert snapshot(manager, topic_name, 0) == reference(ops[:450])

    # Records 450..499 are processed but the final commit only reaches 480; record 490 is done.
    apply_ops(manager, topic_name, ops[450:], partition=0)
    manager.before_commit(topic_name, 0, 480)
    manager.close_partition(topic_name, 0, clean=True)
    ck = ckpts.read()
    assert ck is not None and {s[0] for s in ck.above_commit_sources} == set(range(480, 500))

    # The next owner's view: committed 480, only 490 done -> the local store is dirty: full restore.
    progress = DoneSet({(490, key_hash(ops[490][1]))})
    manager.open_partition(topic_name, 0, 480, progress)
    [status] = manager.learner_status()
    assert status["records_read"] > 450
    assert snapshot(manager, topic_name, 0) == reference(ops, (set(range(480)) | {490}).__contains__)
    manager.close_partition(topic_name, 0, clean=True)

    # Everything committed: the checkpoint is reused again.
    manager.open_partition(topic_name, 0, 500, None)
    [status] = manager.learner_status()
    assert status["records_read"] == 0


def _corrupt_metric(topic: str) -> float:
    registry = CollectorRegistry()
    for c in state_metrics.COLLECTORS:
        registry.register(c)
    v = registry.get_sample_value("multilane_state_corrupt_records_total", {"topic": topic, "partition": "0"})
    return v or 0.0


def test_corrupt_record_fails_or_is_skipped(
    broker: EmbeddedBroker, topic_name: str, manager: StateManager, tmp_path: Path, group: str
) -> None:
    broker.create_topic(topic_name, 1)
    manager.open_partition(topic_name, 0, 0, None)
    apply_ops(manager, topic_name, [(0, b"a", b"1"), (1, b"b", b"1")], partition=0)
    manager.before_commit(topic_name, 0, 2)
    manager.close_partition(topic_name, 0, clean=True)
    changelog = manager.changelog_topic(topic_name)
    offsets: list[int] = []
    p = Producer({"bootstrap.servers": broker.bootstrap})
    p.produce(
        changelog,
        key=b"a",
        value=b"garbage that is no envelope",
        partition=0,
        on_delivery=lambda err, msg: offsets.append(msg.offset()),
    )
    p.flush(10)
    assert offsets == [2]
    # Append a valid change after the corrupt record: reopen from a checkpoint that skips over it.
    ckpts = CheckpointStore(partition_dir(manager.state_dir, topic_name, 0))
    ck = ckpts.read()
    assert ck is not None and ck.changelog_offset == 2
    ckpts.write(Checkpoint(3, ck.committed_offset, ck.above_commit_sources))
    manager.open_partition(topic_name, 0, 2, None)
    apply_ops(manager, topic_name, [(3, b"c", b"1")], partition=0)
    manager.before_commit(topic_name, 0, 5)
    manager.close_partition(topic_name, 0, clean=False)

    failing = StateManager(tmp_path / "fail", broker.bootstrap, group)
    try:
        with pytest.raises(ChangelogCorruptError, match=rf"{changelog}\[0\]@2"):
            failing.open_partition(topic_name, 0, 5, None)
    finally:
        failing.close()

    before = _corrupt_metric(topic_name)
    skipping = StateManager(tmp_path / "skip", broker.bootstrap, group, on_corrupt="skip")
    try:
        skipping.open_partition(topic_name, 0, 5, None)
        assert snapshot(skipping, topic_name, 0) == {b"a": b"1", b"b": b"1", b"c": b"1"}
    finally:
        skipping.close()
    assert _corrupt_metric(topic_name) == before + 1


def test_open_without_committed_offset_applies_nothing_uncommitted(
    broker: EmbeddedBroker, topic_name: str, manager: StateManager, tmp_path: Path, group: str
) -> None:
    broker.create_topic(topic_name, 1)
    manager.open_partition(topic_name, 0, None, None)
    apply_ops(manager, topic_name, [(0, b"a", b"1")], partition=0)
    manager.before_commit(topic_name, 0, 0)
    manager.close_partition(topic_name, 0, clean=False)
    fresh = StateManager(tmp_path / "n", broker.bootstrap, group)
    try:
        fresh.open_partition(topic_name, 0, None, None)
        assert snapshot(fresh, topic_name, 0) == {}
    finally:
        fresh.close()
