"""The autoscaling policy: how many replicas (pods) and lanes per partition (the factor) to run.

Pure: no I/O. The operator calls :meth:`AutoscalePolicy.decide` once per scaling interval with an
:class:`Observation` built from lag and rate metrics, and stores the returned :class:`PolicyState`
(JSON via ``to_dict``/``from_dict``) for the next call. The simulator (``multilane.sim``) calls the
same method unchanged.

The capacity model (needed rate, lane rate, replicas x factor that cover it) is in
:mod:`multilane.operator.capacity`; this module adds the damping. The policy has two speeds:

- **the factor first**: a shortfall (lag rising, or the input above the processing rate) is answered
  at the next decision by raising the factor in place, up to what the pods running now carry within
  ``max_lanes_per_replica`` (:func:`~multilane.operator.capacity.factor_for_pods`); the replicas the
  recommendation needs are asked for in the same decision, for CPU and memory, and the factor
  follows them to the full recommendation as they become ready;
- **a scale-up goes to the current need**, not to the lowest recommendation of a window, when the
  lag rises; without lag evidence a scale-up still needs the whole ``stabilisation_s`` window (then
  to the window's lowest recommendation, so a single noisy sample does not count);
- **settle and effectiveness checks apply only to the demand a scale-up was sized for**: while a
  scale-up settles (``settle_s``, and its rollout), further scale-ups wait, unless the needed rate
  is clearly beyond what the pending scale-up was sized for (its input rate more than
  ``shortfall_margin`` above the input the scale-up was sized for) while the lag rises, which is
  acted on at once; likewise a bottleneck (a settled scale-up that did not raise the processing
  rate) caps the size only while the input stays within that margin of what the ineffective
  scale-up was sized for (a backlog growing at the same input is no new demand). After
  ``bottleneck_retry_s`` one probe up to twice the last effective size is allowed, and each failed
  probe doubles the hold;
- **scale-down** waits ``scale_down_delay_s`` after the last change, needs a history that covers
  that window, goes to the highest recommendation within it, never while a backlog drains, and
  never while the window's highest needed rate is within ``scale_down_tolerance`` of the rate the
  current size was chosen for (a dip of the measured input during a sustained burst does not shrink
  the group);
- an invalid observation (negative lag, NaN or negative rates, missing partitions) holds the last
  decision with the reason.

Every :class:`Decision` names the rule that fired (``Decision.rule``, one of :data:`RULES`) and
explains itself in ``reason`` with the inputs it used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from multilane.operator.capacity import (
    MIN_LANE_RATE,
    LaneRateEstimate,
    Recommendation,
    backlog_threshold,
    estimate_lane_rate,
    estimate_pod_rate,
    factor_for_pods,
    hottest_partition_need,
    needed_capacity,
    recommend,
    replicas_for,
)

__all__ = [
    "MIN_LANE_RATE",
    "RULES",
    "AutoscalePolicy",
    "Decision",
    "LaneRateEstimate",
    "Observation",
    "PolicyConfig",
    "PolicyState",
    "Recommendation",
    "ScaleUpRecord",
    "backlog_threshold",
    "estimate_lane_rate",
    "estimate_pod_rate",
    "hottest_partition_need",
    "needed_capacity",
    "recommend",
    "replicas_for",
]

RULES: dict[str, str] = {
    "shortfall": "scale up at once to the current need: the lag is rising",
    "beyond-pending": "scale up at once: the need is clearly beyond what the pending scale-up was sized for",
    "factor-follows": "raise the factor toward the pending scale-up's target as its pods become ready",
    "stabilised": "scale up: recommended throughout the stabilisation window",
    "settling": "hold: a scale-up is settling (and its rollout running)",
    "stabilising": "hold: a scale-up without lag evidence waits for the stabilisation window",
    "at-recommendation": "hold: the size is the recommendation",
    "draining": "hold: no scale-down while a backlog drains",
    "scale-down-delay": "hold: a scale-down waits for the scale-down delay",
    "within-tolerance": "hold: the need is within the scale-down tolerance of what the size was chosen for",
    "recently-higher": "hold: a higher size was recommended within the scale-down delay",
    "scale-down": "scale down to the highest recommendation of the scale-down delay",
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
    factor follows the new pods). False: the recommended factor at once (the policy before the
    two-speed change; the burst benchmark's baseline)."""

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


