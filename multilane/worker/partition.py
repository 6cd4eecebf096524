"""One assigned partition at run time: its offset tracker, lanes, flow counters and progress.

Does no network I/O itself (dead letters go through the engine's :class:`DeadLetterPublisher`).
The engine's fetch loop hands every fetched message to :meth:`PartitionRuntime.accept`; the lanes
report outcomes back through :meth:`on_success` / :meth:`on_failure`.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from operator import attrgetter
from typing import Any

from multilane.api import OrderingMode
from multilane.formats.keyranges import key_hash
from multilane.formats.progress import ProgressRecord, intervals_from_offsets, union_progress
from multilane.worker.flow import FlowController, FlowCounters
from multilane.worker.lane_core import LaneCore
from multilane.worker.lane_group import LaneGroup
from multilane.worker.lanes import LaneEnv, Work
from multilane.worker.metrics import LatencyHistogram
from multilane.worker.offsets import OffsetTracker
from multilane.worker.retry import DeadLetterPublisher, RetryLog, RetryPolicy

__all__ = ["PartitionRuntime", "Phase"]

log = logging.getLogger(__name__)
# Retries of every partition of this process: each at DEBUG, one INFO summary a minute.
RETRY_LOG = RetryLog(log)


class Phase:
    ACTIVE = "active"
    RELEASING = "releasing"
    LEARNING = "learning"
    PROMOTING = "promoting"
    STARTING = "starting"
    # Lease lost (``Engine.fence``): lanes closed, fetch paused, never committed again; only an
    # assignment with a higher generation replaces the partition (with a fresh runtime).
    FENCED = "fenced"


_KEY_CACHE_MAX = 200_000
_offset_of = attrgetter("offset")
# accept_run builds work items with object.__new__ and sets each of these fields itself (no __init__)
_new_work = object.__new__
WORK_FIELDS = ("topic", "partition", "offset", "key", "value", "headers", "timestamp_ms", "key_hash",
               "nbytes", "attempt")
_nbytes_of = attrgetter("nbytes")


class PartitionRuntime:
    """Everything the engine keeps for one assigned partition.

    Invariants:
    - ``tracker`` holds exactly the offsets fetched since assignment (or the last seek) and admitted,
      plus offsets skipped because ``restore`` said they were done (added as complete).
    - ``inflight`` maps the offset of every admitted, unfinished record to its routing hash, in offset
      order (key mode only; used to compute per-range progress).
    - ``flow`` counts exactly the admitted, unfinished records (queued, running, retry-pending,
      dead letter unacknowledged).
    - After ``closed`` is set, outcomes of records still finishing are ignored.
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        mode: OrderingMode,
        factor: int,
        env: LaneEnv,
        flow: FlowController,
        retry: RetryPolicy,
        dlq: DeadLetterPublisher,
        histogram: LatencyHistogram,
        group: str,
        writer: str,
        committed: int | None,
        restore: ProgressRecord | None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.mode = mode
        self.group = group
        self.writer = writer
        self.phase = Phase.STARTING
        self.tracker = OffsetTracker(committed)
        self.flow_counters = FlowCounters()
        self._flow = flow
        self._retry = retry
        self._dlq = dlq
        self._hist = histogram
        self.lanes = LaneGroup(mode, factor, self, env)
        self.inflight: dict[int, int] = {}
        self._track_inflight = mode is OrderingMode.KEY
        # Key mode routes and parks by the key hash, and a state view is keyed by it; the other modes
        # never read it (partition mode parks everything as one unit, restored unordered progress is
        # by offset), so their work items carry 0 and the fetch path skips hashing.
        self._hash_keys = mode is OrderingMode.KEY or env.view is not None
        self.restore = restore  # progress read on assignment: records it says are done are skipped
        self.restore_until = restore.high if restore is not None else 0
        self.committed = committed  # last offset the broker confirmed as committed
        self.commit_sent: int | None = None  # last offset sent in a commit request
        self.last_progress: bytes | None = None  # encoded progress of the last commit cycle
        # The highest base offset of a progress record produced for this partition (by a commit or the
        # progress cycle; written by multilane.worker.commits only). Invariant: every group of records
        # produced after one of this base ends with a record of this base (or a higher one), so the
        # newest record in the progress topic has the highest base (ProgressStore.read_progress stops
        # at a lower base).
        self.progress_floor: int | None = None
        self.high_watermark: int | None = None
        self.closed = False
        self.user_paused = False
        self._key_cache: dict[bytes, int] = {}
        # counters (exported as metrics)
        self.processed = 0
        self.failed = 0
        self.retried = 0
        self.dead_lettered = 0
        self.skipped = 0
        self.dlq_pending: dict[int, Work] = {}
        # Completed records not yet applied to tracker/flow/metrics (see flush()); loop thread only.
        # Invariant: these list objects are never replaced (lane runners hold their append methods).
        self.done_buf: list[Work] = []
        self.durations: list[float] = []

    # -- fetch side ----------------------------------------------------------------------------------

    def accept_run(self, msgs: list[Any], i: int, check_topic: bool = True) -> tuple[int, bool]:
        """Take the run of messages of this partition starting at ``msgs[i]`` (steps 1-4).

        Returns ``(j, refused)``: ``msgs[i:j]`` were handled; when ``refused``, ``msgs[j]`` (of this
        partition) did not fit the in-flight bounds and nothing from ``j`` on was taken; otherwise
        ``msgs[j]`` (if any) belongs to another partition or is an error event. ``check_topic=False``
        (the consumer reads one topic only) skips comparing topic names.

        1. Take the flow budget once for the run (records and bytes this partition may still take).
        2. Per message: skip re-deliveries, hash the key (cached; key mode or a state view only), skip
           what restored progress says is done, check the budget, build the work item and push it to its lane.
        3. Add the taken offsets to the tracker in one call.
        4. Charge the flow controller once.
        """
        topic = self.topic
        partition = self.partition
        tracker = self.tracker
        pos = tracker.position
        if pos is None:
            pos = -1
        flow = self._flow
        fc = self.flow_counters
        # 1. budget
        rec_room, byte_room = flow.budget(fc)
        taken = 0
        taken_bytes = 0
        offsets: list[int] = []
        cache = self._key_cache
        inflight = self.inflight if self._track_inflight else None
        group = self.lanes
        lanes = group.lanes
        single = lanes[0].queue.append if len(lanes) == 1 else None
        starts = group.starts
        n = len(msgs)
        j = i
        refused = False
        restoring = self.restore is not None
        hash_keys = self._hash_keys
        new_work = _new_work
        # 2. per message
        while j < n:
            m = msgs[j]
            if m.error() is not None or m.partition() != partition or (check_topic and m.topic() != topic):
                break
            offset: int = m.offset()
            if offset < pos:
                j += 1
                continue  # already seen (re-delivery after a seek)
            key: bytes | None = m.key()
            if not hash_keys:
                kh = 0
            elif key is not None:
                cached = cache.get(key)
                if cached is None:
                    kh = cache[key] = key_hash(key)
                    if len(cache) > _KEY_CACHE_MAX:
                        cache.clear()
                else:
                    kh = cached
            else:
                kh = key_hash(offset.to_bytes(8, "big", signed=True))
            if restoring:
                if self._restored(offset, kh, offsets):
                    pos = offset + 1
                    j += 1
                    continue
                restoring = self.restore is not None  # _restored() drops it once past its progress
            value: bytes | None = m.value()
            nbytes = (len(value) if value is not None else 0) + (len(key) if key is not None else 0) + 64
            if taken >= rec_room or (taken_bytes + nbytes > byte_room and (taken or fc.records)):
                refused = True
                break
            taken += 1
            taken_bytes += nbytes
            offsets.append(offset)
            pos = offset + 1
            if inflight is not None:
                inflight[offset] = kh
            # The work item without the dataclass __init__ call (one Python frame a record): every
            # field of Work stored here (WORK_FIELDS; tests/unit/test_partition_work.py holds them equal).
            work = new_work(Work)
            work.topic = topic
            work.partition = partition
            work.offset = offset
            work.key = key
            work.value = value
            work.headers = m.headers() or []
            work.timestamp_ms = m.timestamp()[1]
            work.key_hash = kh
            work.nbytes = nbytes
            work.attempt = 1
            if single is not None:
                single(work)
            else:
                lanes[bisect_right(starts, kh) - 1].queue.append(work)
            j += 1
        if taken:
            for lane in lanes:  # runners were idle? wake them now (they run once we yield)
                lane.wake()
        # 3. tracker
        if offsets:
            tracker.add_many(offsets)
        # 4. flow
        if taken:
            flow.take(fc, taken, taken_bytes)
        return j, refused

    def reached_end(self, position: int) -> None:
        """The consumer reached the end of the partition at ``position`` with every record below it
        taken (the fetch loop checks that): offsets past the newest taken record up to there hold no
        record (transaction markers, compaction), so the committable offset may reach ``position``
        once every taken record completed (:meth:`OffsetTracker.skip_to`)."""
        self.tracker.skip_to(position)

    def _restored(self, offset: int, kh: int, pending: list[int]) -> bool:
        """True (and the offset recorded as complete) when restored progress says it is done."""
        restore = self.restore
        assert restore is not None
        if offset >= self.restore_until:
            self.restore = None
            return False
        if not restore.is_done(offset, kh):
            return False
        if pending:  # keep the tracker's offsets in order
            self.tracker.add_many(pending)
            pending.clear()
        self.tracker.add_completed(offset)
        self.skipped += 1
        return True

    # -- outcomes (called by lanes, on the loop thread) -----------------------------------------------

    def _finish(self, work: Work) -> None:
        offset = work.offset
        self.tracker.complete(offset)
        if self._track_inflight:
            self.inflight.pop(offset, None)
        self._flow.release(self.flow_counters, work.nbytes)

    def on_success(self, work: Work, seconds: float) -> None:
        """One record done: buffered; :meth:`flush` applies the buffer in bulk."""
        self.done_buf.append(work)
        self.durations.append(seconds)

    def on_success_many(self, works: list[Work], durations: list[float]) -> None:
        self.done_buf.extend(works)
        self.durations.extend(durations)

    def flush(self) -> None:
        """Apply buffered completions: offsets, in-flight counts, histogram (amortised bulk work)."""
        works = self.done_buf
        if not works:
            return
        durations = self.durations
        if self.closed:
            works.clear()
            durations.clear()
            return
        offsets = list(map(_offset_of, works))  # C loops over the batch, not a loop per record here
        nbytes = sum(map(_nbytes_of, works))
        self.tracker.complete_many(offsets)
        if self._track_inflight:
            pop = self.inflight.pop
            for o in offsets:
                pop(o, None)
        self._flow.release_many(self.flow_counters, len(works), nbytes)
        self.processed += len(works)
        self._hist.observe_many(durations)
        works.clear()
        durations.clear()

    def on_failure(self, work: Work, exc: BaseException, lane: LaneCore) -> None:
        if self.closed:
            return
        self.flush()
        self.failed += 1
        attempt = work.attempt
        if self._retry.should_retry(attempt, exc):
            self.retried += 1
            delay = self._retry.delay_s(attempt)
            RETRY_LOG.retrying(self.topic, self.partition, work.offset, attempt, exc, delay)
            work.attempt = attempt + 1
            lane.retry_later(work, delay)
            return
        # Not retried (retries exhausted, NonRetryable, a decode error or a type outside --retry-on):
        # dead-letter it with its reason; the key moves on now, the offset completes on delivery.
        self.dlq_pending[work.offset] = work
        lane.key_done(work)
        self._dlq.publish(work, exc, attempt, lambda: self._dead_lettered(work),
                          reason=self._retry.reason(exc))

    def _dead_lettered(self, work: Work) -> None:
        self.dlq_pending.pop(work.offset, None)
        if self.closed:
            return
        self.dead_lettered += 1
        self._finish(work)

    # -- progress --------------------------------------------------------------------------------------

    def progress(self, base: int) -> ProgressRecord:
        """The progress record to accompany committed offset ``base`` (a snapshot of now), never
        claiming less than the restored record while fetching has not passed it (``union_progress``).

        Call :meth:`flush` first (``base`` comes from the tracker after a flush).
        """
        rec = self._own_progress(base)
        restore = self.restore
        return union_progress(rec, restore) if restore is not None else rec

    def _own_progress(self, base: int) -> ProgressRecord:
        position = self.tracker.position
        high = position if position is not None else base
        if self.mode is OrderingMode.KEY:
            layout = self.lanes.layout
            n = len(layout)
            firsts: list[int | None] = [None] * n
            found = 0
            lane_index = self.lanes.lane_index
            for offset, kh in self.inflight.items():  # offset order
                i = lane_index(kh)
                if firsts[i] is None:
                    firsts[i] = offset
                    found += 1
                    if found == n:
                        break
            ranges = tuple(
                (r.start, r.end, max(base, f if f is not None else high))
                for r, f in zip(layout.ranges, firsts, strict=True)
            )
            return ProgressRecord(self.group, self.topic, self.partition, base, self.writer,
                                  OrderingMode.KEY, ranges=ranges)
        if self.mode is OrderingMode.UNORDERED:
            done = intervals_from_offsets(self.tracker.completed_above(base))
            return ProgressRecord(self.group, self.topic, self.partition, base, self.writer,
                                  OrderingMode.UNORDERED, done_offsets=done)
        return ProgressRecord(self.group, self.topic, self.partition, base, self.writer,
                              OrderingMode.PARTITION)

    # -- status ----------------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        self.flush()
        return self.flow_counters.records

    def lag(self) -> int | None:
        hw = self.high_watermark
        if hw is None or hw < 0:
            return None
        base = self.tracker.committable()
        if base is None:
            base = self.committed
        if base is None:
            return None
        return max(0, hw - base)

    def status(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "phase": self.phase,
            "committed": self.committed,
            "position": self.tracker.position,
            "high_watermark": self.high_watermark,
            "lag": self.lag(),
            "in_flight": self.in_flight,
            "in_flight_bytes": self.flow_counters.bytes,
            "paused": self.flow_counters.paused or self.user_paused,
            "restore_lag": 0,
            "processed": self.processed,
            "dead_lettered": self.dead_lettered,
            "skipped": self.skipped,
        }

    def close(self) -> None:
        """Stop the lanes; later outcomes are ignored; drop this partition's flow usage."""
        self.flush()
        self.lanes.close()
        self.closed = True
        self._flow.forget(self.flow_counters)
        # ``tracker`` and ``inflight`` stay: the final commit after close() still needs them.
