"""The fetch loop: ``consume()`` on the event loop, dispatch to partitions, back-pressure. Does I/O.

Every call on the consumer here runs on the engine's event-loop thread. ``consume(num_messages=...,
timeout=0)`` never blocks (librdkafka prefetches in its own threads); the loop sleeps a millisecond
only when nothing came back, and otherwise yields once per batch so lane runners can work.

Back-pressure protocol (per partition):

1. A run of messages is offered to :meth:`PartitionRuntime.accept_run`; when a record does not fit
   the in-flight bounds, the partition is paused (``consumer.pause``) and nothing from that record
   on is taken -- the tracker's position stays at the refused record.
2. Later messages of a paused partition that were already fetched are ignored.
3. Once its usage fell below the low-water mark, the partition is resumed and the consumer seeks to
   the tracker's position, so the refused records are fetched again (never skipped).
4. When the whole process is full, nothing is fetched (records are never taken only to be refused)
   and, once it has been full for ``pause_after_s`` (default 0: at once), every partition is paused
   (step 3 resumes them).

Gaps at the end (``multilane.worker.offsets``): the end-of-partition event carries the consumer's
position, past transaction markers and compacted-away offsets no record covers. It comes through the
same queue as the records, after every record below it, so when the partition took every record
returned so far -- active, and not paused by back-pressure (which ignores later records until the
resume seeks back; events queued before that seek are discarded by librdkafka) -- its tracker skips
to that position, and the next commit reaches the end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from multilane.worker.config import TopicPartitionId
from multilane.worker.flow import FlowController
from multilane.worker.partition import PartitionRuntime, Phase

__all__ = ["ErrorLog", "FetchLoop"]

log = logging.getLogger(__name__)


class ErrorLog:
    """Rate-limited warnings for client and fetch errors (one per error code per interval)."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self._interval_s = interval_s
        self._last: dict[int, float] = {}

    def _due(self, code: int) -> bool:
        now = time.monotonic()
        if now - self._last.get(code, 0.0) > self._interval_s:
            self._last[code] = now
            return True
        return False

    def client_error(self, err: Any) -> None:
        """librdkafka's ``error_cb``: transport errors etc. (the client retries by itself)."""
        code = err.code() if hasattr(err, "code") else -1
        if self._due(code):
            log.warning("kafka client error: %s", err)

    def fetch_error(self, m: Any) -> None:
        err = m.error()
        code = err.code()
        if code == KafkaError._PARTITION_EOF:
            return
        if self._due(code):
            log.warning("fetch error on %s/%s: %s", m.topic(), m.partition(), err)


