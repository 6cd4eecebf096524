"""The commit cycle and the progress cycle: state hooks, progress records, offset commits.

Does I/O (Kafka, thread pool). Every ``commit_interval_ms`` the engine runs :meth:`CommitCycle.run` over
its active partitions, and once more, synchronously, when a partition is released and on shutdown.
Offsets committed are always values of :meth:`OffsetTracker.committable` (never beyond an incomplete
record). Every ``progress_interval_ms`` (independently) it runs :meth:`ProgressCycle.run`, which writes
fresher progress records between commits, so that a crash replays only what completed since the last
progress write. Every consumer and producer call happens on the event loop's thread; blocking hook
calls run on a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from multilane.api import OrderingMode
from multilane.formats.progress import ProgressCodec, ProgressRecord
from multilane.worker.hooks import EngineHooks, PartitionStateHooks, TransactionalStateHooks
from multilane.worker.metrics import COMMIT_LATENCY_BUCKETS, LatencyHistogram
from multilane.worker.partition import PartitionRuntime
from multilane.worker.progress_store import ProgressStore
from multilane.worker.state.errors import StateDurabilityError
from multilane.worker.transactions import TransactionalOutputs
from multilane.worker.txn_commits import TransactionCommits

__all__ = ["CommitBatch", "CommitCycle", "CommitItem", "ProgressCycle", "plan_commit", "progress_for_base"]

log = logging.getLogger(__name__)


def _tp(topic: str, partition: int, offset: int, metadata: str | None) -> Any:
    if metadata is None:
        return TopicPartition(topic, partition, offset)
    return TopicPartition(topic, partition, offset, metadata=metadata)


@dataclass(frozen=True, slots=True)
class CommitItem:
    """One partition of a commit: its committable offset and the progress record for that base."""

    part: PartitionRuntime
    offset: int
    encoded: bytes | None  # the progress record (None: the mode or the engine keeps no progress)


@dataclass(frozen=True)
class CommitBatch:
    """What one commit sends: the partitions whose committable offset or progress changed."""

    items: tuple[CommitItem, ...] = ()
    largest_progress_bytes: int = 0  # size of the last progress record encoded (a metric), 0 if none

    def without(self, lost: Sequence[PartitionRuntime]) -> CommitBatch:
        return CommitBatch(tuple(i for i in self.items if i.part not in lost), self.largest_progress_bytes)


def plan_commit(parts: Sequence[PartitionRuntime], *, with_progress: bool, final: bool) -> CommitBatch:
    """Step 1 of a commit, without I/O: each partition's committable offset ``C`` and its progress
    record (base ``C``); partitions where neither changed since the last commit sent are left out
    unless ``final``. Flushes each partition's completions first (``part.flush()``)."""
    items = []
    size = 0
    for part in parts:
        part.flush()
        c = part.tracker.committable()
        if c is None:
            continue
        encoded: bytes | None = None
        if with_progress and part.mode is not OrderingMode.PARTITION:
            encoded = ProgressCodec.encode(part.progress(c))
            size = len(encoded)
        if not final and c == part.commit_sent and encoded == part.last_progress:
            continue
        items.append(CommitItem(part, c, encoded))
    return CommitBatch(tuple(items), size)


