"""The partition-ownership protocol of a worker: the one way a partition is added and the one way it is
released, used by operator mode (``Engine.assign`` / ``release``) and group mode (the rebalance
callbacks of :mod:`multilane.worker.group`). Does I/O (Kafka, the state hooks).

Add (:meth:`Ownership.add`, :meth:`Ownership.add_blocking`), numbered as in the code:

0. Exactly-once outputs only: open each partition's transaction (``init_transactions`` fences the last
   owner and ends what it left open, so the committed offset read next is final).
1. Read the committed offsets (and metadata) from the group coordinator.
2. The progress records: the one the partition's last owner released (a hint the operator passes
   on) when it is for the committed offset, else read from the progress topic (else the commit
   metadata); vetted either way.
3. Open the state (``open_partition``, several partitions in parallel), after any background close
   of an earlier release of the same partition; all or nothing. The changelog end the last owner
   released at (the operator's other hint) goes with it, only together with a progress hint that
   was used (both come from the same clean release).
4. Create the runtimes, start their lanes, ``incremental_assign`` at the committed offsets.

Release (:meth:`Ownership.release`, :meth:`Ownership.release_blocking`), numbered as in the code:

1. Phase ``releasing``; stop fetching.
2. Hold the lanes: wait for the records already running (not the queued ones: they go to the next
   owner through the committed offset and the progress record), up to the deadline.
3. Stop the lanes (records still running are abandoned and replayed by the next owner); give the
   thread-pool batches until the deadline to return.
4. Final synchronous commit with progress (the answer carries that progress record when the commit
   and its progress write succeeded and nothing was abandoned: the next owner's hint; with it, the
   partition's changelog end from the state hooks, read after the commit flushed the changelog).
5. Close the state: clean only when nothing running was abandoned and the commit succeeded; in
   operator mode after the answer (in the background).
6. ``incremental_unassign`` (operator mode) and forget the partitions (exactly-once outputs: close
   their transactions, committed in step 4 or dropped).

Each protocol is written once, as a coroutine over an I/O driver of
:mod:`multilane.worker.ownership_io`: on the event loop, or blocking inside a rebalance callback.
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from multilane.formats.progress import ProgressCodec, ProgressDecodeError, ProgressRecord
from multilane.worker.commits import CommitCycle
from multilane.worker.config import EngineConfig, TopicPartitionId
from multilane.worker.control_state import ControlState
from multilane.worker.fetch import FetchLoop
from multilane.worker.flow import FlowController
from multilane.worker.hooks import HandoverStateHooks, PartitionStateHooks
from multilane.worker.lanes import LaneEnv
from multilane.worker.metrics import LatencyHistogram
from multilane.worker.ownership_io import (
    BlockingIo,
    Committed,
    LoopIo,
    OwnershipIo,
    close_state_quietly,
    run_now,
)
from multilane.worker.partition import PartitionRuntime, Phase
from multilane.worker.partition_set import PartitionSet
from multilane.worker.progress_store import ProgressStore, choose_progress, vet_progress
from multilane.worker.retry import DeadLetterPublisher, RetryPolicy
from multilane.worker.transactions import TransactionalOutputs

__all__ = ["EngineError", "FencingError", "Ownership", "ReleaseResult", "RuntimeFactory"]

log = logging.getLogger(__name__)



class EngineError(RuntimeError):
    """The engine cannot do what was asked (bad argument or wrong state)."""


class FencingError(EngineError):
    """An assignment carried a generation lower than the worker's current one."""


@dataclass(frozen=True)
class ReleaseResult:
    """A partition this worker released, with its final committed offset."""

    topic: str
    partition: int
    committed_offset: int | None  # the final committed offset (None if nothing was ever committed)
    # The progress record committed with ``committed_offset`` (encoded), set only when the final
    # commit and its progress write both succeeded: the operator hands it to the next owner, which
    # then need not read the progress topic inside the pause (it vets it like a record it read).
    progress: bytes | None = None
    # One past the partition's last changelog record at the release (set only with ``progress``):
    # the next owner's learner reads to it instead of waiting for a fresh fetch's end of partition.
    changelog_end: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"topic": self.topic, "partition": self.partition,
                               "committed_offset": self.committed_offset}
        if self.progress is not None:
            out["progress"] = base64.b64encode(self.progress).decode("ascii")
        if self.changelog_end is not None:
            out["changelog_end"] = self.changelog_end
        return out


