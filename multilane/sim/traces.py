"""Load traces for the simulator: input rate, partition shares and service-time factor over time.

Pure: no I/O (:func:`parse_csv_trace` takes the text; the CLI reads the file). Every trace is a
deterministic function of its parameters and seed; the arrival *noise* is drawn by the simulator
from its own seeded generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

__all__ = [
    "CSV_COLUMNS",
    "DEFAULT_DURATION_S",
    "TRACE_NAMES",
    "Trace",
    "batch_dumps_trace",
    "bursts_trace",
    "crowd_trace",
    "diurnal_trace",
    "flash_diurnal_trace",
    "hot_key_trace",
    "make_trace",
    "parse_csv_trace",
    "ramp_trace",
    "saturated_ramp_trace",
    "slow_episode_trace",
    "slowdown_trace",
    "square_wave_trace",
    "step_trace",
    "surge_trace",
    "uneven_partitions_trace",
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
    events: tuple[float, ...] = ()
    """Every onset (of a step, burst, dump, slowdown); reaction and recovery are measured from each.
    Empty: ``(event_time_s,)`` when that is set."""

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
        if not self.events and self.event_time_s is not None:
            object.__setattr__(self, "events", (float(self.event_time_s),))

    @property
    def peak_demand(self) -> float:
        """The highest load in lane-seconds per second of one-lane time, as records/s at the base
        service time (rate x service factor): what the capacity must cover at the worst second."""
        return float((self.rate * self.service_factor).max()) if self.duration_s else 0.0


def _uniform(duration_s: int, partitions: int) -> np.ndarray:
    return np.full((duration_s, partitions), 1.0 / partitions)


def _build(
    name: str,
    rate: np.ndarray,
    partitions: int,
    *,
    service_factor: float | np.ndarray = 1.0,
    shares: np.ndarray | None = None,
    onsets: Sequence[float] = (),
) -> Trace:
    """The one builder of the built-in traces: ``rate`` (records/s, second by second) shared evenly
    by the partitions unless ``shares`` says otherwise, the service factor (one value or one per
    second) and the onsets, the first of which is the trace's ``event_time_s``."""
    n = int(rate.shape[0])
    factor = np.full(n, service_factor, dtype=float) if np.isscalar(service_factor) else service_factor
    return Trace(
        name,
        rate.astype(float),
        _uniform(n, partitions) if shares is None else shares,
        np.asarray(factor, dtype=float),
        float(onsets[0]) if onsets else None,
        tuple(float(o) for o in onsets),
    )


def _step(duration_s: int, at_s: float, before: float, after: float) -> np.ndarray:
    """``before`` until ``at_s``, ``after`` from it on."""
    return np.where(np.arange(duration_s) < at_s, before, after).astype(float)