class CommitCycle:
    """Commits the committable offsets of partitions, with their progress records.

    One commit path: :func:`plan_commit` decides what to send; :meth:`run` (on the loop) and
    :meth:`run_blocking` (in rebalance callbacks, which cannot await) only send it, steps 2-4:

    2. State hooks: ``before_commit(topic, partition, C)``; a partition whose changes are not durable
       is dropped from the batch (never committed) and returned to the caller.
    3. Progress: produce each partition's records of its lower bases (committed; sent, unanswered),
       then its record of ``C``, to the progress topic, and wait for the acknowledgements.
    4. Commit the offsets (progress as metadata when it fits); mark each partition's ``commit_sent``
       and ``last_progress``.

    Invariant: a commit request for offset ``C`` of a partition is sent only after the state hooks
    flushed every change of records below ``C`` and (when progress is kept) after the progress record
    with base ``C`` was acknowledged or its write failed (then the progress is simply not used later).
    A partition whose ``before_commit`` raised :class:`StateDurabilityError` (a changelog record was
    lost) is not committed in that cycle: it is returned to the caller, which must close its state
    uncleanly and reopen it (its uncommitted records are then processed again).
    """

    def __init__(self, consumer: Any, store: ProgressStore | None, hooks: PartitionStateHooks | None,
                 progress_timeout_s: float = 10.0, transactions: TransactionalOutputs | None = None) -> None:
        self._consumer = consumer
        self._store = store
        self._hooks = hooks
        # exactly-once: each partition's commit is its transaction (multilane/worker/txn_commits.py)
        self._eos = (TransactionCommits(transactions, consumer, store, self, _transactional_state(hooks))
                     if transactions is not None else None)
        self._progress_timeout_s = progress_timeout_s
        self.last_progress_bytes = 0
        self.commit_errors = 0
        # Commit latency: from the start of the cycle that sent an offset to the broker's acknowledgement
        # of that offset (state flush + progress record + commit). ``_sent`` holds, per partition, the
        # offset awaiting its acknowledgement and the cycle's start (monotonic seconds); an
        # acknowledgement of another offset (an older request) is not measured.
        self.latency = LatencyHistogram(COMMIT_LATENCY_BUCKETS)
        self._sent: dict[tuple[str, int], tuple[int, float]] = {}
        # Set by ``Engine.fence()`` (lease lost): while True no commit request is sent, not even by a
        # cycle that was already running when it was set (checked right before each commit).
        self.fenced = False

    def plan(self, parts: Sequence[PartitionRuntime], final: bool) -> CommitBatch:
        """Step 1 (:func:`plan_commit`), keeping the size of the last progress record (a metric)."""
        return self._plan(parts, final)

    def _plan(self, parts: Sequence[PartitionRuntime], final: bool) -> CommitBatch:
        batch = plan_commit(parts, with_progress=self._store is not None, final=final)
        if batch.largest_progress_bytes:
            self.last_progress_bytes = batch.largest_progress_bytes
        return batch

    async def run(self, parts: Sequence[PartitionRuntime], *,
                  final: bool = False) -> list[PartitionRuntime]:
        """The async driver: one cycle over ``parts`` (steps 1-4 of the class docstring).
        ``final``: commit synchronously, even if unchanged. Returns the partitions left out because
        ``before_commit`` raised :class:`StateDurabilityError`."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        if self.fenced:
            return []  # no progress record and no commit while fenced
        if self._eos is not None:
            return await self._eos.run(parts, final, started)
        # 1. plan
        batch = self._plan(parts, final)
        if not batch.items:
            return []
        # 2. state hooks (on a worker thread)
        lost: list[PartitionRuntime] = []
        hooks = self._hooks
        if hooks is not None:
            for item in batch.items:
                try:
                    await loop.run_in_executor(None, hooks.before_commit, item.part.topic,
                                               item.part.partition, item.offset)
                except StateDurabilityError as exc:
                    _log_lost(item, exc)
                    lost.append(item.part)
            batch = batch.without(lost)
            if not batch.items:
                return lost
        flushed = time.monotonic()
        # 3. progress records (wait for each acknowledgement)
        store = self._store
        unwritten: list[PartitionRuntime] = []
        if store is not None:
            waits = [(i.part, fut) for i in batch.items if i.encoded is not None
                     for fut in (*_write_lower_bases(store, i), _write(store, i))]
            for part, fut in waits:
                try:
                    await asyncio.wait_for(fut, self._progress_timeout_s)
                except (KafkaException, TimeoutError) as exc:
                    unwritten.append(part)
                    log.warning("progress record for %s/%d not written (%s); committing without it",
                                part.topic, part.partition, exc)
        written = time.monotonic()
        # 4. commit
        self._commit(batch, started, synchronous=final)
        for part in unwritten:
            part.last_progress = None  # not what the progress topic holds (and written again next cycle)
        if final:  # a release's (inside a handoff's pause) or a stop's: where its time went
            log.info("final commit of %s in %.3fs (state flush %.3fs, progress %.3fs, commit %.3fs)",
                     [(i.part.topic, i.part.partition, i.offset) for i in batch.items],
                     time.monotonic() - started, flushed - started, written - flushed,
                     time.monotonic() - written)
        return lost

    def run_blocking(self, parts: Sequence[PartitionRuntime], producer: Any,
                     timeout_s: float = 10.0) -> list[PartitionRuntime]:
        """The blocking driver, for rebalance callbacks (which cannot await): always final and
        synchronous (steps 1-4 of the class docstring; the hooks are called directly, and the producer
        is flushed for the progress records: their delivery callbacks run here, on the loop thread).
        Returns the partitions left out because ``before_commit`` raised :class:`StateDurabilityError`."""
        started = time.monotonic()
        if self.fenced:
            return []
        if self._eos is not None:
            return self._eos.run_blocking(parts, started)
        # 1. plan
        batch = self._plan(parts, final=True)
        if not batch.items:
            return []
        # 2. state hooks
        lost: list[PartitionRuntime] = []
        if self._hooks is not None:
            for item in batch.items:
                try:
                    self._hooks.before_commit(item.part.topic, item.part.partition, item.offset)
                except StateDurabilityError as exc:
                    _log_lost(item, exc)
                    lost.append(item.part)
            batch = batch.without(lost)
            if not batch.items:
                return lost
        # 3. progress records (flush the producer)
        if self._store is not None:
            futs = [(i, _write(self._store, i)) for i in batch.items if i.encoded is not None]
            if futs:
                producer.flush(timeout_s)
            unwritten = [i.part for i, f in futs if not f.done() or f.exception() is not None]
            if unwritten:
                log.warning("progress record not written before revoke commit; committing without it")
        else:
            unwritten = []
        # 4. commit
        self._commit(batch, started, synchronous=True)
        for part in unwritten:
            part.last_progress = None
        return lost

    def _commit(self, batch: CommitBatch, started: float, *, synchronous: bool) -> None:
        """Step 4 (both drivers): send the offsets (never while fenced: the partitions may already
        belong to another worker); a synchronous commit's answer is applied at once and its failure
        raised, an asynchronous one's arrives in :meth:`on_commit`."""
        if self.fenced:
            log.warning("fenced: not committing %s", [(i.part.topic, i.part.partition) for i in batch.items])
            return
        offsets = []
        for item in batch.items:
            part = item.part
            meta = ProgressStore.metadata_for(item.encoded) if item.encoded is not None else None
            offsets.append(_tp(part.topic, part.partition, item.offset, meta))
            part.commit_sent = item.offset
            part.last_progress = item.encoded
            self._sent[(part.topic, part.partition)] = (item.offset, started)
        try:
            if synchronous:
                result = self._consumer.commit(offsets=offsets, asynchronous=False)
                self.on_commit(None, result or [], {(i.part.topic, i.part.partition): i.part
                                                    for i in batch.items})
            else:
                self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            self.commit_errors += 1
            for item in batch.items:
                item.part.commit_sent = None  # try again next cycle
                self._sent.pop((item.part.topic, item.part.partition), None)
            log.warning("commit failed (%s); will retry", exc)
            if synchronous:
                raise

    def on_commit(self, err: Any, tps: list[Any], parts: dict[tuple[str, int], PartitionRuntime]) -> None:
        """Record confirmed commits (the consumer's ``on_commit`` callback, on the loop thread)."""
        if err is not None:
            self.commit_errors += 1
            log.warning("offset commit failed: %s", err)
        for tp in tps:
            sent = self._sent.get((tp.topic, tp.partition))
            if sent is not None and (tp.error is not None or sent[0] == tp.offset):
                del self._sent[(tp.topic, tp.partition)]
                if tp.error is None:
                    self.latency.observe(time.monotonic() - sent[1])
            part = parts.get((tp.topic, tp.partition))
            if part is None:
                continue
            if tp.error is not None:
                part.commit_sent = None
                log.warning("commit of %s/%d failed: %s", tp.topic, tp.partition, tp.error)
            elif tp.offset >= 0 and (part.committed is None or tp.offset >= part.committed):
                part.committed = tp.offset


