"""Retries with exponential backoff and jitter, the error policy, and the dead-letter publisher.

:class:`RetryPolicy` is pure: which failures are retried (steps in :meth:`RetryPolicy.should_retry`)
and the reason a dead letter names (:func:`failure_reason`). :class:`RetryLog` logs each retry at
DEBUG and one INFO summary a minute. :class:`DeadLetterPublisher` does I/O: it produces failed records to the
dead-letter topic (default ``<topic>.dlq``) on a producer that the engine polls on its event loop, so
delivery callbacks run on the loop thread. A dead letter counts as done only once the broker has
acknowledged it; until then its offset stays in flight and is not committed. Failed deliveries are
produced again after a pause, for as long as it takes (the broker may be unreachable for a while).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from multilane.api import DecodeError, NonRetryable, Record

__all__ = ["DLQ_HEADERS", "REASON_HEADER", "DeadLetterPublisher", "RetryLog", "RetryPolicy",
           "dead_letter_headers", "failure_reason"]

log = logging.getLogger(__name__)

# Headers added to every dead letter (the record's own headers are kept before them).
DLQ_HEADERS = (
    "multilane.error.type",
    "multilane.error.message",
    "multilane.origin.topic",
    "multilane.origin.partition",
    "multilane.origin.offset",
    "multilane.attempts",
    "multilane.error.reason",
)
REASON_HEADER = "multilane.error.reason"

# The reasons a dead letter names (header ``multilane.error.reason``).
DECODE_ERROR = "decode-error"  # a DecodeError: the key or value is not in its format; never retried
NON_RETRYABLE = "non-retryable"  # the processor raised NonRetryable; never retried
NOT_RETRIED = "not-retried"  # an exception type outside --retry-on; never retried
RETRIES_EXHAUSTED = "retries-exhausted"  # retried --max-retries times, failed every time


def failure_reason(exc: BaseException, retry_on: tuple[type[BaseException], ...] = (Exception,)) -> str:
    """Why a failure is not (or no longer) retried, as its dead letter's header names it. Pure."""
    if isinstance(exc, DecodeError):
        return DECODE_ERROR
    if isinstance(exc, NonRetryable):
        return NON_RETRYABLE
    if not isinstance(exc, retry_on):
        return NOT_RETRIED
    return RETRIES_EXHAUSTED


@dataclass(frozen=True)
class RetryPolicy:
    """``max_retries`` retries after the first attempt, backoff ``base * 2**(attempt-1)``, capped.

    Jitter: the delay is drawn uniformly from ``[delay/2, delay]`` ("equal jitter") so that records
    failing together do not retry in lockstep.
    """

    max_retries: int = 3
    base_ms: int = 100
    max_ms: int = 10_000
    # Exception types that are retried (``--retry-on``); any other goes to the dead-letter topic at once.
    # NonRetryable (and DecodeError) are never retried, whatever this says.
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    @classmethod
    def from_config(cls, config: Any) -> RetryPolicy:
        """The policy of an :class:`~multilane.worker.config.EngineConfig`."""
        return cls(config.max_retries, config.retry_backoff_ms, config.retry_backoff_max_ms,
                   tuple(config.retry_on))

    def should_retry(self, attempt: int, exc: BaseException | None = None) -> bool:
        """Whether to retry after attempt ``attempt`` (1-based) failed with ``exc`` (steps 1-3).

        1. A :class:`~multilane.api.NonRetryable` (incl. :class:`~multilane.api.DecodeError`): never.
        2. An exception type outside ``retry_on``: never.
        3. Otherwise while ``attempt <= max_retries``.
        """
        if exc is not None:
            # 1. never retried
            if isinstance(exc, NonRetryable):
                return False
            # 2. not a retried type
            if not isinstance(exc, self.retry_on):
                return False
        # 3. retries left
        return attempt <= self.max_retries

    def reason(self, exc: BaseException) -> str:
        """The dead-letter reason of ``exc`` under this policy (:func:`failure_reason`)."""
        return failure_reason(exc, self.retry_on)

    def delay_s(self, attempt: int, rnd: random.Random | None = None) -> float:
        """Seconds to wait before attempt ``attempt + 1``."""
        if self.base_ms <= 0:
            return 0.0
        full = min(self.max_ms, self.base_ms * (2 ** min(attempt - 1, 30))) / 1000.0
        r = (rnd or random).random()
        return full / 2 + r * full / 2


