"""The autoscaling policy: how many replicas (pods) and lanes per partition (the factor) to run.

Pure: no I/O. The operator calls :meth:`AutoscalePolicy.decide` once per scaling interval with an
:class:`Observation` built from lag and rate metrics, and stores the returned :class:`PolicyState`
(JSON via ``to_dict``/``from_dict``) for the next call. The simulator (``multilane.sim``) calls the
same method unchanged.

The model is rate-based, in the manner of the Flink Kubernetes operator's autoscaler, not a lag
threshold:

- needed capacity (rec/s) = ``input_rate / target_utilisation + backlog / target_catchup_s``; when
  ``max_lag`` is set and the backlog exceeds it, at least ``input_rate + (backlog - max_lag) /
  max_lag_catchup_s`` (the excess over the bound is cleared faster than the rest);
- ``r`` = processing rate of one lane, observed as ``processing_rate / busy_lanes``
  (see :func:`estimate_lane_rate`);
- lanes needed ``L = ceil(needed / r)``; concurrency is ``partitions x F``, so
  ``F = clamp(ceil(L / partitions), min_factor, max_factor)``, raised so that the busiest partition's
  own need (its input / utilisation + its lag / catch-up time) fits in its F lanes;
- replicas carry CPU and memory, not concurrency: ``R`` is the smallest replica count (at least
  ``min_replicas``, at most ``min(max_replicas, partitions)``) that keeps every pod within
  ``max_lanes_per_replica`` lanes, where a pod holds ``ceil(partitions / R)`` partitions, and, when
  the pods' CPU use is observed, that runs ``input_rate + backlog / target_catchup_s`` at
  ``target_cpu_utilisation`` (a pod's capacity is extrapolated as ``processing_rate / (ready pods x
  cpu_utilisation)``; the lane headroom is not applied twice). Choosing the
  smallest R for a given ``ceil(partitions / R)`` makes the shares as equal as they can be (R divides
  the partition count whenever some R with that share does).

Damping (all state lives in :class:`PolicyState`):

- scale-up needs evidence: either the recommendation stayed above the current size for the whole
  ``stabilisation_s`` window (then the size goes to the lowest recommendation of the window, so a
  single noisy sample does not count), or the lag is a backlog and grew since the previous
  observation (a real shortfall, scaled to immediately);
- scale-down waits ``scale_down_delay_s`` after the last change, needs a history that covers that
  window, and goes to the highest recommendation within it; never while a backlog is draining;
- after a scale-up, further scale-ups wait ``settle_s`` and, while the rollout runs, until it ends
  (at most ``bottleneck_retry_s``): new pods start, partitions move, lanes fill;
- a scale-up that did not raise the processing rate after ``settle_s`` (and after the rollout it
  started, ``Observation.rebalancing``) while the backlog stayed is reported as a bottleneck: the
  recommendation is capped at the size before that scale-up (no further scale-up; the useless
  lanes/pods go after the scale-down delay) until the processing rate rises; after
  ``bottleneck_retry_s`` one probe up to twice that size is allowed, and each failed probe doubles
  the hold;
- an invalid observation (negative lag, NaN or negative rates, missing partitions) holds the last
  decision with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "AutoscalePolicy",
    "Decision",
    "LaneRateEstimate",
    "Observation",
    "PolicyConfig",
    "PolicyState",
    "Recommendation",
    "ScaleUpRecord",
    "estimate_lane_rate",
    "needed_capacity",
    "recommend",
]


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
class Decision:
    """What to run, and why. ``changed`` is true when (replicas, factor) differ from the observation."""

    replicas: int
    factor: int
    reason: str
    inputs: dict[str, Any]
    changed: bool
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LaneRateEstimate:
    """The records/s one lane completes, and where the number came from."""

    rate: float
    """> 0."""
    source: str
    """``observed`` (rate / busy lanes), ``saturated`` (rate / all lanes while a backlog stands),
    ``previous`` (last estimate) or ``default`` (configured; nothing observed yet)."""


@dataclass(frozen=True)
class Recommendation:
    """The unconstrained-by-history answer for one observation."""

    replicas: int
    factor: int
    needed_rate: float
    lanes_needed: int
    capacity: float
    """partitions x factor x lane rate."""
    warnings: tuple[str, ...] = ()


@dataclass
class ScaleUpRecord:
    """A scale-up whose effect on the processing rate is still to be judged."""

    time: float
    rate_before: float
    lanes_before: int
    lanes_after: int
    replicas_before: int
    replicas_after: int

    def expected_gain(self) -> float:
        """Relative processing-rate rise the scale-up should bring (0 when it added nothing)."""
        if self.lanes_after > self.lanes_before:
            return self.lanes_after / max(self.lanes_before, 1) - 1.0
        return max(self.replicas_after / max(self.replicas_before, 1) - 1.0, 0.0)


@dataclass
class PolicyState:
    """Everything :meth:`AutoscalePolicy.decide` remembers between calls; owned by the caller.

    Invariant: ``history`` is sorted by time and holds the entries of the last
    ``max(scale_down_delay_s, stabilisation_s)`` before the latest observation, plus the newest entry
    older than that (so that whether the history covers the window is known on any clock).
    """

    history: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, recommended replicas, recommended factor), oldest first."""
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
    bottleneck_strikes: int = 0
    """Probes that failed too; the hold doubles with each (``bottleneck_retry_s x 2**strikes``)."""

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
            "bottleneck_strikes": self.bottleneck_strikes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> PolicyState:
        """Inverse of :meth:`to_dict`; ``None`` or ``{}`` gives a fresh state."""
        if not data:
            return cls()

        def rec(d: Mapping[str, Any] | None) -> ScaleUpRecord | None:
            return None if d is None else ScaleUpRecord(**d)

        return cls(
            history=[(float(t), int(r), int(f)) for t, r, f in data.get("history", [])],
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
            bottleneck_strikes=int(data.get("bottleneck_strikes", 0)),
        )


