"""Metrics of one simulated run. Pure: no I/O."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["DRAIN_THRESHOLD_S", "RunMetrics", "compute_metrics", "time_to_drain"]

DRAIN_THRESHOLD_S = 5.0
"""The lag counts as drained when below this many seconds of input (and at most 100 records)."""


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
    pod_seconds: float
    """Integral of pods alive (starting, ready or draining)."""
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
) -> RunMetrics:
    dt = 1.0
    drain, drained = time_to_drain(time_s, lag, input_rate, event_time_s)
    return RunMetrics(
        lag_seconds=float(lag.sum() * dt),
        peak_lag=float(lag.max()) if len(lag) else 0.0,
        time_to_drain_s=drain,
        drained=drained,
        scaling_actions=scaling_actions,
        partition_moves=partition_moves,
        pod_seconds=float(pods.sum() * dt),
        final_lag=float(lag[-1]) if len(lag) else 0.0,
        produced=produced,
        processed=processed,
    )