def decode_progress_hint(text: str) -> bytes:
    """A ``progress`` field of the control API (base64) as bytes; ValueError with a one-line reason."""
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError(f"progress is not base64: {exc}") from None


ProgressHints = Mapping[TopicPartitionId, bytes]  # partition -> progress record its last owner released
ChangelogEnds = Mapping[TopicPartitionId, int]  # partition -> changelog end its last owner released at


@dataclass(frozen=True)
class RuntimeFactory:
    """Builds the :class:`PartitionRuntime` of a partition being added (the engine's shared parts)."""

    config: EngineConfig
    control: ControlState
    env: LaneEnv
    flow: FlowController
    retry: RetryPolicy
    dlq: DeadLetterPublisher
    hist: LatencyHistogram

    def __call__(self, topic: str, partition: int, committed: int | None,
                 progress: ProgressRecord | None) -> PartitionRuntime:
        cfg = self.config
        return PartitionRuntime(topic, partition, cfg.ordering, self.control.factor, self.env, self.flow,
                                self.retry, self.dlq, self.hist, cfg.group, cfg.worker_id, committed,
                                progress)


# -- the protocol -----------------------------------------------------------------------------------------


class Ownership:
    """Adding and releasing partitions (the module docstring's steps), for both modes."""

    def __init__(self, config: EngineConfig, partitions: PartitionSet, control: ControlState,
                 hooks: PartitionStateHooks | None, consumer: Any, producer: Any, store: ProgressStore,
                 commits: CommitCycle, fetch: FetchLoop, new_runtime: RuntimeFactory,
                 io_pool: concurrent.futures.ThreadPoolExecutor,
                 transactions: TransactionalOutputs | None = None) -> None:
        self.config = config
        self.transactions = transactions
        self.partitions = partitions
        self.control = control
        self.hooks = hooks
        self.consumer = consumer
        self.producer = producer
        self.store = store
        self.commits = commits
        self.fetch = fetch
        self.new_runtime = new_runtime
        self.io_pool = io_pool
        self._loop_io = LoopIo(config, io_pool, partitions, hooks, commits)

    def close(self) -> None:
        """Close the clients the protocol keeps (blocking; at engine stop)."""
        self._loop_io.close()

    async def wait_for_closes(self, tps: Iterable[TopicPartitionId]) -> None:
        """Wait until the background state closes of ``tps`` (a release's step 5) finished."""
        await self._loop_io.wait_closes(tps)

    # -- add ------------------------------------------------------------------------------------------------

    async def add(self, tps: list[TopicPartitionId], hints: ProgressHints | None = None,
                  ends: ChangelogEnds | None = None) -> None:
        """Start consuming ``tps`` (operator mode, and a reopen), on the loop. ``hints``: progress
        records the partitions' last owners released (used in step 2 when they fit the committed
        offset, instead of reading the progress topic); ``ends``: the changelog ends they released at
        (step 3)."""
        await self._add(tps, self._loop_io, self.consumer, hints or {}, ends or {})

    def add_blocking(self, tps: list[TopicPartitionId], consumer: Any) -> None:
        """The same protocol inside group mode's ``on_assign`` (blocks the loop's thread)."""
        run_now(self._add(tps, self._blocking_io(consumer), consumer, {}, {}))

    def _blocking_io(self, consumer: Any) -> BlockingIo:
        return BlockingIo(self.io_pool, self.hooks, self.commits, self.producer, consumer)

    async def _add(self, tps: list[TopicPartitionId], io: OwnershipIo, consumer: Any,
                   hints: ProgressHints, ends: ChangelogEnds) -> None:
        """Steps 1-4 of the module docstring. If a state open fails, those opened are closed uncleanly
        and the error is raised: nothing of this call is assigned. No record of a partition is
        fetched before its state is open."""
        t0 = time.monotonic()
        # 0. transactions (exactly-once outputs): fence the last owner before reading what it committed
        txns = self.transactions
        if txns is not None:
            opened = await io.each(txns.open, [(tp,) for tp in tps])
            errors = [r for r in opened if isinstance(r, BaseException)]
            if errors:
                for tp in tps:
                    await io.call(txns.close, tp)
                raise errors[0]
        # 1. committed offsets
        committed = await io.committed(tps)
        t1 = time.monotonic()
        # 2. progress (a fitting hint, else read; undecodable / stale / foreign records -> warning, ignored)
        loaded = await io.each(self.load_progress, [(tp, committed[tp], hints.get(tp)) for tp in tps])
        t2 = time.monotonic()
        failed = [r for r in loaded if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        progress = [r for r in loaded if not isinstance(r, BaseException)]
        # 3. state (all or nothing); a changelog end only with a progress hint for the committed offset
        if self.hooks is not None:
            await self._open_states(
                [(tp, committed[tp][0], prog, _end_if_fits(ends.get(tp), hints.get(tp), committed[tp][0]))
                 for tp, prog in zip(tps, progress, strict=True)], io
            )
        t3 = time.monotonic()
        # 4. start
        runtimes = [self.new_runtime(tp[0], tp[1], committed[tp][0], prog)
                    for tp, prog in zip(tps, progress, strict=True)]
        for rt in runtimes:
            self._activate(rt)
        consumer.incremental_assign([
            TopicPartition(rt.topic, rt.partition, rt.committed) if rt.committed is not None
            else TopicPartition(rt.topic, rt.partition)
            for rt in runtimes
        ])  # fmt: skip
        _resume_assigned(runtimes, consumer)
        log.info("assigned %s in %.3fs (committed %.3fs, progress %.3fs, state %.3fs)",
                 [f"{rt.topic}/{rt.partition}@{rt.committed}" for rt in runtimes], time.monotonic() - t0,
                 t1 - t0, t2 - t1, t3 - t2)

    async def _open_states(
        self, items: list[tuple[TopicPartitionId, int | None, ProgressRecord | None, int | None]],
        io: OwnershipIo,
    ) -> None:
        """Step 3: ``open_partition`` for every item, in parallel on the I/O threads (the hooks are
        thread-safe across partitions). All or nothing: on any failure, the partitions that opened
        are closed uncleanly and the first error is raised. They are listed as opening meanwhile."""
        hooks = self.hooks
        assert hooks is not None
        tps = [tp for tp, *_ in items]
        await io.wait_closes(tps)
        self.partitions.start_opening(tps)
        try:
            results = await io.each(_open_partition,
                                    [(hooks, tp, off, prog, end) for tp, off, prog, end in items])
        finally:
            self.partitions.end_opening(tps)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for tp, r in zip(tps, results, strict=True):
                if not isinstance(r, BaseException):
                    await io.call(close_state_quietly, hooks, tp, False)
            raise errors[0]

    def _activate(self, rt: PartitionRuntime) -> None:
        topics = self.config.topics
        if any(t != rt.topic for t in self.partitions.topics()) or (topics and rt.topic not in topics):
            self.fetch.multi_topic = True  # never reset: stale messages of another topic may still arrive
        self.partitions.add(rt)
        rt.lanes.start()
        rt.phase = Phase.ACTIVE
        if self.control.user_paused:
            rt.user_paused = True

    # -- release ---------------------------------------------------------------------------------------------

    async def release(self, parts: list[PartitionRuntime], deadline_s: float, *, unassign: bool,
                      commit: bool = True, close_after: bool = False) -> list[ReleaseResult]:
        """Stop, commit and drop ``parts`` on the loop (steps 1-6). Not ``commit``: a partition whose
        changelog lost a record is reopened without a commit. ``close_after``: step 5 runs in the
        background after the call returned (closing a large store flushes its memtables: the caller
        need not wait for it); a later open of the same partition, a learn, and ``stop()`` wait for it."""
        return await self._release(parts, deadline_s, unassign, commit, close_after, self._loop_io)

    def release_blocking(self, parts: list[PartitionRuntime], consumer: Any) -> list[ReleaseResult]:
        """The same protocol inside group mode's ``on_revoke`` (blocks the loop's thread; the group
        unassigns by itself). Records still running are abandoned; the progress record lets the next
        owner replay only those (and the queued ones), not what already completed."""
        return run_now(self._release(parts, self.config.drain_timeout_s, False, True, False,
                                     self._blocking_io(consumer)))

    async def _release(self, parts: list[PartitionRuntime], deadline_s: float, unassign: bool, commit: bool,
                       close_after: bool, io: OwnershipIo) -> list[ReleaseResult]:
        """Steps 1-6 of the module docstring."""
        if not parts:
            return []
        commit = commit and self.control.fenced_at is None  # a fenced worker never commits
        t0 = time.monotonic()
        # 1. stop fetching
        for p in parts:
            p.phase = Phase.RELEASING
        self.fetch.pause_fetch(parts)
        # 2. hold the lanes; wait for running records (and dead letters being written) only
        deadline = time.monotonic() + max(0.0, deadline_s)
        if self.config.release_drain == "queued":  # the older behaviour: drain every fetched record
            await io.wait_until(lambda: not any(p.in_flight for p in parts), deadline, 0.01)
        for p in parts:
            p.lanes.hold()
        await io.wait_until(lambda: not any(_busy(p) for p in parts), deadline, 0.005)
        clean = {id(p): not _busy(p) for p in parts}
        for p in parts:
            if _busy(p):
                log.warning("releasing %s/%d with %d records still running after %.1fs; they will be "
                            "replayed by the next owner", p.topic, p.partition, p.lanes.running, deadline_s)
            elif p.in_flight:
                log.info("releasing %s/%d: %d queued records go to the next owner", p.topic, p.partition,
                         p.in_flight)
        t_drained = time.monotonic()
        # 3. stop lanes (keep the tracker: completed work is still committed); records running on
        #    the thread pool cannot be cancelled: give them until the deadline (at least a moment)
        #    to return, so that the next owner does not run a key while we still do
        for p in parts:
            p.close()
        batches = [f for p in parts for f in p.lanes.batches_running()]
        pending = await io.wait_batches(batches, max(1.0, deadline - time.monotonic()))
        if pending:
            log.warning("%d thread-pool batches still running after the release deadline", pending)
        t_stopped = time.monotonic()
        # 4. final commit
        if commit:
            try:
                for p in await io.commit_final(parts):
                    clean[id(p)] = False
            except io.commit_errors as exc:
                log.warning("final commit failed for %s: %s", [(p.topic, p.partition) for p in parts], exc)
                clean = dict.fromkeys(clean, False)
        else:
            clean = dict.fromkeys(clean, False)
        t_committed = time.monotonic()
        # 5. state hooks (now, or after the answer); the changelog end before the close
        ends: dict[int, int | None] = {}
        if self.hooks is not None:
            for p in parts:
                clean[id(p)] = clean[id(p)] and _fully_committed(p)
                if clean[id(p)] and isinstance(self.hooks, HandoverStateHooks):
                    ends[id(p)] = self.hooks.changelog_end(p.topic, p.partition)
                await io.close_state((p.topic, p.partition), clean[id(p)], close_after)
        t_closed = time.monotonic()
        # 6. unassign and forget
        if unassign:
            try:
                self.consumer.incremental_unassign([TopicPartition(p.topic, p.partition) for p in parts])
            except KafkaException as exc:
                log.warning("unassign failed: %s", exc)
        if self.transactions is not None:
            for p in parts:
                await io.call(self.transactions.close, (p.topic, p.partition))
        out = []
        for p in parts:
            self.partitions.forget(p)
            progress = _released_progress(p) if clean[id(p)] else None
            out.append(ReleaseResult(p.topic, p.partition, p.committed, progress,
                                     ends.get(id(p)) if progress is not None else None))
        log.info("released %s in %.3fs (drain %.3fs, stop %.3fs, commit %.3fs, close %.3fs, unassign %.3fs)",
                 [r.to_dict() for r in out], time.monotonic() - t0, t_drained - t0, t_stopped - t_drained,
                 t_committed - t_stopped, t_closed - t_committed, time.monotonic() - t_closed)
        return out

    def drop_lost(self, tps: list[TopicPartitionId]) -> None:
        """Partitions lost (group session expired): forget them without committing; their state
        closes uncleanly."""
        for tp in tps:
            p = self.partitions.get(tp)
            if p is None:
                continue
            p.close()
            self.partitions.forget(p)
            if self.transactions is not None:
                self.transactions.close(tp)
            if self.hooks is not None:
                self.hooks.close_partition(p.topic, p.partition, False)

    def fenced(self, tp: TopicPartitionId) -> bool:
        """Exactly-once outputs: another worker opened ``tp``'s transaction after this one did."""
        return self.transactions is not None and self.transactions.fenced(tp)

    def load_progress(self, tp: TopicPartitionId, committed: Committed,
                      hint: bytes | None = None) -> ProgressRecord | None:
        """Blocking: the vetted progress record for ``tp`` (None when absent or unusable). ``hint``:
        the record the last owner released with its final commit; used when it is for the committed
        offset read in step 1 (vetted like a record read from the progress topic), else ignored."""
        off, meta = committed
        if off is None:
            return None
        cfg = self.config
        if hint is not None and cfg.ordering.value != "partition":
            rec, fault, detail = vet_progress(hint, group=cfg.group, topic=tp[0], partition=tp[1],
                                              committed=off)
            if rec is not None:
                return rec
            log.info("progress hint for %s/%d not used (%s %s); reading the progress topic", tp[0], tp[1],
                     fault, detail)
        # the progress topic first: between commits it holds fresher records than the commit metadata
        if cfg.ordering.value != "partition":
            try:
                rec = self.store.read_progress(tp[0], tp[1], off)
            except Exception as exc:
                log.warning("cannot read progress for %s/%d (%s)", tp[0], tp[1], exc)
                rec = None
            if rec is not None:
                return rec
        if meta:
            return choose_progress(meta, source="commit metadata", group=cfg.group, topic=tp[0],
                                   partition=tp[1], committed=off)
        log.info("no usable progress record for %s/%d at %d; replaying from the committed offset",
                 tp[0], tp[1], off)
        return None


def _end_if_fits(end: int | None, hint: bytes | None, committed: int | None) -> int | None:
    """The changelog end the last owner released at, when its progress hint (from the same release) is
    for ``committed``: then nobody committed, so nobody wrote the changelog, since that release."""
    if end is None or hint is None or committed is None:
        return None
    try:
        return end if ProgressCodec.decode(hint).base_offset == committed else None
    except ProgressDecodeError:
        return None


def _open_partition(hooks: PartitionStateHooks, tp: TopicPartitionId, committed: int | None,
                    progress: ProgressRecord | None, changelog_end: int | None) -> None:
    """``hooks.open_partition`` (blocking), with ``changelog_end`` only when known (hooks without
    :class:`HandoverStateHooks` never get one: it comes from a release of such hooks)."""
    if changelog_end is None:
        hooks.open_partition(tp[0], tp[1], committed, progress)
    else:
        hooks.open_partition(tp[0], tp[1], committed, progress,
                             changelog_end=changelog_end)  # type: ignore[call-arg]


def _resume_assigned(runtimes: list[PartitionRuntime], consumer: Any) -> None:
    """Clear a pause left from an earlier ownership: librdkafka keeps a partition's pause across
    ``incremental_unassign``/``incremental_assign``, so a partition released (paused) and later given
    back to this process would never be fetched again. User-paused ones stay paused."""
    tps = [TopicPartition(rt.topic, rt.partition) for rt in runtimes if not rt.user_paused]
    if tps:
        try:
            consumer.resume(tps)
        except KafkaException as exc:
            log.warning("resume of newly assigned partitions failed: %s", exc)


def _released_progress(part: PartitionRuntime) -> bytes | None:
    """The progress record of ``part``'s final commit when it is for the committed offset (the
    commit cycle keeps ``last_progress`` only for records whose write was acknowledged)."""
    encoded, committed = part.last_progress, part.committed
    if encoded is None or committed is None:
        return None
    try:
        return encoded if ProgressCodec.decode(encoded).base_offset == committed else None
    except ProgressDecodeError:
        return None


def _busy(part: PartitionRuntime) -> bool:
    """Records of ``part`` still running, or dead letters still being written."""
    return part.lanes.running > 0 or bool(part.dlq_pending)


def _fully_committed(part: PartitionRuntime) -> bool:
    """True when the broker confirmed a commit of everything committable (the partition-level result
    of a synchronous commit can fail without an exception), or nothing was ever committable."""
    c = part.tracker.committable()
    return c is None or c == part.committed
