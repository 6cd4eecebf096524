"""Exactly-once outputs with state, without a broker: a transactional partition holds its changelog
records (in apply order) instead of producing them; a partition's transaction carries the held changes
of exactly the records it counts complete, to the changelog partition of the input partition, before
the outputs; the commit reports the changelog end and the committed offset back to the state; a store
that still holds changes closes uncleanly; exactly-once refuses state hooks that are not
transactional; and restores read committed changelog records only, whatever the overrides say."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from multilane.formats.changelog import ChangelogCodec
from multilane.worker.commits import CommitCycle
from multilane.worker.state.apply import ApplyFilter
from multilane.worker.state.checkpoint import CheckpointStore
from multilane.worker.state.manager import StateManager
from multilane.worker.state.partition import ActivePartitionState, HeldChange
from multilane.worker.state.reader import reader_consumer_config
from multilane.worker.state.store import PartitionStore, partition_dir
from multilane.worker.transactions import TransactionalOutputs, transactional_id
from tests.unit.test_transactions import TP, Consumer, Part, Store, Tracker, TxnProducer

CHANGELOG = "g.orders.changelog"


@dataclass
class Msg:
    _offset: int

    def offset(self) -> int:
        return self._offset


@dataclass
class DeliveringProducer(TxnProducer):
    """A transactional producer double that acknowledges each record at the next offset of its topic
    partition when the transaction commits (as librdkafka serves delivery reports in the commit)."""

    next_offset: dict[tuple[str, int], int] = field(default_factory=dict)
    pending: list[tuple[Any, int]] = field(default_factory=list)

    def produce(self, topic: str, value: Any, key: Any, **kw: Any) -> None:
        super().produce(topic, value, key, **kw)
        tp = (topic, kw.get("partition", -1))
        off = self.next_offset.get(tp, 100)
        self.next_offset[tp] = off + 1
        self.pending.append((kw["on_delivery"], off))

    def commit_transaction(self, timeout: float) -> None:
        for cb, off in self.pending:
            cb(None, Msg(off))
        self.pending.clear()
        super().commit_transaction(timeout)


class Hooks:
    """The transactional part of the state hooks over one real :class:`ActivePartitionState`."""

    transactional = True

    def __init__(self, part: ActivePartitionState) -> None:
        self.part = part
        self.committed: list[tuple[int, int | None]] = []

    def take_changes(self, topic: str, partition: int, is_complete: Any) -> list[HeldChange]:
        assert (topic, partition) == TP
        return self.part.take_changes(is_complete)

    def changes_committed(self, topic: str, partition: int, offset: int, end: int | None) -> None:
        self.committed.append((offset, end))
        self.part.changes_committed(offset, end)


@pytest.fixture
def part(tmp_path: Path) -> Any:
    store = PartitionStore(partition_dir(tmp_path, *TP)).open()
    # no shared changelog producer: a transactional partition has nothing to produce outside its transaction
    yield ActivePartitionState(*TP, CHANGELOG, store, None, 10, set(), 40)
    store.close()


def test_a_transactional_partition_holds_its_changes_in_apply_order(part: ActivePartitionState) -> None:
    part.put(b"a", b"1", 12, 7)
    part.delete(b"b", 11, 8)
    part.put(b"a", b"2", 13, 7)
    assert part.get(b"a") == b"2" and part.holds_changes()  # applied locally at once
    taken = part.take_changes(lambda o: o in (11, 13))
    assert [(c[0], c[1], c[2], c[3]) for c in taken] == [
        (11, CHANGELOG, 3, b"b"), (11, CHANGELOG, 3, b"b"), (13, CHANGELOG, 3, b"a")]
    assert taken[0][4] == ChangelogCodec.encode_delete(11, 8) and taken[1][4] is None  # D, then tombstone
    assert part.holds_changes()  # offset 12 is not complete: still held
    part.changes_committed(12, 57)
    assert part.changelog_end() == 57 and part.committed_offset == 12
    assert part.snapshot_sources() == (12, ((12, 7), (13, 7)))
    assert [c[0] for c in part.take_changes(lambda o: True)] == [12] and not part.holds_changes()


def test_the_transaction_carries_the_completed_records_changes_first(part: ActivePartitionState) -> None:
    made: dict[str, DeliveringProducer] = {}

    def new_producer(_topic: str, _partition: int, tid: str) -> DeliveringProducer:
        made[tid] = DeliveringProducer(tid)
        return made[tid]

    txns = TransactionalOutputs(new_producer, "g")
    txns.open(TP)
    producer = made[transactional_id("g", *TP)]
    for off in (10, 11, 12):
        part.put(b"count", str(off).encode(), off, 5)
        txns.hold(*TP, off, [("out", f"v{off}".encode(), b"k", [])])
    hooks = Hooks(part)
    cycle = CommitCycle(Consumer(), Store(), hooks, transactions=txns)  # type: ignore[arg-type]
    rt = Part(*TP, Tracker(prefix=11, done_above={12}))  # 10 and 12 complete, 11 not
    assert asyncio.run(cycle.run([rt])) == []  # type: ignore[list-item]
    sent = [(t, kw.get("partition"), v) for t, v, _k, kw in producer.produced]
    assert sent[:2] == [(CHANGELOG, 3, ChangelogCodec.encode_put(b"10", 10, 5)),
                        (CHANGELOG, 3, ChangelogCodec.encode_put(b"12", 12, 5))]
    assert [v for t, _p, v in sent[2:4]] == [b"v10", b"v12"] and sent[4][0] == "multilane-progress.g"
    assert producer.calls[-3:] == ["offsets", "commit", "begin"]
    assert hooks.committed == [(11, 102)]  # changelog offsets 100, 101 were written
    assert part.changelog_end() == 102 and part.committed_offset == 11
    assert part.holds_changes()  # the change of offset 11 waits for its record
    # an aborted transaction loses the changes it took: the partition is reopened (wiped, restored)
    rt.tracker.prefix, rt.tracker.done_above = 13, set()
    producer.fail_commit = KafkaError(KafkaError.REQUEST_TIMED_OUT, "timed out", txn_requires_abort=True)
    assert asyncio.run(cycle.run([rt])) == [rt]  # type: ignore[list-item]
    assert hooks.committed == [(11, 102)] and not part.holds_changes()


def test_exactly_once_refuses_state_hooks_that_are_not_transactional(part: ActivePartitionState) -> None:
    txns = TransactionalOutputs(lambda _t, _p, tid: TxnProducer(tid), "g")

    class Plain:
        def open_partition(self, *_a: Any, **_k: Any) -> None: ...

    with pytest.raises(ValueError, match="transactional state hooks"):
        CommitCycle(Consumer(), Store(), Plain(), transactions=txns)  # type: ignore[arg-type]
    hooks = Hooks(part)
    hooks.transactional = False
    with pytest.raises(ValueError, match="transactional state hooks"):
        CommitCycle(Consumer(), Store(), hooks, transactions=txns)  # type: ignore[arg-type]


def test_restores_and_learners_read_committed_only() -> None:
    conf = reader_consumer_config("b:9092", "g.orders.changelog", {"isolation.level": "read_uncommitted",
                                                                   "fetch.wait.max.ms": 5})
    assert conf["isolation.level"] == "read_committed" and conf["fetch.wait.max.ms"] == 5


@pytest.mark.parametrize("held", [True, False])
def test_a_close_with_changes_not_committed_is_unclean(tmp_path: Path, held: bool,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The local store is ahead of the committed changelog: no checkpoint, so the next open wipes it
    and restores from the committed changelog. Without held changes a clean close keeps its checkpoint.
    A transactional manager creates no shared changelog producer (nothing would go through it)."""
    from multilane.testing.broker import free_port
    from multilane.worker.state import manager as manager_module

    def no_writer(*_a: Any, **_k: Any) -> None:
        raise AssertionError("a transactional state manager created the shared changelog producer")

    monkeypatch.setattr(manager_module, "ChangelogWriter", no_writer)
    manager = StateManager(tmp_path, f"127.0.0.1:{free_port()}", "g", transactional=True)
    try:
        directory = partition_dir(tmp_path, *TP)
        store = PartitionStore(directory).open()
        manager._activate(TP, store, ApplyFilter(10, None), 40, set())
        active = manager._active[TP]
        active.put(b"a", b"1", 10, 7)
        if not held:
            manager.take_changes(*TP, lambda o: True)
            manager.changes_committed(*TP, 11, 41)
        manager.close_partition(*TP, clean=True)
        ckpt = CheckpointStore(directory).read()
        assert (ckpt is None) == held
        if not held:
            assert ckpt is not None and (ckpt.changelog_offset, ckpt.committed_offset) == (41, 11)
    finally:
        manager.close()
