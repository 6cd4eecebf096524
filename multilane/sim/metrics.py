"""Metrics of one simulated run. Pure: no I/O."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = [
    "DRAIN_THRESHOLD_S",
    "RECOVERY_SHARE",
    "RECOVERY_SUSTAIN_S",
    "RunMetrics",
    "compute_metrics",
    "reaction_times",
    "recovery_times",
    "time_to_drain",
]

DRAIN_THRESHOLD_S = 5.0
"""The lag counts as drained when below this many seconds of input (and at most 100 records)."""
RECOVERY_SHARE = 0.95
RECOVERY_SUSTAIN_S = 3
"""Recovered: processing >= 95 % of the input for 3 s in a row (the burst benchmark's definition)."""


@dataclass(frozen=True)
class RunMetrics:
    lag_seconds: float
    """Integral of the total lag over time (record-seconds): lower is better."""
    peak_lag: float
    time_to_drain_s: float | None
    """From the trace's event to the lag back under the drain threshold; None if it never drained
    (or the trace has no event)."""
    drained: bool | None
    """Whether the lag drained after the event; None when the trace has no event."""
    scaling_actions: int
    """Decisions that changed replicas or factor."""
    partition_moves: int
    replica_changes: int
    """Decisions that changed the replicas."""
    factor_changes: int
    """Decisions that changed the factor."""
    reaction_s: float | None
    """Mean over the trace's events of event -> first scale-up (replicas or factor raised) before
    the next event (None: no event, or no scale-up after any event)."""
    recovery_s: float | None
    """Mean over the trace's events of event -> processing >= 95 % of the input for 3 s (None: no
    event, or some event never recovered before the next one; see ``recovered``)."""
    recovered: bool | None
    """Every event recovered before the next (None without events)."""
    time_above_slo_s: float
    """Seconds with the total lag above the SLO lag."""
    pod_seconds: float
    """Integral of pods alive (starting, ready or draining)."""
    lane_seconds: float
    """Integral of the lanes the group runs (partitions x factor on the pods that own them;
    one per partition for a serial group): the memory and connections lanes hold."""
    call_seconds: float
    """Integral of the calls in flight to the downstream (busy lanes, including those queued at a
    saturated downstream): the load the group puts on the downstream."""
    final_lag: float
    produced: float
    processed: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def time_to_drain(
    time_s: np.ndarray, lag: np.ndarray, input_rate: np.ndarray, event_time_s: float | None
) -> tuple[float | None, bool | None]:
    """Seconds from ``event_time_s`` until the lag, having risen above the threshold, falls back under
    it (0 when it never rose); (None, False) when it never falls back; (None, None) without event."""
    if event_time_s is None:
        return None, None
    threshold = np.maximum(100.0, input_rate * DRAIN_THRESHOLD_S)
    after = time_s >= event_time_s
    above = after & (lag > threshold)
    if not above.any():
        return 0.0, True
    first_above = int(np.argmax(above))
    below = (np.arange(len(lag)) > first_above) & (lag <= threshold)
    if not below.any():
        return None, False
    return float(time_s[int(np.argmax(below))] - event_time_s), True


def _windows(events: tuple[float, ...], end: float) -> list[tuple[float, float]]:
    """Each event with the time of the next one (or the end of the run)."""
    ev = sorted(events)
    return [(t, ev[i + 1] if i + 1 < len(ev) else end) for i, t in enumerate(ev)]


def reaction_times(events: tuple[float, ...], decision_times: list[float], end: float) -> list[float]:
    """Per event, seconds to the first of ``decision_times`` (the scale-ups) at or after it and before
    the next event (events without one in their window are left out)."""
    out: list[float] = []
    for t, nxt in _windows(events, end):
        first = next((d for d in sorted(decision_times) if t <= d < nxt), None)
        if first is not None:
            out.append(first - t)
    return out


def recovery_times(
    events: tuple[float, ...], processed: np.ndarray, input_rate: np.ndarray
) -> list[float | None]:
    """Per event, seconds until processing >= :data:`RECOVERY_SHARE` of the input (the trace's rate)
    for :data:`RECOVERY_SUSTAIN_S` seconds in a row, before the next event; None if it does not."""
    n = len(processed)
    ok = processed >= RECOVERY_SHARE * input_rate[:n]
    out: list[float | None] = []
    for t, nxt in _windows(events, float(n)):
        found: float | None = None
        run = 0
        for i in range(int(t), min(int(nxt), n)):
            run = run + 1 if ok[i] else 0
            if run >= RECOVERY_SUSTAIN_S:
                found = float(i - RECOVERY_SUSTAIN_S + 1) - t
                break
        out.append(found)
    return out


def compute_metrics(
    *,
    time_s: np.ndarray,
    lag: np.ndarray,
    pods: np.ndarray,
    input_rate: np.ndarray,
    event_time_s: float | None,
    scaling_actions: int,
    partition_moves: int,
    produced: float,
    processed: float,
    processed_per_s: np.ndarray | None = None,
    events: tuple[float, ...] = (),
    decision_times: list[float] | None = None,
    replica_changes: int = 0,
    factor_changes: int = 0,
    slo_lag: float = 1000.0,
    lanes: np.ndarray | None = None,
    calls: np.ndarray | None = None,
) -> RunMetrics:
    dt = 1.0
    drain, drained = time_to_drain(time_s, lag, input_rate, event_time_s)
    end = float(len(lag))
    reactions = reaction_times(events, decision_times or [], end)
    recoveries = recovery_times(events, processed_per_s, input_rate) if processed_per_s is not None else []
    recovered = None if not recoveries else all(r is not None for r in recoveries)
    done = [r for r in recoveries if r is not None]
    return RunMetrics(
        lag_seconds=float(lag.sum() * dt),
        peak_lag=float(lag.max()) if len(lag) else 0.0,
        time_to_drain_s=drain,
        drained=drained,
        scaling_actions=scaling_actions,
        partition_moves=partition_moves,
        replica_changes=replica_changes,
        factor_changes=factor_changes,
        reaction_s=sum(reactions) / len(reactions) if reactions else None,
        recovery_s=sum(done) / len(done) if recovered else None,
        recovered=recovered,
        time_above_slo_s=float((lag > slo_lag).sum() * dt),
        pod_seconds=float(pods.sum() * dt),
        lane_seconds=float(lanes.sum() * dt) if lanes is not None else 0.0,
        call_seconds=float(calls.sum() * dt) if calls is not None else 0.0,
        final_lag=float(lag[-1]) if len(lag) else 0.0,
        produced=produced,
        processed=processed,
    )
