"""Load traces for the simulator: input rate, partition shares and service-time factor over time.

Pure: no I/O (:func:`parse_csv_trace` takes the text; the CLI reads the file). Every trace is a
deterministic function of its parameters and seed; the arrival *noise* is drawn by the simulator
from its own seeded generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "TRACE_NAMES",
    "Trace",
    "bursts_trace",
    "diurnal_trace",
    "hot_key_trace",
    "make_trace",
    "parse_csv_trace",
    "slowdown_trace",
    "step_trace",
    "surge_trace",
]


@dataclass(frozen=True)
class Trace:
    """Per-second load of a run.

    Invariants: ``rate``, ``service_factor`` have ``duration_s`` entries; ``shares`` is
    ``(duration_s, partitions)`` with rows summing to 1; rates >= 0, service factors > 0.
    """

    name: str
    rate: np.ndarray
    """Records/s produced to the whole topic, second by second."""
    shares: np.ndarray
    """Share of each partition in the input, second by second."""
    service_factor: np.ndarray
    """Multiplier on the per-record service time (downstream slowdown), second by second."""
    event_time_s: float | None = None
    """When the interesting change starts (step, hot key, slowdown); time to drain counts from it."""

    @property
    def duration_s(self) -> int:
        return int(self.rate.shape[0])

    @property
    def partitions(self) -> int:
        return int(self.shares.shape[1])

    def __post_init__(self) -> None:
        n = self.rate.shape[0]
        if self.shares.shape[0] != n or self.service_factor.shape[0] != n:
            raise ValueError("rate, shares and service_factor must cover the same seconds")
        if (self.rate < 0).any() or not np.isfinite(self.rate).all():
            raise ValueError("rates must be finite and >= 0")
        if not np.allclose(self.shares.sum(axis=1), 1.0):
            raise ValueError("partition shares must sum to 1 every second")
        if (self.service_factor <= 0).any():
            raise ValueError("service factors must be > 0")


def _uniform(duration_s: int, partitions: int) -> np.ndarray:
    return np.full((duration_s, partitions), 1.0 / partitions)


def _ones(duration_s: int) -> np.ndarray:
    return np.ones(duration_s)


def step_trace(
    duration_s: int, partitions: int, base: float = 20.0, factor: float = 10.0, at_s: float = 600.0
) -> Trace:
    """``base`` rec/s, then ``factor`` x ``base`` from ``at_s`` on."""
    t = np.arange(duration_s)
    rate = np.where(t < at_s, base, base * factor).astype(float)
    return Trace("step", rate, _uniform(duration_s, partitions), _ones(duration_s), at_s)


def surge_trace(
    duration_s: int, partitions: int, base: float = 60.0, factor: float = 10.0, at_s: float = 600.0
) -> Trace:
    """A 10x step past what one lane per partition can process (600 rec/s against 12 x 20 rec/s)."""
    t = step_trace(duration_s, partitions, base, factor, at_s)
    return Trace("surge", t.rate, t.shares, t.service_factor, t.event_time_s)


def diurnal_trace(
    duration_s: int, partitions: int, low: float = 20.0, high: float = 200.0, period_s: float | None = None
) -> Trace:
    """A day compressed into ``period_s`` (default: the run): low at the start, high half-way."""
    period = float(period_s or duration_s)
    t = np.arange(duration_s)
    rate = low + (high - low) * (1 - np.cos(2 * math.pi * t / period)) / 2
    return Trace("diurnal", rate, _uniform(duration_s, partitions), _ones(duration_s), None)


def bursts_trace(
    duration_s: int,
    partitions: int,
    seed: int,
    base: float = 40.0,
    burst: float = 200.0,
    burst_s: int = 60,
    mean_gap_s: float = 600.0,
) -> Trace:
    """``base`` rec/s with bursts to ``burst`` rec/s of ``burst_s`` seconds at seeded random times."""
    rng = np.random.default_rng(seed)
    rate = np.full(duration_s, base, dtype=float)
    t = float(rng.exponential(mean_gap_s / 2))
    first: float | None = None
    while t < duration_s:
        start = int(t)
        rate[start : start + burst_s] = burst
        first = start if first is None else first
        t = start + burst_s + float(rng.exponential(mean_gap_s))
    return Trace("bursts", rate, _uniform(duration_s, partitions), _ones(duration_s), first)


def hot_key_trace(
    duration_s: int, partitions: int, rate: float = 100.0, hot_share: float = 0.4, at_s: float = 600.0
) -> Trace:
    """Constant ``rate``; from ``at_s`` partition 0 receives ``hot_share`` of it (a hot key range)."""
    if not 0 < hot_share <= 1:
        raise ValueError("hot_share must be in (0, 1]")
    shares = _uniform(duration_s, partitions)
    if partitions > 1:
        hot = np.full(partitions, (1 - hot_share) / (partitions - 1))
        hot[0] = hot_share
        shares[int(at_s) :] = hot
    return Trace("hot_key", np.full(duration_s, rate), shares, _ones(duration_s), at_s)


def slowdown_trace(
    duration_s: int,
    partitions: int,
    rate: float = 100.0,
    slow_factor: float = 3.0,
    at_s: float = 1200.0,
    until_s: float = 2400.0,
) -> Trace:
    """Constant ``rate``; the service time is ``slow_factor`` x higher in ``[at_s, until_s)``."""
    t = np.arange(duration_s)
    factor = np.where((t >= at_s) & (t < until_s), slow_factor, 1.0)
    return Trace("slowdown", np.full(duration_s, rate), _uniform(duration_s, partitions), factor, at_s)


def parse_csv_trace(text: str, duration_s: int, partitions: int, name: str = "csv") -> Trace:
    """A trace from CSV rows ``timestamp_s,rate`` (a header row is allowed; rows in any order).

    The rate holds from each timestamp to the next (step interpolation); before the first row it is
    the first row's rate. Partitions share evenly.
    """
    points: list[tuple[float, float]] = []
    for i, line in enumerate(text.splitlines()):
        cells = [c.strip() for c in line.split(",")]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            points.append((float(cells[0]), float(cells[1])))
        except (ValueError, IndexError) as exc:
            if i == 0:
                continue  # header
            raise ValueError(f"line {i + 1}: expected 'timestamp_s,rate', got {line!r}") from exc
    if not points:
        raise ValueError("the CSV trace has no rows")
    points.sort()
    times = np.array([p[0] for p in points])
    rates = np.array([p[1] for p in points])
    t = np.arange(duration_s)
    idx = np.clip(np.searchsorted(times, t, side="right") - 1, 0, len(rates) - 1)
    return Trace(name, rates[idx].astype(float), _uniform(duration_s, partitions), _ones(duration_s), None)


TraceFactory = Callable[[int, int, int], Trace]

_FACTORIES: dict[str, TraceFactory] = {
    "step": lambda d, p, s: step_trace(d, p),
    "surge": lambda d, p, s: surge_trace(d, p),
    "diurnal": lambda d, p, s: diurnal_trace(d, p),
    "bursts": lambda d, p, s: bursts_trace(d, p, s),
    "hot_key": lambda d, p, s: hot_key_trace(d, p),
    "slowdown": lambda d, p, s: slowdown_trace(d, p),
}
TRACE_NAMES: Sequence[str] = tuple(_FACTORIES)


def make_trace(name: str, duration_s: int, partitions: int, seed: int) -> Trace:
    """One of :data:`TRACE_NAMES` with its default parameters."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown trace {name!r}; known: {', '.join(TRACE_NAMES)}") from None
    return factory(duration_s, partitions, seed)
