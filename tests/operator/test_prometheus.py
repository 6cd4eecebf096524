"""``PrometheusSource`` against a real Prometheus (the Debian ``prometheus`` binary) scraping a tiny
in-test exporter that exposes multilane's worker metric names (and kafka-exporter's lag metric).

Real: Prometheus, prometheus-api-client, PromQL. The exporter is a stand-in for the workers' metrics
endpoint (same metric names and labels; the scrape config adds ``namespace``/``pod`` as Kubernetes
service discovery would).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from multilane.operator.sources import (
    MetricsInvalidError,
    MetricsUnavailableError,
    PrometheusSource,
    QueryContext,
)
from multilane.testing.broker import free_port

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs the prometheus binary"),
]

TOPIC = "orders"
CTX = QueryContext(
    namespace="team-a", name="app", group="app-group", partitions=[f"{TOPIC}/{i}" for i in range(3)]
)


class Exporter:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.lag = Gauge("multilane_consumer_lag", "lag", ["topic", "partition"], registry=self.registry)
        self.processed = Counter(
            "multilane_records_processed", "processed", ["topic", "partition"], registry=self.registry
        )
        self.kafka_lag = Gauge(
            "kafka_consumergroup_lag",
            "kafka-exporter lag",
            ["consumergroup", "topic", "partition"],
            registry=self.registry,
        )
        self.port = free_port()
        self.stop = threading.Event()

    def start(self) -> None:
        start_http_server(self.port, addr="127.0.0.1", registry=self.registry)
        for i in range(3):
            self.lag.labels(TOPIC, str(i)).set(100 * (i + 1))
            self.kafka_lag.labels("app-group", TOPIC, str(i)).set(7 + i)

        def tick() -> None:  # 30 records/s per partition
            while not self.stop.wait(0.1):
                for i in range(3):
                    self.processed.labels(TOPIC, str(i)).inc(3)

        threading.Thread(target=tick, daemon=True).start()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Exporter]]:
    exporter = Exporter()
    exporter.start()
    tmp = tmp_path_factory.mktemp("prometheus")
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: workers\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{exporter.port}']\n"
        "        labels: {namespace: team-a, pod: app-0}\n"
    )
    port = free_port()
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--config.file={config}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError(f"prometheus did not start: {Path(log.name).read_text()[-2000:]}")
        yield url, exporter
    finally:
        exporter.stop.set()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def wait_sample(source: PrometheusSource, accept: object, timeout: float = 60.0) -> object:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = source._sample(CTX)
            if accept(last):  # type: ignore[operator]
                return last
        except MetricsInvalidError as exc:  # no series scraped yet
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"no acceptable sample in {timeout}s; last: {last!r}")


def test_default_queries_read_the_workers_metrics(prometheus: tuple[str, Exporter]) -> None:
    url, _ = prometheus
    source = PrometheusSource(url, window="20s", step="1s")
    # The rate settles once Prometheus holds a few scrapes (3 partitions x 30 records/s = 90/s).
    sample = wait_sample(
        source, lambda s: s.processing_rate and s.processing_rate >= 30 and s.input_rate is not None
    )
    assert sample.lag == {f"{TOPIC}/0": 100, f"{TOPIC}/1": 200, f"{TOPIC}/2": 300}  # type: ignore[attr-defined]
    assert sample.processing_rate <= 150  # type: ignore[attr-defined]
    # A constant lag: input rate = processing rate + d(lag)/dt = processing rate.
    assert sample.input_rate == pytest.approx(sample.processing_rate, rel=0.3)  # type: ignore[attr-defined]


def test_kafka_exporter_style_queries(prometheus: tuple[str, Exporter]) -> None:
    url, _ = prometheus
    source = PrometheusSource(
        url,
        lag_query=(
            'sum by (topic, partition) (kafka_consumergroup_lag{consumergroup="$group", topic=~"$topics"})'
        ),
        rate_query='sum(rate(multilane_records_processed_total{namespace="$namespace"}[1m]))',
        window="20s",
        step="1s",
    )
    sample = wait_sample(source, lambda s: s.processing_rate is not None)
    assert sample.lag == {f"{TOPIC}/0": 7, f"{TOPIC}/1": 8, f"{TOPIC}/2": 9}  # type: ignore[attr-defined]


def test_nonsense_and_missing_partitions_are_invalid(prometheus: tuple[str, Exporter]) -> None:
    url, exporter = prometheus
    wait_sample(PrometheusSource(url, window="20s", step="1s"), lambda s: True)
    more = QueryContext(CTX.namespace, CTX.name, CTX.group, [*CTX.partitions, f"{TOPIC}/3"])
    with pytest.raises(MetricsInvalidError, match="no lag for 1 partition"):
        PrometheusSource(url)._sample(more)
    with pytest.raises(MetricsInvalidError, match="query rejected"):
        PrometheusSource(url, lag_query="sum(")._sample(CTX)
    exporter.lag.labels(TOPIC, "1").set(-5)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and exporter_value(url) >= 0:
            time.sleep(0.5)
        with pytest.raises(MetricsInvalidError, match="negative lag"):
            PrometheusSource(url)._sample(CTX)
    finally:
        exporter.lag.labels(TOPIC, "1").set(200)


def exporter_value(url: str) -> float:
    """The scraped lag of orders/1 as Prometheus has it now."""
    answer = requests.get(
        f"{url}/api/v1/query",
        params={"query": f'multilane_consumer_lag{{topic="{TOPIC}",partition="1"}}'},
        timeout=5,
    ).json()
    result = answer["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def test_unreachable_prometheus_is_unavailable() -> None:
    with pytest.raises(MetricsUnavailableError):
        PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout_s=1)._sample(CTX)
