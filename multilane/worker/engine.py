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
- ``ownership``: the partition-ownership protocol (add: committed offsets, progress, state, activate;
  release: stop fetching, let running records finish, commit, close), for both modes;
- ``group``: group mode's rebalance callbacks, an adapter onto ``ownership``;
- ``views``: the status and the metric-source accessors;
- ``housekeeping``: the *housekeeping loop* (commit cycle, watchdog, lag, rate, reopen after a lost
  change), the *progress loop* (progress records between commits) and the *producer loop*;
- this module: lifecycle and composition, and the control API.

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

Length (~520 lines): the lifecycle, the control API and the learner verbs share the control lock
and the fencing rules, so they stay together; the protocol's steps are in ``ownership``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer

from multilane.api import Processor, is_async_processor
from multilane.worker.admin import ensure_topic, max_partition_count, security_config
from multilane.worker.commits import CommitCycle, ProgressCycle
from multilane.worker.config import EngineConfig, TopicPartitionId
from multilane.worker.fetch import ErrorLog, FetchLoop
from multilane.worker.flow import FlowController
from multilane.worker.group import GroupRebalanceAdapter
from multilane.worker.housekeeping import Housekeeping
from multilane.worker.lanes import LaneEnv
from multilane.worker.metrics import LatencyHistogram, WorkerMetrics
from multilane.worker.ownership import EngineError, FencingError, ReleasedPartition
from multilane.worker.partition import PartitionRuntime, Phase
from multilane.worker.progress_store import ProgressStore
from multilane.worker.retry import DeadLetterPublisher, RetryPolicy
from multilane.worker.watchdog import StallWatchdog

__all__ = ["Engine", "EngineError", "FencingError", "ReleasedPartition"]

log = logging.getLogger(__name__)



class Engine(GroupRebalanceAdapter, Housekeeping):
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
        # True from a lost Lease (fence()) until it is renewed (lease_renewed()). Invariant: while
        # True, assign() accepts no generation at all, so a worker that may be considered dead by the
        # operator at any moment never resumes processing.
        self._lease_lost = False
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
        """Stop, commit and close (steps 1-4); idempotent.

        1. Stop fetching (pause every partition).
        2. Release every partition like a handoff: the records already running finish (up to
           ``drain_timeout_s``), queued ones are left to the next owner (the committed offset and the
           progress record say what is done), final synchronous commit with progress,
           ``close_partition``.
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
            if self._fenced_at is not None and self._lease_lost:
                # the operator may not see the Lease as expired yet; processing resumes only once it
                # is held again (else a new owner could start while this worker still runs)
                raise FencingError(f"fenced (lease lost) at generation {self._fenced_at}: the lease is "
                                   "not renewed yet")
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

    def lease_renewed(self) -> None:
        """The Lease is held again (``LeaseKeeper``'s ``on_renewed``): a fenced engine may now accept
        an assignment with a higher generation (it stays fenced until one arrives)."""
        self._lease_lost = False

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
        4. :meth:`assign` refuses every generation up to the current one, and every generation while
           the Lease is not renewed (:meth:`lease_renewed`); then an assignment with a higher
           generation drops the fenced partitions without committing and adds the wanted ones from
           their committed offsets (the next owner may have committed meanwhile). Until then the
           reopen of a partition whose state lost a change does not run.
        """
        if not self.config.operator_mode:
            raise EngineError("fence() is for operator mode (the Lease belongs to the operator)")
        self._lease_lost = True
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
        return await self._each_state_call("learn", partitions)

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
        return await self._each_state_call("drop", partitions)

    async def _each_state_call(self, verb: str,
                               partitions: Iterable[TopicPartitionId]) -> list[TopicPartitionId]:
        """``hooks.<verb>`` on each partition, under the control lock, after any background close."""
        tps = _normalise(partitions)
        fn = self._state_call(verb)
        self._require_started()
        async with self._control_lock:
            await self._closed(tps)
            for tp in tps:
                await self._run_io(fn, tp[0], tp[1])
        return tps

    # ------------------------------------------------------------------------------------------------
    # helpers
    # ------------------------------------------------------------------------------------------------

    def _ensure_progress_topic(self, topics: list[str]) -> None:
        assert self._store is not None
        cfg = self.config
        self._store.ensure_topic(max_partition_count(cfg.bootstrap_servers, topics,
                                                     security_config(cfg.consumer_overrides)))

    def _ensure_topic(self, topic: str) -> None:
        """Create a dead-letter topic if it does not exist (blocking, short timeout)."""
        cfg = self.config
        ensure_topic(cfg.bootstrap_servers, topic, security_config(cfg.consumer_overrides))


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