def _one_per_slice(rng: np.random.Generator, duration_s: int, count: int, length_s: int) -> list[int]:
    """``count`` seeded starts, one in each equal slice of the run, never in its first or last 5 %
    (a window of ``length_s`` fits in its slice when the slice is long enough)."""
    if duration_s <= 0:
        return []
    edge = int(0.05 * duration_s)
    span = max((duration_s - 2 * edge) // max(count, 1), 1)
    starts = []
    for i in range(count):
        lo = edge + i * span
        starts.append(int(rng.integers(lo, max(lo + span - length_s, lo + 1))))
    return starts


def _windows(duration_s: int, base: float, starts: Sequence[int], length_s: int, high: float) -> np.ndarray:
    """``base`` rec/s with ``high`` rec/s for ``length_s`` seconds from each start."""
    rate = np.full(duration_s, base, dtype=float)
    for start in starts:
        rate[start : start + length_s] = high
    return rate


def step_trace(
    duration_s: int, partitions: int, base: float = 20.0, factor: float = 10.0, at_s: float = 600.0
) -> Trace:
    """``base`` rec/s, then ``factor`` x ``base`` from ``at_s`` on."""
    return _build("step", _step(duration_s, at_s, base, base * factor), partitions, onsets=(at_s,))


def surge_trace(
    duration_s: int, partitions: int, base: float = 60.0, factor: float = 10.0, at_s: float = 600.0
) -> Trace:
    """A 10x step past what one lane per partition can process (600 rec/s against 12 x 20 rec/s)."""
    return replace(step_trace(duration_s, partitions, base, factor, at_s), name="surge")


def diurnal_trace(
    duration_s: int, partitions: int, low: float = 20.0, high: float = 200.0, period_s: float | None = None
) -> Trace:
    """A day compressed into ``period_s`` (default: the run): low at the start, high half-way."""
    period = float(period_s or duration_s)
    t = np.arange(duration_s)
    return _build("diurnal", low + (high - low) * (1 - np.cos(2 * math.pi * t / period)) / 2, partitions)


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
    t = float(rng.exponential(mean_gap_s / 2))
    starts: list[int] = []
    while t < duration_s:
        starts.append(int(t))
        t = int(t) + burst_s + float(rng.exponential(mean_gap_s))
    rate = _windows(duration_s, base, starts, burst_s, burst)
    return _build("bursts", rate, partitions, onsets=starts)


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
    return _build("hot_key", np.full(duration_s, rate), partitions, shares=shares, onsets=(at_s,))


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
    return _build("slowdown", np.full(duration_s, rate), partitions, service_factor=factor, onsets=(at_s,))


def flash_diurnal_trace(
    duration_s: int,
    partitions: int,
    seed: int,
    low: float = 60.0,
    high: float = 300.0,
    crowds: int = 3,
    crowd_factor: float = 2.5,
    crowd_s: int = 180,
) -> Trace:
    """A diurnal curve (:func:`diurnal_trace` from ``low`` to ``high``) with ``crowds`` flash crowds:
    the rate jumps to ``crowd_factor`` x the curve for ``crowd_s`` seconds, at seeded times (one
    per equal slice of the run, never in its first or last 5 %)."""
    rate = diurnal_trace(duration_s, partitions, low, high).rate.copy()
    starts = _one_per_slice(np.random.default_rng(seed), duration_s, crowds, crowd_s)
    for start in starts:
        rate[start : start + crowd_s] *= crowd_factor
    return _build("flash_diurnal", rate, partitions, onsets=starts)


def batch_dumps_trace(
    duration_s: int,
    partitions: int,
    seed: int,
    base: float = 50.0,
    factor: float = 10.0,
    dump_s: int = 180,
    every_s: int = 600,
) -> Trace:
    """``base`` rec/s with a batch dump of ``factor`` x ``base`` for ``dump_s`` seconds every
    ``every_s`` seconds (a nightly export replayed every 10 minutes); the first dump starts at a
    seeded offset within the first period."""
    first = int(np.random.default_rng(seed).integers(60, max(every_s - dump_s, 61)))
    starts = list(range(first, duration_s, every_s))
    rate = _windows(duration_s, base, starts, dump_s, base * factor)
    return _build("batch_dumps", rate, partitions, onsets=starts)


def ramp_trace(
    duration_s: int, partitions: int, low: float = 30.0, high: float = 600.0, ramp_s: float = 7200.0
) -> Trace:
    """A slow ramp from ``low`` to ``high`` rec/s over ``ramp_s`` seconds (two hours), then flat."""
    t = np.arange(duration_s)
    return _build("ramp", low + (high - low) * np.clip(t / ramp_s, 0.0, 1.0), partitions)


def slow_episode_trace(
    duration_s: int,
    partitions: int,
    rate: float = 300.0,
    slow_factor: float = 3.0,
    at_s: float = 1200.0,
    episode_s: float = 600.0,
) -> Trace:
    """A downstream slowdown episode: constant ``rate``; service time x ``slow_factor`` for
    ``episode_s`` (10 minutes) from ``at_s``. Unlike ``slowdown``, the slow service needs more lanes
    than the partitions' one record at a time (300 rec/s x 150 ms = 45 busy lanes)."""
    trace = slowdown_trace(duration_s, partitions, rate, slow_factor, at_s, at_s + episode_s)
    return replace(trace, name="slow_episode")


def square_wave_trace(
    duration_s: int,
    partitions: int,
    seed: int,
    low: float = 100.0,
    high: float = 700.0,
    period_s: int = 600,
    high_s: int = 200,
) -> Trace:
    """Periodic load: ``high`` rec/s for ``high_s`` seconds, then ``low`` rec/s for the rest of every
    ``period_s`` (troughs of 400 s: longer than the 300 s scale-down delay, so each trough invites a
    scale-down shortly before the load comes back); the first period starts at a seeded offset
    within the first period."""
    offset = int(np.random.default_rng(seed).integers(0, period_s))
    t = np.arange(duration_s) + offset
    rate = np.where((t % period_s) >= period_s - high_s, high, low).astype(float)
    starts = [i for i in range(1, duration_s) if rate[i] > rate[i - 1]]
    return _build("square_wave", rate, partitions, onsets=starts)


def saturated_ramp_trace(
    duration_s: int, partitions: int, low: float = 30.0, high: float = 1200.0, ramp_s: float = 7200.0
) -> Trace:
    """A two-hour ramp from ``low`` to ``high`` rec/s, past what the downstream serves (960 rec/s at
    the defaults: 48 calls of 50 ms): no size helps beyond it, and lanes added there are waste."""
    return replace(ramp_trace(duration_s, partitions, low, high, ramp_s), name="saturated_ramp")


def crowd_trace(
    duration_s: int,
    partitions: int,
    seed: int,
    base: float = 80.0,
    factor: float = 10.0,
    crowd_s: int = 60,
    crowds: int = 4,
) -> Trace:
    """Sudden 10x crowds: ``base`` rec/s with ``crowds`` crowds of ``factor`` x ``base`` for
    ``crowd_s`` seconds, one at a seeded time in each equal slice of the run (never in its first or
    last 5 %)."""
    starts = _one_per_slice(np.random.default_rng(seed), duration_s, crowds, crowd_s)
    rate = _windows(duration_s, base, starts, crowd_s, base * factor)
    return _build("crowd", rate, partitions, onsets=starts)


def uneven_partitions_trace(
    duration_s: int,
    partitions: int,
    rate: float = 2700.0,
    service_factor: float = 0.2,
    at_s: float = 300.0,
    base: float = 300.0,
) -> Trace:
    """Pods, not lanes, are the limit: ``base`` rec/s, then ``rate`` rec/s from ``at_s`` with a fast
    downstream (service time x ``service_factor``: 10 ms, so lanes and the downstream are plenty and
    the pods' CPU is the limit). At 2,700 rec/s the mean CPU asks for 10 pods, but 10 pods on 12
    partitions give two pods two partitions each: 450 rec/s against a pod's 400 (the busiest pod
    sets the size: ``ceil(partitions / R)``)."""
    return _build(
        "uneven_partitions",
        _step(duration_s, at_s, base, rate),
        partitions,
        service_factor=service_factor,
        onsets=(at_s,),
    )


CSV_COLUMNS = "t_seconds,records_per_second[,service_factor[,event]]"
"""The columns of a CSV trace (the last two optional)."""


def parse_csv_trace(text: str, duration_s: int | None, partitions: int, name: str = "csv") -> Trace:
    """A trace from CSV rows ``t_seconds,records_per_second[,service_factor[,event]]`` (a header row
    is allowed; ``#`` comments and blank lines are skipped; rows in any order; see
    examples/trace-flash-crowd.csv).

    The rate and the service factor (a multiplier on the service time: 3 = the downstream three
    times slower; empty: 1) hold from each timestamp to the next (step interpolation); before the
    first row they are the first row's. A non-empty ``event`` other than ``0`` marks an onset at the
    row's time (reaction and recovery are measured from each). Partitions share evenly.
    ``duration_s`` None: up to the last timestamp plus 600 s (to see the last rate's effect); a
    ``duration_s`` that would cut off a row is an error, never a silent truncation. Negative times or
    rates, and service factors <= 0, are errors naming the line.
    """
    points: list[tuple[float, float, float]] = []
    events: list[float] = []
    header_allowed = True
    for i, line in enumerate(text.splitlines()):
        cells = [c.strip() for c in line.split(",")]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        first_row, header_allowed = header_allowed, False
        try:
            t, rate = float(cells[0]), float(cells[1])
            factor = float(cells[2]) if len(cells) > 2 and cells[2] else 1.0
        except (ValueError, IndexError) as exc:
            if first_row:
                continue  # header
            raise ValueError(f"line {i + 1}: expected '{CSV_COLUMNS}', got {line!r}") from exc
        if len(cells) > 4:
            raise ValueError(f"line {i + 1}: more than 4 columns ({CSV_COLUMNS}), got {line!r}")
        if t < 0 or rate < 0 or not all(map(math.isfinite, (t, rate, factor))):
            raise ValueError(f"line {i + 1}: time and rate must be finite and >= 0, got {line!r}")
        if factor <= 0:
            raise ValueError(f"line {i + 1}: the service factor must be > 0, got {line!r}")
        points.append((t, rate, factor))
        if len(cells) > 3 and cells[3] not in ("", "0"):
            events.append(t)
    if not points:
        raise ValueError("the CSV trace has no rows")
    points.sort()
    last = points[-1][0]
    if duration_s is None:
        duration_s = math.ceil(last) + 600
    elif duration_s <= last:
        raise ValueError(
            f"--duration {duration_s} would cut the CSV trace, whose last row is at t={last:g} s "
            f"(leave --duration out for {math.ceil(last) + 600} s, or give more than {last:g})"
        )
    times = np.array([p[0] for p in points])
    rates = np.array([p[1] for p in points])
    factors = np.array([p[2] for p in points])
    seconds = np.arange(duration_s)
    idx = np.clip(np.searchsorted(times, seconds, side="right") - 1, 0, len(rates) - 1)
    onsets = tuple(sorted(set(events)))
    return Trace(
        name,
        rates[idx].astype(float),
        _uniform(duration_s, partitions),
        factors[idx].astype(float),
        float(onsets[0]) if onsets else None,
        onsets,
    )


TraceFactory = Callable[[int, int, int], Trace]

_FACTORIES: dict[str, TraceFactory] = {
    "step": lambda d, p, s: step_trace(d, p),
    "surge": lambda d, p, s: surge_trace(d, p),
    "diurnal": lambda d, p, s: diurnal_trace(d, p),
    "bursts": lambda d, p, s: bursts_trace(d, p, s),
    "hot_key": lambda d, p, s: hot_key_trace(d, p),
    "slowdown": lambda d, p, s: slowdown_trace(d, p),
    "flash_diurnal": lambda d, p, s: flash_diurnal_trace(d, p, s),
    "batch_dumps": lambda d, p, s: batch_dumps_trace(d, p, s),
    "ramp": lambda d, p, s: ramp_trace(d, p),
    "slow_episode": lambda d, p, s: slow_episode_trace(d, p),
    "square_wave": lambda d, p, s: square_wave_trace(d, p, s),
    "saturated_ramp": lambda d, p, s: saturated_ramp_trace(d, p),
    "crowd": lambda d, p, s: crowd_trace(d, p, s),
    "uneven_partitions": lambda d, p, s: uneven_partitions_trace(d, p),
}
TRACE_NAMES: Sequence[str] = tuple(_FACTORIES)

DEFAULT_DURATION_S: dict[str, int] = {name: 3600 for name in _FACTORIES} | {
    "ramp": 9000,
    "saturated_ramp": 9000,
}
"""Each trace's own length (``--duration`` overrides it): an hour, and for the two-hour ramp two
hours and a half (the flat top included), also for the saturated ramp."""


def make_trace(name: str, duration_s: int | None, partitions: int, seed: int) -> Trace:
    """One of :data:`TRACE_NAMES` with its default parameters (``duration_s`` None: its own length)."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown trace {name!r}; known: {', '.join(TRACE_NAMES)}") from None
    return factory(DEFAULT_DURATION_S[name] if duration_s is None else duration_s, partitions, seed)
