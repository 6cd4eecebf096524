"""Retries with exponential backoff and jitter, and the dead-letter publisher.

:class:`RetryPolicy` is pure. :class:`DeadLetterPublisher` does I/O: it produces failed records to the
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
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from multilane.api import Record

__all__ = ["DLQ_HEADERS", "DeadLetterPublisher", "RetryPolicy"]

log = logging.getLogger(__name__)

# Headers added to every dead letter (the record's own headers are kept before them).
DLQ_HEADERS = (
    "multilane.error.type",
    "multilane.error.message",
    "multilane.origin.topic",
    "multilane.origin.partition",
    "multilane.origin.offset",
    "multilane.attempts",
)


@dataclass(frozen=True)
class RetryPolicy:
    """``max_retries`` retries after the first attempt, backoff ``base * 2**(attempt-1)``, capped.

    Jitter: the delay is drawn uniformly from ``[delay/2, delay]`` ("equal jitter") so that records
    failing together do not retry in lockstep.
    """

    max_retries: int = 3
    base_ms: int = 100
    max_ms: int = 10_000

    def should_retry(self, attempt: int) -> bool:
        """``attempt`` is the 1-based attempt that just failed."""
        return attempt <= self.max_retries

    def delay_s(self, attempt: int, rnd: random.Random | None = None) -> float:
        """Seconds to wait before attempt ``attempt + 1``."""
        if self.base_ms <= 0:
            return 0.0
        full = min(self.max_ms, self.base_ms * (2 ** min(attempt - 1, 30))) / 1000.0
        r = (rnd or random).random()
        return full / 2 + r * full / 2


def _describe(exc: BaseException) -> tuple[bytes, bytes]:
    etype = f"{type(exc).__module__}.{type(exc).__qualname__}".encode()
    message = (str(exc) or repr(exc))[:2000].encode("utf-8", "replace")
    return etype, message


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
    ) -> None:
        self._producer = producer
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

    def publish(self, record: Record, exc: BaseException, attempts: int, on_done: Callable[[], None]) -> None:
        """Produce ``record`` to its dead-letter topic; call ``on_done`` once it is acknowledged."""
        topic = self._topic_for(record.topic)
        etype, message = _describe(exc)
        headers = [
            *record.headers,
            ("multilane.error.type", etype),
            ("multilane.error.message", message),
            ("multilane.origin.topic", record.topic.encode()),
            ("multilane.origin.partition", str(record.partition).encode()),
            ("multilane.origin.offset", str(record.offset).encode()),
            ("multilane.attempts", str(attempts).encode()),
        ]
        tb = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        log.warning(
            "dead-lettering %s/%d@%d after %d attempts to %s: %s",
            record.topic, record.partition, record.offset, attempts, topic, tb,
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
