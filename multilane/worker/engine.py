"""The worker engine: one Kafka consumer feeding the lanes of every assigned partition. Does I/O.

Everything runs on ONE asyncio event loop, and every call on the engine's consumer happens on that
loop's thread. The engine is split into modules, each readable on its own:

- ``fetch``: the *fetch loop* -- ``consumer.consume(num_messages=..., timeout=0)`` (librdkafka
  prefetches in its own threads), runs of messages to their :class:`PartitionRuntime`, back-pressure
  (pause, then resume + seek at the low-water mark);
- ``partition``: one assigned partition -- offset tracker, lanes, flow counters, progress records;
- ``lanes``: long-lived runner coroutines per lane (``async def`` processors awaited on the loop,
  plain functions in per-lane batches on a thread pool), retry parking, factor changes;
- ``flow``, ``retry``, ``commits``, ``watchdog``, ``progress_store``, ``admin``: bounds, retries and
  dead letters, the commit cycle, stall detection, progress persistence, topic creation;
- this module: lifecycle, the control API, adding and releasing partitions (both modes), and the
  *housekeeping loop* (commit cycle, watchdog, lag, rate), *progress loop* (progress records between
  commits) and *producer loop* (delivery callbacks).

Modes: operator mode (``assign()`` only; the assignment changes through :meth:`Engine.assign` /
:meth:`Engine.release`, fenced by a generation number) and standalone mode (``subscribe()`` with the
cooperative-sticky assignor; revoked partitions are committed in the revoke callback).

The Python control API (:meth:`assign`, :meth:`release`, :meth:`set_factor`, :meth:`pause`,
:meth:`resume`, :meth:`status`, and with state hooks :meth:`learn`, :meth:`promote`, :meth:`demote`,
:meth:`drop`) must be called on the engine's loop; ``runner.EngineRunner`` wraps it for other threads.

State hooks (``hooks``, ``PartitionStateHooks`` of docs/state.md, e.g. ``StateManager``): a partition's
state is opened before any of its records is fetched, ``before_commit`` precedes every commit (a
:class:`StateDurabilityError` there reopens the partition without committing, see
:meth:`Engine._reopen_lost`), and it is closed after the final commit (cleanly only when that commit
succeeded and no record was abandoned).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from multilane.api import Processor, is_async_processor
from multilane.worker.admin import ensure_topic, max_partition_count, security_config
from multilane.worker.commits import CommitCycle, ProgressCycle
from multilane.worker.config import EngineConfig, TopicPartitionId
from multilane.worker.fetch import ErrorLog, FetchLoop
from multilane.worker.flow import FlowController
from multilane.worker.lanes import LaneEnv
from multilane.worker.metrics import LatencyHistogram, WorkerMetrics
from multilane.worker.partition import PartitionRuntime, Phase
from multilane.worker.progress import ProgressRecord
from multilane.worker.progress_store import ProgressStore, choose_progress
from multilane.worker.retry import DeadLetterPublisher, RetryPolicy
from multilane.worker.watchdog import StallWatchdog

__all__ = ["Engine", "EngineError", "FencingError", "ReleasedPartition"]

log = logging.getLogger(__name__)

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
        return {"topic": self.topic, "partition": self.partition,
                "committed_offset": self.committed_offset}


class Engine:
    """One worker process's consumer, lanes, commits and control API.

    Invariants: ``_parts`` holds exactly the partitions this engine owns (any phase); every consumer
    call runs on ``_loop``'s thread; ``generation`` never decreases.
    """

    def __init__(self, config: EngineConfig, processor: Processor, hooks: Any | None = None) -> None:
        self.config = config
        self.processor = processor
        self.hooks = hooks
        self.generation = 0
        # Not None while fenced (:meth:`fence`): the generation held when the lease was lost. Invariant:
        # while set, nothing is fetched, processed or committed, and only an assignment with a higher
        # generation is accepted (it clears it).
        self._fenced_at: int | None = None
        self._factor = config.factor
        self._parts: dict[TopicPartitionId, PartitionRuntime] = {}
        # Partitions whose state is being opened (restore or promotion) before they join ``_parts``.
        # Invariant: disjoint from ``_parts``; an entry lives exactly while its open_partition runs.
        self._opening: set[TopicPartitionId] = set()
        # The state hooks' learner_status() as last read on an I/O thread (never on the loop: the
        # hooks may hold their lock during network calls). Refreshed by the housekeeping loop and by
        # refresh_learners(); read by status().
        self._learners: list[dict[str, Any]] = []
        self._learners_refresh: asyncio.Task[None] | None = None  # the housekeeping loop's, if running
        # Reopens scheduled after a StateDurabilityError (at most one task per partition at a time).
        self._reopens: dict[TopicPartitionId, asyncio.Task[None]] = {}
        # Partitions a reopen released and has not added back yet (its add failed and is retried).
        # Invariant: disjoint from ``_parts``; any control call or rebalance that decides a
        # partition's ownership removes it (the reopen then stops retrying).
        self._reopen_pending: set[TopicPartitionId] = set()
        # State closes running after a release answered (``_release_parts(close_after=True)``).
        # Invariant: an entry lives until its close finished; opening or learning the partition again,
        # and stop(), wait for it first.
        self._closing: dict[TopicPartitionId, asyncio.Future[Any]] = {}
        self._flow = FlowController(config.max_in_flight, config.max_in_flight_bytes,
                                    config.partition_max_records, config.partition_max_bytes,
                                    config.resume_fraction)
        self._retry = RetryPolicy(config.max_retries, config.retry_backoff_ms, config.retry_backoff_max_ms)
        self._hist = LatencyHistogram()
        self._watchdog = StallWatchdog(config.stall_threshold_s)
        collectors = getattr(hooks, "metrics_collectors", None)
        self.metrics = WorkerMetrics(self, collectors() if collectors is not None else ())
        self._is_async = is_async_processor(processor)
        self._proc_pool: ThreadPoolExecutor | None = None
        self._io_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="multilane-io")
        # learner_status() reads only: its own thread, so restores filling _io_pool never delay status
        self._status_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="multilane-status")
        self._consumer: Any = None
        self._producer: Any = None
        self._store: ProgressStore | None = None
        self._dlq: DeadLetterPublisher | None = None
        self._commits: CommitCycle | None = None
        self._progress: ProgressCycle | None = None
        self._env: LaneEnv | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._control_lock = asyncio.Lock()
        self._stop_requested: asyncio.Event | None = None
        self._stopping = False
        self._stopped = False
        self.ready = asyncio.Event()
        self.user_paused = False
        self.processing_rate = 0.0
        # Average number of records being processed at once (busy lanes), smoothed like
        # processing_rate over the same samples: processing seconds completed per second (Little's
        # law), so processing_rate / busy_lanes is the service rate of one busy lane.
        self.busy_lanes = 0.0
        self._released_total = 0  # processed counts of released partitions (for processed_total)
        self._last_rate_sample: tuple[float, int] = (time.monotonic(), 0)
        self._last_busy_sample = 0.0  # the latency histogram's sum at the last rate sample
        self._errors = ErrorLog()
        self._fetch: FetchLoop | None = None
        # True when partitions of more than one topic may be assigned (fetch runs compare topics).
        # Invariant: once True, stays True.
        self._multi_topic = len(set(config.topics) | {t for t, _ in config.assign}) != 1

    # ------------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create clients, make the progress topic, take the initial assignment, start the loops.

        1. Create the producer (dead letters, progress) and the consumer.
        2. Ensure the progress topic exists (one partition per input partition index).
        3. Operator mode: assign the initial partitions; standalone: subscribe.
        4. Start the fetch, housekeeping and producer loops; set ``ready``.
        """
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        if cfg.gc_threshold:
            g0, g1, g2 = gc.get_threshold()
            if g0 < cfg.gc_threshold:
                gc.set_threshold(cfg.gc_threshold, g1, g2)
        if not self._is_async:
            self._proc_pool = ThreadPoolExecutor(max_workers=cfg.max_threads,
                                                 thread_name_prefix="multilane-proc")
        self._env = LaneEnv(self.processor, self._is_async, self._proc_pool, cfg.yield_every,
                            cfg.sync_batch, self.hooks.view if self.hooks is not None else None)
        # 1. clients
        self._producer = Producer(cfg.producer_config())
        conf: dict[str, Any] = dict(cfg.consumer_config())
        conf["on_commit"] = self._on_commit
        conf["error_cb"] = self._errors.client_error
        self._consumer = Consumer(conf)
        self._fetch = FetchLoop(self._consumer, self._parts, self._flow, cfg.consume_batch, self._errors,
                                self._multi_topic)
        self._dlq = DeadLetterPublisher(self._producer, cfg.dead_letter_topic_for, self._ensure_topic)
        self._store = ProgressStore(cfg.bootstrap_servers, cfg.group, cfg.progress_topic_name,
                                    self._producer, security_config(cfg.consumer_overrides))
        self._commits = CommitCycle(self._consumer, self._store, self.hooks)
        self._progress = ProgressCycle(self._store, self.hooks, self._commits)
        # 2. progress topic
        topics = list(cfg.topics) or sorted({t for t, _ in cfg.assign})
        await self._retrying("create the progress topic", self._run_io, self._ensure_progress_topic, topics)
        # 3. assignment
        if cfg.operator_mode:
            if cfg.assign:
                await self._retrying("take the initial assignment", self.assign, list(cfg.assign),
                                     self.generation)
        else:
            self._consumer.subscribe(list(cfg.topics), on_assign=self._on_assign,
                                     on_revoke=self._on_revoke, on_lost=self._on_lost)
        # 4. loops. Objects alive now (modules, clients, config) move to the collector's permanent
        # generation: full collections then do not traverse them again and again.
        if cfg.gc_threshold:
            gc.freeze()
        loop = self._loop
        self._tasks = [
            loop.create_task(self._fetcher().run(), name="multilane-fetch"),
            loop.create_task(self._housekeeping_loop(), name="multilane-housekeeping"),
            loop.create_task(self._producer_loop(), name="multilane-producer"),
        ]
        if cfg.progress_interval_ms > 0:
            self._tasks.append(loop.create_task(self._progress_loop(), name="multilane-progress"))
        self.ready.set()
        log.info("engine %s started (%s mode, ordering=%s, factor=%d)", cfg.worker_id,
                 "operator" if cfg.operator_mode else "standalone", cfg.ordering.value, self._factor)

    async def _retrying(self, what: str, fn: Any, *args: Any) -> Any:
        """Call ``fn(*args)`` until it succeeds (the broker may not be reachable yet), with backoff."""
        delay = 0.5
        while True:
            try:
                return await fn(*args)
            except (KafkaException, RuntimeError) as exc:
                if self._stop_requested is not None and self._stop_requested.is_set():
                    raise
                log.warning("cannot %s yet (%s); retrying in %.1fs", what, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _require_started(self) -> None:
        if self._consumer is None or self._stopped:
            raise EngineError("the engine is not running")

    def _fetcher(self) -> FetchLoop:
        if self._fetch is None:
            raise EngineError("the engine has not started")
        return self._fetch

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop (safe from signal handlers on the loop)."""
        if self._stop_requested is not None:
            self._stop_requested.set()

    async def run(self) -> None:
        """Start, wait until :meth:`request_stop`, then stop cleanly."""
        await self.start()
        assert self._stop_requested is not None
        await self._stop_requested.wait()
        await self.stop()

    async def wait_stop_requested(self) -> None:
        assert self._stop_requested is not None
        await self._stop_requested.wait()

    async def stop(self) -> None:
        """Drain, commit and close (steps 1-4); idempotent.

        1. Stop fetching (pause every partition).
        2. Release every partition: drain in-flight records up to ``drain_timeout_s``, final
           synchronous commit with progress, ``close_partition``.
        3. Stop the loops; flush the producer.
        4. Close the consumer (standalone: leaves the group) and the thread pools.
        """
        if self._stopped or self._consumer is None:
            return
        self._stopped = True
        # 1. stop fetching
        self._fetcher().pause_fetch(list(self._parts.values()))
        # 2. drain and commit
        try:
            async with self._control_lock:
                await self._release_parts(list(self._parts.values()), self.config.drain_timeout_s,
                                          unassign=self.config.operator_mode)
        except Exception:
            log.exception("error while releasing partitions at shutdown")
        await self._closed(list(self._closing))
        # 3. loops and producer
        self._stopping = True
        if self._fetch is not None:
            self._fetch.stopping = True
        background = [*self._tasks, *self._reopens.values()]
        if self._learners_refresh is not None:
            background.append(self._learners_refresh)
        for t in background:
            t.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if self._dlq is not None:
            self._dlq.close()
        await self._run_io(self._producer.flush, 10.0)
        # 4. close
        try:
            self._consumer.close()
        except Exception as exc:  # closing after a lost broker
            log.warning("consumer close: %s", exc)
        # close the producer, so that it stops reconnecting
        try:
            self._producer.close()
        except Exception as exc:
            log.debug("producer close: %s", exc)
        self._dlq = None
        self._store = None
        self._commits = None
        self._producer = None
        if self._proc_pool is not None:
            self._proc_pool.shutdown(wait=False, cancel_futures=True)
        self._io_pool.shutdown(wait=False, cancel_futures=True)
        self._status_pool.shutdown(wait=False, cancel_futures=True)
        log.info("engine %s stopped", self.config.worker_id)

    # ------------------------------------------------------------------------------------------------
    # control API (call on the engine's loop)
    # ------------------------------------------------------------------------------------------------

    async def assign(self, partitions: Iterable[TopicPartitionId], generation: int,
                     release_deadline_s: float = 30.0) -> list[ReleasedPartition]:
        """Make the assignment exactly ``partitions`` (operator mode); fenced by ``generation``.

        1. Refuse (FencingError) a generation below the current one, or, while fenced
           (:meth:`fence`), one not above the generation held when fenced; adopt the new generation.
        2. Release partitions no longer wanted (drain up to the deadline, final commit). After a
           fence: drop every fenced partition without committing, then lift the fence.
        3. Add new partitions at their committed offset, skipping what their progress says is done.
        """
        if not self.config.operator_mode:
            raise EngineError("assign() is for operator mode; standalone mode uses group rebalances")
        wanted = _normalise(partitions)
        self._require_started()
        async with self._control_lock:
            # 1. fencing
            if generation < self.generation:
                raise FencingError(f"assignment generation {generation} is older than current "
                                   f"generation {self.generation}")
            if self._fenced_at is not None and generation <= self._fenced_at:
                raise FencingError(f"fenced (lease lost) at generation {self._fenced_at}: waiting for "
                                   f"a higher generation than {generation}")
            self.generation = generation
            self._reopen_pending.clear()  # this assignment decides every partition
            # 2. release (fenced partitions: dropped uncommitted, re-added fresh if still wanted)
            if self._fenced_at is not None:
                fenced = [p for p in self._parts.values() if p.phase == Phase.FENCED]
                await self._release_parts(fenced, 0.0, unassign=True, commit=False)
                self._fenced_at = None
                assert self._commits is not None
                self._commits.fenced = False
                log.info("fence lifted by generation %d", generation)
            gone = [p for tp, p in self._parts.items() if tp not in wanted]
            released = await self._release_parts(gone, release_deadline_s, unassign=True,
                                                 close_after=True)
            # 3. add
            new = [tp for tp in wanted if tp not in self._parts]
            if new:
                await self._add_partitions(new)
            return released

    async def release(self, partitions: Iterable[TopicPartitionId],
                      deadline_s: float = 30.0) -> list[ReleasedPartition]:
        """Drain and hand back partitions; returns their final committed offsets."""
        tps = _normalise(partitions)
        self._require_started()
        async with self._control_lock:
            self._reopen_pending.difference_update(tps)
            unknown = [tp for tp in tps if tp not in self._parts]
            if unknown:
                log.info("release of partitions not owned: %s", unknown)
            parts = [self._parts[tp] for tp in tps if tp in self._parts]
            return await self._release_parts(parts, deadline_s, unassign=self.config.operator_mode,
                                             close_after=self.config.operator_mode)

    async def set_factor(self, factor: int) -> int:
        """Change lanes per partition at run time (quiesce + re-route; see LaneGroup.resize)."""
        if not isinstance(factor, int) or isinstance(factor, bool) or not 1 <= factor <= 65536:
            raise EngineError(f"factor must be an int in [1, 65536], got {factor!r}")
        async with self._control_lock:
            self._factor = factor
            await asyncio.gather(*(p.lanes.resize(factor) for p in list(self._parts.values())
                                   if p.phase != Phase.FENCED))
        return factor

    def pause(self) -> bool:
        """Stop fetching every partition (records in flight still finish)."""
        self.user_paused = True
        parts = list(self._parts.values())
        for p in parts:
            p.user_paused = True
        if self._fetch is not None:
            self._fetch.pause_fetch(parts)
        return True

    def resume(self) -> bool:
        """Undo :meth:`pause` (partitions paused by back-pressure stay paused until drained)."""
        self.user_paused = False
        for p in self._parts.values():
            p.user_paused = False
            if not p.flow_counters.paused and p.phase == Phase.ACTIVE:
                self._fetcher().resume_fetch(p)
        return False

    @property
    def fenced(self) -> bool:
        """True between :meth:`fence` and the next accepted assignment."""
        return self._fenced_at is not None

    def fence(self) -> None:
        """Stop processing and committing at once: the worker's Lease was lost (``LeaseKeeper``'s
        ``on_lost``), so the operator may hand its partitions to another worker (steps 1-4).
        Synchronous, on the loop thread, without awaiting; idempotent; operator mode only.

        1. Commits stop: the commit cycle sends no further commit request (also one already running),
           and no release or stop commits a fenced partition.
        2. Every owned partition goes to phase ``fenced``: its fetching is paused, and messages
           already fetched for it are ignored by the fetch loop.
        3. Its lanes are closed: queued records are dropped, running async records cancelled, a
           thread-pool batch stops after its current record; outcomes arriving later are ignored.
        4. :meth:`assign` refuses every generation up to the current one; an assignment with a higher
           generation drops the fenced partitions without committing and adds the wanted ones from
           their committed offsets (the next owner may have committed meanwhile). Until then the
           reopen of a partition whose state lost a change does not run.
        """
        if not self.config.operator_mode:
            raise EngineError("fence() is for operator mode (the Lease belongs to the operator)")
        if self._fenced_at is not None:
            return
        # 1. no more commits
        self._fenced_at = self.generation
        if self._commits is not None:
            self._commits.fenced = True
        # 2. stop fetching
        parts = list(self._parts.values())
        for p in parts:
            p.phase = Phase.FENCED
        if self._fetch is not None:
            self._fetch.pause_fetch(parts)
        # 3. stop processing
        for p in parts:
            p.close()
        # 4. (assign) wait for a higher generation
        log.error("fenced at generation %d: stopped processing and committing %s", self.generation,
                  [(p.topic, p.partition) for p in parts])

    # -- learner calls (state hooks; docs/state.md, "Learner protocol") ---------------------------------

    def _state_call(self, verb: str) -> Any:
        fn = getattr(self.hooks, verb, None) if self.hooks is not None else None
        if fn is None:
            raise EngineError(f"{verb} needs a worker with a state store")
        return fn

    async def learn(self, partitions: Iterable[TopicPartitionId]) -> list[TopicPartitionId]:
        """Start learning partitions this worker does not process (``hooks.learn``; returns once each
        learner's tail thread runs). A partition this engine owns is refused by the hooks."""
        tps = _normalise(partitions)
        fn = self._state_call("learn")
        self._require_started()
        async with self._control_lock:
            await self._closed(tps)
            for tp in tps:
                await self._run_io(fn, tp[0], tp[1])
        return tps

    async def promote(self, partitions: Iterable[TopicPartitionId]) -> list[TopicPartitionId]:
        """Check that each partition is learning here, healthy and caught up (``hooks.promote``;
        raises the hooks' ``StatePhaseError`` otherwise). The switch itself is the assignment: opening
        a learning partition (:meth:`assign`) is the promotion."""
        tps = _normalise(partitions)
        fn = self._state_call("promote")
        for tp in tps:
            await self._run_io(fn, tp[0], tp[1])
        return tps

    async def demote(self, partitions: Iterable[TopicPartitionId],
                     deadline_s: float = 30.0) -> list[ReleasedPartition]:
        """Active -> learner (steps 1-2); returns the released partitions with their final offsets.

        1. Release the partitions this engine owns like :meth:`release` (drain, final commit, close
           the state cleanly when nothing was abandoned): no lane may still use the store.
        2. ``hooks.demote``: learn from the checkpoint just written (or from scratch after an unclean
           close). Partitions not owned here just start learning.
        """
        tps = _normalise(partitions)
        fn = self._state_call("demote")
        self._require_started()
        async with self._control_lock:
            # 1. release
            self._reopen_pending.difference_update(tps)
            parts = [self._parts[tp] for tp in tps if tp in self._parts]
            released = await self._release_parts(parts, deadline_s, unassign=self.config.operator_mode)
            # 2. learn (after any background close of an earlier release)
            await self._closed(tps)
            for tp in tps:
                await self._run_io(fn, tp[0], tp[1])
        return released

    async def drop(self, partitions: Iterable[TopicPartitionId]) -> list[TopicPartitionId]:
        """Stop learning and delete the local state of partitions (``hooks.drop``); refused by the
        hooks for a partition that is active here (release it first)."""
        tps = _normalise(partitions)
        fn = self._state_call("drop")
        self._require_started()
        async with self._control_lock:
            await self._closed(tps)
            for tp in tps:
                await self._run_io(fn, tp[0], tp[1])
        return tps

    @property
    def factor(self) -> int:
        return self._factor

    def status(self) -> dict[str, Any]:
        """The worker's status (``GET /v1/status``; docs/architecture.md, "Worker control API").

        ``partitions``: the partitions this engine owns, plus those whose state is being opened
        (phase ``promoting``: a restore or a learner's promotion before processing starts); their
        ``restore_lag`` comes from the state hooks' ``learner_status()``. ``learners``: every
        partition the state hooks know (restoring, learning, promoting, active, failed) with its
        restore progress; learners of partitions this engine does not own appear only there (the
        operator counts every ``partitions`` entry as owned). The learner figures are those of the
        last :meth:`refresh_learners` (the housekeeping loop refreshes them every half second).
        """
        parts = sorted(self._parts.values(), key=lambda p: (p.topic, p.partition))
        learners = self._learners
        by_tp = {(str(e.get("topic")), int(e.get("partition", -1))): e for e in learners}
        entries = []
        for p in parts:
            entry = p.status()
            learner = by_tp.get((p.topic, p.partition))
            if learner is not None:
                entry["restore_lag"] = int(learner.get("restore_lag") or 0)
            entries.append(entry)
        for tp in sorted(self._opening):
            learner = by_tp.get(tp, {})
            entries.append({"topic": tp[0], "partition": tp[1], "phase": Phase.PROMOTING,
                            "committed": learner.get("committed_offset"), "position": None,
                            "high_watermark": None, "lag": None, "in_flight": 0,
                            "restore_lag": int(learner.get("restore_lag") or 0),
                            "state_phase": learner.get("phase")})
        out: dict[str, Any] = {
            "worker_id": self.config.worker_id,
            "generation": self.generation,
            "factor": self._factor,
            "mode": self.config.ordering.value,
            "paused": self.user_paused,
            "fenced": self._fenced_at is not None,
            "partitions": entries,
            "processed_total": self.processed_total(),
            "processing_rate": round(self.processing_rate, 3),
            "busy_lanes": round(self.busy_lanes, 3),
            "in_flight": self._flow.records,
            "in_flight_bytes": self._flow.bytes,
            "peak_in_flight": self._flow.peak_records,
            "peak_in_flight_bytes": self._flow.peak_bytes,
            "max_in_flight": self._flow.max_records,
            "max_in_flight_bytes": self._flow.max_bytes,
            "stalled": self._watchdog.stalled,
            "back_pressure_pauses": sum(p.flow_counters.pauses for p in parts),
        }
        if self.hooks is not None:
            out["learners"] = learners
        return out

    async def refresh_learners(self) -> None:
        """Re-read the state hooks' ``learner_status()`` on an I/O thread (for :meth:`status`)."""
        if self.hooks is not None and not self._stopping:
            self._learners = await asyncio.get_running_loop().run_in_executor(
                self._status_pool, self._learner_status)

    def _learner_status(self) -> list[dict[str, Any]]:
        """The state hooks' ``learner_status()`` ([] without hooks or when it fails; blocking)."""
        fn = getattr(self.hooks, "learner_status", None) if self.hooks is not None else None
        if fn is None:
            return []
        try:
            return list(fn())
        except Exception:
            log.exception("learner_status() failed")
            return []

    def processed_total(self) -> int:
        return self._released_total + sum(p.processed for p in self._parts.values())

    # -- metrics source --------------------------------------------------------------------------------

    def metric_partitions(self) -> list[PartitionRuntime]:
        return list(self._parts.values())

    @property
    def histogram(self) -> LatencyHistogram:
        return self._hist

    def stalled_count(self) -> int:
        return self._watchdog.stalled

    def lane_utilisation(self) -> float:
        parts = list(self._parts.values())
        if not parts:
            return 0.0
        return sum(p.lanes.busy_fraction for p in parts) / len(parts)

    def last_progress_bytes(self) -> int:
        return self._commits.last_progress_bytes if self._commits is not None else 0

    # ------------------------------------------------------------------------------------------------
    # partitions: add and release
    # ------------------------------------------------------------------------------------------------

    def _new_runtime(self, topic: str, partition: int, committed: int | None,
                     progress: ProgressRecord | None) -> PartitionRuntime:
        assert self._env is not None and self._dlq is not None
        cfg = self.config
        return PartitionRuntime(topic, partition, cfg.ordering, self._factor, self._env, self._flow,
                                self._retry, self._dlq, self._hist, cfg.group, cfg.worker_id,
                                committed, progress)

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
        progress = await asyncio.gather(*(self._run_io(self._load_progress, tp, committed[tp])
                                          for tp in tps))
        # 3. state restore
        if self.hooks is not None:
            await self._open_states([(tp, committed[tp][0], prog)
                                     for tp, prog in zip(tps, progress, strict=True)])
        runtimes = [self._new_runtime(tp[0], tp[1], committed[tp][0], prog)
                    for tp, prog in zip(tps, progress, strict=True)]
        # 4. start
        for rt in runtimes:
            self._activate(rt)
        self._consumer.incremental_assign([
            TopicPartition(rt.topic, rt.partition, rt.committed) if rt.committed is not None
            else TopicPartition(rt.topic, rt.partition) for rt in runtimes
        ])
        self._resume_assigned(runtimes, self._consumer)
        log.info("assigned %s", [f"{rt.topic}/{rt.partition}@{rt.committed}" for rt in runtimes])

    async def _open_states(self, items: list[tuple[TopicPartitionId, int | None,
                                                   ProgressRecord | None]]) -> None:
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
                return_exceptions=True)
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
        client = Consumer({"bootstrap.servers": cfg.bootstrap_servers, "group.id": cfg.group,
                           "enable.auto.commit": False, **security_config(cfg.consumer_overrides)})
        try:
            return self._committed(tps, client)
        finally:
            client.close()

    def _committed(self, tps: list[TopicPartitionId],
                   client: Any = None) -> dict[TopicPartitionId, _Committed]:
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
            return choose_progress(meta, source="commit metadata", group=cfg.group, topic=tp[0],
                                   partition=tp[1], committed=off)
        log.info("no usable progress record for %s/%d at %d; replaying from the committed offset",
                 tp[0], tp[1], off)
        return None

    async def _release_parts(self, parts: list[PartitionRuntime], deadline_s: float,
                             unassign: bool, commit: bool = True,
                             close_after: bool = False) -> list[ReleasedPartition]:
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
                log.warning("releasing %s/%d with %d records still running after %.1fs; they will be "
                            "replayed by the next owner", p.topic, p.partition, p.lanes.running,
                            deadline_s)
            elif p.in_flight:
                log.info("releasing %s/%d: %d queued records go to the next owner", p.topic,
                         p.partition, p.in_flight)
        # 3. stop lanes (keep the tracker: completed work is still committed); records running on
        #    the thread pool cannot be cancelled: give them until the deadline (at least a moment)
        #    to return, so that the next owner does not run a key while we still do
        for p in parts:
            p.close()
        batches = [asyncio.wrap_future(f) for p in parts for f in p.lanes.batches_running()]
        if batches:
            _done, pending = await asyncio.wait(batches, timeout=max(1.0, deadline - time.monotonic()))
            if pending:
                log.warning("%d thread-pool batches still running after the release deadline",
                            len(pending))
        # 4. final commit
        assert self._commits is not None
        if commit:
            try:
                for p in await self._commits.run(parts, final=True):
                    clean[id(p)] = False
            except KafkaException as exc:
                log.warning("final commit failed for %s: %s", [(p.topic, p.partition) for p in parts],
                            exc)
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
                        self._run_io(self._close_state_quietly, tp, clean[id(p)]))
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

    # -- standalone mode: rebalance callbacks (run inside consume(), on the loop thread) -------------

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Cooperative assign: committed offsets, progress, state restore, then assign (blocking)."""
        tps = [(tp.topic, tp.partition) for tp in partitions if (tp.topic, tp.partition) not in self._parts]
        if not tps:
            return
        try:
            committed = self._committed(tps)
        except KafkaException as exc:
            # librdkafka then starts at the committed offset itself; without it no progress is used.
            log.warning("cannot read committed offsets of %s (%s); starting without progress", tps, exc)
            committed = {tp: (None, None) for tp in tps}
        # progress reads in parallel on the I/O threads (this callback blocks the loop meanwhile)
        futs = {tp: self._io_pool.submit(self._load_progress, tp, committed[tp]) for tp in tps}
        progress = {tp: futs[tp].result() for tp in tps}
        if self.hooks is not None:
            # state restores in parallel, all or nothing (as in _open_states)
            hooks = self.hooks
            opens = {tp: self._io_pool.submit(hooks.open_partition, tp[0], tp[1], committed[tp][0],
                                              progress[tp]) for tp in tps}
            concurrent.futures.wait(list(opens.values()))
            failed = [e for f in opens.values() if (e := f.exception()) is not None]
            if failed:
                for tp, f in opens.items():
                    if f.exception() is None:
                        self._close_state_quietly(tp, False)
                raise failed[0]
        runtimes = [self._new_runtime(tp[0], tp[1], committed[tp][0], progress[tp]) for tp in tps]
        for rt in runtimes:
            self._activate(rt)
        consumer.incremental_assign([
            TopicPartition(rt.topic, rt.partition, rt.committed) if rt.committed is not None
            else TopicPartition(rt.topic, rt.partition) for rt in runtimes
        ])
        self._resume_assigned(runtimes, consumer)
        log.info("group assigned %s", [f"{rt.topic}/{rt.partition}@{rt.committed}" for rt in runtimes])

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        """Cooperative revoke: stop the lanes and commit completed work with progress (blocking).

        Records still running are abandoned; the progress record lets the next owner replay only
        those (and the queued ones), not what already completed.
        """
        parts = [self._parts[(tp.topic, tp.partition)] for tp in partitions
                 if (tp.topic, tp.partition) in self._parts]
        self._reopen_pending.difference_update((tp.topic, tp.partition) for tp in partitions)
        if not parts:
            return
        # clean close only for partitions with nothing abandoned and a successful commit (below)
        clean = {id(p): p.in_flight == 0 for p in parts}
        for p in parts:
            p.phase = Phase.RELEASING
            p.close()
        # Records running on the thread pool keep running while the loop is blocked here; wait for
        # them (each batch stops after its current record) so the next owner never overlaps a key.
        batches = [f for p in parts for f in p.lanes.batches_running()]
        if batches:
            _done, pending = concurrent.futures.wait(batches, timeout=self.config.drain_timeout_s)
            if pending:
                log.warning("%d thread-pool batches still running after revoke", len(pending))
        assert self._commits is not None
        try:
            for p in self._commits.run_blocking(parts, self._producer):
                clean[id(p)] = False
        except Exception as exc:
            log.warning("commit on revoke failed: %s", exc)
            clean = dict.fromkeys(clean, False)
        for p in parts:
            self._close_state_quietly((p.topic, p.partition), clean[id(p)] and _fully_committed(p))
            self._parts.pop((p.topic, p.partition), None)
            self._flow.set_partitions(len(self._parts))
            self._released_total += p.processed
        log.info("group revoked %s", [(p.topic, p.partition, p.committed) for p in parts])

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        """Partitions lost (session expired): drop them without committing."""
        self._reopen_pending.difference_update((tp.topic, tp.partition) for tp in partitions)
        for tp in partitions:
            p = self._parts.pop((tp.topic, tp.partition), None)
            self._flow.set_partitions(len(self._parts))
            if p is not None:
                p.close()
                self._released_total += p.processed
                if self.hooks is not None:
                    self.hooks.close_partition(p.topic, p.partition, False)
        log.warning("group lost %s", [(tp.topic, tp.partition) for tp in partitions])

    # ------------------------------------------------------------------------------------------------
    # loops
    # ------------------------------------------------------------------------------------------------

    def _on_commit(self, err: Any, tps: list[Any]) -> None:
        if self._commits is not None:
            self._commits.on_commit(err, tps, self._parts)

    async def _housekeeping_loop(self) -> None:
        interval = self.config.commit_interval_ms / 1000.0
        assert self._commits is not None
        next_commit = time.monotonic() + interval
        while not self._stopping:
            await asyncio.sleep(min(0.5, interval))
            now = time.monotonic()
            self._watchdog.scan([s for p in self._parts.values() for s in p.lanes.slots()], now)
            self._update_watermarks()
            self._update_rate(now)
            # learner figures: in the background (the hooks' lock may be held by a learn() for a
            # while; commits must not wait for it)
            task = self._learners_refresh
            if self.hooks is not None and (task is None or task.done()):
                self._learners_refresh = asyncio.get_running_loop().create_task(self.refresh_learners())
            if now >= next_commit:
                next_commit = now + interval
                active = [p for p in self._parts.values() if p.phase == Phase.ACTIVE]
                try:
                    lost = await self._commits.run(active)
                except Exception:
                    log.exception("commit cycle failed; retrying next cycle")
                    continue
                for p in lost:
                    self._schedule_reopen(p)

    def _schedule_reopen(self, part: PartitionRuntime) -> None:
        """Start :meth:`_reopen_lost` for ``part`` unless one is already running for it."""
        tp = (part.topic, part.partition)
        task = self._reopens.get(tp)
        if task is not None and not task.done():
            return
        assert self._loop is not None
        self._reopens[tp] = self._loop.create_task(self._reopen_lost(part), name=f"multilane-reopen-{tp}")

    async def _reopen_lost(self, part: PartitionRuntime) -> None:
        """Reopen a partition whose changelog lost a record (``before_commit`` raised
        :class:`StateDurabilityError`), so that every record not committed is processed again
        (steps 1-3, under the control lock).

        1. Still the same runtime (not released or reopened meanwhile)? Otherwise nothing to do.
        2. Release it without committing: drain (up to ``drain_timeout_s``), stop its lanes,
           ``close_partition(clean=False)`` (no checkpoint: the next open wipes the store), unassign.
        3. Add it again: committed offset and progress as on any assignment, ``open_partition``
           (full restore from the changelog), fetching from the committed offset. If that fails,
           retry with backoff (lock released in between) while it is in ``_reopen_pending``, i.e.
           until a control call or rebalance decides the partition's ownership.
        In standalone mode the partition stays in the group's assignment throughout; only the local
        consumer assignment is dropped and retaken.
        """
        tp = (part.topic, part.partition)
        delay = 0.5
        async with self._control_lock:
            # 1.
            if self._stopped or self._fenced_at is not None or self._parts.get(tp) is not part:
                return
            log.warning("reopening %s/%d: its state changes are not durable; records after the last "
                        "commit will be processed again", tp[0], tp[1])
            # 2.
            await self._release_parts([part], self.config.drain_timeout_s, unassign=True, commit=False)
            self._reopen_pending.add(tp)
            # 3.
            if await self._try_reopen_add(tp, delay):
                return
        while not self._stopped:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
            async with self._control_lock:
                if self._stopped or self._fenced_at is not None or tp not in self._reopen_pending:
                    return
                if await self._try_reopen_add(tp, delay):
                    return

    async def _try_reopen_add(self, tp: TopicPartitionId, delay: float) -> bool:
        """Step 3 of :meth:`_reopen_lost` (control lock held): True when done."""
        try:
            await self._add_partitions([tp])
        except Exception as exc:
            log.warning("cannot reopen %s/%d yet (%s); retrying in %.1fs", tp[0], tp[1], exc, delay)
            return False
        self._reopen_pending.discard(tp)
        return True

    def _update_watermarks(self) -> None:
        for p in self._parts.values():
            try:
                _lo, hi = self._consumer.get_watermark_offsets(
                    TopicPartition(p.topic, p.partition), cached=True)
            except KafkaException:
                continue
            if hi is not None and hi >= 0:
                p.high_watermark = hi

    def _update_rate(self, now: float) -> None:
        t0, n0 = self._last_rate_sample
        n = self.processed_total()
        if now - t0 >= 1.0:
            rate = (n - n0) / (now - t0)
            prev = self.processing_rate
            self.processing_rate = rate if prev == 0 else 0.5 * prev + 0.5 * rate
            self._last_rate_sample = (now, n)
            busy_s = self._hist.sum
            busy = (busy_s - self._last_busy_sample) / (now - t0)
            self.busy_lanes = busy if self.busy_lanes == 0 else 0.5 * self.busy_lanes + 0.5 * busy
            self._last_busy_sample = busy_s

    async def _progress_loop(self) -> None:
        """Every ``progress_interval_ms``: progress records of the active partitions (between commits)."""
        interval = self.config.progress_interval_ms / 1000.0
        assert self._progress is not None
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._progress.run([p for p in self._parts.values() if p.phase == Phase.ACTIVE])
            except Exception:
                log.exception("progress cycle failed; retrying next cycle")
            await asyncio.sleep(self._progress.next_delay(interval, time.monotonic() - started))

    async def _producer_loop(self) -> None:
        producer = self._producer
        while not self._stopping:
            producer.poll(0)
            await asyncio.sleep(0.005 if len(producer) else 0.05)

    # ------------------------------------------------------------------------------------------------
    # helpers
    # ------------------------------------------------------------------------------------------------

    async def _run_io(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._io_pool, fn, *args)

    def _ensure_progress_topic(self, topics: list[str]) -> None:
        assert self._store is not None
        cfg = self.config
        self._store.ensure_topic(max_partition_count(cfg.bootstrap_servers, topics,
                                                     security_config(cfg.consumer_overrides)))

    def _ensure_topic(self, topic: str) -> None:
        """Create a dead-letter topic if it does not exist (blocking, short timeout)."""
        cfg = self.config
        ensure_topic(cfg.bootstrap_servers, topic, security_config(cfg.consumer_overrides))


def _busy(part: PartitionRuntime) -> bool:
    """Records of ``part`` still running, or dead letters still being written."""
    return part.lanes.running > 0 or bool(part.dlq_pending)


def _fully_committed(part: PartitionRuntime) -> bool:
    """True when the broker confirmed a commit of everything committable (the partition-level result
    of a synchronous commit can fail without an exception), or nothing was ever committable."""
    c = part.tracker.committable()
    return c is None or c == part.committed


def _normalise(partitions: Iterable[Any]) -> list[TopicPartitionId]:
    out: list[TopicPartitionId] = []
    for tp in partitions:
        if isinstance(tp, dict):
            topic, part = tp.get("topic"), tp.get("partition")
        else:
            try:
                topic, part = tp
            except (TypeError, ValueError) as exc:
                raise EngineError(f"a partition must be (topic, partition), got {tp!r}") from exc
        if not isinstance(topic, str) or not topic or not isinstance(part, int) or isinstance(part, bool) \
                or part < 0:
            raise EngineError(f"a partition must be (topic: str, partition: int >= 0), got {tp!r}")
        if (topic, part) not in out:
            out.append((topic, part))
    return out
