"""The partition-ownership protocol of a worker: how a partition is added and how it is released, in
operator mode (``Engine.assign`` / ``Engine.release``) and in group mode (the rebalance callbacks of
:mod:`multilane.worker.group`). Does I/O (Kafka, the state hooks).

Add (:meth:`PartitionOwnership._add_partitions`), numbered as in the code:

1. Read the committed offsets (and metadata) from the group coordinator.
2. Read the progress records (the progress topic, else the commit metadata) and vet them.
3. Open the state (``hooks.open_partition``, several partitions in parallel), after any background
   close of an earlier release of the same partition; all or nothing.
4. Create the runtimes, start their lanes, ``incremental_assign`` at the committed offsets.

Release (:meth:`PartitionOwnership._release_parts`), numbered as in the code:

1. Phase ``releasing``; stop fetching.
2. Hold the lanes: wait for the records already running (not the queued ones: they go to the next
   owner through the committed offset and the progress record), up to the deadline.
3. Stop the lanes (records still running are abandoned and replayed by the next owner).
4. Final synchronous commit with progress.
5. Close the state: clean only when nothing running was abandoned and the commit succeeded; in
   operator mode after the answer (in the background).
6. ``incremental_unassign`` and forget the partitions.

:class:`PartitionOwnership` is a base class of :class:`multilane.worker.engine.Engine`: it declares the
engine state the protocol reads and writes (set by ``Engine.__init__`` and ``Engine.start``, where
the invariants are written) next to the steps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from multilane.formats.progress import ProgressRecord
from multilane.worker.admin import security_config
from multilane.worker.commits import CommitCycle, ProgressCycle
from multilane.worker.config import EngineConfig, TopicPartitionId
from multilane.worker.fetch import FetchLoop
from multilane.worker.flow import FlowController
from multilane.worker.lanes import LaneEnv
from multilane.worker.metrics import LatencyHistogram
from multilane.worker.partition import PartitionRuntime, Phase
from multilane.worker.progress_store import ProgressStore, choose_progress
from multilane.worker.retry import DeadLetterPublisher, RetryPolicy
from multilane.worker.watchdog import StallWatchdog

__all__ = ["EngineError", "FencingError", "PartitionOwnership", "ReleasedPartition"]

log = logging.getLogger("multilane.worker.engine")

_Committed = tuple[int | None, str | None]  # (committed offset or None, commit metadata or None)


class EngineError(RuntimeError):
    """The engine cannot do what was asked (bad argument or wrong state)."""


class FencingError(EngineError):
    """An assignment carried a generation lower than the worker's current one."""


@dataclass(frozen=True)
class ReleasedPartition:
    topic: str
    partition: int
    committed_offset: int | None  # the final committed offset (None if nothing was ever committed)

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "committed_offset": self.committed_offset}


