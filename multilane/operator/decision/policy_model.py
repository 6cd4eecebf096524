"""The autoscaling policy's contract types: its configuration, what it observes, what it decides, and
the rules a decision can name. Pure: no I/O (the operator, the local control plane and the simulator
share them)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RULES", "Decision", "DecisionTrace", "Observation", "PolicyConfig", "validate_observation"]

RULES: dict[str, str] = {
    "shortfall": "scale up at once to the current need: the lag is rising",
    "beyond-pending": "scale up at once: the need is clearly beyond what the pending scale-up was sized for",
    "factor-follows": (
        "raise the factor as the pending scale-up's pods become ready: to its target, or to the current "
        "need while the lag rises and those pods carry it (the same scale-up, in place)"
    ),
    "stabilised": "scale up: recommended throughout the stabilisation window",
    "settling": "hold: a scale-up is settling (and its rollout running)",
    "stabilising": "hold: a scale-up without lag evidence waits for the stabilisation window",
    "at-recommendation": "hold: the size is the recommendation (never while the lag rises measurably)",
    "draining": "hold: no scale-down while a backlog drains",
    "scale-down-delay": "hold: a scale-down waits for the scale-down delay",
    "within-tolerance": "hold: the need is within the scale-down tolerance of what the size was chosen for",
    "recently-higher": "hold: a higher size was recommended within the scale-down delay",
    "periodic": (
        "hold: the load came back within twice the scale-down delay after the last trough; a "
        "scale-down needs the need low for twice the delay"
    ),
    "scale-down": "scale down to the highest recommendation of the scale-down delay",
    "reverted": "scale the factor back at once: the lanes above the last effective size gave no gain",
    "invalid-observation": "hold the last decision: the observation cannot be used",
}
"""The rules a decision can name (``Decision.rule``), with what each means."""


@dataclass(frozen=True)
class PolicyConfig:
    """Bounds and targets, from the ParallelConsumer's ``spec.scaling`` (plus the partition count).

    Fields beyond the contract in docs/architecture.md have defaults and are documented here.
    """

    partitions: int
    """Partition count of the input topic(s); > 0."""
    min_replicas: int = 1
    """>= 1 (a replica count above ``partitions`` is cut to ``partitions``)."""
    max_replicas: int = 10
    """>= min_replicas."""
    min_factor: int = 1
    """>= 1."""
    max_factor: int = 64
    """>= min_factor."""
    target_catchup_s: float = 300.0
    """> 0: a backlog is to be cleared within this time."""
    max_lag: int | None = None
    """Optional bound on the total lag (records); > 0 when set."""
    target_utilisation: float = 0.7
    """In (0, 1]: steady-state share of capacity used by the input rate."""
    scale_down_delay_s: float = 300.0
    """>= 0: scale-down only after the recommendation stayed lower for this long."""
    stabilisation_s: float = 60.0
    """>= 0: a scale-up without lag evidence must be recommended for this long."""
    # --- additions to the contract -------------------------------------------------------------
    max_lanes_per_replica: int = 64
    """>= 1: per-pod lane budget; replicas are added when ``ceil(partitions / R) x F`` exceeds it."""
    max_lag_catchup_s: float = 60.0
    """> 0: with ``max_lag`` set, the lag above it is to be cleared within this time."""
    default_lane_rate: float = 100.0
    """> 0: records/s of one lane, used only until a lane rate has been observed."""
    backlog_threshold_s: float = 10.0
    """>= 0: the lag is a *backlog* when above this many seconds of input (and above 100 records)."""
    settle_s: float = 60.0
    """>= 0: time after a scale-up before its effect on the processing rate is judged."""
    min_scale_up_gain: float = 0.25
    """In [0, 1]: a scale-up is ineffective when the rate rose by less than this share of the
    expected rise (the expected rise is proportional to the added lanes)."""
    bottleneck_retry_s: float = 600.0
    """> 0: after this long, a held (bottlenecked) scale-up is probed once more (at most twice the
    last effective size); each failed probe doubles the hold."""
    target_cpu_utilisation: float = 0.7
    """In (0, 1]: replicas are added so that the pods' CPU stays at or below this share of their
    limit at the needed rate (only when the observation reports CPU)."""
    cpu_tolerance: float = 0.1
    """In [0, 1): no pod is added for CPU while the busiest pod of the current count stays within
    this share above ``target_cpu_utilisation`` at the needed rate (the HPA's default tolerance,
    0.1: 300 rec/s on one pod of 400 rec/s is 0.75 against 0.7, within it)."""
    shortfall_margin: float = 0.25
    """>= 0: an input rate more than this share above the input the pending (or the bottlenecked)
    scale-up was sized for is new demand: with the lag rising it is acted on at once instead of
    waiting for that scale-up to settle (and a bottleneck's cap no longer applies)."""
    scale_down_tolerance: float = 0.1
    """In [0, 1): no scale-down while the highest needed rate of the scale-down window is within
    this share below the needed rate the current size was chosen for (as the HPA's tolerance)."""
    shortfall_input_ratio: float = 1.1
    """>= 1: with the lag rising, input above this multiple of the processing rate is a shortfall
    even before the lag reaches ``rising_lag_threshold_s`` of input."""
    rising_lag_threshold_s: float = 1.0
    """>= 0: a rising lag above this many seconds of input (and above 100 records) is a shortfall."""
    factor_first: bool = True
    """While pods are added, run only the factor the ready pods carry within their lane budget (the
    factor follows the new pods, and while the lag still rises it follows the current need). False:
    the recommended factor at once, and a pending scale-up's factor stays at its own target (the
    policy before the two-speed change; the burst benchmark's baseline)."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.partitions < 1:
            problems.append("partitions must be >= 1")
        if not 1 <= self.min_replicas <= self.max_replicas:
            problems.append("need 1 <= min_replicas <= max_replicas")
        if not 1 <= self.min_factor <= self.max_factor:
            problems.append("need 1 <= min_factor <= max_factor")
        if not self.target_catchup_s > 0:
            problems.append("target_catchup_s must be > 0")
        if self.max_lag is not None and self.max_lag <= 0:
            problems.append("max_lag must be > 0 when set")
        if not 0 < self.target_utilisation <= 1:
            problems.append("target_utilisation must be in (0, 1]")
        if self.scale_down_delay_s < 0 or self.stabilisation_s < 0 or self.settle_s < 0:
            problems.append("delays must be >= 0")
        if self.max_lanes_per_replica < 1:
            problems.append("max_lanes_per_replica must be >= 1")
        if not self.max_lag_catchup_s > 0 or not self.default_lane_rate > 0:
            problems.append("max_lag_catchup_s and default_lane_rate must be > 0")
        if self.backlog_threshold_s < 0 or not 0 <= self.min_scale_up_gain <= 1:
            problems.append("backlog_threshold_s >= 0 and min_scale_up_gain in [0, 1]")
        if not 0 < self.target_cpu_utilisation <= 1:
            problems.append("target_cpu_utilisation must be in (0, 1]")
        if not self.bottleneck_retry_s > 0:
            problems.append("bottleneck_retry_s must be > 0")
        if self.shortfall_margin < 0 or not 0 <= self.scale_down_tolerance < 1:
            problems.append("shortfall_margin >= 0 and scale_down_tolerance in [0, 1)")
        if not 0 <= self.cpu_tolerance < 1:
            problems.append("cpu_tolerance must be in [0, 1)")
        if self.shortfall_input_ratio < 1 or self.rising_lag_threshold_s < 0:
            problems.append("shortfall_input_ratio >= 1 and rising_lag_threshold_s >= 0")
        if problems:
            raise ValueError("invalid PolicyConfig: " + "; ".join(problems))

    @property
    def replica_ceiling(self) -> int:
        """The largest useful replica count: replicas beyond the partition count hold nothing."""
        return min(self.max_replicas, self.partitions)

    @property
    def replica_floor(self) -> int:
        """The smallest replica count, cut to the ceiling."""
        return min(self.min_replicas, self.replica_ceiling)


@dataclass(frozen=True)
class Observation:
    """One look at the consumer group (the operator builds it from metrics)."""

    now: float
    """Seconds on a clock that only moves forward (wall or simulated)."""
    lag_by_partition: Mapping[int, int]
    """Records not yet committed, per partition index; must cover every partition, each >= 0."""
    input_rate: float
    """Records/s produced to the whole topic; >= 0."""
    processing_rate: float
    """Records/s completed by the whole group; >= 0."""
    replicas: int
    """Replicas the group is set to (the StatefulSet's spec, not the count of ready pods); >= 0."""
    factor: int
    """Lanes per partition the group is set to (the factor last applied); >= 1."""
    busy_lanes: float | None = None
    """Average number of lanes busy over the rate window (utilisation x lanes); None if unknown."""
    input_rate_by_partition: Mapping[int, float] | None = None
    """Addition to the contract: records/s produced per partition (from end-offset deltas); None if
    unknown (then the input is taken as spread evenly). Used to size F for the busiest partition."""
    cpu_utilisation: float | None = None
    """Addition: mean CPU use of the ready worker pods over the rate window, as a share of their CPU
    limit (0..1, above 1 when bursting); None if unknown. Sizes the replicas when pods are CPU-bound."""
    ready_replicas: int | None = None
    """Addition: pods ready over the rate window (None: taken as ``replicas``)."""
    rebalancing: bool = False
    """Addition: pods are starting or partitions moving; a scale-up is judged only after it ends."""


@dataclass(frozen=True)
class DecisionTrace:
    """What :meth:`~multilane.operator.decision.policy.AutoscalePolicy.decide` found, step by step.

    Built once per decision from what each step returned (no step writes into another's result);
    :meth:`as_inputs` is the flat form stored in ``status.lastDecision.inputs``.
    """

    backlog: int
    backlog_threshold: float
    input_rate: float
    processing_rate: float
    busy_lanes: float | None
    lane_rate: float
    lane_rate_source: str
    cpu_utilisation: float | None
    pod_rate: float | None
    needed_rate: float
    hottest_partition_rate: float
    lanes_needed: int
    recommended_replicas: int
    """After the bottleneck's cap (when one applied)."""
    recommended_factor: int
    current_replicas: int
    current_factor: int
    ready_replicas: int
    lag_rising: bool
    shortfall: bool
    capped_by_bottleneck: str | None = None
    """``"RxF"`` when a bottleneck capped the recommendation, else None."""
    bottleneck_lifted: str | None = None
    """Why a bottleneck's cap did not apply (new demand), else None."""
    notes: tuple[str, ...] = ()
    """Extra findings of the rules (``"name: text"``), in the order the steps made them."""
    warnings: tuple[str, ...] = ()

    def as_inputs(self) -> dict[str, Any]:
        """The flat, JSON-safe form (rounded rates; the optional fields only when set)."""
        out: dict[str, Any] = {
            "backlog": self.backlog,
            "backlog_threshold": round(self.backlog_threshold, 1),
            "input_rate": round(self.input_rate, 3),
            "processing_rate": round(self.processing_rate, 3),
            "busy_lanes": self.busy_lanes,
            "lane_rate": round(self.lane_rate, 3),
            "lane_rate_source": self.lane_rate_source,
            "cpu_utilisation": self.cpu_utilisation,
            "pod_rate": None if self.pod_rate is None else round(self.pod_rate, 3),
            "needed_rate": round(self.needed_rate, 3),
            "hottest_partition_rate": round(self.hottest_partition_rate, 3),
            "lanes_needed": self.lanes_needed,
            "recommended_replicas": self.recommended_replicas,
            "recommended_factor": self.recommended_factor,
            "current_replicas": self.current_replicas,
            "current_factor": self.current_factor,
            "ready_replicas": self.ready_replicas,
            "lag_rising": self.lag_rising,
            "shortfall": self.shortfall,
        }
        if self.capped_by_bottleneck is not None:
            out["capped_by_bottleneck"] = self.capped_by_bottleneck
        if self.bottleneck_lifted is not None:
            out["bottleneck_lifted"] = self.bottleneck_lifted
        for note in self.notes:
            key, _, text = note.partition(": ")
            out[key] = text
        return out


@dataclass(frozen=True)
class Decision:
    """What to run, and why. ``changed`` is true when (replicas, factor) differ from the observation."""

    replicas: int
    factor: int
    reason: str
    inputs: dict[str, Any]
    changed: bool
    warnings: list[str] = field(default_factory=list)
    rule: str = "at-recommendation"
    """The rule that fired: a key of :data:`RULES`."""
    trace: DecisionTrace | None = None
    """What the policy found (multilane's policy; None for the simulator's baselines and an invalid
    observation). ``inputs`` and ``warnings`` are its flat form."""


def _finite_nonneg(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x >= 0


def validate_observation(obs: Observation, config: PolicyConfig) -> list[str]:
    """The reasons ``obs`` cannot be used (empty when it can)."""
    problems: list[str] = []
    if not isinstance(obs.now, int | float) or not math.isfinite(obs.now):
        problems.append(f"time is not finite ({obs.now!r})")
    missing = [p for p in range(config.partitions) if p not in obs.lag_by_partition]
    if missing:
        problems.append(f"no lag for partitions {missing[:8]}{'...' if len(missing) > 8 else ''}")
    bad = {p: v for p, v in obs.lag_by_partition.items() if not _finite_nonneg(v)}
    if bad:
        problems.append(f"invalid lag {dict(list(bad.items())[:4])}")
    for name in ("input_rate", "processing_rate"):
        v = getattr(obs, name)
        if not _finite_nonneg(v):
            problems.append(f"invalid {name} {v!r}")
    if obs.input_rate_by_partition is not None:
        bad_in = {p: v for p, v in obs.input_rate_by_partition.items() if not _finite_nonneg(v)}
        if bad_in:
            problems.append(f"invalid input_rate_by_partition {dict(list(bad_in.items())[:4])}")
    if obs.cpu_utilisation is not None and not _finite_nonneg(obs.cpu_utilisation):
        problems.append(f"invalid cpu_utilisation {obs.cpu_utilisation!r}")
    if obs.ready_replicas is not None and obs.ready_replicas < 0:
        problems.append(f"invalid ready_replicas {obs.ready_replicas}")
    if obs.busy_lanes is not None and not _finite_nonneg(obs.busy_lanes):
        problems.append(f"invalid busy_lanes {obs.busy_lanes!r}")
    if obs.replicas < 0 or obs.factor < 1:
        problems.append(f"invalid current size replicas={obs.replicas} factor={obs.factor}")
    return problems