def _transactional_state(hooks: PartitionStateHooks | None) -> TransactionalStateHooks | None:
    """The state hooks of an exactly-once worker: they must hold their changelog records for the
    transactions (else a crash could leave state ahead of the committed outputs). Raises ValueError."""
    if hooks is None:
        return None
    if not isinstance(hooks, TransactionalStateHooks) or not hooks.transactional:
        raise ValueError("exactly-once outputs need transactional state hooks "
                         "(StateManager(..., transactional=True))")
    return hooks


def _write(store: ProgressStore, item: CommitItem) -> asyncio.Future[None]:
    """Step 3: produce the progress record of a commit item; it raises the partition's base floor
    (``PartitionRuntime.progress_floor``: the progress cycle writes no lower base after it)."""
    part = item.part
    assert item.encoded is not None
    if part.progress_floor is None or item.offset > part.progress_floor:
        part.progress_floor = item.offset
    return store.write(part.topic, part.partition, item.encoded)


def _write_lower_bases(store: ProgressStore, item: CommitItem) -> list[asyncio.Future[None]]:
    """Step 3, before the commit's own record: records of the lower bases the broker may still hold
    when the worker dies before this commit lands (the confirmed committed offset; an offset sent in
    a commit still unanswered), as fresh as the commit's own; the commit's record follows them, so
    the newest record has the highest base. Without them a kill before the commit landed left the
    reader a record of the committed offset from before the commit cycle started (issue 31)."""
    part = item.part
    bases = sorted({b for b in (part.committed, part.commit_sent) if b is not None and b < item.offset})
    return [store.write(part.topic, part.partition,
                        ProgressCodec.encode(progress_for_base(part, b, item.offset))) for b in bases]


