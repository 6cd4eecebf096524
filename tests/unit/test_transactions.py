"""Exactly-once outputs without a broker: what a partition's transaction carries (the held outputs of the
records counted complete, in offset order, the progress record, the committed offset), what an abort
and a fence do, how holds are replaced and dropped, and dead letters as outputs of the transaction."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from multilane.api import Context, OrderingMode, Record
from multilane.formats.progress import ProgressCodec, ProgressRecord
from multilane.worker.commits import CommitCycle
from multilane.worker.retry import DeadLetterPublisher
from multilane.worker.transactions import (
    TransactionalOutputs,
    transactional_id,
    with_transactional_outputs,
)

TP = ("orders", 3)


@dataclass
class TxnProducer:
    """A transactional producer double: records every call; ``fail_commit`` raises once at commit."""

    tid: str
    calls: list[str] = field(default_factory=list)
    produced: list[tuple[str, Any, Any, dict[str, Any]]] = field(default_factory=list)
    offsets: list[Any] = field(default_factory=list)
    fail_commit: KafkaError | None = None
    closed: bool = False

    def init_transactions(self, _timeout: float) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, topic: str, value: Any, key: Any, **kw: Any) -> None:
        self.produced.append((topic, value, key, kw))

    def poll(self, _timeout: float) -> int:
        return 0

    def send_offsets_to_transaction(self, offsets: list[Any], meta: Any, _timeout: float) -> None:
        assert meta == "group-metadata"
        self.offsets.append([(o.topic, o.partition, o.offset) for o in offsets])
        self.calls.append("offsets")

    def commit_transaction(self, _timeout: float) -> None:
        if self.fail_commit is not None:
            err, self.fail_commit = self.fail_commit, None
            raise KafkaException(err)
        self.calls.append("commit")

    def abort_transaction(self, _timeout: float) -> None:
        self.calls.append("abort")

    def close(self) -> None:
        self.closed = True


@dataclass
class Tracker:
    prefix: int
    done_above: set[int] = field(default_factory=set)

    def committable(self) -> int:
        return self.prefix

    def is_complete(self, offset: int) -> bool:
        return offset < self.prefix or offset in self.done_above


@dataclass(eq=False)
class Part:
    topic: str
    partition: int
    tracker: Tracker
    mode: OrderingMode = OrderingMode.UNORDERED
    commit_sent: int | None = None
    last_progress: bytes | None = None
    committed: int | None = None

    def flush(self) -> None:
        pass

    def progress(self, base: int) -> ProgressRecord:
        done = tuple((o, o + 1) for o in sorted(self.tracker.done_above))
        return ProgressRecord("g", self.topic, self.partition, base, "w", OrderingMode.UNORDERED,
                              done_offsets=done)


class Consumer:
    def consumer_group_metadata(self) -> str:
        return "group-metadata"

    def commit(self, **_kw: Any) -> None:
        raise AssertionError("exactly-once never commits through the consumer")


class Store:
    topic = "multilane-progress.g"

    def partition_index(self, partition: int) -> int:
        return partition % 2


def _txns(max_records: int = 100) -> tuple[TransactionalOutputs, dict[str, TxnProducer]]:
    made: dict[str, TxnProducer] = {}

    def new_producer(_topic: str, _partition: int, tid: str) -> TxnProducer:
        made[tid] = TxnProducer(tid)
        return made[tid]

    return TransactionalOutputs(new_producer, "g", max_records=max_records), made


def _opened() -> tuple[TransactionalOutputs, TxnProducer]:
    """Transactional outputs with ``TP``'s transaction open, and that transaction's producer."""
    txns, made = _txns()
    txns.open(TP)
    return txns, made[transactional_id("g", *TP)]


def _out(i: int) -> list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]]:
    return [("out", f"v{i}".encode(), b"k", [])]


def test_open_fences_with_the_partition_id_and_holds_are_replaced_or_dropped() -> None:
    txns, made = _txns(max_records=2)
    full: list[int] = []
    txns.on_full = lambda: full.append(1)
    txns.hold(*TP, 5, _out(5))  # no transaction yet: dropped
    txns.open(TP)
    producer = made[transactional_id("g", *TP)]
    assert producer.tid == "multilane.g.orders.3" and producer.calls == ["init", "begin"]
    epoch = txns.epoch(*TP)
    txns.hold(*TP, 5, _out(5), epoch)
    txns.hold(*TP, 5, _out(50), epoch)  # a later attempt of the same record replaces
    txns.hold(*TP, 6, _out(6), epoch - 1)  # an attempt from an earlier ownership: dropped
    assert txns.held(TP) == 1 and not full
    txns.hold(*TP, 7, [])  # a record without outputs is in the transaction too
    assert full == [1] and txns.held(TP) == 2  # max_records records: a commit is due now
    txns.hold(*TP, 5, [])  # an attempt without outputs replaces one with outputs
    assert txns.take(TP, lambda o: o == 5) == [] and txns.held(TP) == 1
    txns.hold(*TP, 8, _out(8))
    assert txns.take(TP, lambda o: True) == _out(8) and txns.held(TP) == 0
    txns.close(TP)
    assert producer.closed and txns.held(TP) == 0


def test_a_transaction_carries_the_completed_records_outputs_progress_and_offset() -> None:
    """Held outputs of records counted complete go out in offset order, then the progress record to its
    progress partition, then the committed offset; records not complete stay held for the next one."""
    txns, producer = _opened()
    for off in (12, 10, 15, 11):
        txns.hold(*TP, off, _out(off))
    part = Part(*TP, Tracker(prefix=12, done_above={15}))  # 10, 11 below the prefix, 15 above; 12 not
    cycle = CommitCycle(Consumer(), Store(), None, transactions=txns)  # type: ignore[arg-type]
    lost = asyncio.run(cycle.run([part]))  # type: ignore[list-item]
    assert lost == []
    values = [(t, v) for t, v, _k, _kw in producer.produced]
    assert values[:3] == [("out", b"v10"), ("out", b"v11"), ("out", b"v15")]
    topic, encoded = values[3]
    _t, _v, key, kw = producer.produced[3]
    assert topic == "multilane-progress.g" and kw["partition"] == 1 and key == b"orders/3"
    rec = ProgressCodec.decode(encoded)
    assert rec.base_offset == 12 and rec.done_offsets == ((15, 16),)
    assert producer.offsets == [[("orders", 3, 12)]]
    assert producer.calls == ["init", "begin", "offsets", "commit", "begin"]
    assert part.committed == 12 and part.last_progress == encoded
    assert txns.held(TP) == 1  # offset 12: not complete, held for the next transaction
    assert txns.committed_transactions == 1
    asyncio.run(cycle.run([part]))  # nothing changed: no transaction
    assert producer.calls.count("commit") == 1


def test_an_aborted_transaction_returns_the_partition_and_its_outputs_are_gone() -> None:
    txns, producer = _opened()
    txns.hold(*TP, 0, _out(0))
    producer.fail_commit = KafkaError(KafkaError.REQUEST_TIMED_OUT, "timed out", txn_requires_abort=True)
    part = Part(*TP, Tracker(prefix=1))
    cycle = CommitCycle(Consumer(), Store(), None, transactions=txns)  # type: ignore[arg-type]
    lost = asyncio.run(cycle.run([part]))  # type: ignore[list-item]
    assert lost == [part] and part.committed is None and part.commit_sent is None
    assert producer.calls[-2:] == ["abort", "begin"] and txns.aborted_transactions == 1
    assert not txns.fenced(TP) and txns.held(TP) == 0  # the caller reopens: the record runs again
    # until the reopen replaced the transaction, no later cycle commits past the aborted records
    txns.hold(*TP, 1, _out(1))
    part.tracker.prefix = 2
    assert asyncio.run(cycle.run([part])) == []  # type: ignore[list-item]
    assert producer.offsets == [[("orders", 3, 1)]] and part.committed is None


def test_a_fenced_partition_is_lost_for_good() -> None:
    txns, producer = _opened()
    producer.fail_commit = KafkaError(KafkaError._FENCED, "fenced", fatal=True)
    part = Part(*TP, Tracker(prefix=1))
    cycle = CommitCycle(Consumer(), Store(), None, transactions=txns)  # type: ignore[arg-type]
    assert asyncio.run(cycle.run([part])) == [part]  # type: ignore[list-item]
    assert txns.fenced(TP) and "abort" not in producer.calls
    part.tracker.prefix = 2
    assert asyncio.run(cycle.run([part])) == []  # type: ignore[list-item]  # never tried again
    assert producer.calls.count("offsets") == 1


def test_the_blocking_driver_commits_the_same_transaction() -> None:
    txns, producer = _opened()
    txns.hold(*TP, 0, _out(0))
    part = Part(*TP, Tracker(prefix=1))
    cycle = CommitCycle(Consumer(), Store(), None, transactions=txns)  # type: ignore[arg-type]
    assert cycle.run_blocking([part], producer=None) == []  # type: ignore[list-item]
    assert producer.offsets == [[("orders", 3, 1)]] and part.committed == 1
    assert next(v for _t, v, _k, _kw in producer.produced) == b"v0"


def test_a_dead_letter_is_an_output_of_the_transaction() -> None:
    held: list[tuple[Any, ...]] = []
    done: list[int] = []

    class NoProducer:
        def produce(self, *_a: Any, **_kw: Any) -> None:
            raise AssertionError("exactly-once: a dead letter is not produced outside the transaction")

    dlq = DeadLetterPublisher(NoProducer(), lambda t: f"{t}.dlq", hold=lambda *a: held.append(a))
    dlq.publish(Record("orders", 3, 17, b"k", b"bad", []), ValueError("x"), 3, lambda: done.append(1))
    assert done == [1] and dlq.pending == 0
    ((topic, partition, offset, outputs),) = held
    assert (topic, partition, offset) == (*TP, 17)
    ((out_topic, value, key, headers),) = outputs
    assert (out_topic, value, key) == ("orders.dlq", b"bad", b"k") and dict(headers)["multilane.error.reason"]


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_the_wrapper_holds_a_returning_attempts_outputs_only(sync: bool) -> None:
    txns, _made = _txns()
    txns.open(TP)
    fail = [True]

    def body(record: Record, ctx: Context) -> None:
        ctx.produce("out", b"a", key=record.key)
        if fail[0]:
            fail[0] = False
            raise RuntimeError("first attempt fails after producing")

    if sync:
        proc: Any = body
    else:
        async def proc(record: Record, ctx: Context) -> None:
            body(record, ctx)

    wrapped = with_transactional_outputs(proc, txns)
    record = Record("orders", 3, 4, b"k", b"v", [])

    def attempt() -> None:
        out = wrapped(record, Context("orders", 3, 4, b"k", [], 0, 1))
        if not sync:
            asyncio.run(out)

    with pytest.raises(RuntimeError):
        attempt()
    assert txns.held(TP) == 0
    attempt()
    assert txns.take(TP, lambda o: True) == [("out", b"a", b"k", [])]


def _parse(argv: list[str], app: Any = None) -> Any:
    import argparse

    from multilane.worker.cli import add_arguments, parse_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parse_args(parser, ["--bootstrap-servers", "127.0.0.1:1", "--group", "g", "--topic", "t", *argv],
                      app=app, environ={})


def test_the_setting_and_what_it_refuses() -> None:
    """``--outputs exactly-once`` (or the App's ``outputs="exactly-once"``) parses, with or
    without a state directory; with fewer than one record per transaction the worker refuses with one
    line."""
    import multilane
    from multilane.worker.cli import ConfigError, check_exactly_once_args

    app = multilane.App(name="copy", outputs="exactly-once")
    assert _parse([], app).outputs == "exactly-once"
    check_exactly_once_args(_parse(["--outputs", "exactly-once"]))
    check_exactly_once_args(_parse(["--outputs", "exactly-once", "--state-dir", "/tmp/x"]))  # state: fine
    with pytest.raises(ConfigError, match="at least 1") as exc:
        check_exactly_once_args(_parse(["--outputs", "exactly-once", "--transaction-max-records", "0"]))
    assert "\n" not in str(exc.value)
    check_exactly_once_args(_parse(["--state-dir", "/tmp/x"]))  # at-least-once: state is fine


def test_a_broker_without_transactions_is_refused_in_one_line() -> None:
    """Nothing that answers ``init_transactions`` (here: no broker at all) -> one line naming the need."""
    from multilane.testing.broker import free_port
    from multilane.worker.transactions import (
        TransactionsUnavailableError,
        check_transactions,
        transactional_producer_config,
    )

    conf = transactional_producer_config(f"127.0.0.1:{free_port()}", "probe", "multilane.g.probe.w")
    conf["log_level"] = 0
    with pytest.raises(TransactionsUnavailableError) as exc:
        check_transactions(conf, timeout_s=1.0)
    text = str(exc.value)
    assert "\n" not in text and text.startswith("--outputs exactly-once needs Kafka transactions")
