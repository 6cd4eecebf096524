"""Exactly-once outputs (``--outputs exactly-once``): a record's outputs are held until its processor
returns and go out in its input partition's transaction, with the committed offset and the progress
record. Does I/O (one transactional confluent-kafka producer per owned input partition).

Per input partition (``docs/outputs.md``, "Exactly-once"), numbered as in the code:

1. Open (:meth:`TransactionalOutputs.open`, when the worker takes the partition, before it reads the
   committed offset): a producer with ``transactional.id = multilane.<group>.<topic>.<partition>``,
   ``init_transactions`` (fences the previous owner and aborts what it left open), then
   ``begin_transaction``. The partition's *epoch* rises: holds of attempts started under an earlier
   epoch are dropped.
2. Hold (:meth:`TransactionalOutputs.hold`, any thread, as a processor returns): the record joins the
   partition's open transaction, and the attempt's outputs (none, or the record's dead letter) replace
   whatever the record held before. A failed attempt holds nothing (its retry holds its own). A
   transaction with ``max_records`` records makes the next commit due at once.
3. Commit (:meth:`TransactionalOutputs.take` on the loop, then :meth:`TransactionalOutputs.commit` on an
   I/O thread, one commit of a partition at a time and in the order taken, see ``turn``): with state,
   the changelog records of those records (held by the state, taken with the outputs; in apply
   order, to the changelog partition of the input partition), the held
   outputs of every record the offset tracker counts complete, the progress record (base ``C``),
   ``send_offsets_to_transaction`` of ``C``, ``commit_transaction``, ``begin_transaction``. Any failure
   aborts: :class:`TransactionAbortedError` (the caller reopens the partition: its records after ``C`` run
   again) or :class:`TransactionFencedError` (another worker opened the partition's id: drop it, never
   reopen it, else it would fence the rightful owner back).
4. Close (:meth:`TransactionalOutputs.close`, after a release's final commit or without one): the
   producer goes (an open transaction with nothing sent is dropped with it); held outputs are dropped.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from multilane.api import Context, Processor, Record, is_async_processor, needs_state, processor_needs_state

__all__ = [
    "HeldOutputs",
    "Output",
    "PartitionTransaction",
    "ProgressTarget",
    "TransactionAbortedError",
    "TransactionFencedError",
    "TransactionalOutputs",
    "TransactionsUnavailableError",
    "check_transactions",
    "transactional_id",
    "transactional_producer_config",
    "with_transactional_outputs",
]

log = logging.getLogger(__name__)

Output = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]  # topic, value, key, headers
# a state change held for the transaction: source offset, changelog topic, partition, key, value
# (multilane.worker.state.partition.HeldChange)
Change = tuple[int, str, int, bytes, bytes | None]
TopicPartitionId = tuple[str, int]


class TransactionsUnavailableError(RuntimeError):
    """The broker does not run Kafka transactions (one line, for the worker's refusal to start)."""


class TransactionAbortedError(Exception):
    """A partition's transaction failed and was aborted: its records after the committed offset run
    again (the caller reopens the partition)."""


class TransactionFencedError(TransactionAbortedError):
    """Another worker opened the partition's transactional id: this worker no longer owns it."""


def transactional_id(group: str, topic: str, partition: int) -> str:
    """The one transactional id of an input partition within a consumer group."""
    return f"multilane.{group}.{topic}.{partition}"


def transactional_producer_config(bootstrap: str, client_id: str, tid: str, linger_ms: float = 5.0,
                                  security: Mapping[str, str] | None = None,
                                  extra: Mapping[str, str] | None = None,
                                  transaction_timeout_ms: int = 60_000) -> dict[str, Any]:
    """Settings of one partition's transactional producer (pure): idempotent, ``acks=all``, the worker's
    security settings, then ``extra`` (``--output-config``). The linger may be longer than the
    at-least-once producer's: outputs go out at the commit, which flushes."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "transactional.id": tid,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": linger_ms,
        "transaction.timeout.ms": transaction_timeout_ms,
    }
    conf.update(security or {})
    conf.update(extra or {})
    return conf


def check_transactions(conf: Mapping[str, Any], timeout_s: float = 15.0) -> None:
    """Blocking: ``init_transactions`` with a probe id; :class:`TransactionsUnavailableError` (one line)
    when the broker does not answer it (no transaction coordinator, too old, or refused)."""
    producer = Producer(dict(conf))
    broken = True
    try:
        producer.init_transactions(timeout_s)
        broken = False
    except KafkaException as exc:
        raise TransactionsUnavailableError(
            "--outputs exactly-once needs Kafka transactions, and the broker at "
            f"{conf.get('bootstrap.servers')} did not initialise one ({_text(exc)})") from None
    finally:
        _close(producer, broken=broken)


def _close(producer: Any, broken: bool = False) -> None:
    """Close without waiting for unsent outputs: a transaction not committed is dropped anyway.
    ``broken`` (fenced, or an abort failed): purge and let the client go without ``close()``, which
    aborts and flushes first and can hang on a fenced producer (seen with librdkafka 2.16 after a
    ``send_offsets_to_transaction`` failed with ``_FENCED``); dropping the last reference destroys it."""
    close = getattr(producer, "close", None)
    try:
        purge = getattr(producer, "purge", None)
        if purge is not None:
            purge(True, True, False)
            producer.poll(0)
        if close is not None and not broken:
            close()
    except Exception as exc:  # closing after a lost broker
        log.debug("transactional producer close: %s", exc)


class HeldOutputs:
    """The outputs of one attempt (an :class:`~multilane.api.OutputSink`), held in memory until the
    processor returns. Invariant: written by the processor's thread only."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[Output] = []

    def produce(self, topic: str, value: bytes | None, key: bytes | None,
                headers: list[tuple[str, bytes]]) -> None:
        self.items.append((topic, value, key, headers))


@dataclass(frozen=True, slots=True)
class ProgressTarget:
    """Where a partition's progress record goes: the progress topic, its partition, the record's key."""

    topic: str
    partition: int
    key: bytes


class PartitionTransaction:
    """One input partition's transactional producer (blocking calls, on I/O threads).

    Invariants: ``turn`` is held from the loop's :meth:`TransactionalOutputs.take` until the end of the
    commit that follows (so commits of a partition run one at a time, in the order taken);
    ``committed`` is the offset of the last committed transaction (None before one); ``fenced`` never
    goes back to False.
    """

    def __init__(self, producer: Any, tid: str, timeout_s: float) -> None:
        self.producer = producer
        self.tid = tid
        self.timeout_s = timeout_s
        self.turn = threading.Lock()
        self.committed: int | None = None
        self.fenced = False
        # a transaction failed: no further transaction of this producer (the partition is reopened with a
        # new one; its records after the committed offset run again)
        self.broken = False
        self._errors: list[Any] = []
        self._changelog_end: int | None = None

    # 1.
    def open(self) -> None:
        try:
            self.producer.init_transactions(self.timeout_s)
            self.producer.begin_transaction()
        except KafkaException as exc:
            raise TransactionAbortedError(f"{self.tid}: cannot open a transaction: {_text(exc)}") from None

    # 3.
    def commit(self, outputs: list[Output], progress: tuple[ProgressTarget, bytes] | None,
               offsets: list[Any], group_metadata: Any,
               changes: Sequence[Change] = ()) -> int | None:
        """Send ``changes`` (changelog records, in order), ``outputs`` and ``progress``, add ``offsets``,
        commit, begin the next transaction. Returns one past the highest changelog offset written
        (None without changes). Raises :class:`TransactionFencedError` or
        :class:`TransactionAbortedError` (after aborting)."""
        p = self.producer
        self._errors = []
        self._changelog_end = None
        try:
            for _src, cl_topic, cl_partition, cl_key, cl_value in changes:
                self._produce(cl_topic, cl_value, cl_key, None, cl_partition, self._changelog_delivered)
            for topic, value, key, headers in outputs:
                self._produce(topic, value, key, headers or None, None)
            if progress is not None:
                target, encoded = progress
                self._produce(target.topic, encoded, target.key, None, target.partition)
            if offsets:
                p.send_offsets_to_transaction(offsets, group_metadata, self.timeout_s)
            p.commit_transaction(self.timeout_s)
        except (KafkaException, BufferError) as exc:
            self._abort(exc)
        if self._errors:  # a delivery error the commit did not raise (it should have): not committed?
            raise TransactionAbortedError(f"{self.tid}: an output was not delivered: {self._errors[0]}")
        end = self._changelog_end
        try:
            p.begin_transaction()
        except KafkaException as exc:
            self._abort(exc)
        return end

    def _produce(self, topic: str, value: bytes | None, key: bytes | None, headers: Any,
                 partition: int | None, on_delivery: Callable[[Any, Any], None] | None = None) -> None:
        kwargs: dict[str, Any] = {"on_delivery": on_delivery or self._delivered}
        if headers:
            kwargs["headers"] = headers
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self.producer.produce(topic, value, key, **kwargs)
                return
            except BufferError:
                self.producer.poll(0.05)  # the local queue is full: serve reports, then again

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._errors.append(err)

    def _changelog_delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(err)
            return
        end = msg.offset() + 1
        if self._changelog_end is None or end > self._changelog_end:
            self._changelog_end = end

    def _abort(self, exc: BaseException) -> None:
        err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        if isinstance(err, KafkaError) and (err.fatal() or err.code() in _FENCED_CODES):
            self.fenced = True
            raise TransactionFencedError(f"{self.tid}: fenced by a newer owner ({_text(exc)})") from None
        try:
            self.producer.abort_transaction(self.timeout_s)
            self.producer.begin_transaction()
        except KafkaException as abort_exc:
            aerr = abort_exc.args[0] if abort_exc.args else None
            if isinstance(aerr, KafkaError) and (aerr.fatal() or aerr.code() in _FENCED_CODES):
                self.fenced = True
                raise TransactionFencedError(
                    f"{self.tid}: fenced by a newer owner ({_text(abort_exc)})") from None
            self.broken = True
            raise TransactionAbortedError(f"{self.tid}: commit failed ({_text(exc)}) and so did the "
                                          f"abort ({_text(abort_exc)})") from None
        raise TransactionAbortedError(f"{self.tid}: aborted ({_text(exc)})") from None

    # 4.
    def close(self) -> None:
        _close(self.producer, broken=self.fenced or self.broken)


_FENCED_CODES = {getattr(KafkaError, n) for n in ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")
                 if hasattr(KafkaError, n)}


def _text(exc: BaseException) -> str:
    err = exc.args[0] if exc.args else exc
    return err.str() if isinstance(err, KafkaError) else str(exc)


class TransactionalOutputs:
    """The worker's exactly-once outputs: one :class:`PartitionTransaction` per owned input partition and
    the outputs held per record (steps 1-4 of the module docstring).

    Invariants: ``_held[tp]`` exists exactly while ``tp`` has a transaction, and maps the offset of
    every record of that transaction not yet taken by a commit to its outputs (possibly none); holds
    (from any thread) and takes (on the loop) go under ``_lock``; ``_epoch[tp]`` rises at each open.
    """

    def __init__(self, new_producer: Callable[[str, int, str], Any], group: str, max_records: int = 10_000,
                 timeout_s: float = 30.0) -> None:
        """``new_producer(topic, partition, transactional_id)``: a producer (or a double) for one
        partition. ``max_records``: records in a partition's open transaction (processed, with or
        without outputs, not yet committed) that make the next commit due at once (``on_full`` is
        called, from the holding thread)."""
        self._new_producer = new_producer
        self.group = group
        self.max_records = max(1, max_records)
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._txns: dict[TopicPartitionId, PartitionTransaction] = {}
        self._held: dict[TopicPartitionId, dict[int, list[Output]]] = {}
        self._epoch: dict[TopicPartitionId, int] = {}
        self._fenced: set[TopicPartitionId] = set()
        self.on_full: Callable[[], None] = lambda: None
        self.committed_transactions = 0
        self.aborted_transactions = 0

    @classmethod
    def from_config(cls, conf: Mapping[str, Any], group: str, **kwargs: Any) -> TransactionalOutputs:
        """Producers built from ``conf`` (the settings of :func:`transactional_producer_config` but the
        id), each with its partition's transactional id and client id."""
        base = dict(conf)

        def new_producer(topic: str, partition: int, tid: str) -> Any:
            return Producer({**base, "transactional.id": tid,
                             "client.id": f"{base.get('client.id', 'multilane')}-{topic}-{partition}"})

        return cls(new_producer, group, **kwargs)

    # 1.
    def open(self, tp: TopicPartitionId) -> None:
        """Blocking: a fresh transaction for ``tp`` (fences its previous owner). Raises
        :class:`TransactionAbortedError` when the broker refuses."""
        self.close(tp)
        txn = PartitionTransaction(self._new_producer(tp[0], tp[1], transactional_id(self.group, *tp)),
                                   transactional_id(self.group, *tp), self.timeout_s)
        try:
            txn.open()
        except BaseException:
            txn.close()
            raise
        with self._lock:
            self._txns[tp] = txn
            self._held[tp] = {}
            self._epoch[tp] = self._epoch.get(tp, 0) + 1
            self._fenced.discard(tp)

    def epoch(self, topic: str, partition: int) -> int:
        """The partition's current epoch (an attempt passes it back to :meth:`hold`)."""
        return self._epoch.get((topic, partition), 0)

    # 2.
    def hold(self, topic: str, partition: int, offset: int, outputs: list[Output],
             epoch: int | None = None) -> None:
        """Any thread: the record at ``offset`` is in the partition's open transaction, with ``outputs``
        (possibly none) replacing what it held. Dropped when the partition has no transaction, or
        ``epoch`` is not its current one (an attempt of an earlier ownership that outlived its
        release)."""
        tp = (topic, partition)
        full = False
        with self._lock:
            held = self._held.get(tp)
            if held is None or (epoch is not None and epoch != self._epoch.get(tp)):
                return
            held[offset] = outputs
            full = len(held) >= self.max_records
        if full:
            self.on_full()

    def held(self, tp: TopicPartitionId) -> int:
        """Records in ``tp``'s open transaction now (processed, not yet taken by a commit)."""
        with self._lock:
            return len(self._held.get(tp, ()))

    # 3.
    def transaction(self, tp: TopicPartitionId) -> PartitionTransaction | None:
        return self._txns.get(tp)

    def take(self, tp: TopicPartitionId, is_complete: Callable[[int], bool]) -> list[Output]:
        """On the loop, holding the partition's ``turn``: remove the records ``is_complete`` says are
        complete and return their held outputs (in offset order)."""
        with self._lock:
            held = self._held.get(tp)
            if not held:
                return []
            done = sorted(o for o in held if is_complete(o))
            return [out for o in done for out in held.pop(o)]

    def commit(self, txn: PartitionTransaction, outputs: list[Output],
               progress: tuple[ProgressTarget, bytes] | None, topic: str, partition: int, offset: int,
               group_metadata: Any, changes: Sequence[Change] = ()) -> int | None:
        """Blocking (I/O thread), with ``txn.turn`` held by the caller (released here): one
        transaction of the partition, with the state's ``changes`` (changelog records). Returns one
        past the highest changelog offset written (None without changes). Raises
        :class:`TransactionAbortedError` or :class:`TransactionFencedError`."""
        try:
            end = txn.commit(outputs, progress, [TopicPartition(topic, partition, offset)], group_metadata,
                             changes)
            txn.committed = offset
            self.committed_transactions += 1
            return end
        except TransactionFencedError:
            with self._lock:
                self._fenced.add((topic, partition))
            self.aborted_transactions += 1
            raise
        except BaseException:
            # the records whose outputs this transaction carried count complete in the tracker: no later
            # transaction of this producer may commit an offset past them; the partition is reopened
            txn.broken = True
            self.aborted_transactions += 1
            raise
        finally:
            txn.turn.release()

    def fenced(self, tp: TopicPartitionId) -> bool:
        """True when another worker opened ``tp``'s transactional id after this one did."""
        return tp in self._fenced

    # 4.
    def close(self, tp: TopicPartitionId) -> None:
        """Blocking: drop ``tp``'s transaction (its producer closes) and what it held."""
        with self._lock:
            txn = self._txns.pop(tp, None)
            self._held.pop(tp, None)
        if txn is not None:
            got = txn.turn.acquire(timeout=txn.timeout_s)  # a commit in progress finishes first
            try:
                txn.close()
            finally:
                if got:
                    txn.turn.release()

    def close_all(self) -> None:
        for tp in list(self._txns):
            self.close(tp)


def with_transactional_outputs(processor: Processor, txns: TransactionalOutputs) -> Processor:
    """``processor`` with ``ctx.produce`` holding its outputs (step 2 of the module docstring): when the
    processor returns, the attempt's outputs replace what its record held; a processor that raises
    holds nothing. Keeps the processor's kind (sync or async) and its ``@needs_state`` mark."""
    wrapped: Callable[..., Any]
    hold = txns.hold
    epoch_of = txns.epoch
    if is_async_processor(processor):
        async_proc: Any = processor

        async def run_held_async(record: Record, ctx: Context) -> None:
            sink = HeldOutputs()
            ctx.outputs = sink
            epoch = epoch_of(record.topic, record.partition)
            await async_proc(record, ctx)
            hold(record.topic, record.partition, record.offset, sink.items, epoch)

        wrapped = run_held_async
    else:
        sync_proc: Any = processor

        def run_held(record: Record, ctx: Context) -> None:
            sink = HeldOutputs()
            ctx.outputs = sink
            epoch = epoch_of(record.topic, record.partition)
            sync_proc(record, ctx)
            hold(record.topic, record.partition, record.offset, sink.items, epoch)

        wrapped = run_held
    functools.update_wrapper(wrapped, processor)
    if processor_needs_state(processor):
        needs_state(wrapped)
    return wrapped
