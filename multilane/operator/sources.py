"""Metric sources for the scaling loop: lag per partition, input and processing rates. Does I/O.

- :class:`PrometheusSource` runs PromQL through ``prometheus-api-client``. The default queries read the
  workers' own metrics (``multilane_consumer_lag``, ``multilane_records_processed_total``); every query
  is configurable, so a common exporter works too, e.g. kafka-exporter::

      lag_query:  sum by (topic, partition) (kafka_consumergroup_lag{consumergroup="$group"})
      rate_query: sum(rate(kafka_consumergroup_current_offset{consumergroup="$group"}[1m]))

  Placeholders (``string.Template``): ``$namespace``, ``$name``, ``$group``, ``$topics`` (a regex
  alternation of the topic names). The input rate is ``processing rate + d(total lag)/dt``.
- :class:`KafkaSource` (the fallback) reads committed offsets vs end offsets through the admin API and
  derives the rates from consecutive samples; its first sample has no rates. Note: some
  Kafka-compatible brokers under-report end offsets via the admin API (see FACTS.md); prefer
  the Prometheus source where the workers' own lag (from fetch responses) is scraped.

A source raises :class:`MetricsUnavailableError` when it cannot be asked and
:class:`MetricsInvalidError` when the answer is nonsense (negative or non-finite values, no series,
missing partitions); the caller then holds its last decision.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from string import Template
from typing import Any, Protocol

from multilane.operator.decision.planner import format_partition
from multilane.operator.kafka_admin import KafkaAdminClient, KafkaUnavailableError

__all__ = [
    "DEFAULT_LAG_QUERY",
    "DEFAULT_RATE_QUERY",
    "KafkaSource",
    "MetricSample",
    "MetricSource",
    "MetricsInvalidError",
    "MetricsUnavailableError",
    "PrometheusSource",
    "QueryContext",
]

_SELECTOR = 'namespace="$namespace", pod=~"$name-[0-9]+"'
DEFAULT_LAG_QUERY = f"max by (topic, partition) (multilane_consumer_lag{{{_SELECTOR}}})"
DEFAULT_RATE_QUERY = f"sum(rate(multilane_records_processed_total{{{_SELECTOR}}}[1m]))"


class MetricsUnavailableError(RuntimeError):
    """The source could not be asked (connection refused, timeout, HTTP error)."""


class MetricsInvalidError(ValueError):
    """The source answered with something that must not drive scaling."""


@dataclass(frozen=True, slots=True)
class QueryContext:
    """What a source needs to know about the consumer it measures."""

    namespace: str
    name: str
    group: str
    partitions: Sequence[str]  # every "topic/index" of the subscribed topics

    @property
    def topics(self) -> list[str]:
        return sorted({p.rpartition("/")[0] for p in self.partitions})


@dataclass(frozen=True, slots=True)
class MetricSample:
    """Invariants: every lag value is a non-negative int; rates are finite, >= 0, or None (unknown)."""

    lag: Mapping[str, int]  # "topic/index" -> records
    input_rate: float | None
    processing_rate: float | None
    time: float

    @property
    def total_lag(self) -> int:
        return sum(self.lag.values())


class MetricSource(Protocol):
    async def sample(self, ctx: QueryContext) -> MetricSample: ...


def _check_rate(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value) or value < 0:
        raise MetricsInvalidError(f"{name} is {value!r}")
    return value


def _check_lag(lag: Mapping[str, int], ctx: QueryContext) -> None:
    missing = [p for p in ctx.partitions if p not in lag]
    if missing:
        raise MetricsInvalidError(f"no lag for {len(missing)} partition(s), e.g. {missing[0]}")
    bad = {p: v for p, v in lag.items() if v < 0}
    if bad:
        raise MetricsInvalidError(f"negative lag: {bad}")


class PrometheusSource:
    """``client_factory(url)`` returns an object with ``custom_query(query) -> list`` (the
    ``PrometheusConnect`` API); injectable for tests. ``window``/``step``: the subquery used for the
    lag derivative."""

    def __init__(
        self,
        url: str,
        lag_query: str = "",
        rate_query: str = "",
        window: str = "2m",
        step: str = "15s",
        timeout_s: float = 5.0,
        client_factory: Callable[[str], Any] | None = None,
    ) -> None:
        self.url = url
        self.lag_query = lag_query or DEFAULT_LAG_QUERY
        self.rate_query = rate_query or DEFAULT_RATE_QUERY
        self.window = window
        self.step = step
        self.timeout_s = timeout_s
        self._client_factory = client_factory or self._default_client
        self._client: Any = None

    @staticmethod
    def _default_client(url: str) -> Any:
        from prometheus_api_client import PrometheusConnect

        return PrometheusConnect(url=url, disable_ssl=False)

    def queries(self, ctx: QueryContext) -> tuple[str, str, str]:
        """The (lag, processing-rate, input-rate) queries for ``ctx``."""
        values = {
            "namespace": ctx.namespace,
            "name": ctx.name,  # a DNS-1123 name: nothing to escape
            "group": ctx.group,
            # A regex inside a PromQL string literal: "." must be "\\." in the query text.
            "topics": "|".join(t.replace(".", "\\\\.") for t in ctx.topics),
        }
        lag = Template(self.lag_query).safe_substitute(values)
        rate = Template(self.rate_query).safe_substitute(values)
        input_rate = f"({rate}) + deriv((sum({lag}))[{self.window}:{self.step}])"
        return lag, rate, input_rate

    def _query(self, query: str) -> list[dict[str, Any]]:
        if self._client is None:
            self._client = self._client_factory(self.url)
        try:
            result = self._client.custom_query(
                query=query, params={"timeout": f"{int(self.timeout_s * 1000)}ms"}
            )
        except Exception as exc:  # the client raises requests' and its own errors
            if "HTTP Status Code 400" in str(exc) or "HTTP Status Code 422" in str(exc):
                # Prometheus refused the query itself (bad PromQL in lagQuery/rateQuery): not transient.
                raise MetricsInvalidError(f"query rejected by {self.url}: {exc}") from exc
            raise MetricsUnavailableError(f"{self.url}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(result, list):
            raise MetricsInvalidError(f"unexpected answer type {type(result).__name__}")
        return result

    @staticmethod
    def _scalar(result: list[dict[str, Any]], name: str) -> float | None:
        if not result:
            return None
        try:
            return float(result[0]["value"][1])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise MetricsInvalidError(f"{name}: malformed sample {result[0]!r}") from exc

    def _sample(self, ctx: QueryContext) -> MetricSample:
        lag_q, rate_q, input_q = self.queries(ctx)
        lag: dict[str, int] = {}
        for series in self._query(lag_q):
            labels = series.get("metric") or {}
            try:
                value = float(series["value"][1])
                key = format_partition(str(labels["topic"]), int(labels["partition"]))
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise MetricsInvalidError(f"lag series without topic/partition or value: {series!r}") from exc
            if not math.isfinite(value):
                raise MetricsInvalidError(f"lag of {key} is {value}")
            lag[key] = int(value)
        if not lag:
            raise MetricsInvalidError("the lag query returned no series")
        _check_lag(lag, ctx)
        processing = _check_rate("processing rate", self._scalar(self._query(rate_q), "processing rate"))
        raw_input = self._scalar(self._query(input_q), "input rate")
        if raw_input is not None and math.isfinite(raw_input):
            raw_input = max(0.0, raw_input)  # a shrinking backlog can make the estimate dip below zero
        input_rate = _check_rate("input rate", raw_input)
        return MetricSample(
            lag={p: lag[p] for p in ctx.partitions},
            input_rate=input_rate,
            processing_rate=processing,
            time=time.time(),
        )

    async def sample(self, ctx: QueryContext) -> MetricSample:
        return await asyncio.to_thread(self._sample, ctx)


class KafkaSource:
    """Lag from committed vs end offsets; rates from the previous sample of the same source."""

    def __init__(self, admin: KafkaAdminClient, clock: Callable[[], float] = time.time) -> None:
        self.admin = admin
        self.clock = clock
        self._previous: tuple[float, int, int] | None = None  # (time, sum of ends, sum of committed)

    async def sample(self, ctx: QueryContext) -> MetricSample:
        counts: dict[str, int] = {}
        for p in ctx.partitions:
            topic, _, index = p.rpartition("/")
            counts[topic] = max(counts.get(topic, 0), int(index) + 1)
        try:
            offsets = await self.admin.offsets(ctx.group, counts)
        except KafkaUnavailableError as exc:
            raise MetricsUnavailableError(str(exc)) from exc
        lag = {o.partition: o.lag for o in offsets}
        _check_lag(lag, ctx)
        now = self.clock()
        ends = sum(o.high for o in offsets)
        done = sum(o.committed if o.committed is not None else o.low for o in offsets)
        input_rate = processing_rate = None
        if self._previous is not None and now > self._previous[0]:
            dt_s = now - self._previous[0]
            input_rate = max(0.0, (ends - self._previous[1]) / dt_s)
            processing_rate = max(0.0, (done - self._previous[2]) / dt_s)
        self._previous = (now, ends, done)
        return MetricSample(
            lag={p: lag[p] for p in ctx.partitions},
            input_rate=_check_rate("input rate", input_rate),
            processing_rate=_check_rate("processing rate", processing_rate),
            time=now,
        )
