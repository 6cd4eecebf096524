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

from typing import Any

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
from multilane.operator.decision.damping import DampingRules, PolicyState, ScaleUpRecord, prune_history
from multilane.operator.decision.policy_model import (
    RULES,
    Decision,
    Observation,
    PolicyConfig,
    validate_observation,
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


class AutoscalePolicy:
    """Decides replicas x factor from one observation and the remembered state. Pure."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self.rules = DampingRules(config)

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
        self.rules.judge_scale_up(obs, st, has_backlog, cur_lanes, warnings)
        if st.bottleneck is not None:
            rec = self.rules.cap_by_bottleneck(
                st, rec, obs.input_rate, now, obs.processing_rate, warnings, inputs
            )
        # 4.
        st.history = prune_history(st.history, now, max(cfg.scale_down_delay_s, cfg.stabilisation_s))
        st.history.append((now, rec.replicas, rec.factor, needed))
        # 5.
        choice = self.rules.choose(obs, st, rec, needed, has_backlog, shortfall, draining, ready, inputs)
        new_r, new_f = choice.replicas, choice.factor
        # 6.
        if (new_r, new_f) != (cur_r, cur_f):
            st.last_change_time = now
            st.sized_need = choice.sized_for if choice.sized_for is not None else needed
            if cfg.partitions * new_f > cur_lanes or new_r > cur_r:
                p = st.pending_scale_up
                if choice.rule == "factor-follows" and p is not None:
                    # the same scale-up, completed as its pods became ready (and re-sized when the
                    # demand grew beyond it but its pods carry it)
                    p.lanes_after = cfg.partitions * new_f
                    if choice.resized_input is not None:
                        p.sized_for = choice.resized_input
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
