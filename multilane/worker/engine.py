"""The worker engine: one Kafka consumer feeding the lanes of every assigned partition. Does I/O.

Everything runs on ONE asyncio event loop, and every call on the engine's consumer happens on that
loop's thread. :class:`Engine` wires parts that each own their fields and hold one protocol:

- ``partition_set``: :class:`PartitionSet`, the owned partitions and those opening, closing or
  waiting for a reopen (the only writer of those sets);
- ``ownership``: :class:`Ownership`, the one add and the one release of a partition (numbered
  steps), on the loop (operator mode, reopen) or blocking (``group``: the rebalance callbacks);
- ``fetch``: the *fetch loop* -- ``consume()``, runs of messages to their :class:`PartitionRuntime`,
  back-pressure (pause, then resume + seek at the low-water mark);
- ``commits``: the one commit path (``plan_commit`` and its async and blocking drivers), and the
  progress cycle;
- ``housekeeping``: the *housekeeping loop* (commit cycle, watchdog, lag, rate, learner figures),
  the *progress loop* and the *producer loop*; ``reopen``: reopen after a lost state change;
- ``assignment``: the control verbs over partitions (assign, release, factor, pause, fence) and
  their fencing rules; ``control_state``: what they decided (written there and here only);
- ``views``: the status; ``hooks``: the typed state hooks;
- ``partition``, ``lanes``, ``flow``, ``retry``, ``watchdog``, ``progress_store``, ``admin``: one
  partition, lane runners, bounds, retries and dead letters, stall detection, progress persistence,
  topic creation.

Modes: operator mode (``assign()`` only; the assignment changes through :meth:`Engine.assign` /
:meth:`Engine.release`, fenced by a generation number) and standalone mode (``subscribe()`` with the
cooperative-sticky assignor; revoked partitions are committed in the revoke callback).

The Python control API (:meth:`assign`, :meth:`release`, :meth:`set_factor`, :meth:`pause`,
:meth:`resume`, :meth:`status`, and with learner hooks :meth:`learn`, :meth:`promote`, :meth:`demote`,
:meth:`drop`) must be called on the engine's loop; ``runner.EngineRunner`` wraps it for other threads.

State hooks (:class:`~multilane.worker.hooks.PartitionStateHooks`, e.g. ``StateManager``): a partition's
state is opened before any of its records is fetched, ``before_commit`` precedes every commit (a
:class:`StateDurabilityError` there reopens the partition without committing, see
:mod:`multilane.worker.reopen`), and it is closed after the final commit (cleanly only when that
commit succeeded and no record was abandoned).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaException, Producer

from multilane.api import Processor, is_async_processor
from multilane.worker.admin import ensure_topic, max_partition_count, security_config
from multilane.worker.assignment import AssignmentControl, normalise_partitions
from multilane.worker.commits import CommitCycle, ProgressCycle
from multilane.worker.config import EngineConfig, TopicPartitionId
from multilane.worker.control_state import ControlState, Lifecycle
from multilane.worker.fetch import ErrorLog, FetchLoop
from multilane.worker.flow import FlowController
from multilane.worker.group import GroupRebalance
from multilane.worker.hooks import EngineHooks, LearnerHooks, PartitionStateHooks
from multilane.worker.housekeeping import (
    HousekeepingLoop,
    LearnerStatusCache,
    ProducerLoop,
    ProgressLoop,
    RateMeter,
)
from multilane.worker.lanes import LaneEnv
from multilane.worker.learner_calls import LearnerCalls
from multilane.worker.metrics import LatencyHistogram, WorkerMetrics
from multilane.worker.ownership import EngineError, FencingError, Ownership, ReleaseResult, RuntimeFactory
from multilane.worker.partition import PartitionRuntime
from multilane.worker.partition_set import PartitionSet
from multilane.worker.progress_store import ProgressStore
from multilane.worker.reopen import Reopener
from multilane.worker.retry import DeadLetterPublisher, RetryPolicy
from multilane.worker.transactions import TransactionalOutputs
from multilane.worker.views import StatusView
from multilane.worker.watchdog import StallWatchdog

__all__ = ["Engine", "EngineError", "FencingError", "ReleaseResult"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Engine:
    """One worker process's consumer, lanes, commits and control API: wires the parts together.

    Invariants: every consumer call runs on the loop's thread; ``control.generation`` never decreases;
    the parts created by :meth:`start` (clients, ownership, loops) exist exactly between ``start`` and
    ``stop``.
    """

    def __init__(self, config: EngineConfig, processor: Processor,
                 hooks: PartitionStateHooks | None = None,
                 transactions: TransactionalOutputs | None = None) -> None:
        """``transactions``: exactly-once outputs (``--outputs exactly-once``): each partition's commit
        is its transaction, the processor is wrapped by ``with_transactional_outputs`` over the same
        object, and dead letters are outputs of the transaction."""
        self.config = config
        self.transactions = transactions
        self.processor = processor
        self.hooks = hooks
        self._hooks = EngineHooks.of(hooks)
        self.control = ControlState(factor=config.factor)
        self._life = Lifecycle()
        self._flow = FlowController(config.max_in_flight, config.max_in_flight_bytes,
                                    config.partition_max_records, config.partition_max_bytes,
                                    config.resume_fraction)
        self.partitions = PartitionSet(self._flow)
        self._retry = RetryPolicy.from_config(config)
        self._hist = LatencyHistogram()
        self._watchdog = StallWatchdog(config.stall_threshold_s)
        self._rate = RateMeter(self.partitions, self._hist)
        self.metrics = WorkerMetrics(self, self._hooks.collectors())
        self._is_async = is_async_processor(processor)
        self._proc_pool: ThreadPoolExecutor | None = None
        self._io_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="multilane-io")
        # learner_status() reads only: its own thread, so restores filling _io_pool never delay status
        self._status_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="multilane-status")
        self._learners = LearnerStatusCache(self._hooks.status, self._status_pool, self._life)
        self._view = StatusView(config, self.control, self.partitions, self._flow, self._watchdog,
                                self._rate, self._learners, hooks is not None)
        # created by start(); None before it and after stop()
        self._consumer: Any = None
        self._producer: Any = None
        self._dlq: DeadLetterPublisher | None = None
        self._commits: CommitCycle | None = None
        self._fetch: FetchLoop | None = None
        self._ownership: Ownership | None = None
        self._reopener: Reopener | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._control_lock = asyncio.Lock()
        self._assignment = AssignmentControl(config, self.control, self.partitions, self._control_lock,
                                             self._started, lambda: self._ownership)
        self._learner_calls = LearnerCalls(self._hooks.learner, self.partitions, self._control_lock,
                                           self._run_io, config.operator_mode)
        self._stop_requested: asyncio.Event | None = None
        self.ready = asyncio.Event()
        self._errors = ErrorLog()

    # ------------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create clients, make the progress topic, take the initial assignment, start the loops.

        1. Create the producer (dead letters, progress), the consumer and the parts that use them.
        2. Ensure the progress topic exists (one partition per input partition index).
        3. Operator mode: assign the initial partitions; standalone: subscribe.
        4. Start the fetch, housekeeping and producer loops; set ``ready``.
        """
        cfg = self.config
        loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        if cfg.gc_threshold:
            g0, g1, g2 = gc.get_threshold()
            if g0 < cfg.gc_threshold:
                gc.set_threshold(cfg.gc_threshold, g1, g2)
        if not self._is_async:
            self._proc_pool = ThreadPoolExecutor(max_workers=cfg.max_threads,
                                                 thread_name_prefix="multilane-proc")
        state = self._hooks.state
        env = LaneEnv(self.processor, self._is_async, self._proc_pool, cfg.yield_every, cfg.sync_batch,
                      state.view if state is not None else None)
        # 1. clients and the parts that use them
        self._producer = Producer(cfg.producer_config())
        conf: dict[str, Any] = dict(cfg.consumer_config())
        conf["on_commit"] = self._on_commit
        conf["error_cb"] = self._errors.client_error
        self._consumer = Consumer(conf)
        multi_topic = len(set(cfg.topics) | {t for t, _ in cfg.assign}) != 1
        fetch = self._fetch = FetchLoop(self._consumer, self.partitions.runtimes, self._flow,
                                        cfg.consume_batch, self._errors, multi_topic)
        txns = self.transactions
        dlq = self._dlq = DeadLetterPublisher(self._producer, cfg.dead_letter_topic_for, self._ensure_topic,
                                              hold=txns.hold if txns is not None else None)
        producer_loop = ProducerLoop(self._producer, self._life)
        store = ProgressStore(cfg.bootstrap_servers, cfg.group, cfg.progress_topic_name, self._producer,
                              security_config(cfg.consumer_overrides), on_produce=producer_loop.wake)
        commits = self._commits = CommitCycle(self._consumer, store, state, transactions=txns)
        commit_due = asyncio.Event()
        if txns is not None:
            def commit_now() -> None:  # any thread: a partition's transaction is full
                loop.call_soon_threadsafe(commit_due.set)

            txns.on_full = commit_now
        runtimes = RuntimeFactory(cfg, self.control, env, self._flow, self._retry, dlq, self._hist)
        ownership = self._ownership = Ownership(cfg, self.partitions, self.control, state, self._consumer,
                                                self._producer, store, commits, fetch, runtimes,
                                                self._io_pool, txns)
        reopener = self._reopener = Reopener(ownership, self.partitions, self.control, self._life,
                                             self._control_lock, cfg.drain_timeout_s)
        # exactly-once: progress records go only in the transactions (between them they would claim
        # records whose outputs are not committed)
        progress = ProgressCycle(store if txns is None else None, self._hooks, commits,
                                 on_lost=reopener.schedule)
        # 2. progress topic
        topics = list(cfg.topics) or sorted({t for t, _ in cfg.assign})
        await self._retrying("create the progress topic", self._run_io, self._ensure_progress_topic, store,
                             topics)
        # 3. assignment
        if cfg.operator_mode:
            if cfg.assign:
                await self._retrying("take the initial assignment", self.assign, list(cfg.assign),
                                     self.control.generation)
        else:
            group = GroupRebalance(self.partitions, ownership)
            self._consumer.subscribe(list(cfg.topics), on_assign=group.on_assign,
                                     on_revoke=group.on_revoke, on_lost=group.on_lost)
        # 4. loops. Objects alive now (modules, clients, config) move to the collector's permanent
        # generation: full collections then do not traverse them again and again.
        if cfg.gc_threshold:
            gc.freeze()
        housekeeping = HousekeepingLoop(cfg.commit_interval_ms / 1000.0, self.partitions, commits,
                                        self._consumer, self._watchdog, self._rate, self._learners, reopener,
                                        self._life, commit_due)
        self._tasks = [
            loop.create_task(fetch.run(), name="multilane-fetch"),
            loop.create_task(housekeeping.run(), name="multilane-housekeeping"),
            loop.create_task(producer_loop.run(), name="multilane-producer"),
        ]
        if cfg.progress_interval_ms > 0:
            progress_loop = ProgressLoop(cfg.progress_interval_ms / 1000.0, self.partitions, progress,
                                         self._life)
            self._tasks.append(loop.create_task(progress_loop.run(), name="multilane-progress"))
        self.ready.set()
        log.info("engine %s started (%s mode, ordering=%s, factor=%d)", cfg.worker_id,
                 "operator" if cfg.operator_mode else "standalone", cfg.ordering.value, self.control.factor)

    async def _retrying(self, what: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
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

    def _started(self) -> Ownership:
        """The ownership protocol of a running engine (EngineError before start or after stop)."""
        if self._ownership is None or self._life.stopped:
            raise EngineError("the engine is not running")
        return self._ownership

    async def _run_io(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io_pool, fn, *args)

    def _on_commit(self, err: Any, tps: list[Any]) -> None:
        if self._commits is not None:
            self._commits.on_commit(err, tps, self.partitions.runtimes)

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
        if self._life.stopped or self._ownership is None:
            return
        ownership = self._ownership
        self._life.stopped = True
        # 1. stop fetching
        ownership.fetch.pause_fetch(self.partitions.owned())
        # 2. drain and commit
        try:
            async with self._control_lock:
                await ownership.release(self.partitions.owned(), self.config.drain_timeout_s,
                                        unassign=self.config.operator_mode)
        except Exception:
            log.exception("error while releasing partitions at shutdown")
        await ownership.wait_for_closes(self.partitions.all_closing())
        # 3. loops and producer
        self._life.stopping = True
        ownership.fetch.stopping = True
        background = [*self._tasks, *(self._reopener.tasks() if self._reopener else []),
                      *self._learners.tasks()]
        for t in background:
            t.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if self._dlq is not None:
            self._dlq.close()
        await self._run_io(self._producer.flush, 10.0)
        # 4. close
        await self._run_io(ownership.close)
        if self.transactions is not None:
            await self._run_io(self.transactions.close_all)
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
                     release_deadline_s: float = 30.0,
                     progress: Mapping[TopicPartitionId, bytes] | None = None,
                     changelog_ends: Mapping[TopicPartitionId, int] | None = None) -> list[ReleaseResult]:
        """Make the assignment exactly ``partitions`` (operator mode); fenced by ``generation``
        (:meth:`AssignmentControl.assign`, numbered steps); ``progress``: records the partitions'
        last owners released; ``changelog_ends``: the changelog ends they released at."""
        return await self._assignment.assign(partitions, generation, release_deadline_s, progress,
                                             changelog_ends)

    async def release(self, partitions: Iterable[TopicPartitionId],
                      deadline_s: float = 30.0) -> list[ReleaseResult]:
        """Drain and hand back partitions; returns their final committed offsets."""
        return await self._assignment.release(partitions, deadline_s)

    async def set_factor(self, factor: int) -> int:
        """Change lanes per partition at run time (quiesce + re-route; see LaneGroup.resize)."""
        return await self._assignment.set_factor(factor)

    def pause(self) -> bool:
        """Stop fetching every partition (records in flight still finish)."""
        return self._assignment.pause()

    def resume(self) -> bool:
        """Undo :meth:`pause` (partitions paused by back-pressure stay paused until drained)."""
        return self._assignment.resume()

    @property
    def generation(self) -> int:
        return self.control.generation

    @property
    def user_paused(self) -> bool:
        return self.control.user_paused

    @property
    def fenced(self) -> bool:
        """True between :meth:`fence` and the next accepted assignment."""
        return self.control.fenced_at is not None


    def lease_renewed(self) -> None:
        """The Lease is held again: a fenced engine may accept a higher generation
        (:meth:`AssignmentControl.lease_renewed`)."""
        self._assignment.lease_renewed()

    def fence(self) -> None:
        """Stop processing and committing at once: the worker's Lease was lost
        (:meth:`AssignmentControl.fence`, numbered steps; operator mode only)."""
        self._assignment.fence()

    # -- learner calls (learner hooks; docs/state.md, "Learner protocol"; multilane.worker.learner_calls) --

    @property
    def learner(self) -> LearnerHooks | None:
        """The learner hooks (None: the learner calls raise :class:`EngineError`, HTTP 404)."""
        return self._hooks.learner

    async def learn(self, partitions: Iterable[TopicPartitionId]) -> list[TopicPartitionId]:
        """Start learning partitions this worker does not process (``hooks.learn``; returns once each
        learner's tail thread runs). A partition this engine owns is refused by the hooks."""
        tps = normalise_partitions(partitions)
        fn = self._learner_calls.hooks("learn").learn
        return await self._learner_calls.each(self._started(), fn, tps)

    async def promote(self, partitions: Iterable[TopicPartitionId]) -> list[TopicPartitionId]:
        """Check that each partition is learning here, healthy and caught up (``hooks.promote``;
        raises the hooks' ``StatePhaseError`` otherwise). The switch itself is the assignment: opening
        a learning partition (:meth:`assign`) is the promotion."""
        return await self._learner_calls.promote(normalise_partitions(partitions))

    async def demote(self, partitions: Iterable[TopicPartitionId],
                     deadline_s: float = 30.0) -> list[ReleaseResult]:
        """Active -> learner: release what this engine owns, then learn from the checkpoint
        (:meth:`LearnerCalls.demote`); returns the released partitions with their final offsets."""
        tps = normalise_partitions(partitions)
        self._learner_calls.hooks("demote")
        return await self._learner_calls.demote(self._started(), tps, deadline_s)

    async def drop(self, partitions: Iterable[TopicPartitionId]) -> list[TopicPartitionId]:
        """Stop learning and delete the local state of partitions (``hooks.drop``); refused by the
        hooks for a partition that is active here (release it first)."""
        tps = normalise_partitions(partitions)
        fn = self._learner_calls.hooks("drop").drop
        return await self._learner_calls.each(self._started(), fn, tps)

    # ------------------------------------------------------------------------------------------------
    # status and metric sources (multilane.worker.metrics.MetricsSource)
    # ------------------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The worker's status (``GET /v1/status``; :meth:`StatusView.status`)."""
        return self._view.status()

    async def refresh_learners(self) -> None:
        """Re-read the state hooks' ``learner_status()`` off the loop (for :meth:`status`)."""
        await self._learners.refresh()

    @property
    def factor(self) -> int:
        return self.control.factor

    @property
    def processing_rate(self) -> float:
        return self._rate.processing_rate

    @property
    def busy_lanes(self) -> float:
        return self._rate.busy_lanes

    def processed_total(self) -> int:
        return self.partitions.processed_total()

    @property
    def commit_latency(self) -> LatencyHistogram | None:
        """Start of a commit cycle -> the broker's acknowledgement (None before the start)."""
        return self._commits.latency if self._commits is not None else None

    def metric_partitions(self) -> list[PartitionRuntime]:
        return self.partitions.owned()

    @property
    def histogram(self) -> LatencyHistogram:
        return self._hist

    def stalled_count(self) -> int:
        return self._watchdog.stalled

    def lane_utilisation(self) -> float:
        return self._view.lane_utilisation()

    def last_progress_bytes(self) -> int:
        return self._commits.last_progress_bytes if self._commits is not None else 0

    # ------------------------------------------------------------------------------------------------
    # helpers
    # ------------------------------------------------------------------------------------------------

    def _ensure_progress_topic(self, store: ProgressStore, topics: list[str]) -> None:
        cfg = self.config
        store.ensure_topic(max_partition_count(cfg.bootstrap_servers, topics,
                                               security_config(cfg.consumer_overrides)))

    def _ensure_topic(self, topic: str) -> None:
        """Create a dead-letter topic if it does not exist (blocking, short timeout)."""
        cfg = self.config
        ensure_topic(cfg.bootstrap_servers, topic, security_config(cfg.consumer_overrides))
