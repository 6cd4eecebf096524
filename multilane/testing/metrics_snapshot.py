"""Metric snapshots: scrape Prometheus metric endpoints once and write one text-format file.

Does I/O (HTTP GETs of the endpoints, one file write). Needs only the core dependencies
(``prometheus-client`` and the standard library), so the demo can write ``metrics.prom`` without
Prometheus or the test extras.

:func:`write_metrics_snapshot` writes every sample, each labelled with its endpoint's labels, plus
``up`` per endpoint, as Prometheus itself records a scrape.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

__all__ = ["scrape_endpoints", "write_metrics_snapshot"]


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def _relabel(labels: Mapping[str, str], target: Mapping[str, str]) -> dict[str, str]:
    """Target labels win; a scraped label they replace is kept as ``exported_<name>`` (Prometheus's
    ``honor_labels: false``)."""
    out = dict(labels)
    for key, value in target.items():
        if key in out and out[key] != value:
            out[f"exported_{key}"] = out[key]
        out[key] = value
    return out


def scrape_endpoints(
    endpoints: Mapping[str, Mapping[str, str]], timeout_s: float = 5.0
) -> list[Metric]:
    """Scrape every endpoint (URL -> target labels) once; the merged metric families, with one ``up``
    sample per endpoint (1: answered with parseable text, 0: did not)."""
    families: dict[str, Metric] = {}
    up = GaugeMetricFamily("up", "1 when the endpoint answered the snapshot's scrape", labels=())
    for url, target in endpoints.items():
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as answer:
                text = answer.read().decode("utf-8")
            parsed = list(text_string_to_metric_families(text))
        except (OSError, ValueError):
            up.add_sample("up", dict(target), 0.0)
            continue
        up.add_sample("up", dict(target), 1.0)
        for fam in parsed:
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            elif merged.type != fam.type:
                raise ValueError(f"{fam.name}: type {fam.type} at {url}, {merged.type} elsewhere")
            for s in fam.samples:
                merged.add_sample(s.name, _relabel(s.labels, target), s.value, s.timestamp)
    return [up, *families.values()]


def write_metrics_snapshot(
    path: str | os.PathLike[str],
    endpoints: Mapping[str, Mapping[str, str]],
    timeout_s: float = 5.0,
) -> int:
    """Scrape ``endpoints`` (metrics URL -> target labels, e.g. ``{"job": "workers", "instance":
    "w-0"}``) once and write every sample to ``path`` in the Prometheus text format (atomically:
    temp file + rename). Returns the number of samples written (``up`` included)."""
    path = Path(path)
    families = scrape_endpoints(endpoints, timeout_s)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    header = f"# multilane metrics snapshot of {len(endpoints)} endpoint(s) at {stamp}\n"
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(header.encode() + generate_latest(registry))
    os.replace(tmp, path)
    return sum(len(f.samples) for f in families)