class PartitionOwnership:
    """Adding and releasing partitions (the module docstring's steps). The annotations below are the
    engine's state, set by ``Engine.__init__`` and ``Engine.start``."""

    config: EngineConfig
    hooks: Any
    generation: int
    user_paused: bool
    processing_rate: float
    busy_lanes: float
    _factor: int
    _parts: dict[TopicPartitionId, PartitionRuntime]
    _opening: set[TopicPartitionId]
    _closing: dict[TopicPartitionId, asyncio.Future[Any]]
    _reopen_pending: set[TopicPartitionId]
    _reopens: dict[TopicPartitionId, asyncio.Task[None]]
    _fenced_at: int | None
    _flow: FlowController
    _retry: RetryPolicy
    _hist: LatencyHistogram
    _watchdog: StallWatchdog
    _env: LaneEnv | None
    _dlq: DeadLetterPublisher | None
    _store: ProgressStore | None
    _commits: CommitCycle | None
    _progress: ProgressCycle | None
    _consumer: Any
    _producer: Any
    _fetch: FetchLoop | None
    _multi_topic: bool
    _released_total: int
    _io_pool: ThreadPoolExecutor
    _status_pool: ThreadPoolExecutor
    _control_lock: asyncio.Lock
    _loop: asyncio.AbstractEventLoop | None
    _learners: list[dict[str, Any]]
    _learners_refresh: asyncio.Task[None] | None
    _stopping: bool
    _stopped: bool
    _last_rate_sample: tuple[float, int]
    _last_busy_sample: float

    async def _run_io(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._io_pool, fn, *args)

    def _fetcher(self) -> FetchLoop:
        if self._fetch is None:
            raise EngineError("the engine has not started")
        return self._fetch

    def _new_runtime(
        self, topic: str, partition: int, committed: int | None, progress: ProgressRecord | None
    ) -> PartitionRuntime:
        assert self._env is not None and self._dlq is not None
        cfg = self.config
        return PartitionRuntime(
            topic,
            partition,
            cfg.ordering,
            self._factor,
            self._env,
            self._flow,
            self._retry,
            self._dlq,
            self._hist,
            cfg.group,
            cfg.worker_id,
            committed,
            progress,
        )

    async def _add_partitions(self, tps: list[TopicPartitionId]) -> None:
        """Start consuming ``tps`` (operator mode; steps 1-4).

        1. Read committed offsets (and metadata) from the group coordinator.
        2. Read progress records (metadata first, else the progress topic; on a worker thread) and vet
           them (undecodable / stale / foreign -> warning, ignored).
        3. Let the state hooks restore (``open_partition``; blocking, on worker threads, several
           partitions in parallel). If one fails, those opened are closed uncleanly and the error is
           raised: nothing of this call is assigned.
        4. Create the runtimes, start their lanes, and ``incremental_assign`` at the committed offsets.
           No record of a partition is fetched before its state is open.
        """
        # 1. committed offsets (a short-lived client on a worker thread: the loop keeps processing)
        committed = await self._run_io(self._committed_blocking, tps)
        # 2. progress
        progress = await asyncio.gather(*(self._run_io(self._load_progress, tp, committed[tp]) for tp in tps))
        # 3. state restore
        if self.hooks is not None:
            await self._open_states(
                [(tp, committed[tp][0], prog) for tp, prog in zip(tps, progress, strict=True)]
            )
        runtimes = [
            self._new_runtime(tp[0], tp[1], committed[tp][0], prog)
            for tp, prog in zip(tps, progress, strict=True)
        ]
        # 4. start
        for rt in runtimes:
            self._activate(rt)
        self._consumer.incremental_assign(
            [
                TopicPartition(rt.topic, rt.partition, rt.committed)
                if rt.committed is not None
                else TopicPartition(rt.topic, rt.partition)
                for rt in runtimes
            ]
        )
        self._resume_assigned(runtimes, self._consumer)
        log.info("assigned %s", [f"{rt.topic}/{rt.partition}@{rt.committed}" for rt in runtimes])

    async def _open_states(
        self, items: list[tuple[TopicPartitionId, int | None, ProgressRecord | None]]
    ) -> None:
        """``hooks.open_partition`` for every item, in parallel on the I/O threads (the hooks are
        thread-safe across partitions). All or nothing: on any failure, the partitions that opened
        are closed uncleanly and the first error is raised. ``_opening`` lists them meanwhile."""
        hooks = self.hooks
        assert hooks is not None
        await self._closed([tp for tp, _, _ in items])
        for tp, _, _ in items:
            self._opening.add(tp)
        try:
            results = await asyncio.gather(
                *(self._run_io(hooks.open_partition, tp[0], tp[1], off, prog) for tp, off, prog in items),
                return_exceptions=True,
            )
        finally:
            for tp, _, _ in items:
                self._opening.discard(tp)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for (tp, _, _), r in zip(items, results, strict=True):
                if not isinstance(r, BaseException):
                    await self._run_io(self._close_state_quietly, tp, False)
            raise errors[0]

    async def _closed(self, tps: Iterable[TopicPartitionId]) -> None:
        """Wait for the background state closes of ``tps`` (see ``_release_parts``, step 5)."""
        pending = [f for tp in tps if (f := self._closing.pop(tp, None)) is not None]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def _close_state_quietly(self, tp: TopicPartitionId, clean: bool) -> None:
        """``hooks.close_partition`` (blocking), logging instead of raising."""
        if self.hooks is None:
            return
        try:
            self.hooks.close_partition(tp[0], tp[1], clean)
        except Exception:
            log.exception("close_partition failed for %s/%d", tp[0], tp[1])

    @staticmethod
    def _resume_assigned(runtimes: list[PartitionRuntime], consumer: Any) -> None:
        """Clear a pause left from an earlier ownership: librdkafka keeps a partition's pause across
        ``incremental_unassign``/``incremental_assign``, so a partition released (paused) and later
        given back to this process would never be fetched again. User-paused ones stay paused."""
        tps = [TopicPartition(rt.topic, rt.partition) for rt in runtimes if not rt.user_paused]
        if tps:
            try:
                consumer.resume(tps)
            except KafkaException as exc:
                log.warning("resume of newly assigned partitions failed: %s", exc)

    def _activate(self, rt: PartitionRuntime) -> None:
        topics = self.config.topics
        if any(t != rt.topic for t, _ in self._parts) or (topics and rt.topic not in topics):
            self._multi_topic = True  # never reset: stale messages of another topic may still arrive
            if self._fetch is not None:
                self._fetch.multi_topic = True
        self._parts[(rt.topic, rt.partition)] = rt
        self._flow.set_partitions(len(self._parts))
        rt.lanes.start()
        rt.phase = Phase.ACTIVE
        if self.user_paused:
            rt.user_paused = True

    def _committed_blocking(self, tps: list[TopicPartitionId]) -> dict[TopicPartitionId, _Committed]:
        """Committed offsets via a separate client of the same group (blocking; worker thread)."""
        cfg = self.config
        client = Consumer(
            {
                "bootstrap.servers": cfg.bootstrap_servers,
                "group.id": cfg.group,
                "enable.auto.commit": False,
                **security_config(cfg.consumer_overrides),
            }
        )
        try:
            return self._committed(tps, client)
        finally:
            client.close()

    def _committed(
        self, tps: list[TopicPartitionId], client: Any = None
    ) -> dict[TopicPartitionId, _Committed]:
        """Committed offsets and metadata of ``tps`` (blocking; by default the engine's consumer,
        which may only be used on the loop thread)."""
        out: dict[TopicPartitionId, _Committed] = {}
        consumer = client if client is not None else self._consumer
        result = consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=15)
        for tp in result:
            off = tp.offset if tp.offset >= 0 else None
            out[(tp.topic, tp.partition)] = (off, getattr(tp, "metadata", None))
        for tp in tps:
            out.setdefault(tp, (None, None))
        return out

    def _load_progress(self, tp: TopicPartitionId, committed: _Committed) -> ProgressRecord | None:
        """Blocking: the vetted progress record for ``tp`` (None when absent or unusable)."""
        off, meta = committed
        if off is None:
            return None
        cfg = self.config
        # the progress topic first: between commits it holds fresher records than the commit metadata
        if cfg.ordering.value != "partition" and self._store is not None:
            try:
                rec = self._store.read_progress(tp[0], tp[1], off)
            except Exception as exc:
                log.warning("cannot read progress for %s/%d (%s)", tp[0], tp[1], exc)
                rec = None
            if rec is not None:
                return rec
        if meta:
            return choose_progress(
                meta, source="commit metadata", group=cfg.group, topic=tp[0], partition=tp[1], committed=off
            )
        log.info(
            "no usable progress record for %s/%d at %d; replaying from the committed offset",
            tp[0],
            tp[1],
            off,
        )
        return None

    async def _release_parts(
        self,
        parts: list[PartitionRuntime],
        deadline_s: float,
        unassign: bool,
        commit: bool = True,
        close_after: bool = False,
    ) -> list[ReleasedPartition]:
        """Stop, commit and drop ``parts`` (steps 1-6).

        1. Phase ``releasing``; pause fetching (records fetched later are ignored).
        2. Hold their lanes (no queued record starts any more) and wait until the records already
           *running* finished, or the deadline passed. Queued records are not waited for: they are
           above the committed offset and not marked done by the progress record, so the next owner
           runs them (nothing is lost, and nothing that completed runs again). The deadline bounds
           only slow running records.
        3. Stop their lanes (records still running are abandoned; the next owner replays them).
        4. Final synchronous commit of the committable offsets, with progress records (skipped when
           not ``commit``: a partition whose changelog lost a record is reopened without one).
        5. ``close_partition``: clean only when no running record was abandoned and the final commit
           succeeded (a partition whose ``before_commit`` raised :class:`StateDurabilityError` is not
           committed and closes uncleanly). With ``close_after``, this runs in the background after
           the call returned (closing a large store flushes its memtables: the caller need not wait
           for it); a later open of the same partition, a learn, and :meth:`stop` wait for it.
        6. ``incremental_unassign`` (operator mode) and forget them.
        """
        if not parts:
            return []
        commit = commit and self._fenced_at is None  # a fenced worker never commits
        # 1. stop fetching
        for p in parts:
            p.phase = Phase.RELEASING
        self._fetcher().pause_fetch(parts)
        # 2. hold the lanes; wait for running records (and dead letters being written) only
        deadline = time.monotonic() + max(0.0, deadline_s)
        if self.config.release_drain == "queued":  # the older behaviour: drain every fetched record
            while any(p.in_flight for p in parts) and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        for p in parts:
            p.lanes.hold()
        while any(_busy(p) for p in parts) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        clean = {id(p): not _busy(p) for p in parts}
        for p in parts:
            if _busy(p):
                log.warning(
                    "releasing %s/%d with %d records still running after %.1fs; they will be "
                    "replayed by the next owner",
                    p.topic,
                    p.partition,
                    p.lanes.running,
                    deadline_s,
                )
            elif p.in_flight:
                log.info(
                    "releasing %s/%d: %d queued records go to the next owner",
                    p.topic,
                    p.partition,
                    p.in_flight,
                )
        # 3. stop lanes (keep the tracker: completed work is still committed); records running on
        #    the thread pool cannot be cancelled: give them until the deadline (at least a moment)
        #    to return, so that the next owner does not run a key while we still do
        for p in parts:
            p.close()
        batches = [asyncio.wrap_future(f) for p in parts for f in p.lanes.batches_running()]
        if batches:
            _done, pending = await asyncio.wait(batches, timeout=max(1.0, deadline - time.monotonic()))
            if pending:
                log.warning("%d thread-pool batches still running after the release deadline", len(pending))
        # 4. final commit
        assert self._commits is not None
        if commit:
            try:
                for p in await self._commits.run(parts, final=True):
                    clean[id(p)] = False
            except KafkaException as exc:
                log.warning("final commit failed for %s: %s", [(p.topic, p.partition) for p in parts], exc)
                clean = dict.fromkeys(clean, False)
        else:
            clean = dict.fromkeys(clean, False)
        # 5. state hooks (now, or after the answer)
        if self.hooks is not None:
            for p in parts:
                clean[id(p)] = clean[id(p)] and _fully_committed(p)
                tp = (p.topic, p.partition)
                if close_after:
                    self._closing[tp] = asyncio.ensure_future(
                        self._run_io(self._close_state_quietly, tp, clean[id(p)])
                    )
                else:
                    await self._run_io(self.hooks.close_partition, p.topic, p.partition, clean[id(p)])
        # 6. unassign and forget
        if unassign:
            try:
                self._consumer.incremental_unassign([TopicPartition(p.topic, p.partition) for p in parts])
            except KafkaException as exc:
                log.warning("unassign failed: %s", exc)
        out = []
        for p in parts:
            self._parts.pop((p.topic, p.partition), None)
            self._flow.set_partitions(len(self._parts))
            self._released_total += p.processed
            out.append(ReleasedPartition(p.topic, p.partition, p.committed))
        log.info("released %s", [r.to_dict() for r in out])
        return out


def _busy(part: PartitionRuntime) -> bool:
    """Records of ``part`` still running, or dead letters still being written."""
    return part.lanes.running > 0 or bool(part.dlq_pending)


def _fully_committed(part: PartitionRuntime) -> bool:
    """True when the broker confirmed a commit of everything committable (the partition-level result
    of a synchronous commit can fail without an exception), or nothing was ever committable."""
    c = part.tracker.committable()
    return c is None or c == part.committed