@dataclass
class ScaleUpRecord:
    """A scale-up whose effect on the processing rate is still to be judged."""

    time: float
    rate_before: float
    lanes_before: int
    lanes_after: int
    replicas_before: int
    replicas_after: int
    sized_for: float = 0.0
    """The input rate (rec/s) the scale-up was sized for: its settle and effectiveness checks apply
    to this demand only (0: unknown, from an older state). A backlog that grows while the input
    stays is not new demand (it is what an ineffective scale-up looks like)."""
    factor_target: int = 0
    """The factor recommended when it was decided; the factor follows the new pods up to it."""

    def beyond(self, input_rate: float, margin: float) -> bool:
        """True when ``input_rate`` is clearly beyond the demand this scale-up was sized for."""
        return self.sized_for > 0 and input_rate > self.sized_for * (1.0 + margin)

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
            "sized_need": self.sized_need,
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
            bottleneck_strikes=int(data.get("bottleneck_strikes", 0)),
            sized_need=data.get("sized_need"),
        )


def _history_entry(h: Any) -> tuple[float, int, int, float]:
    """A history entry from JSON; entries of older states have no needed rate (0.0)."""
    return float(h[0]), int(h[1]), int(h[2]), float(h[3]) if len(h) > 3 else 0.0


def _finite_nonneg(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x >= 0


def prune_history(
    history: list[tuple[float, int, int, float]], now: float, horizon: float
) -> list[tuple[float, int, int, float]]:
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


class AutoscalePolicy:
    """Decides replicas x factor from one observation and the remembered state. Pure."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    def decide(self, obs: Observation, state: PolicyState) -> tuple[Decision, PolicyState]:
        """One scaling step.

        1. Validate the observation; on a problem hold the last decision.
        2. Estimate the lane rate and the needed capacity; compute the recommendation.
        3. Judge a pending scale-up (settled, rollout over: did the rate rise?); set or clear the
           bottleneck; while it is set and the need stays within ``shortfall_margin`` of what the
           ineffective scale-up was sized for, cap the recommendation at the size before it.
        4. Record the recommendation (and the needed rate) in the history window.
        5. Choose (:meth:`_choose`): scale up (a shortfall at once, the factor first; without lag
           evidence after a full stabilisation window; not while a scale-up settles unless the need
           is clearly beyond it), let the factor follow new pods, scale down (delay passed, window
           covered, not draining, beyond the tolerance, to the window max), or hold.
        6. Update the state and return the decision, naming the rule that fired.
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
        shortfall = lag_rising and (
            backlog > max(100.0, obs.input_rate * cfg.rising_lag_threshold_s)
            or obs.input_rate > obs.processing_rate * cfg.shortfall_input_ratio
        )
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
        ready = obs.replicas if obs.ready_replicas is None else obs.ready_replicas
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
            "ready_replicas": ready,
            "lag_rising": lag_rising,
            "shortfall": shortfall,
        }
        # 3.
        self._judge_scale_up(obs, st, has_backlog, cur_lanes, warnings)
        if st.bottleneck is not None:
            rec = self._cap_by_bottleneck(st, rec, obs.input_rate, now, obs.processing_rate, warnings, inputs)
        # 4.
        st.history = prune_history(st.history, now, max(cfg.scale_down_delay_s, cfg.stabilisation_s))
        st.history.append((now, rec.replicas, rec.factor, needed))
        # 5.
        choice = self._choose(obs, st, rec, needed, has_backlog, shortfall, draining, ready, inputs)
        new_r, new_f = choice.replicas, choice.factor
        # 6.
        if (new_r, new_f) != (cur_r, cur_f):
            st.last_change_time = now
            st.sized_need = choice.sized_for if choice.sized_for is not None else needed
            if cfg.partitions * new_f > cur_lanes or new_r > cur_r:
                p = st.pending_scale_up
                if choice.rule == "factor-follows" and p is not None:
                    # the same scale-up, completed as its pods became ready
                    p.lanes_after = cfg.partitions * new_f
                else:
                    st.pending_scale_up = ScaleUpRecord(
                        time=now,
                        rate_before=obs.processing_rate,
                        lanes_before=cur_lanes,
                        lanes_after=cfg.partitions * new_f,
                        replicas_before=cur_r,
                        replicas_after=new_r,
                        sized_for=obs.input_rate,
                        factor_target=rec.factor,
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
            reason=choice.reason,
            inputs=inputs,
            changed=(new_r, new_f) != (cur_r, cur_f),
            warnings=warnings,
            rule=choice.rule,
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
            rule="invalid-observation",
        )
        return decision, st

    def _cap_by_bottleneck(
        self,
        st: PolicyState,
        rec: Recommendation,
        input_rate: float,
        now: float,
        processing_rate: float,
        warnings: list[str],
        inputs: dict[str, Any],
    ) -> Recommendation:
        """Step 3: cap the recommendation at the last effective size while a bottleneck holds and the
        input stays within ``shortfall_margin`` of what the ineffective scale-up was sized for."""
        cfg = self.config
        b = st.bottleneck
        assert b is not None
        warnings.append(
            f"scale-up {now - b.time:.0f}s ago from {b.lanes_before} to {b.lanes_after} lanes "
            f"({b.replicas_before}->{b.replicas_after} replicas) did not raise the processing rate "
            f"(before {b.rate_before:.1f} rec/s, now {processing_rate:.1f} rec/s): "
            "a bottleneck outside the consumer (downstream, CPU or a hot key?)"
        )
        if b.beyond(input_rate, cfg.shortfall_margin):
            inputs["bottleneck_lifted"] = (
                f"input {input_rate:.1f} rec/s is beyond the {b.sized_for:.1f} rec/s the ineffective "
                "scale-up was sized for"
            )
            return rec
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
        return rec

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
        needed: float,
        has_backlog: bool,
        shortfall: bool,
        draining: bool,
        ready: int,
        inputs: dict[str, Any],
    ) -> _Choice:
        """Step 5: bounds first (a size outside the, possibly edited, bounds is corrected at once and
        the rest of the step starts from the corrected size), then up, follow, down or hold."""
        cfg = self.config
        cur_r = min(max(obs.replicas, cfg.replica_floor), cfg.replica_ceiling)
        cur_f = min(max(obs.factor, cfg.min_factor), cfg.max_factor)
        ctx = _Context(
            now=float(obs.now),
            cur_r=cur_r,
            cur_f=cur_f,
            ready=ready,
            needed=needed,
            input_rate=obs.input_rate,
            rebalancing=obs.rebalancing,
            capped="capped_by_bottleneck" in inputs,
            summary=_summary(rec, inputs),
        )
        if rec.factor > cur_f or rec.replicas > cur_r:
            choice = self._up(ctx, st, rec, shortfall)
        elif rec.factor < cur_f or rec.replicas < cur_r:
            choice = self._down(ctx, st, rec, draining)
        else:
            choice = _Choice(
                cur_r, cur_f, "at-recommendation", f"hold {cur_r}x{cur_f}: at the recommendation"
            )
        choice.reason += f"; {ctx.summary}"
        if (cur_r, cur_f) != (obs.replicas, obs.factor):
            choice.reason = (
                f"clamp {obs.replicas}x{obs.factor} into bounds -> {cur_r}x{cur_f}; " + choice.reason
            )
        return choice

    def _up(self, c: _Context, st: PolicyState, rec: Recommendation, shortfall: bool) -> _Choice:
        """A scale-up is recommended: settle, follow, at once, after the window, or hold."""
        cfg = self.config
        p = st.pending_scale_up
        age = c.now - p.time if p is not None else math.inf
        settling = p is not None and (age < cfg.settle_s or (c.rebalancing and age < cfg.bottleneck_retry_s))
        if settling and p is not None and not p.beyond(c.input_rate, cfg.shortfall_margin):
            # the pending scale-up covers this demand: its factor follows its pods, nothing more
            target = min(rec.factor, max(p.factor_target, c.cur_f))
            f = self._factor_now(c, c.cur_r, target)
            if f > c.cur_f:
                return _Choice(
                    c.cur_r,
                    f,
                    "factor-follows",
                    f"factor {c.cur_f} -> {f}: {c.ready} of {c.cur_r} pods ready for the scale-up "
                    f"{age:.0f}s ago (target factor {p.factor_target})",
                )
            return _Choice(
                c.cur_r,
                c.cur_f,
                "settling",
                f"hold {c.cur_r}x{c.cur_f}: scale-up to {rec.replicas}x{rec.factor} waits until the "
                f"scale-up {age:.0f}s ago (sized for {p.sized_for:.1f} rec/s) has settled "
                f"({cfg.settle_s:.0f}s, rollout {'in progress' if c.rebalancing else 'done'})",
            )
        if shortfall:
            r = max(rec.replicas, c.cur_r)
            f = self._factor_now(c, r, max(rec.factor, c.cur_f))
            if settling and p is not None:
                rule = "beyond-pending"
                why = (
                    f"input {c.input_rate:.1f} rec/s is more than {cfg.shortfall_margin:.0%} above the "
                    f"{p.sized_for:.1f} rec/s the scale-up {age:.0f}s ago was sized for"
                )
            else:
                rule, why = "shortfall", "lag is rising"
            return _Choice(
                r, f, rule, f"scale up {c.cur_r}x{c.cur_f} -> {r}x{f}: {why}" + _pods_note(c, r, f, rec)
            )
        # The history holds at least this observation; right after a (re)start it is short and
        # the window is whatever has been seen (as in the HPA).
        window = [h for h in st.history if h[0] >= c.now - cfg.stabilisation_s]
        low_r = min(h[1] for h in window)
        low_f = min(h[2] for h in window)
        if low_f > c.cur_f or low_r > c.cur_r:
            span = c.now - window[0][0]
            seen = (
                f"recommended throughout the {cfg.stabilisation_s:.0f}s stabilisation window"
                if span >= cfg.stabilisation_s
                else f"recommended by every observation so far ({len(window)} in {span:.0f}s)"
            )
            r = max(low_r, c.cur_r)
            f = self._factor_now(c, r, max(low_f, c.cur_f))
            return _Choice(
                r,
                f,
                "stabilised",
                f"scale up {c.cur_r}x{c.cur_f} -> {r}x{f}: {seen}" + _pods_note(c, r, f, rec),
                sized_for=min(h[3] for h in window),  # the need the window's lowest answers
            )
        return _Choice(
            c.cur_r,
            c.cur_f,
            "stabilising",
            f"hold {c.cur_r}x{c.cur_f}: scale-up to {rec.replicas}x{rec.factor} waits for the "
            f"{cfg.stabilisation_s:.0f}s stabilisation window",
        )

    def _factor_now(self, c: _Context, replicas: int, wanted: int) -> int:
        """The factor to run now: ``wanted``, or what the ready pods carry while more are coming."""
        if replicas > c.ready and self.config.factor_first:
            return factor_for_pods(self.config, c.ready, wanted, c.cur_f)
        return wanted

    def _down(self, c: _Context, st: PolicyState, rec: Recommendation, draining: bool) -> _Choice:
        """A smaller size is recommended: delay, tolerance and window max decide."""
        cfg = self.config
        hold = f"hold {c.cur_r}x{c.cur_f}: scale-down to {rec.replicas}x{rec.factor}"
        if draining:
            return _Choice(
                c.cur_r, c.cur_f, "draining", f"{hold} waits: no scale-down while a backlog is draining"
            )
        since_change = c.now - st.last_change_time if st.last_change_time is not None else 0.0
        covered = bool(st.history) and st.history[0][0] <= c.now - cfg.scale_down_delay_s
        if since_change < cfg.scale_down_delay_s or not covered:
            return _Choice(
                c.cur_r,
                c.cur_f,
                "scale-down-delay",
                f"{hold} waits for the {cfg.scale_down_delay_s:.0f}s delay",
            )
        window = [h for h in st.history if h[0] >= c.now - cfg.scale_down_delay_s]
        high_r = max(h[1] for h in window)
        high_f = max(h[2] for h in window)
        high_need = max(h[3] for h in window)
        sized = st.sized_need
        tolerated = sized is not None and high_need >= (1.0 - cfg.scale_down_tolerance) * sized
        if tolerated and not c.capped:
            return _Choice(
                c.cur_r,
                c.cur_f,
                "within-tolerance",
                f"{hold} waits: the highest need of the last {cfg.scale_down_delay_s:.0f}s, "
                f"{high_need:.1f} rec/s, is within {cfg.scale_down_tolerance:.0%} of the {sized:.1f} rec/s "
                f"the size was chosen for",
            )
        r, f = min(c.cur_r, high_r), min(c.cur_f, high_f)
        if (r, f) == (c.cur_r, c.cur_f):
            return _Choice(
                c.cur_r,
                c.cur_f,
                "recently-higher",
                f"hold {c.cur_r}x{c.cur_f}: a higher size was recommended within the last "
                f"{cfg.scale_down_delay_s:.0f}s",
            )
        return _Choice(
            r,
            f,
            "scale-down",
            f"scale down {c.cur_r}x{c.cur_f} -> {r}x{f}: highest recommendation of the last "
            f"{cfg.scale_down_delay_s:.0f}s",
            sized_for=high_need,
        )