class RetryLog:
    """Logs retries: each one at DEBUG, and at INFO one summary line a minute (``interval_s``).

    The summary says how many retries there were since the last one, of how many records and which
    error types; it is written by the first retry after the interval, or by :meth:`flush`.
    """

    def __init__(self, logger: logging.Logger | None = None, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger or log
        self._interval_s = interval_s
        self._clock = clock
        self._since = clock()
        self._retries = 0  # retries since the last summary
        self._types: Counter[str] = Counter()  # error type -> retries since the last summary

    def retrying(self, topic: str, partition: int, offset: int, attempt: int, exc: BaseException,
                 delay_s: float) -> None:
        """Record one retry (attempt ``attempt`` failed; the next one starts in ``delay_s``)."""
        self._log.debug("retrying %s/%d@%d (attempt %d failed: %r) in %.3fs",
                        topic, partition, offset, attempt, exc, delay_s)
        self._retries += 1
        self._types[type(exc).__name__] += 1
        if self._clock() - self._since >= self._interval_s:
            self.flush()

    def flush(self) -> None:
        """Write the summary now (nothing when there was no retry since the last one)."""
        now = self._clock()
        if self._retries:
            types = ", ".join(f"{name} x{n}" for name, n in self._types.most_common(5))
            self._log.info("%d retries in the last %.0fs (%s); each is logged at DEBUG",
                           self._retries, now - self._since, types)
        self._since = now
        self._retries = 0
        self._types.clear()


def _describe(exc: BaseException) -> tuple[bytes, bytes]:
    etype = f"{type(exc).__module__}.{type(exc).__qualname__}".encode()
    message = (str(exc) or repr(exc))[:2000].encode("utf-8", "replace")
    return etype, message


def dead_letter_headers(record: Record, exc: BaseException, attempts: int,
                        reason: str) -> list[tuple[str, bytes]]:
    """The headers of ``record``'s dead letter: its own, then :data:`DLQ_HEADERS`. Pure."""
    etype, message = _describe(exc)
    return [
        *record.headers,
        ("multilane.error.type", etype),
        ("multilane.error.message", message),
        ("multilane.origin.topic", record.topic.encode()),
        ("multilane.origin.partition", str(record.partition).encode()),
        ("multilane.origin.offset", str(record.offset).encode()),
        ("multilane.attempts", str(attempts).encode()),
        (REASON_HEADER, reason.encode()),
    ]


class DeadLetterPublisher:
    """Produces records that exhausted their retries to the dead-letter topic.

    Invariant: every call to :meth:`publish` ends in exactly one call of its ``on_done`` callback,
    after the broker acknowledged the dead letter (or never, while the engine keeps retrying and the
    publisher is not closed).
    """

    def __init__(
        self,
        producer: Any,
        topic_for: Callable[[str], str],
        ensure_topic: Callable[[str], None] | None = None,
        retry_delay_s: float = 1.0,
        hold: Callable[..., None] | None = None,
    ) -> None:
        """``hold``: exactly-once outputs (``TransactionalOutputs.hold``): a dead letter is held as the
        record's output (it goes out in the partition's transaction) and the record completes at once."""
        self._producer = producer
        self._hold = hold
        self._topic_for = topic_for
        self._ensure_topic = ensure_topic
        self._retry_delay_s = retry_delay_s
        self._known_topics: set[str] = set()
        # topics being created -> dead letters waiting for them (loop thread only)
        self._creating: dict[str, list[tuple[Record, list[tuple[str, bytes]], Callable[[], None]]]] = {}
        self._closed = False
        self.pending = 0  # dead letters produced and not yet acknowledged

    def close(self) -> None:
        self._closed = True

    def publish(self, record: Record, exc: BaseException, attempts: int, on_done: Callable[[], None],
                reason: str | None = None) -> None:
        """Produce ``record`` to its dead-letter topic; call ``on_done`` once it is acknowledged.

        ``reason`` (header ``multilane.error.reason``) defaults to :func:`failure_reason` of ``exc``;
        callers with a ``--retry-on`` policy pass ``policy.reason(exc)``.
        """
        topic = self._topic_for(record.topic)
        reason = reason or failure_reason(exc)
        headers = dead_letter_headers(record, exc, attempts, reason)
        tb = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        log.warning(
            "dead-lettering %s/%d@%d (%s, %d attempt(s)) to %s: %s",
            record.topic, record.partition, record.offset, reason, attempts, topic, tb,
        )
        self.pending += 1
        self._produce(topic, record, headers, on_done)

    def _produce(
        self, topic: str, record: Record, headers: list[tuple[str, bytes]], on_done: Callable[[], None]
    ) -> None:
        if self._closed:
            self.pending -= 1
            return
        if topic not in self._known_topics and self._ensure_topic is not None:
            # Create the topic on a worker thread (admin calls block); produce once it exists.
            waiting = self._creating.get(topic)
            if waiting is None:
                waiting = self._creating[topic] = []
                loop = asyncio.get_running_loop()
                fut = loop.run_in_executor(None, self._ensure_topic, topic)
                fut.add_done_callback(functools.partial(self._created, topic))
            waiting.append((record, headers, on_done))
            return
        if self._hold is not None:
            self._hold(record.topic, record.partition, record.offset,
                       [(topic, record.value, record.key, headers)])
            self.pending -= 1
            on_done()
            return

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                log.warning("dead letter for %s/%d@%d not delivered (%s); retrying",
                            record.topic, record.partition, record.offset, err)
                self._later(topic, record, headers, on_done)
                return
            self.pending -= 1
            on_done()

        try:
            self._producer.produce(topic, value=record.value, key=record.key, headers=headers,
                                   on_delivery=delivered)
        except BufferError:
            self._later(topic, record, headers, on_done)
        except Exception as exc:
            log.warning("dead letter produce failed (%s); retrying", exc)
            self._later(topic, record, headers, on_done)

    def _created(self, topic: str, fut: asyncio.Future[None]) -> None:
        waiting = self._creating.pop(topic, [])
        exc = fut.exception() if not fut.cancelled() else None
        if fut.cancelled() or exc is not None:
            log.warning("cannot create dead-letter topic %s yet (%s); retrying", topic, exc)
        else:
            self._known_topics.add(topic)
        for record, headers, on_done in waiting:
            if exc is None and not fut.cancelled():
                self._produce(topic, record, headers, on_done)
            else:
                self._later(topic, record, headers, on_done)

    def _later(
        self, topic: str, record: Record, headers: list[tuple[str, bytes]], on_done: Callable[[], None]
    ) -> None:
        asyncio.get_running_loop().call_later(
            self._retry_delay_s, self._produce, topic, record, headers, on_done
        )
