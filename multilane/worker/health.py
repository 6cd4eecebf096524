"""A worker's health: the broker probe, the Kafka clients' log through Python ``logging`` (rate-limited),
and the health metrics (breaker, end-to-end latency, loop blocking, broker reachability, the group).
Does I/O (metadata requests on a helper thread).

- :class:`BrokerProbe`: a metadata request every ``interval_s`` (on a thread: the admin client
  blocks). It tracks since when the broker has not answered, which input topics are missing, and
  after ``timeout_s`` without an answer calls ``on_give_up`` once (the worker exits: steps in
  ``multilane.worker.cli``). One WARNING line when the broker stops answering, one INFO line when it
  answers again.
- :func:`kafka_logger`: the logger handed to librdkafka clients (config ``logger``), with a
  :class:`RateLimitFilter` that lets the same message through at most once per ``window_s`` (a wrong
  bootstrap address otherwise prints ~40 lines a second) and says how many it dropped.
- :class:`HealthCollector`: ``multilane_breaker_open``, ``multilane_end_to_end_latency_seconds``,
  ``multilane_loop_blocked_total``, ``multilane_broker_reachable`` and ``multilane_worker_info``, all
  labelled with the consumer ``group``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["AppMetricsCollector", "BrokerProbe", "HealthCollector", "RateLimitFilter", "kafka_logger"]

log = logging.getLogger(__name__)


class RateLimitFilter(logging.Filter):
    """Passes a message (digits masked) at most once per ``window_s``; the next one that passes says
    how many were dropped in between."""

    _DIGITS = re.compile(r"\d+")

    def __init__(self, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = self._DIGITS.sub("#", str(record.msg))[:200]
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.window_s:
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return False
        self._last[key] = now
        dropped = self._dropped.pop(key, 0)
        if dropped:
            record.msg = f"{record.msg} ({dropped} more like it in the last {self.window_s:.0f}s)"
        if len(self._last) > 1000:  # bounded memory: forget the oldest half
            for k in sorted(self._last, key=self._last.__getitem__)[:500]:
                self._last.pop(k, None)
        return True


def kafka_logger(window_s: float = 10.0) -> logging.Logger:
    """The logger librdkafka clients write to (``multilane.kafka``), rate-limited once."""
    logger = logging.getLogger("multilane.kafka")
    if not any(isinstance(f, RateLimitFilter) for f in logger.filters):
        logger.addFilter(RateLimitFilter(window_s))
    return logger


class BrokerProbe:
    """Asks the broker for the input topics' metadata every ``interval_s`` (steps 1-3 per probe).

    1. ``list_topics`` on a helper thread (``admin_factory()`` gives the client, made once).
    2. An answer: reachable; topics missing from it are recorded (``missing``).
    3. No answer: unreachable since the first failure; one WARNING; after ``timeout_s`` (> 0)
       ``on_give_up(reason)`` once.
    """

    def __init__(self, admin_factory: Callable[[], Any], topics: Sequence[str], interval_s: float = 2.0,
                 timeout_s: float = 0.0, on_give_up: Callable[[str], None] | None = None,
                 request_timeout_s: float = 5.0) -> None:
        self._admin_factory = admin_factory
        self._admin: Any = None
        self.topics = tuple(topics)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._on_give_up = on_give_up
        self._request_timeout_s = request_timeout_s
        self.reachable = True  # optimistic until the first probe
        self.unreachable_since: float | None = None
        self.missing: tuple[str, ...] = ()
        self.gave_up = False
        self._task: asyncio.Task[None] | None = None

    @property
    def unreachable_s(self) -> float:
        return 0.0 if self.unreachable_since is None else time.monotonic() - self.unreachable_since

    def check(self) -> tuple[bool, tuple[str, ...]]:
        """One blocking probe: (answered, missing topics). Call on a helper thread."""
        # 1.
        if self._admin is None:
            self._admin = self._admin_factory()
        poll = getattr(self._admin, "poll", None)
        try:
            md = self._admin.list_topics(timeout=self._request_timeout_s)
        except Exception as exc:
            log.debug("broker probe: %s", exc)
            return False, ()
        finally:
            if poll is not None:
                poll(0)  # serves the client's queued log lines (config ``logger``)
        present = {name for name, t in md.topics.items() if t.error is None}
        return True, tuple(t for t in self.topics if t not in present)

    def record(self, answered: bool, missing: tuple[str, ...]) -> None:
        """Apply one probe's result (on the loop)."""
        now = time.monotonic()
        if answered:
            # 2.
            if not self.reachable:
                log.info("broker reachable again after %.0fs", self.unreachable_s)
            self.reachable = True
            self.unreachable_since = None
            self.missing = missing
            return
        # 3.
        if self.reachable:
            self.reachable = False
            self.unreachable_since = now
            log.warning("broker unreachable (no metadata answer within %.0fs)%s", self._request_timeout_s,
                        f"; the worker exits after {self.timeout_s:g}s (--broker-timeout-s)"
                        if self.timeout_s > 0 else "")
        if self.timeout_s > 0 and not self.gave_up and self.unreachable_s >= self.timeout_s:
            self.gave_up = True
            if self._on_give_up is not None:
                self._on_give_up(f"broker unreachable for {self.unreachable_s:.0f}s (--broker-timeout-s "
                                 f"{self.timeout_s:g})")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            answered, missing = await loop.run_in_executor(None, self.check)
            self.record(answered, missing)
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="multilane-broker-probe")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