@dataclass(frozen=True)
class _Context:
    """What :meth:`AutoscalePolicy._choose` decides from (sizes within bounds)."""

    now: float
    cur_r: int
    cur_f: int
    ready: int
    needed: float
    input_rate: float
    rebalancing: bool
    capped: bool  # the recommendation is capped by a bottleneck: the lanes above it are useless
    summary: str


@dataclass
class _Choice:
    """A chosen size, the rule that fired and why; ``sized_for``: the needed rate the size answers
    (None: the current need)."""

    replicas: int
    factor: int
    rule: str
    reason: str
    sized_for: float | None = None


def _summary(rec: Recommendation, inputs: Mapping[str, Any]) -> str:
    summary = (
        f"need {rec.needed_rate:.1f} rec/s = {rec.lanes_needed} lanes at "
        f"{inputs['lane_rate']} rec/s/lane ({inputs['lane_rate_source']}); backlog {inputs['backlog']}"
    )
    if "capped_by_bottleneck" in inputs:
        summary += (
            f"; capped at {inputs['capped_by_bottleneck']}: the last scale-up did not raise the "
            "processing rate (bottleneck)"
        )
    return summary


def _pods_note(c: _Context, replicas: int, factor: int, rec: Recommendation) -> str:
    if factor < rec.factor and replicas > c.ready:
        return f"; factor {factor} until the new pods are ready ({c.ready} of {replicas}), then {rec.factor}"
    return ""