class FetchLoop:
    """Polls the consumer and feeds partitions.

    Invariant: a partition whose ``flow_counters.paused`` is set takes no records until
    :meth:`resume_drained` resumed it and sought back to its tracker position.
    """

    def __init__(self, consumer: Any, parts: dict[TopicPartitionId, PartitionRuntime],
                 flow: FlowController, batch_max: int, errors: ErrorLog, multi_topic: bool) -> None:
        self._consumer = consumer
        self._parts = parts  # shared with the engine (it adds and removes partitions)
        self._flow = flow
        self._batch_max = batch_max
        self._errors = errors
        self.multi_topic = multi_topic  # partitions of several topics may arrive (compare topics)
        self.stopping = False
        self.full_poll_interval_s = 1.0  # how often to poll while the process-wide bound is full
        # Pause every partition when the process stays full this long. 0: at once (the bound then
        # also covers librdkafka's prefetch queue immediately; resuming at the low-water mark refetches
        # within milliseconds, long before the queued half of the bound has drained).
        self.pause_after_s = 0.0

    async def run(self) -> None:
        consumer = self._consumer
        parts = self._parts
        flow = self._flow
        batch_max = self._batch_max
        active = Phase.ACTIVE
        monotonic = time.monotonic
        last_poll = monotonic()
        full_since: float | None = None
        while not self.stopping:
            for rt in parts.values():
                if rt.done_buf:
                    rt.flush()
            room = flow.room()
            if not room:
                # 4. The process is full: wait for completions (librdkafka keeps its bounded prefetch
                # queue, so work continues at once when room frees up); if it stays full, pause
                # every partition, which also frees librdkafka's queue.
                now = monotonic()
                if full_since is None:
                    full_since = now
                if now - full_since >= self.pause_after_s:
                    self.pause_all_for_flow()
                # Still poll now and then: rebalance callbacks run inside consume(), and
                # max.poll.interval.ms must be honoured.
                if now - last_poll < self.full_poll_interval_s:
                    await asyncio.sleep(0.001)
                    continue
            else:
                full_since = None
            last_poll = monotonic()
            try:
                msgs = consumer.consume(num_messages=min(batch_max, room) if room else 1, timeout=0)
            except (KafkaException, RuntimeError) as exc:
                log.warning("consume failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            if not msgs:
                self.resume_drained()
                await asyncio.sleep(0.001 if room else 0.002)
                continue
            i = 0
            n = len(msgs)
            while i < n:
                m = msgs[i]
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        self.end_of_partition(m)
                    else:
                        self._errors.fetch_error(m)
                    i += 1
                    continue
                part = parts.get((m.topic(), m.partition()))
                if part is None or part.phase != active:
                    i += 1  # not ours (any more): a new owner starts at the committed offset
                    continue
                if part.flow_counters.paused:
                    # 2. Paused by back-pressure: everything from the refused record on is fetched
                    # again later, from the tracker's position; a partition that has taken nothing yet
                    # (no committed offset: position unknown) resumes from the first record dropped here.
                    if part.tracker.position is None:
                        part.tracker.reset(m.offset())
                    i += 1
                    continue
                # 1. offer the run
                j, refused = part.accept_run(msgs, i, self.multi_topic)
                if refused:
                    self.pause_for_flow(part, msgs[j].offset())
                i = j if refused else max(j, i + 1)
            # 3. resume what drained
            self.resume_drained()
            await asyncio.sleep(0)

    def end_of_partition(self, m: Any) -> None:
        """An end-of-partition event: skip the partition's tracker to the position it carries, when
        the partition took every record returned before it (module docstring, "Gaps at the end")."""
        part = self._parts.get((m.topic(), m.partition()))
        offset = m.offset()
        if part is None or part.phase != Phase.ACTIVE or part.flow_counters.paused:
            return
        if offset is None or offset < 0:
            return
        part.reached_end(offset)

    def pause_for_flow(self, part: PartitionRuntime, offset: int) -> None:
        fc = part.flow_counters
        fc.paused = True
        fc.pauses += 1
        if part.tracker.position is None:
            # Nothing taken yet and no committed offset: without this, resume would not seek and
            # librdkafka would continue after the refused record, skipping it.
            part.tracker.reset(offset)
        # No seek here: the tracker's position is ``offset`` (the refused record), and resuming seeks
        # there. (Measured: a seek while paused delays the first fetch after resume by ~1 s; resume
        # followed by a seek fetches within milliseconds.)
        try:
            self._consumer.pause([TopicPartition(part.topic, part.partition)])
        except KafkaException as exc:
            log.warning("pause of %s/%d@%d failed: %s", part.topic, part.partition, offset, exc)

    def pause_all_for_flow(self) -> None:
        """Pause every active partition not paused yet (the process-wide bound stayed full)."""
        todo = [p for p in self._parts.values() if p.phase == Phase.ACTIVE and not p.flow_counters.paused]
        for p in todo:
            p.flow_counters.paused = True
            p.flow_counters.pauses += 1
        self.pause_fetch(todo)

    def resume_drained(self) -> None:
        flow = self._flow
        for part in self._parts.values():
            fc = part.flow_counters
            if fc.paused and flow.can_resume(fc) and part.phase == Phase.ACTIVE:
                fc.paused = False
                if not part.user_paused:
                    self.resume_fetch(part)

    def resume_fetch(self, part: PartitionRuntime) -> None:
        """Resume fetching, then seek to the tracker's position (the first offset not yet taken):
        librdkafka would otherwise continue after the last message it returned, skipping records
        that back-pressure refused."""
        try:
            self._consumer.resume([TopicPartition(part.topic, part.partition)])
        except KafkaException as exc:
            log.warning("resume of %s/%d failed: %s", part.topic, part.partition, exc)
        pos = part.tracker.position
        if pos is not None:
            try:
                self._consumer.seek(TopicPartition(part.topic, part.partition, pos))
            except KafkaException as exc:
                # Without the seek, refused records would be skipped: stop taking this partition's
                # records until a seek succeeds.
                log.warning("seek of %s/%d to %d failed (%s); retrying", part.topic, part.partition,
                            pos, exc)
                part.flow_counters.paused = True
                self._consumer.pause([TopicPartition(part.topic, part.partition)])

    def pause_fetch(self, parts: Iterable[PartitionRuntime]) -> None:
        tps = [TopicPartition(p.topic, p.partition) for p in parts]
        if not tps:
            return
        try:
            self._consumer.pause(tps)
        except KafkaException as exc:
            log.warning("pause failed: %s", exc)