MIN_LANE_RATE = 1e-6
"""Records/s; lane-rate estimates below this are treated as "not observed" (they would explode L)."""


def _finite_nonneg(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x >= 0


def prune_history(
    history: list[tuple[float, int, int]], now: float, horizon: float
) -> list[tuple[float, int, int]]:
    """Entries within ``horizon`` before ``now`` (none from the future), plus the newest one older
    than that: on a free-running clock no entry lands exactly ``horizon`` ago, and without it the
    history would never be seen to cover the window."""
    kept = [h for h in history if now - horizon <= h[0] <= now]
    older = [h for h in history if h[0] < now - horizon]
    return ([older[-1]] if older else []) + kept


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


def backlog_threshold(config: PolicyConfig, input_rate: float) -> float:
    """The lag (records) above which the lag counts as a backlog, not as records in flight."""
    return max(100.0, input_rate * config.backlog_threshold_s)


def estimate_lane_rate(obs: Observation, config: PolicyConfig, previous: float | None) -> LaneRateEstimate:
    """Records/s one lane completes (the key input of the policy).

    1. ``processing_rate / busy_lanes`` when busy lanes are reported (>= 0.5 lane busy on average)
       and records were processed: the service rate of a busy lane, independent of the load.
    2. Else, while a backlog stands, every lane is busy: ``processing_rate / (partitions x factor)``.
    3. Else the previous estimate, else ``config.default_lane_rate``.

    Estimates below :data:`MIN_LANE_RATE` are discarded at each step.
    """
    lanes = config.partitions * max(obs.factor, 1)
    backlog = sum(obs.lag_by_partition.values())
    # 1.
    if obs.busy_lanes is not None and obs.busy_lanes >= 0.5:
        rate = obs.processing_rate / obs.busy_lanes
        if rate >= MIN_LANE_RATE:
            return LaneRateEstimate(rate, "observed")
    # 2.
    if backlog > backlog_threshold(config, obs.input_rate) and obs.replicas > 0:
        rate = obs.processing_rate / lanes
        if rate >= MIN_LANE_RATE:
            return LaneRateEstimate(rate, "saturated")
    # 3.
    if previous is not None and previous >= MIN_LANE_RATE:
        return LaneRateEstimate(previous, "previous")
    return LaneRateEstimate(config.default_lane_rate, "default")


MIN_CPU_FOR_ESTIMATE = 0.05
"""CPU utilisation below this is too small to extrapolate a pod's capacity from."""


def estimate_pod_rate(obs: Observation, previous: float | None) -> float | None:
    """Records/s one pod would handle at 100 % of its CPU limit: ``processing_rate / (ready pods x
    cpu_utilisation)`` when CPU is reported and high enough to extrapolate; else the previous value."""
    ready = obs.replicas if obs.ready_replicas is None else obs.ready_replicas
    cpu = obs.cpu_utilisation
    if cpu is not None and cpu >= MIN_CPU_FOR_ESTIMATE and ready > 0 and obs.processing_rate > 0:
        rate = obs.processing_rate / (ready * cpu)
        if rate >= MIN_LANE_RATE:
            return rate
    return previous


def needed_capacity(
    config: PolicyConfig, input_rate: float, backlog: float, utilisation: float | None = None
) -> float:
    """Records/s the group must be able to process (see the module docstring).

    ``utilisation`` overrides ``config.target_utilisation`` (1.0 gives the rate to be processed,
    without headroom: the CPU sizing applies its own target to it)."""
    u = config.target_utilisation if utilisation is None else utilisation
    needed = input_rate / u + backlog / config.target_catchup_s
    if config.max_lag is not None and backlog > config.max_lag:
        needed = max(needed, input_rate + (backlog - config.max_lag) / config.max_lag_catchup_s)
    return needed


def hottest_partition_need(config: PolicyConfig, obs: Observation) -> float:
    """Records/s the busiest partition needs: its input at the target utilisation plus its own
    backlog cleared within the catch-up time (input spread evenly when per-partition rates are
    unknown)."""
    even = obs.input_rate / config.partitions
    by_p = obs.input_rate_by_partition or {}
    return max(
        by_p.get(p, even) / config.target_utilisation
        + obs.lag_by_partition.get(p, 0) / config.target_catchup_s
        for p in range(config.partitions)
    )


def replicas_for(config: PolicyConfig, factor: int) -> tuple[int, bool]:
    """The smallest replica count that keeps every pod within the lane budget.

    Returns (replicas, within_budget). Candidates are, for each share size ``s`` (partitions per
    pod), ``ceil(partitions / s)``: the fewest pods giving that share, hence the most even split.
    """
    p = config.partitions
    for r in range(config.replica_floor, config.replica_ceiling + 1):
        share = -(-p // r)
        if share * factor <= config.max_lanes_per_replica:
            return r, True
    return config.replica_ceiling, False


def recommend(
    config: PolicyConfig,
    needed: float,
    lane_rate: float,
    hottest_needed: float = 0.0,
    pod_rate: float | None = None,
    cpu_needed: float | None = None,
) -> Recommendation:
    """Replicas and factor whose capacity covers ``needed`` (or the maximum, with a warning).

    ``hottest_needed`` is the rate the busiest partition alone needs: lanes belong to one partition,
    so a skewed load needs ``F >= hottest_needed / lane_rate`` even when the total is covered.

    1. lanes needed ``L = ceil(needed / lane_rate)`` (at least one lane per partition);
    2. ``F = clamp(max(ceil(L / partitions), ceil(hottest_needed / lane_rate)), min_factor,
       max_factor)`` (rounded up: never one step short);
    3. ``R`` from the per-pod lane budget (:func:`replicas_for`), raised to
       ``ceil(cpu_needed / (pod_rate x target_cpu_utilisation))`` when a pod's CPU capacity is known
       (``cpu_needed``: the rate without the lane headroom; defaults to ``needed``).
    """
    warnings: list[str] = []
    p = config.partitions
    # 1. (a ratio beyond the maximum lane count is cut there: it can only mean "the maximum")
    ratio = needed / max(lane_rate, MIN_LANE_RATE)
    lanes_needed = max(math.ceil(min(ratio, float(p * config.max_factor + 1))), p)
    # 2.
    hot_ratio = hottest_needed / max(lane_rate, MIN_LANE_RATE)
    hot_factor = math.ceil(min(hot_ratio, float(config.max_factor + 1)))
    factor = max(-(-lanes_needed // p), hot_factor)
    if hot_factor > config.max_factor:
        warnings.append(
            f"the busiest partition needs {hottest_needed:.1f} rec/s, above "
            f"{config.max_factor * lane_rate:.1f} rec/s of max_factor={config.max_factor} lanes"
        )
    if -(-lanes_needed // p) > config.max_factor:
        warnings.append(
            f"demand {needed:.1f} rec/s exceeds the maximum capacity "
            f"{p * config.max_factor * lane_rate:.1f} rec/s (max_factor={config.max_factor})"
        )
    factor = min(max(factor, config.min_factor), config.max_factor)
    # 3.
    replicas, within = replicas_for(config, factor)
    if not within:
        warnings.append(
            f"{-(-p // replicas) * factor} lanes per pod exceed max_lanes_per_replica="
            f"{config.max_lanes_per_replica} at max replicas {replicas}"
        )
    if pod_rate is not None and pod_rate > 0:
        cpu_rate = needed if cpu_needed is None else cpu_needed
        cpu_ratio = cpu_rate / (pod_rate * config.target_cpu_utilisation)
        for_cpu = math.ceil(min(cpu_ratio, float(config.partitions + 1)))
        if for_cpu > config.replica_ceiling:
            warnings.append(
                f"CPU: {cpu_rate:.1f} rec/s needs {for_cpu} pods at {pod_rate:.1f} rec/s per pod and "
                f"target_cpu_utilisation={config.target_cpu_utilisation}; at most {config.replica_ceiling}"
            )
        replicas = min(max(replicas, for_cpu), config.replica_ceiling)
    return Recommendation(
        replicas=replicas,
        factor=factor,
        needed_rate=needed,
        lanes_needed=lanes_needed,
        capacity=p * factor * lane_rate,
        warnings=tuple(warnings),
    )


class AutoscalePolicy:
    """Decides replicas x factor from one observation and the remembered state. Pure."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    def decide(self, obs: Observation, state: PolicyState) -> tuple[Decision, PolicyState]:
        """One scaling step.

        1. Validate the observation; on a problem hold the last decision.
        2. Estimate the lane rate and the needed capacity; compute the recommendation.
        3. Judge a pending scale-up (settled, rollout over: did the rate rise?); set or clear the
           bottleneck; while it is set, cap the recommendation at the size before the ineffective
           scale-up (so that size is also where a later scale-down returns).
        4. Record the recommendation in the history window.
        5. Choose: scale up (confirmed by lag growth or a full stabilisation window, not within the
           settle time of the last scale-up), scale down (delay passed, window covered, not draining,
           to the window max), or hold.
        6. Update the state and return the decision.
        """
        cfg = self.config
        st = PolicyState.from_dict(state.to_dict())  # never mutate the caller's state
        # 1.
        problems = validate_observation(obs, cfg)
        if problems:
            return self._hold_invalid(obs, st, problems)
        now = float(obs.now)
        backlog = int(sum(obs.lag_by_partition.values()))
        cur_r = obs.replicas
        cur_f = obs.factor
        cur_lanes = cfg.partitions * cur_f
        threshold = backlog_threshold(cfg, obs.input_rate)
        has_backlog = backlog > threshold
        lag_rising = st.last_lag is not None and backlog > st.last_lag
        draining = has_backlog and st.last_lag is not None and backlog < st.last_lag
        # 2.
        est = estimate_lane_rate(obs, cfg, st.lane_rate)
        # The observed input rate is used as is: inferring the input from lag growth reacts faster
        # but turns a glitch in the lag (end offsets under-reported, then caught up) into a wild scale.
        needed = needed_capacity(cfg, obs.input_rate, backlog)
        hottest = hottest_partition_need(cfg, obs)
        # during a rollout the ready pods and the CPU window disagree: keep the previous estimate
        pod_rate = st.pod_rate if obs.rebalancing else estimate_pod_rate(obs, st.pod_rate)
        cpu_needed = needed_capacity(cfg, obs.input_rate, backlog, utilisation=1.0)
        rec = recommend(cfg, needed, est.rate, hottest, pod_rate, cpu_needed)
        warnings = list(rec.warnings)
        if est.source == "default":
            warnings.append(f"no lane rate observed yet; assuming default_lane_rate={cfg.default_lane_rate}")
        inputs: dict[str, Any] = {
            "backlog": backlog,
            "backlog_threshold": round(threshold, 1),
            "input_rate": round(obs.input_rate, 3),
            "processing_rate": round(obs.processing_rate, 3),
            "busy_lanes": obs.busy_lanes,
            "lane_rate": round(est.rate, 3),
            "lane_rate_source": est.source,
            "cpu_utilisation": obs.cpu_utilisation,
            "pod_rate": None if pod_rate is None else round(pod_rate, 3),
            "needed_rate": round(needed, 3),
            "hottest_partition_rate": round(hottest, 3),
            "lanes_needed": rec.lanes_needed,
            "recommended_replicas": rec.replicas,
            "recommended_factor": rec.factor,
            "current_replicas": cur_r,
            "current_factor": cur_f,
        }
        # 3.
        self._judge_scale_up(obs, st, has_backlog, cur_lanes, warnings)
        if st.bottleneck is not None:
            b = st.bottleneck
            warnings.append(
                f"scale-up at t={b.time:.0f}s from {b.lanes_before} to {b.lanes_after} lanes "
                f"({b.replicas_before}->{b.replicas_after} replicas) did not raise the processing rate "
                f"(before {b.rate_before:.1f} rec/s, now {obs.processing_rate:.1f} rec/s): "
                "a bottleneck outside the consumer (downstream, CPU or a hot key?)"
            )
            cap_f = max(cfg.min_factor, -(-b.lanes_before // cfg.partitions))
            cap_r = max(cfg.replica_floor, b.replicas_before)
            if st.bottleneck_hold_until is not None and now >= st.bottleneck_hold_until:
                # the hold is over: one probe, at most twice the last effective size
                cap_f = min(2 * cap_f, cfg.max_factor)
                cap_r = min(2 * cap_r, cfg.replica_ceiling)
            if rec.factor > cap_f or rec.replicas > cap_r:
                rec = replace(rec, replicas=min(rec.replicas, cap_r), factor=min(rec.factor, cap_f))
                inputs["recommended_replicas"], inputs["recommended_factor"] = rec.replicas, rec.factor
                inputs["capped_by_bottleneck"] = f"{cap_r}x{cap_f}"
        # 4.
        st.history = prune_history(st.history, now, max(cfg.scale_down_delay_s, cfg.stabilisation_s))
        st.history.append((now, rec.replicas, rec.factor))
        # 5.
        new_r, new_f, reason = self._choose(obs, st, rec, has_backlog, lag_rising, draining, inputs)
        # 6.
        if (new_r, new_f) != (cur_r, cur_f):
            st.last_change_time = now
            if cfg.partitions * new_f > cur_lanes or new_r > cur_r:
                st.pending_scale_up = ScaleUpRecord(
                    time=now,
                    rate_before=obs.processing_rate,
                    lanes_before=cur_lanes,
                    lanes_after=cfg.partitions * new_f,
                    replicas_before=cur_r,
                    replicas_after=new_r,
                )
            else:
                st.pending_scale_up = None
        elif st.last_change_time is None:
            st.last_change_time = now
        if est.source in ("observed", "saturated"):
            st.lane_rate = est.rate
        st.pod_rate = pod_rate
        st.last_lag = backlog
        st.last_time = now
        st.last_replicas, st.last_factor = new_r, new_f
        decision = Decision(
            replicas=new_r,
            factor=new_f,
            reason=reason,
            inputs=inputs,
            changed=(new_r, new_f) != (cur_r, cur_f),
            warnings=warnings,
        )
        return decision, st

    # -- steps -------------------------------------------------------------------------------

    def _hold_invalid(
        self, obs: Observation, st: PolicyState, problems: list[str]
    ) -> tuple[Decision, PolicyState]:
        cfg = self.config
        if st.last_replicas is not None and st.last_factor is not None:
            r, f, what = st.last_replicas, st.last_factor, "the last decision"
        else:
            r = min(max(obs.replicas, cfg.replica_floor), cfg.replica_ceiling)
            f = min(max(obs.factor, cfg.min_factor), cfg.max_factor)
            what = "the current size (within bounds)"
        reason = f"hold {what} {r}x{f}: invalid observation: " + "; ".join(problems)
        decision = Decision(
            replicas=r,
            factor=f,
            reason=reason,
            inputs={"problems": problems, "current_replicas": obs.replicas, "current_factor": obs.factor},
            changed=(r, f) != (obs.replicas, obs.factor),
            warnings=[reason],
        )
        return decision, st

    def _judge_scale_up(
        self,
        obs: Observation,
        st: PolicyState,
        has_backlog: bool,
        cur_lanes: int,
        warnings: list[str],
    ) -> None:
        """Judge the pending scale-up once settled; clear a bottleneck that no longer holds."""
        cfg = self.config
        now = float(obs.now)
        b = st.bottleneck
        if b is not None:
            # 1. the ceiling lifted (the downstream recovered, say): forget the bottleneck
            risen = obs.processing_rate > b.rate_before * (
                1.0 + max(cfg.min_scale_up_gain * b.expected_gain(), 0.05)
            )
            if risen:
                st.bottleneck, st.bottleneck_hold_until, st.bottleneck_strikes = None, None, 0
        p = st.pending_scale_up
        if p is None or now - p.time < cfg.settle_s or obs.rebalancing:
            return
        st.pending_scale_up = None
        if not has_backlog or cur_lanes < p.lanes_after:
            return  # demand met, or the scale-up was reverted: nothing to judge
        # 2. judge the settled scale-up (a probe after a hold included)
        gain = obs.processing_rate / p.rate_before - 1.0 if p.rate_before > 0 else math.inf
        expected = p.expected_gain()
        if expected > 0 and gain < cfg.min_scale_up_gain * expected:
            if st.bottleneck is None:
                st.bottleneck, st.bottleneck_strikes = p, 0
            else:
                st.bottleneck_strikes += 1
            st.bottleneck_hold_until = now + cfg.bottleneck_retry_s * 2**st.bottleneck_strikes
        elif st.bottleneck is not None:
            st.bottleneck, st.bottleneck_hold_until, st.bottleneck_strikes = None, None, 0

    def _choose(
        self,
        obs: Observation,
        st: PolicyState,
        rec: Recommendation,
        has_backlog: bool,
        lag_rising: bool,
        draining: bool,
        inputs: dict[str, Any],
    ) -> tuple[int, int, str]:
        cfg = self.config
        now = float(obs.now)
        # Bounds first: a size outside the (possibly edited) bounds is corrected at once, and the
        # rest of the step starts from the corrected size.
        cur_r = min(max(obs.replicas, cfg.replica_floor), cfg.replica_ceiling)
        cur_f = min(max(obs.factor, cfg.min_factor), cfg.max_factor)
        prefix = ""
        if (cur_r, cur_f) != (obs.replicas, obs.factor):
            prefix = f"clamp {obs.replicas}x{obs.factor} into bounds -> {cur_r}x{cur_f}; "
        r, f, reason = self._choose_within_bounds(
            now, cur_r, cur_f, st, rec, has_backlog, lag_rising, draining, obs.rebalancing, inputs
        )
        return r, f, prefix + reason

    def _choose_within_bounds(
        self,
        now: float,
        cur_r: int,
        cur_f: int,
        st: PolicyState,
        rec: Recommendation,
        has_backlog: bool,
        lag_rising: bool,
        draining: bool,
        rebalancing: bool,
        inputs: dict[str, Any],
    ) -> tuple[int, int, str]:
        cfg = self.config
        summary = (
            f"need {rec.needed_rate:.1f} rec/s = {rec.lanes_needed} lanes at "
            f"{inputs['lane_rate']} rec/s/lane ({inputs['lane_rate_source']}); backlog {inputs['backlog']}"
        )
        if "capped_by_bottleneck" in inputs:
            summary += (
                f"; capped at {inputs['capped_by_bottleneck']}: the last scale-up did not raise the "
                "processing rate (bottleneck)"
            )
        up = rec.factor > cur_f or rec.replicas > cur_r
        if up:
            p = st.pending_scale_up
            age = now - p.time if p is not None else math.inf
            if p is not None and (age < cfg.settle_s or (rebalancing and age < cfg.bottleneck_retry_s)):
                return (
                    cur_r,
                    cur_f,
                    f"hold {cur_r}x{cur_f}: scale-up to {rec.replicas}x{rec.factor} waits until the "
                    f"scale-up at t={p.time:.0f}s has settled ({cfg.settle_s:.0f}s, rollout "
                    f"{'in progress' if rebalancing else 'done'}); {summary}",
                )
            # The history holds at least this observation; right after a (re)start it is short and
            # the window is whatever has been seen (as in the HPA).
            window = [h for h in st.history if h[0] >= now - cfg.stabilisation_s]
            low_r = min(h[1] for h in window)
            low_f = min(h[2] for h in window)
            if has_backlog and lag_rising:
                r, f = max(rec.replicas, cur_r), max(rec.factor, cur_f)
                return r, f, f"scale up {cur_r}x{cur_f} -> {r}x{f}: lag is rising; {summary}"
            if low_f > cur_f or low_r > cur_r:
                span = now - window[0][0]
                seen = (
                    f"recommended throughout the {cfg.stabilisation_s:.0f}s stabilisation window"
                    if span >= cfg.stabilisation_s
                    else f"recommended by every observation so far ({len(window)} in {span:.0f}s)"
                )
                r, f = max(low_r, cur_r), max(low_f, cur_f)
                return (
                    r,
                    f,
                    (f"scale up {cur_r}x{cur_f} -> {r}x{f}: {seen}; {summary}"),
                )
            return (
                cur_r,
                cur_f,
                (
                    f"hold {cur_r}x{cur_f}: scale-up to {rec.replicas}x{rec.factor} waits for the "
                    f"{cfg.stabilisation_s:.0f}s stabilisation window; {summary}"
                ),
            )
        down = rec.factor < cur_f or rec.replicas < cur_r
        if not down:
            return cur_r, cur_f, f"hold {cur_r}x{cur_f}: at the recommendation; {summary}"
        if draining:
            return cur_r, cur_f, f"hold {cur_r}x{cur_f}: no scale-down while a backlog is draining; {summary}"
        since_change = now - st.last_change_time if st.last_change_time is not None else 0.0
        covered = bool(st.history) and st.history[0][0] <= now - cfg.scale_down_delay_s
        if since_change < cfg.scale_down_delay_s or not covered:
            return (
                cur_r,
                cur_f,
                (
                    f"hold {cur_r}x{cur_f}: scale-down to {rec.replicas}x{rec.factor} waits for the "
                    f"{cfg.scale_down_delay_s:.0f}s delay; {summary}"
                ),
            )
        window = [h for h in st.history if h[0] >= now - cfg.scale_down_delay_s]
        high_r = max(h[1] for h in window)
        high_f = max(h[2] for h in window)
        r, f = min(cur_r, high_r), min(cur_f, high_f)
        if (r, f) == (cur_r, cur_f):
            return (
                cur_r,
                cur_f,
                (
                    f"hold {cur_r}x{cur_f}: a higher size was recommended within the last "
                    f"{cfg.scale_down_delay_s:.0f}s; {summary}"
                ),
            )
        return (
            r,
            f,
            (
                f"scale down {cur_r}x{cur_f} -> {r}x{f}: highest recommendation of the last "
                f"{cfg.scale_down_delay_s:.0f}s; {summary}"
            ),
        )
