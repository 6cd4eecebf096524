"""What the autoscaling policy remembers between decisions: :class:`PolicyState` (owned by the
caller, JSON via ``to_dict``/``from_dict``), a pending :class:`ScaleUpRecord`, and the history window
(:func:`prune_history`). Pure: no I/O. The rules that read and write it are in
:mod:`multilane.operator.decision.damping`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PolicyState", "ScaleUpRecord", "prune_history"]


@dataclass
class ScaleUpRecord:
    """A scale-up whose effect on the processing rate is still to be judged."""

    time: float
    rate_before: float
    lanes_before: int
    lanes_after: int
    replicas_before: int
    replicas_after: int
    sized_for: float | None = None
    """The input rate (rec/s) the scale-up was sized for: its settle and effectiveness checks apply
    to this demand only (None: unknown, from an older state: they apply to any demand). A backlog
    that grows while the input stays is not new demand (it is what an ineffective scale-up looks
    like). 0 is a real figure: a scale-up decided before any input was measured (a lane budget at
    start) holds back no later demand."""
    factor_target: int = 0
    """The factor recommended when it was decided; the factor follows the new pods up to it."""
    follow_rate: float | None = None
    """The processing rate at the last ``factor-follows`` step of this scale-up (None: none yet);
    the next step needs a measured gain over it (no creep)."""

    def beyond(self, input_rate: float, margin: float) -> bool:
        """True when ``input_rate`` is clearly beyond the demand this scale-up was sized for."""
        if self.sized_for is None:
            return False
        return input_rate > self.sized_for * (1.0 + margin)

    def expected_gain(self) -> float:
        """Relative processing-rate rise the scale-up should bring (0 when it added nothing)."""
        if self.lanes_after > self.lanes_before:
            return self.lanes_after / max(self.lanes_before, 1) - 1.0
        return max(self.replicas_after / max(self.replicas_before, 1) - 1.0, 0.0)


@dataclass
class PolicyState:
    """Everything :meth:`AutoscalePolicy.decide` remembers between calls; owned by the caller.

    Invariant: ``history`` is sorted by time and holds the entries of the last
    ``max(2 x scale_down_delay_s, stabilisation_s)`` before the latest observation (twice the delay:
    the periodic rule's window), plus the newest entry older than that (so that whether the history
    covers the window is known on any clock).
    """

    history: list[tuple[float, int, int, float]] = field(default_factory=list)
    """(time, recommended replicas, recommended factor, needed rate), oldest first."""
    sized_need: float | None = None
    """The needed rate (rec/s) when the current size was chosen (the last change); the scale-down
    tolerance is measured against it."""
    last_lag: int | None = None
    last_time: float | None = None
    lane_rate: float | None = None
    """Last lane-rate estimate that came from an observation (not the default)."""
    pod_rate: float | None = None
    """Last estimate of the records/s one pod handles at 100 % CPU (None until CPU was observed)."""
    last_replicas: int | None = None
    last_factor: int | None = None
    last_change_time: float | None = None
    pending_scale_up: ScaleUpRecord | None = None
    bottleneck: ScaleUpRecord | None = None
    """Set when a scale-up proved ineffective: until ``bottleneck_hold_until`` recommendations are
    capped at its "before" size (the last effective one), then at twice that (one probe)."""
    bottleneck_hold_until: float | None = None
    bottleneck_ceiling: float | None = None
    """The processing rate (rec/s) when the bottleneck was found: the measured limit. The bottleneck
    is forgotten only when the processing rises clearly above it (None: from an older state, then
    the rate before the ineffective scale-up is used)."""
    bottleneck_strikes: int = 0
    """Probes that failed too; the hold doubles with each (``bottleneck_retry_s x 2**strikes``)."""
    last_scale_down_time: float | None = None
    """When the group last scaled down (the start of a trough)."""
    last_scale_down_need: float | None = None
    """The needed rate that scale-down was sized for (the trough's need)."""
    recurring_since: float | None = None
    """Set when the need came back (above the trough's by more than ``shortfall_margin``) within
    ``2 x scale_down_delay_s`` of the last scale-down: the load is periodic, and a scale-down then
    goes only to the highest recommendation of twice the delay (the periodic rule). Cleared by a
    scale-down after the need stayed low for twice the delay (the pattern broke)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy."""

        def rec(r: ScaleUpRecord | None) -> dict[str, Any] | None:
            return None if r is None else dict(vars(r))

        return {
            "history": [list(h) for h in self.history],
            "last_lag": self.last_lag,
            "last_time": self.last_time,
            "lane_rate": self.lane_rate,
            "pod_rate": self.pod_rate,
            "last_replicas": self.last_replicas,
            "last_factor": self.last_factor,
            "last_change_time": self.last_change_time,
            "pending_scale_up": rec(self.pending_scale_up),
            "bottleneck": rec(self.bottleneck),
            "bottleneck_hold_until": self.bottleneck_hold_until,
            "bottleneck_ceiling": self.bottleneck_ceiling,
            "bottleneck_strikes": self.bottleneck_strikes,
            "sized_need": self.sized_need,
            "last_scale_down_time": self.last_scale_down_time,
            "last_scale_down_need": self.last_scale_down_need,
            "recurring_since": self.recurring_since,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> PolicyState:
        """Inverse of :meth:`to_dict`; ``None`` or ``{}`` gives a fresh state."""
        if not data:
            return cls()

        def rec(d: Mapping[str, Any] | None) -> ScaleUpRecord | None:
            return None if d is None else ScaleUpRecord(**d)

        return cls(
            history=[_history_entry(h) for h in data.get("history", [])],
            last_lag=data.get("last_lag"),
            last_time=data.get("last_time"),
            lane_rate=data.get("lane_rate"),
            pod_rate=data.get("pod_rate"),
            last_replicas=data.get("last_replicas"),
            last_factor=data.get("last_factor"),
            last_change_time=data.get("last_change_time"),
            pending_scale_up=rec(data.get("pending_scale_up")),
            bottleneck=rec(data.get("bottleneck")),
            bottleneck_hold_until=data.get("bottleneck_hold_until"),
            bottleneck_ceiling=data.get("bottleneck_ceiling"),
            bottleneck_strikes=int(data.get("bottleneck_strikes", 0)),
            sized_need=data.get("sized_need"),
            last_scale_down_time=data.get("last_scale_down_time"),
            last_scale_down_need=data.get("last_scale_down_need"),
            recurring_since=data.get("recurring_since"),
        )


def _history_entry(h: Any) -> tuple[float, int, int, float]:
    """A history entry from JSON; entries of older states have no needed rate (0.0)."""
    return float(h[0]), int(h[1]), int(h[2]), float(h[3]) if len(h) > 3 else 0.0


def prune_history(
    history: list[tuple[float, int, int, float]], now: float, horizon: float
) -> list[tuple[float, int, int, float]]:
    """Entries within ``horizon`` before ``now`` (none from the future), plus the newest one older
    than that: on a free-running clock no entry lands exactly ``horizon`` ago, and without it the
    history would never be seen to cover the window."""
    kept = [h for h in history if now - horizon <= h[0] <= now]
    older = [h for h in history if h[0] < now - horizon]
    return ([older[-1]] if older else []) + kept
