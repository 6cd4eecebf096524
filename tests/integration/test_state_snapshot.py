"""Restore and learners from a state snapshot + changelog tail equal a full changelog replay; corrupt or
unusable snapshots fall back to the full replay, logged and counted (embedded broker; snapshots are
built by the snapshot job's task functions in process, no Spark)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from multilane.formats.keyranges import KeyRangeMap, key_hash
from multilane.pipeline.job import SnapshotJob, SnapshotJobConfig
from multilane.snapshots.layout import manifest_path
from multilane.snapshots.manifest import SnapshotManifest
from multilane.testing.broker import EmbeddedBroker
from multilane.worker.state import StateManager
from multilane.worker.state import metrics as state_metrics
from tests.support.state_ops import DoneSet, Ops, apply_ops, random_ops, reference

pytestmark = pytest.mark.broker


def state_of(sm: StateManager, topic: str) -> dict[bytes, bytes]:
    return dict(sm.store(topic, 0).items())


def sample(name: str, labels: dict[str, str]) -> float:
    registry = CollectorRegistry()
    for c in state_metrics.COLLECTORS:
        registry.register(c)
    return registry.get_sample_value(name, labels) or 0.0


def snapshot_outcomes(topic: str) -> dict[str, float]:
    return {
        o: sample("multilane_state_snapshot_restores_total", {"topic": topic, "partition": "0", "outcome": o})
        for o in ("loaded", "none", "failed")
    }


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def managers(broker: EmbeddedBroker, tmp_path: Path, group: str) -> Iterator[Callable[..., StateManager]]:
    made: list[StateManager] = []

    def make(name: str, snapshot_uri: str | None = None) -> StateManager:
        sm = StateManager(
            tmp_path / name,
            broker.bootstrap,
            group,
            committed_poll_interval_s=0.2,
            snapshot_uri=snapshot_uri,
        )
        made.append(sm)
        return sm

    yield make
    for sm in made:
        sm.close()


def build_snapshot(broker: EmbeddedBroker, group: str, topic: str, uri: str, bound: int) -> SnapshotManifest:
    """The snapshot job's steps, in process, bounded at source offset ``bound``; small offset ranges so
    that the range merge is exercised."""
    config = SnapshotJobConfig(
        bootstrap=broker.bootstrap,
        group=group,
        topics=(topic,),
        uri=uri,
        layout=KeyRangeMap.even(2),
        source_bounds={(topic, 0): bound},
        max_records_per_task=700,
        idle_timeout_s=30,
    )
    return SnapshotJob(config).run_in_process().manifest


@pytest.fixture
def history(
    broker: EmbeddedBroker, topic_name: str, managers: Callable[..., StateManager], group: str, tmp_path: Path
) -> tuple[Ops, SnapshotManifest, str]:
    """A changelog of 2,400 changes with a snapshot bounded at source offset 1,200 taken when 2,000
    changes were written (so its ``changelog_offset`` cuts before the first change of record 1,200),
    then 400 more changes (the tail)."""
    broker.create_topic(topic_name, 1)
    owner = managers("owner")
    ops = random_ops(2400, 150, seed=11, first=0)
    owner.open_partition(topic_name, 0, 0, None)
    apply_ops(owner, topic_name, ops[:2000])
    owner.before_commit(topic_name, 0, 1200)
    uri = str(tmp_path / "snapshots")
    manifest = build_snapshot(broker, group, topic_name, uri, bound=1200)
    entry = manifest.partitions[0]
    assert entry.source_bound == 1200 and entry.changelog_offset < entry.changelog_end
    assert 0 < entry.rows < 150
    apply_ops(owner, topic_name, ops[2000:])
    owner.before_commit(topic_name, 0, 2400)
    owner.close_partition(topic_name, 0, clean=False)
    return ops, manifest, uri


@pytest.mark.matrix
def test_restore_from_snapshot_and_tail_equals_full_replay(
    topic_name: str, managers: Callable[..., StateManager], history: tuple[Ops, SnapshotManifest, str]
) -> None:
    ops, manifest, uri = history
    # Committed 2,100 with two records above it done: the tail filter must skip and apply as a replay does.
    done = {2150, 2390}
    progress = DoneSet({(o, key_hash(ops[o][1])) for o in done})
    expected = reference(ops, lambda s: s < 2100 or s in done)
    assert expected != reference(ops, lambda s: True)
    before = snapshot_outcomes(topic_name)

    replayed = managers("replay")
    replayed.open_partition(topic_name, 0, 2100, progress)
    assert state_of(replayed, topic_name) == expected
    [full] = replayed.learner_status()
    assert full["snapshot_id"] is None
    end = full["records_read"]  # every changelog record (envelopes and the tombstones after deletes)
    assert isinstance(end, int) and end > manifest.partitions[0].changelog_end

    fast = managers("fast", snapshot_uri=uri)
    fast.open_partition(topic_name, 0, 2100, progress)
    assert state_of(fast, topic_name) == expected
    [st] = fast.learner_status()
    assert st["snapshot_id"] == manifest.snapshot_id
    assert st["snapshot_rows_loaded"] == st["snapshot_rows"] == manifest.partitions[0].rows
    assert st["records_read"] == end - manifest.partitions[0].changelog_offset  # only the tail was read
    assert snapshot_outcomes(topic_name)["loaded"] == before["loaded"] + 1

    # The restored store is a normal active store: writes go on, and a clean close checkpoints it.
    apply_ops(fast, topic_name, [(2400, b"new", b"x")])
    fast.before_commit(topic_name, 0, 2401)
    fast.close_partition(topic_name, 0, clean=True)
    fast.open_partition(topic_name, 0, 2401, None)
    [st] = fast.learner_status()
    assert st["records_read"] == 0 and st["snapshot_id"] is None  # from the checkpoint, not the snapshot
    assert state_of(fast, topic_name) == {**expected, b"new": b"x"}


def test_corrupt_snapshot_falls_back_to_full_replay(
    topic_name: str,
    managers: Callable[..., StateManager],
    history: tuple[Ops, SnapshotManifest, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    ops, manifest, uri = history
    shard = Path(uri) / manifest.partitions[0].files[-1].path
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different SHA-256
    shard.write_bytes(bytes(data))
    before = snapshot_outcomes(topic_name)

    sm = managers("corrupt", snapshot_uri=uri)
    with caplog.at_level(logging.WARNING, logger="multilane.worker.state.snapshot"):
        sm.open_partition(topic_name, 0, 2400, None)
    assert state_of(sm, topic_name) == reference(ops, lambda s: True)
    [st] = sm.learner_status()
    assert st["snapshot_id"] is None and st["snapshot_rows_loaded"] == 0
    assert isinstance(st["records_read"], int) and st["records_read"] > manifest.partitions[0].changelog_end
    assert snapshot_outcomes(topic_name)["failed"] == before["failed"] + 1
    assert any("SHA-256" in r.getMessage() and "replaying" in r.getMessage() for r in caplog.records)


def test_unusable_snapshots_are_not_used(
    topic_name: str, managers: Callable[..., StateManager], history: tuple[Ops, SnapshotManifest, str]
) -> None:
    ops, manifest, uri = history
    before = snapshot_outcomes(topic_name)
    # 1. Committed offset moved back below the snapshot's bound: the snapshot may hold changes this
    #    restore must skip.
    sm = managers("behind", snapshot_uri=uri)
    sm.open_partition(topic_name, 0, 1000, None)
    assert state_of(sm, topic_name) == reference(ops, lambda s: s < 1000)
    [st] = sm.learner_status()
    assert st["snapshot_id"] is None
    assert isinstance(st["records_read"], int) and st["records_read"] > manifest.partitions[0].changelog_end
    assert snapshot_outcomes(topic_name)["none"] == before["none"] + 1
    sm.close_partition(topic_name, 0, clean=False)
    # 2. A torn (corrupt) manifest is skipped like a missing one.
    Path(uri, manifest_path(manifest.snapshot_id)).write_text('{"format": "multilane.snap')
    sm2 = managers("torn", snapshot_uri=uri)
    sm2.open_partition(topic_name, 0, 2400, None)
    assert state_of(sm2, topic_name) == reference(ops, lambda s: True)
    assert snapshot_outcomes(topic_name)["none"] == before["none"] + 2


@pytest.mark.parametrize("corrupt", [False, True])
def test_learner_starts_from_snapshot_and_promotes(
    broker: EmbeddedBroker,
    topic_name: str,
    group: str,
    managers: Callable[..., StateManager],
    history: tuple[Ops, SnapshotManifest, str],
    corrupt: bool,
) -> None:
    """The learner loads the snapshot in its thread and tails from its offset; with a corrupt data
    file it learns from the changelog start instead, to the same state."""
    ops, manifest, uri = history
    if corrupt:
        shard = Path(uri) / manifest.partitions[0].files[0].path
        shard.write_bytes(shard.read_bytes()[:-1] + b"\x00")
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic_name, 0, 2300)], asynchronous=False)
    finally:
        c.close()
    learner = managers("learner", snapshot_uri=uri)
    learner.learn(topic_name, 0)
    deadline = time.monotonic() + 60
    while not learner.learner_caught_up(topic_name, 0):
        assert time.monotonic() < deadline, f"learner did not catch up: {learner.learner_status()}"
        time.sleep(0.05)
    [st] = learner.learner_status()
    assert isinstance(st["records_read"], int)
    if corrupt:
        assert st["snapshot_id"] is None and st["records_read"] > manifest.partitions[0].changelog_end
    else:
        assert st["snapshot_id"] == manifest.snapshot_id
        assert st["snapshot_rows_loaded"] == manifest.partitions[0].rows
        # Only the tail was read: fewer records than the changes after the bound, plus deletes.
        assert 0 < st["records_read"] < 2 * (2400 - 1200)
    # Held back: the changes of records 2300.. (not committed yet).
    assert state_of(learner, topic_name) == reference(ops, lambda s: s < 2300)
    assert st["buffered"] == sum(1 for s, _, _ in ops if s >= 2300)
    learner.open_partition(topic_name, 0, 2400, None)  # promotion with everything committed
    assert state_of(learner, topic_name) == reference(ops, lambda s: True)


def test_snapshot_offset_beyond_the_changelog_falls_back(
    topic_name: str, managers: Callable[..., StateManager], history: tuple[Ops, SnapshotManifest, str]
) -> None:
    """A snapshot of an older incarnation of the changelog (topic deleted and recreated): its
    ``changelog_offset`` is past the end. The restore must not wait or trust it: wipe, full replay."""
    import dataclasses

    from multilane.snapshots.manifest import ManifestCodec

    ops, manifest, uri = history
    entry = manifest.partitions[0]
    far = entry.changelog_end + 1_000_000
    forged = dataclasses.replace(
        manifest, partitions=(dataclasses.replace(entry, changelog_offset=far, changelog_end=far),)
    )
    Path(uri, manifest_path(manifest.snapshot_id)).write_bytes(ManifestCodec.encode(forged))
    before = snapshot_outcomes(topic_name)
    sm = managers("recreated", snapshot_uri=uri)
    t0 = time.monotonic()
    sm.open_partition(topic_name, 0, 2400, None)
    assert time.monotonic() - t0 < 30
    assert state_of(sm, topic_name) == reference(ops, lambda s: True)
    [st] = sm.learner_status()
    assert st["snapshot_id"] is None and st["snapshot_rows_loaded"] == 0
    after = snapshot_outcomes(topic_name)
    assert after["loaded"] == before["loaded"] and after["failed"] == before["failed"] + 1
