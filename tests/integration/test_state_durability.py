"""Durability edges: lanes writing concurrently (changelog order == store order), partitions opened
concurrently, and a lost changelog write blocking the commit and the checkpoint (embedded broker)."""

from __future__ import annotations

import random
import threading
import uuid
from pathlib import Path

import pytest

from multilane.formats.keyranges import HASH_SPACE, KeyRange, key_hash
from multilane.testing.broker import EmbeddedBroker
from multilane.worker.state import StateDurabilityError, StateManager
from multilane.worker.state.checkpoint import CheckpointStore
from multilane.worker.state.store import partition_dir

pytestmark = pytest.mark.broker

FULL = KeyRange(0, HASH_SPACE)


def test_concurrent_writers_restore_to_the_same_state(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path
) -> None:
    """Unordered mode lets records of one key run at once: 8 threads race on 20 keys; whatever order
    the store applied, the changelog has the same order, so a restore rebuilds the same state."""
    broker.create_topic(topic_name, 1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    with StateManager(tmp_path / "a", broker.bootstrap, group) as sm:
        sm.open_partition(topic_name, 0, 0, None)
        offsets = iter(range(1_000_000))
        lock = threading.Lock()

        def lane(seed: int) -> None:
            rnd = random.Random(seed)
            for _ in range(1500):
                with lock:
                    src = next(offsets)
                key = b"k%d" % rnd.randrange(20)
                view = sm.view(topic_name, 0, key, FULL, src, key_hash(key))
                if rnd.random() < 0.1:
                    view.delete()
                else:
                    view.put(b"%d-%d" % (seed, src))

        threads = [threading.Thread(target=lane, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sm.before_commit(topic_name, 0, 12_000)
        live = dict(sm.store(topic_name, 0).items())
        sm.close_partition(topic_name, 0, clean=False)
    with StateManager(tmp_path / "b", broker.bootstrap, group) as other:
        other.open_partition(topic_name, 0, 12_000, None)
        assert dict(other.store(topic_name, 0).items()) == live


def test_partitions_open_concurrently(broker: EmbeddedBroker, topic_name: str, tmp_path: Path) -> None:
    broker.create_topic(topic_name, 4)
    group = f"g-{uuid.uuid4().hex[:8]}"
    with StateManager(tmp_path / "a", broker.bootstrap, group) as sm:
        for p in range(4):
            sm.open_partition(topic_name, p, 0, None)
            sm.view(topic_name, p, b"k", FULL, 0, key_hash(b"k")).put(b"%d" % p)
            sm.before_commit(topic_name, p, 1)
            sm.close_partition(topic_name, p, clean=False)
    with StateManager(tmp_path / "b", broker.bootstrap, group) as sm:
        errors: list[BaseException] = []

        def open_one(p: int) -> None:
            try:
                sm.open_partition(topic_name, p, 1, None)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_one, args=(p,)) for p in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        for p in range(4):
            assert sm.store(topic_name, p).get(b"k") == b"%d" % p


def test_lost_changelog_write_blocks_commit_and_checkpoint(tmp_path: Path) -> None:
    """The broker goes away after a write: before_commit raises (the engine must not commit) and a
    'clean' close writes no checkpoint, so the next open restores from the changelog."""
    own = EmbeddedBroker().start()
    try:
        own.create_topic("in", 1)
        sm = StateManager(
            tmp_path / "a", own.bootstrap, "g", producer_config={"message.timeout.ms": 1500},
            flush_timeout_s=20,
        )  # fmt: skip
        try:
            sm.open_partition("in", 0, 0, None)
            sm.view("in", 0, b"k", FULL, 0, key_hash(b"k")).put(b"v1")
            sm.before_commit("in", 0, 1)
            own.stop()
            sm.view("in", 0, b"k", FULL, 1, key_hash(b"k")).put(b"v2")
            with pytest.raises(StateDurabilityError):
                sm.before_commit("in", 0, 2)
            sm.close_partition("in", 0, clean=True)
            assert CheckpointStore(partition_dir(tmp_path / "a", "in", 0)).read() is None
        finally:
            sm.close()
    finally:
        own.stop()
