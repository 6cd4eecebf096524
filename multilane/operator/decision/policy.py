"""The autoscaling policy: how many replicas (pods) and lanes per partition (the factor) to run.

Pure: no I/O. The operator calls :meth:`AutoscalePolicy.decide` once per scaling interval with an
:class:`Observation` built from lag and rate metrics, and stores the returned :class:`PolicyState`
(JSON via ``to_dict``/``from_dict``) for the next call. The simulator (``multilane.sim``) calls the
same method unchanged.

Its parts: the contract types in :mod:`multilane.operator.decision.policy_model`, the capacity model (needed
rate, lane rate, replicas x factor that cover it) in :mod:`multilane.operator.decision.capacity`, the damping
state machine in :mod:`multilane.operator.decision.damping` and the words of a decision in
:mod:`multilane.operator.decision.explain`; :class:`AutoscalePolicy` composes them. The policy has two speeds:

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

from dataclasses import dataclass

from multilane.operator.decision.capacity import (
    MIN_LANE_RATE,
    LaneRateEstimate,
    Recommendation,
    backlog_threshold,
    estimate_lane_rate,
    estimate_pod_rate,
    hottest_partition_need,
    needed_capacity,
    recommend,
    replicas_for,
)
from multilane.operator.decision.damping import (
    Choice,
    DampingContext,
    DampingRules,
    PolicyState,
    ScaleUpRecord,
    prune_history,
)
from multilane.operator.decision.explain import summary
from multilane.operator.decision.policy_model import (
    RULES,
    Decision,
    DecisionTrace,
    Observation,
    PolicyConfig,
    validate_observation,
)

__all__ = [
    "MIN_LANE_RATE",
    "RULES",
    "AutoscalePolicy",
    "Decision",
    "DecisionTrace",
    "LaneRateEstimate",
    "Observation",
    "PolicyConfig",
    "PolicyState",
    "Recommendation",
    "ScaleUpRecord",
    "Signals",
    "backlog_threshold",
    "estimate_lane_rate",
    "estimate_pod_rate",
    "hottest_partition_need",
    "needed_capacity",
    "recommend",
    "replicas_for",
]


@dataclass(frozen=True)
class Signals:
    """What one observation says about the lag, against the previous one (step 2 of ``decide``)."""

    backlog: int
    """Total lag (records)."""
    threshold: float
    """The lag above which it is a backlog (:func:`backlog_threshold`)."""
    has_backlog: bool
    lag_rising: bool
    draining: bool
    """A backlog that fell since the last observation."""
    shortfall: bool
    """The lag rises and is more than a blip, or the input clearly exceeds the processing rate."""

    @classmethod
    def read(cls, obs: Observation, config: PolicyConfig, last_lag: int | None) -> Signals:
        backlog = int(sum(obs.lag_by_partition.values()))
        threshold = backlog_threshold(config, obs.input_rate)
        has_backlog = backlog > threshold
        lag_rising = last_lag is not None and backlog > last_lag
        shortfall = lag_rising and (
            backlog > max(100.0, obs.input_rate * config.rising_lag_threshold_s)
            or obs.input_rate > obs.processing_rate * config.shortfall_input_ratio
        )
        draining = has_backlog and last_lag is not None and backlog < last_lag
        return cls(backlog, threshold, has_backlog, lag_rising, draining, shortfall)


@dataclass(frozen=True)
class Sizing:
    """The capacity model's answer for one observation (step 3 of ``decide``)."""

    lane_rate: LaneRateEstimate
    pod_rate: float | None
    needed: float
    """Records/s the group must be able to process."""
    hottest: float
    """Records/s the busiest partition alone needs."""
    recommendation: Recommendation
    warnings: tuple[str, ...]
    onset_input: float = 0.0
    """The input of the last interval, the rate the group ran at plus the lag's slope (0: not
    measured)."""
    sizing_input: float = 0.0
    """The input the need was sized for: the windowed input, or with a confirmed shortfall the larger
    of it and ``onset_input`` (not a window that straddles the onset)."""