def _log_lost(item: CommitItem, exc: StateDurabilityError) -> None:
    log.error("not committing %s/%d at %d: %s", item.part.topic, item.part.partition, item.offset, exc)


def progress_for_base(part: PartitionRuntime, base: int, committable: int) -> ProgressRecord:
    """``part``'s progress now, relative to ``base <= committable`` (call ``part.flush()`` first).

    ``base`` may lie below the committable offset (an offset committed earlier, or sent in a commit
    whose answer is still due): every record in ``[base, committable)`` is complete, so the record
    says so (key mode: every range's ``next_offset`` is at least ``committable`` already; unordered
    mode: ``[base, committable)`` joins the done intervals).
    """
    if base > committable:
        raise ValueError(f"base {base} above the committable offset {committable}")
    rec = part.progress(base)
    if rec.mode is not OrderingMode.UNORDERED or base == committable:
        return rec
    done = list(rec.done_offsets)
    if done and done[0][0] <= committable:
        done[0] = (base, done[0][1])
    else:
        done.insert(0, (base, committable))
    return ProgressRecord(rec.group, rec.topic, rec.partition, base, rec.writer, rec.mode,
                          done_offsets=tuple(done))


@dataclass
class _Written:
    """What the progress cycle last wrote for one partition."""

    encoded: dict[int, bytes] = field(default_factory=dict)  # base offset -> last encoding produced
    pending: int = 0  # records produced and not yet acknowledged (or failed)


