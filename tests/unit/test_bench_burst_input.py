"""The burst benchmark flags a row whose load generator delivered less than the offered burst."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks.burst import input_check
from multilane.testing.loadgen import LoadResult


def _load(delivered: list[int], latency: list[float], skipped: int = 0) -> LoadResult:
    return LoadResult("t", skipped=skipped, delivered_per_s=delivered, latency_max_per_s=latency,
                      offered_per_s=[150.0, 1500.0, 1500.0, 150.0], ready_s=0.4)


def test_a_full_burst_is_ok() -> None:
    figures = SimpleNamespace(offered_rate=1500.0, achieved_rate=1499.0)
    assert input_check(figures, _load([150, 1500, 1498, 150], [0.01] * 4)) == "ok"


def test_a_short_burst_names_skipped_records_and_the_delivery_latency_of_its_seconds() -> None:
    figures = SimpleNamespace(offered_rate=1500.0, achieved_rate=929.0)
    text = input_check(figures, _load([150, 900, 958, 1800], [0.02, 2.5, 3.25, 9.0], skipped=12))
    # the latency of the lull after the burst (9 s) is not the burst's
    assert text == ("SHORT 62% of offered: 12 skipped, delivery latency up to 3.2 s, "
                    "producer ready after 0.4 s")


def test_the_threshold_is_95_percent() -> None:
    load = _load([0, 0, 0, 0], [0.0] * 4)
    assert input_check(SimpleNamespace(offered_rate=1000.0, achieved_rate=950.0), load) == "ok"
    short = input_check(SimpleNamespace(offered_rate=1000.0, achieved_rate=949.0), load)
    assert short.startswith("SHORT 95%")
