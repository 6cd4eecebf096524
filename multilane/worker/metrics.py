"""Prometheus metrics of a worker. Does I/O only in :meth:`WorkerMetrics.render` callers (HTTP).

Counters are not incremented per record through prometheus_client (that costs about a microsecond
each): the engine keeps plain integer counters and :class:`WorkerMetrics` reads them at scrape time
through a custom collector. Each :class:`WorkerMetrics` has its own ``CollectorRegistry``, so several
engines can live in one process (tests). Metric names are fixed in docs/architecture.md
("Worker metrics").
"""

from __future__ import annotations

import bisect
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

__all__ = [
    "COMMIT_LATENCY_BUCKETS",
    "CONTENT_TYPE",
    "LatencyHistogram",
    "MetricsServer",
    "MetricsSource",
    "WorkerMetrics",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

DEFAULT_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)


class LatencyHistogram:
    """A cheap histogram of processing durations (seconds), exported at scrape time.

    Invariant: ``counts[i]`` counts observations ``<= bounds[i]`` and ``> bounds[i-1]``;
    ``counts[-1]`` counts those above the last bound; ``total == sum(counts)``.
    """

    __slots__ = ("bounds", "counts", "sum", "total")

    def __init__(self, bounds: Iterable[float] = DEFAULT_BUCKETS) -> None:
        self.bounds: list[float] = sorted(bounds)
        self.counts: list[int] = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.total = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds
        self.total += 1

    def observe_many(self, values: list[float]) -> None:
        """Count a batch: ``values`` is sorted in place, then each bucket is one bisection of it (C
        work per value, Python work per bucket; the caller's list is a buffer it clears next)."""
        n = len(values)
        if not n:
            return
        values.sort()
        counts = self.counts
        right = bisect.bisect_right
        below = 0  # values <= the previous bound
        for i, bound in enumerate(self.bounds):
            upto = right(values, bound)
            if upto != below:
                counts[i] += upto - below
                below = upto
            if upto == n:
                break
        else:
            counts[-1] += n - below
        self.sum += sum(values)
        self.total += n

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, c in zip(self.bounds, self.counts, strict=False):
            acc += c
            out.append((repr(bound), float(acc)))
        out.append(("+Inf", float(acc + self.counts[-1])))
        return out


#: Buckets of ``multilane_commit_latency_seconds`` (a commit cycle includes the state flush and the
#: progress record's acknowledgement, so it is slower than a bare offset commit).
COMMIT_LATENCY_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
_EMPTY_COMMIT_LATENCY = LatencyHistogram(COMMIT_LATENCY_BUCKETS)


class MetricsSource(Protocol):
    """What the collector reads from the engine (on the engine's loop thread, at scrape time)."""

    def metric_partitions(self) -> list[Any]: ...  # PartitionRuntime objects
    @property
    def factor(self) -> int: ...
    @property
    def histogram(self) -> LatencyHistogram: ...
    def stalled_count(self) -> int: ...
    def lane_utilisation(self) -> float: ...
    def last_progress_bytes(self) -> int: ...


class _EngineCollector(Collector):
    def __init__(self, source: MetricsSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        src = self._source
        parts = src.metric_partitions()
        labels = ["topic", "partition"]
        counters = {
            "multilane_records_processed": ("records processed successfully", "processed"),
            "multilane_records_failed": ("processing attempts that raised", "failed"),
            "multilane_records_retried": ("attempts scheduled again after a failure", "retried"),
            "multilane_records_dead_lettered": ("records sent to the dead-letter topic", "dead_lettered"),
        }
        for name, (doc, attr) in counters.items():
            fam = CounterMetricFamily(name, doc, labels=labels)
            for p in parts:
                fam.add_metric([p.topic, str(p.partition)], float(getattr(p, attr)))
            yield fam
        gauges: dict[str, tuple[str, Any]] = {
            "multilane_in_flight_records": ("records fetched and not yet complete",
                                            lambda p: p.in_flight),
            "multilane_committed_offset": ("last committed offset", lambda p: p.committed),
            "multilane_consumer_lag": ("high watermark minus committable offset", lambda p: p.lag()),
            "multilane_partition_paused": ("1 when fetching of the partition is paused",
                                           lambda p: 1 if (p.flow_counters.paused or p.user_paused)
                                           else 0),
            "multilane_in_flight_bytes": ("bytes of records fetched and not yet complete",
                                          lambda p: p.flow_counters.bytes),
        }
        for name, (doc, get) in gauges.items():
            fam_g = GaugeMetricFamily(name, doc, labels=labels)
            for p in parts:
                v = get(p)
                if v is not None:
                    fam_g.add_metric([p.topic, str(p.partition)], float(v))
            yield fam_g
        yield GaugeMetricFamily("multilane_lane_utilisation_ratio",
                                "records being processed / lane concurrency, over all partitions (records "
                                "waiting only for their outputs' acknowledgements not counted)",
                                value=src.lane_utilisation())
        yield GaugeMetricFamily("multilane_stalled_records",
                                "records running longer than the stall threshold",
                                value=float(src.stalled_count()))
        yield GaugeMetricFamily("multilane_factor", "lanes per partition (parallelising factor)",
                                value=float(src.factor))
        yield GaugeMetricFamily("multilane_progress_record_bytes",
                                "size of the last encoded progress record",
                                value=float(src.last_progress_bytes()))
        h = src.histogram
        yield HistogramMetricFamily("multilane_processing_seconds", "processing time per attempt",
                                    buckets=h.cumulative(), sum_value=h.sum)
        c = _commit_latency(src)
        yield HistogramMetricFamily("multilane_commit_latency_seconds",
                                    "from the start of a commit cycle (state flush, progress record) to "
                                    "the broker's acknowledgement of the offset commit",
                                    buckets=c.cumulative(), sum_value=c.sum)


def _commit_latency(src: MetricsSource) -> LatencyHistogram:
    """The commit cycle's latency histogram (``src.commit_latency``, None before the engine started:
    an empty histogram then)."""
    found = getattr(src, "commit_latency", None)
    return found if isinstance(found, LatencyHistogram) else _EMPTY_COMMIT_LATENCY


class WorkerMetrics:
    """The worker's metric registry (one per engine).

    ``extra``: further collectors served from the same registry, e.g. the state store's
    (``StateManager.metrics_collectors()``: restore and learner metrics).
    """

    def __init__(self, source: MetricsSource, extra: Iterable[Collector] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(source))
        for collector in extra:
            self.registry.register(collector)

    def render(self) -> bytes:
        """The exposition text (call on the engine's loop thread)."""
        return generate_latest(self.registry)


class MetricsServer:
    """Serves ``GET /metrics`` (aiohttp, on the engine's loop, so scrapes read consistent counters)."""

    def __init__(
        self,
        metrics: WorkerMetrics,
        host: str = "0.0.0.0",
        port: int = 9464,
        probes: Mapping[str, Callable[[Any], Awaitable[Any]]] | None = None,
    ) -> None:
        self.metrics = metrics
        # path -> GET handler served beside /metrics (the control endpoint's /healthz and /readyz)
        self.probes = dict(probes or {})
        self.host = host
        self.port = port
        self._runner: Any = None

    async def start(self) -> int:
        from aiohttp import web

        async def handle(_request: web.Request) -> web.Response:
            return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

        app = web.Application()
        app.router.add_get("/metrics", handle)
        for path, probe in self.probes.items():
            app.router.add_get(path, probe)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        sockets = getattr(site._server, "sockets", None)
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