class HealthCollector(Collector):
    """The health metrics, read at scrape time from the objects that own them (any may be None)."""

    def __init__(self, group: str, worker_id: str, breaker: Any = None, latency: Any = None,
                 loopwatch: Any = None, probe: BrokerProbe | None = None) -> None:
        self.group = group
        self.worker_id = worker_id
        self.breaker = breaker
        self.latency = latency
        self.loopwatch = loopwatch
        self.probe = probe

    def collect(self) -> Iterator[Metric]:
        g = [self.group]
        info = GaugeMetricFamily("multilane_worker_info", "this worker's consumer group and id (value 1)",
                                 labels=["group", "worker_id"])
        info.add_metric([self.group, self.worker_id], 1.0)
        yield info
        if self.breaker is not None:
            yield _of_group(GaugeMetricFamily, "multilane_breaker_open", "1 while the circuit breaker holds "
                            "records (N consecutive dead letters; POST /breaker/reset)", self.group,
                            1.0 if self.breaker.is_open else 0.0)
            yield _of_group(CounterMetricFamily, "multilane_breaker_opened",
                            "times the circuit breaker opened", self.group, float(self.breaker.opened_total))
        if self.latency is not None:
            h = self.latency.histogram
            fam_h = HistogramMetricFamily("multilane_end_to_end_latency_seconds",
                                          "from the record's timestamp to the end of its processing",
                                          labels=["group"])
            fam_h.add_metric(g, h.cumulative(), h.sum)
            yield fam_h
        if self.loopwatch is not None:
            yield _of_group(CounterMetricFamily, "multilane_loop_blocked", "times the event loop was blocked "
                            "longer than the threshold (a processor blocking it is named in a WARNING)",
                            self.group, float(self.loopwatch.blocked_total))
        if self.probe is not None:
            yield _of_group(GaugeMetricFamily, "multilane_broker_reachable", "1 when the last metadata "
                            "request was answered", self.group, 1.0 if self.probe.reachable else 0.0)


def _of_group(kind: type[GaugeMetricFamily | CounterMetricFamily], name: str, documentation: str, group: str,
              value: float) -> Metric:
    """A gauge or counter family of one sample, labelled with the consumer group."""
    family = kind(name, documentation, labels=["group"])
    family.add_metric([group], value)
    return family


class AppMetricsCollector(Collector):
    """The application's own metrics: everything in ``prometheus_client``'s default registry (metrics a
    processor module defines with ``prometheus_client.Counter(...)`` etc., plus the process and Python
    collectors), served on the worker's ``/metrics`` beside the worker's."""

    def collect(self) -> Iterator[Metric]:
        from prometheus_client import REGISTRY

        yield from REGISTRY.collect()