class ProgressCycle:
    """Writes progress records between commits, so that a crash replays little completed work.

    Invariants (docs/architecture.md, "Offsets and progress"):
    - every record claims only records that are complete (and, with state hooks, whose state changes
      the hooks made durable before the record was produced), so any record is true forever;
    - its ``base_offset`` is an offset the broker may hold as committed when the worker dies: the
      confirmed committed offset and, while a commit awaits its answer, the offset sent (one record
      for each), so that the reader finds a record whose base equals whichever of the two landed;
    - a cycle's last record of a partition has the highest base written so far
      (``PartitionRuntime.progress_floor``, raised by the commit cycle's own record before it commits):
      the cycle writes the records of all its bases in ascending order, the floor's among them, so
      that the newest record has the highest base. The reader stops at a lower base (everything
      before it is older); a record of the previous committed offset written last, after the commit's
      own record, made it stop there after the commit landed, and replay every record completed above
      the committed offset (issue 31: one run in three of a kill -9 test with three kills). The
      records of the lower bases still follow, each with its higher base after it: while a commit
      awaits its progress record's acknowledgement or its answer, the committed offset keeps a fresh
      record, so a kill before the commit lands replays no more than one later (issue 31: without
      them such a kill replayed what completed since the commit cycle started, 2-79 records, about
      one run in ten under load; the commit writes those bases first too, ``_write_lower_bases``);
    - nothing is produced while fenced (``CommitCycle.fenced``), or for partitions whose mode keeps no
      progress;
    - a partition that never had a committed offset has no base for a record: its first commit is not
      left to the commit interval but sent by the first cycle that finds a committable offset (step
      0), so that a kill -9 soon after a fresh partition's first records replays no more than a later
      one (before, every record completed before the first commit ran again);
    - coalescing: a partition with ``MAX_PENDING`` records still unacknowledged is skipped this cycle
      (a slow broker cannot pile records up in the producer), and a record equal to the last one
      written for the same base is not written again (an idle partition costs nothing).

    A record is durable one acknowledgement after its snapshot, so the engine starts a cycle every
    ``interval - ack_latency_estimate_s`` (at least every ``interval / 2``, see :meth:`next_delay`):
    the newest durable record is then about one interval old when the worker dies.
    """

    MAX_PENDING = 3

    def __init__(self, store: ProgressStore | None, hooks: EngineHooks, commits: CommitCycle,
                 on_lost: Callable[[PartitionRuntime], None] | None = None) -> None:
        """``on_lost``: called with a partition whose first commit (step 0) was left out because its
        state changes are not durable (the engine reopens it, as after a commit cycle's loss)."""
        self._store = store
        self._hooks = hooks
        self._commits = commits
        self._on_lost = on_lost
        self._written: weakref.WeakKeyDictionary[PartitionRuntime, _Written] = weakref.WeakKeyDictionary()
        self.records_written = 0  # acknowledged
        self.bytes_written = 0  # acknowledged, encoded value bytes
        self.write_errors = 0
        self.ack_latency_s = 0.0  # of the last acknowledged record: produce to delivery callback
        # rises at once with a slower acknowledgement, decays slowly (next_delay() uses it)
        self.ack_latency_estimate_s = 0.0
        self.skipped_pending = 0  # partitions skipped because their previous record was unacknowledged

    async def run(self, parts: Sequence[PartitionRuntime]) -> int:
        """One cycle over ``parts`` (steps 0-4); returns the number of records produced.

        0. First commits: partitions with progress, no committed offset and no commit sent, whose
           committable offset is known, are committed now through the commit cycle (which writes their
           first progress record before the commit; its records are counted there, not here); one
           whose state changes are not durable goes to ``on_lost`` (reopened, as after a commit).
        1. Snapshot: per partition with progress, flush completions, read the committable offset
           ``C`` and the bases (confirmed committed offset; the offset of a commit still awaiting its
           answer; the floor, the base of a commit's record about to be committed); encode the progress
           for each base; keep the partition if any of them changed since the last write (all of its
           records are then written, ascending: the highest base last).
        2. State hooks: ``make_durable(topic, partition)`` on a worker thread (the changes of every
           record the snapshot calls done are acknowledged by the changelog); a partition whose
           changes are not durable is dropped (the commit cycle reopens it).
        3. Fenced meanwhile? Produce nothing.
        4. Produce the records without waiting, unless a commit raised the floor above their highest
           base meanwhile; delivery callbacks (on the loop thread, from the engine's producer loop)
           count them and clear the partition's pending mark.
        """
        store = self._store
        if store is None or self._commits.fenced:
            return 0
        # 0. first commits
        firsts = [p for p in parts if p.mode is not OrderingMode.PARTITION and not p.closed
                  and p.committed is None and p.commit_sent is None and p.tracker.committable() is not None]
        if firsts:
            for p in await self._commits.run(firsts):
                if self._on_lost is not None:
                    self._on_lost(p)
        # 1. snapshot
        batch: list[tuple[PartitionRuntime, _Written, list[int], list[tuple[int, bytes]]]] = []
        for part in parts:
            if part.mode is OrderingMode.PARTITION or part.closed or part in firsts:
                continue  # (a first commit just wrote its record)
            written = self._written.get(part)
            if written is None:
                written = self._written[part] = _Written()
            if written.pending >= self.MAX_PENDING:
                self.skipped_pending += 1
                continue
            part.flush()
            c = part.tracker.committable()
            if c is None:
                continue
            floor = part.progress_floor
            if floor is not None and floor > c:
                continue  # (no record of the floor's base can be written last)
            bases = sorted({b for b in (part.committed, part.commit_sent, floor) if b is not None and b <= c})
            if not bases:
                continue
            encodings = [(b, ProgressCodec.encode(progress_for_base(part, b, c))) for b in bases]
            if any(written.encoded.get(b) != e for b, e in encodings):
                batch.append((part, written, bases, encodings))  # all of them, the highest base last
        if not batch:
            return 0
        # 2. state hooks
        durable = self._hooks.durable
        if self._hooks.state is not None:
            if durable is None:
                return 0  # hooks that cannot make changes durable on demand: progress with commits only
            loop = asyncio.get_running_loop()
            kept = []
            for item in batch:
                part = item[0]
                try:
                    await loop.run_in_executor(None, durable.make_durable, part.topic, part.partition)
                except Exception as exc:  # StateDurabilityError, or the partition's store closed
                    log.warning("no progress record for %s/%d this cycle: %s", part.topic, part.partition,
                                exc)
                    continue
                kept.append(item)
            batch = kept
        # 3. fenced meanwhile?
        if self._commits.fenced:
            return 0
        # 4. produce
        produced = 0
        for part, written, bases, out in batch:
            if part.closed:
                continue
            floor = part.progress_floor
            if floor is not None and bases[-1] < floor:
                continue  # a commit wrote a higher base meanwhile (step 2 awaited): none of them last
            written.encoded = {b: e for b, e in written.encoded.items() if b in bases}
            for base, encoded in out:
                part.progress_floor = base
                written.encoded[base] = encoded
                written.pending += 1
                fut = store.write(part.topic, part.partition, encoded)
                fut.add_done_callback(self._delivered(written, len(encoded), time.monotonic()))
                produced += 1
        return produced

    def next_delay(self, interval_s: float, elapsed_s: float) -> float:
        """Seconds until the next cycle: ``interval_s`` after the start of this one, less the expected
        acknowledgement latency (never less than ``interval_s / 2`` between starts)."""
        period = max(interval_s / 2, interval_s - self.ack_latency_estimate_s)
        return max(0.0, period - elapsed_s)

    def _delivered(self, written: _Written, nbytes: int, produced_at: float) -> Any:
        def done(fut: asyncio.Future[None]) -> None:
            written.pending -= 1
            if fut.cancelled() or fut.exception() is not None:
                self.write_errors += 1
                written.encoded.clear()  # write it again next cycle
                log.warning("progress record not written: %s",
                            "cancelled" if fut.cancelled() else fut.exception())
                return
            self.records_written += 1
            self.bytes_written += nbytes
            latency = self.ack_latency_s = time.monotonic() - produced_at
            self.ack_latency_estimate_s = max(latency, 0.8 * self.ack_latency_estimate_s + 0.2 * latency)

        return done