class AutoscalePolicy:
    """Decides replicas x factor from one observation and the remembered state. Pure."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self.rules = DampingRules(config)

    def decide(self, obs: Observation, state: PolicyState) -> tuple[Decision, PolicyState]:
        """One scaling step.

        1. Validate the observation; on a problem hold the last decision.
        2. Read the lag signals against the last observation (:class:`Signals`).
        3. Size: lane rate, needed capacity, the recommendation (:meth:`_size`).
        4. Judge a pending scale-up (settled, rollout over: did the rate rise?); set or clear the
           bottleneck (:meth:`DampingRules.judge_scale_up`).
        5. While a bottleneck holds and the need stays within ``shortfall_margin`` of what the
           ineffective scale-up was sized for, cap the recommendation at the size before it.
        6. Record the recommendation (and the needed rate) in the history window.
        7. Choose (:meth:`DampingRules.choose`): scale up (a shortfall at once, the factor first;
           without lag evidence after a full stabilisation window; not while a scale-up settles unless
           the need is clearly beyond it), let the factor follow new pods, scale down (delay passed,
           window covered, not draining, beyond the tolerance, to the window max), or hold.
        8. Remember: the change, the pending scale-up, the estimates (:meth:`_remember`).
        9. Return the decision with its :class:`DecisionTrace`, naming the rule that fired.
        """
        cfg = self.config
        state = PolicyState.from_dict(state.to_dict())  # never mutate the caller's state
        # 1.
        problems = validate_observation(obs, cfg)
        if problems:
            return self._hold_invalid(obs, state, problems)
        now = float(obs.now)
        current_lanes = cfg.partitions * obs.factor
        # 2.
        signals = Signals.read(obs, cfg, state.last_lag)
        # 3.
        sizing = self._size(obs, state, signals)
        # 4.
        verdict = self.rules.judge_scale_up(obs, state, signals.has_backlog, current_lanes, signals.shortfall)
        # 5.
        rec = sizing.recommendation
        bottleneck = None
        if state.bottleneck is not None:
            bottleneck = self.rules.cap_by_bottleneck(state, rec, obs.input_rate, now, obs.processing_rate)
            rec = bottleneck.recommendation
        # 6.
        horizon = max(2.0 * cfg.scale_down_delay_s, cfg.stabilisation_s)
        state.history = prune_history(state.history, now, horizon)
        state.history.append((now, rec.replicas, rec.factor, sizing.needed))
        # 7.
        ready = obs.replicas if obs.ready_replicas is None else obs.ready_replicas
        capped_by = bottleneck.capped_by if bottleneck is not None else None
        replicas, factor = self.rules.within_bounds(obs.replicas, obs.factor)
        ctx = DampingContext(
            now=now,
            current_replicas=replicas,
            current_factor=factor,
            ready=ready,
            needed=sizing.needed,
            input_rate=obs.input_rate,
            rebalancing=obs.rebalancing,
            shortfall=signals.shortfall,
            measured_shortfall=signals.shortfall
            and signals.backlog > max(100.0, obs.input_rate * cfg.rising_lag_threshold_s)
            and obs.input_rate > obs.processing_rate * cfg.shortfall_input_ratio,
            draining=signals.draining,
            capped=capped_by is not None,
            processing_rate=obs.processing_rate,
            onset_input=sizing.onset_input,
            sizing_input=sizing.sizing_input,
            cpu_bound=obs.cpu_utilisation is not None and obs.cpu_utilisation >= cfg.target_cpu_utilisation,
            summary=summary(
                rec.needed_rate,
                rec.lanes_needed,
                sizing.lane_rate.rate,
                sizing.lane_rate.source,
                signals.backlog,
                capped_by,
            ),
        )
        choice = self.rules.choose(obs, state, rec, ctx)
        # 8.
        self._remember(obs, state, choice, rec, sizing, signals.backlog)
        # 9.
        trace = DecisionTrace(
            backlog=signals.backlog,
            backlog_threshold=signals.threshold,
            input_rate=obs.input_rate,
            processing_rate=obs.processing_rate,
            busy_lanes=obs.busy_lanes,
            lane_rate=sizing.lane_rate.rate,
            lane_rate_source=sizing.lane_rate.source,
            cpu_utilisation=obs.cpu_utilisation,
            pod_rate=sizing.pod_rate,
            needed_rate=sizing.needed,
            hottest_partition_rate=sizing.hottest,
            lanes_needed=rec.lanes_needed,
            recommended_replicas=rec.replicas,
            recommended_factor=rec.factor,
            current_replicas=obs.replicas,
            current_factor=obs.factor,
            ready_replicas=ready,
            lag_rising=signals.lag_rising,
            shortfall=signals.shortfall,
            capped_by_bottleneck=capped_by,
            bottleneck_lifted=bottleneck.lifted if bottleneck is not None else None,
            notes=() if verdict is None else (verdict,),
            warnings=sizing.warnings + ((bottleneck.warning,) if bottleneck is not None else ()),
        )
        decision = Decision(
            replicas=choice.replicas,
            factor=choice.factor,
            reason=choice.reason,
            inputs=trace.as_inputs(),
            changed=(choice.replicas, choice.factor) != (obs.replicas, obs.factor),
            warnings=list(trace.warnings),
            rule=choice.rule,
            trace=trace,
        )
        return decision, state

    # -- steps -------------------------------------------------------------------------------

    def _size(self, obs: Observation, state: PolicyState, signals: Signals) -> Sizing:
        """Step 3: the lane rate, the needed capacity and the recommendation that covers it."""
        cfg = self.config
        lane_rate = estimate_lane_rate(obs, cfg, state.lane_rate)
        # The onset: the input of the last interval is the processing rate plus the lag's slope. It
        # sizes the need only with a shortfall that the windowed input confirms (input above the
        # processing rate): a glitch in the lag alone (end offsets under-reported, then caught up)
        # never turns into a wild scale.
        confirmed = signals.shortfall and obs.input_rate > obs.processing_rate
        # pod_rate first: the onset needs it (during a rollout the ready pods and the CPU window
        # disagree: keep the previous estimate)
        pod_rate = state.pod_rate if obs.rebalancing else estimate_pod_rate(obs, state.pod_rate)
        onset = 0.0
        if state.last_lag is not None and state.last_time is not None and obs.now > state.last_time:
            # a lag that rose from below the backlog threshold has risen, on average, for half the
            # interval (the onset fell somewhere in it): its slope over half the interval
            span = float(obs.now) - state.last_time
            if confirmed and state.last_lag <= signals.threshold:
                span /= 2.0
            slope = (signals.backlog - state.last_lag) / span
            onset = self._running_rate(obs, lane_rate.rate, pod_rate, confirmed) + max(slope, 0.0)
        sizing_input = max(obs.input_rate, onset) if confirmed else obs.input_rate
        needed = needed_capacity(cfg, sizing_input, signals.backlog)
        hottest = hottest_partition_need(cfg, obs) * sizing_input / max(obs.input_rate, MIN_LANE_RATE)
        cpu_needed = needed_capacity(cfg, sizing_input, signals.backlog, utilisation=1.0)
        rec = recommend(cfg, needed, lane_rate.rate, hottest, pod_rate, cpu_needed, obs.replicas)
        warnings = rec.warnings
        if lane_rate.source == "default":
            warnings += (f"no lane rate observed yet; assuming default_lane_rate={cfg.default_lane_rate}",)
        return Sizing(lane_rate, pod_rate, needed, hottest, rec, warnings, onset, sizing_input)

    def _running_rate(
        self, obs: Observation, lane_rate: float, pod_rate: float | None, confirmed: bool
    ) -> float:
        """The rate the group processed at in the last interval, for the onset.

        The windowed processing rate straddles the onset as the input does. With a confirmed
        shortfall the group ran at its capacity (the lag rose because the input exceeded it): the
        smaller of its lanes' capacity (``partitions x factor x lane rate``) and its ready pods' CPU
        capacity (``ready x pod_rate``), when that is known and above the windowed rate.
        """
        if not confirmed or pod_rate is None or pod_rate <= 0:
            return obs.processing_rate
        ready = obs.replicas if obs.ready_replicas is None else obs.ready_replicas
        capacity = min(self.config.partitions * obs.factor * lane_rate, ready * pod_rate)
        return max(obs.processing_rate, capacity)

    def _remember(
        self,
        obs: Observation,
        state: PolicyState,
        choice: Choice,
        rec: Recommendation,
        sizing: Sizing,
        backlog: int,
    ) -> None:
        """Step 8: what the next decision needs of this one (on the policy's own copy of the state)."""
        cfg = self.config
        now = float(obs.now)
        current_lanes = cfg.partitions * obs.factor
        if (choice.replicas, choice.factor) != (obs.replicas, obs.factor):
            state.last_change_time = now
            state.sized_need = choice.sized_for if choice.sized_for is not None else sizing.needed
            if cfg.partitions * choice.factor > current_lanes or choice.replicas > obs.replicas:
                pending = state.pending_scale_up
                if choice.rule == "factor-follows" and pending is not None:
                    # the same scale-up, completed as its pods became ready (and re-sized when the
                    # demand grew beyond it but its pods carry it); the next step needs a gain
                    pending.lanes_after = cfg.partitions * choice.factor
                    pending.follow_rate = obs.processing_rate
                    if choice.resized_input is not None:
                        pending.sized_for = choice.resized_input
                else:
                    # 8b. a scale-up not yet judged is never overwritten: a further step keeps its
                    #     "before" (the last judged size and rate), so the whole is judged at once
                    before = pending
                    state.pending_scale_up = ScaleUpRecord(
                        time=now,
                        rate_before=obs.processing_rate if before is None else before.rate_before,
                        lanes_before=current_lanes if before is None else before.lanes_before,
                        lanes_after=cfg.partitions * choice.factor,
                        replicas_before=obs.replicas if before is None else before.replicas_before,
                        replicas_after=choice.replicas,
                        sized_for=sizing.sizing_input,
                        factor_target=rec.factor,
                    )
            else:
                state.pending_scale_up = None
                if choice.rule == "scale-down":
                    state.last_scale_down_time = now
                    state.last_scale_down_need = choice.sized_for
                    if choice.ends_pattern:
                        state.recurring_since = None  # the need stayed low for the periodic window
        elif state.last_change_time is None:
            state.last_change_time = now
        # 8a. the periodic rule: the need came back (above the trough's by more than the shortfall
        #     margin) within twice the scale-down delay after the last scale-down
        trough_at, trough_need = state.last_scale_down_time, state.last_scale_down_need
        if (
            trough_at is not None
            and trough_need is not None
            and now - trough_at <= 2.0 * cfg.scale_down_delay_s
            and sizing.needed > trough_need * (1.0 + cfg.shortfall_margin)
        ):
            state.recurring_since = now
        if sizing.lane_rate.source in ("observed", "saturated", "limited"):
            state.lane_rate = sizing.lane_rate.rate
        state.pod_rate = sizing.pod_rate
        state.last_lag = backlog
        state.last_time = now
        state.last_replicas, state.last_factor = choice.replicas, choice.factor

    def _hold_invalid(
        self, obs: Observation, state: PolicyState, problems: list[str]
    ) -> tuple[Decision, PolicyState]:
        """Step 1's exit: hold the last decision (or the current size within bounds)."""
        if state.last_replicas is not None and state.last_factor is not None:
            r, f, what = state.last_replicas, state.last_factor, "the last decision"
        else:
            r, f = self.rules.within_bounds(obs.replicas, obs.factor)
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
        return decision, state
