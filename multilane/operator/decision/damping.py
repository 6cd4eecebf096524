"""The damping rules of the autoscaling policy (what they remember is in
:mod:`multilane.operator.decision.policy_state`, re-exported here): the rules that turn a
recommendation into the size to run (:class:`DampingRules`: scale up at once or after the window, let
the factor follow new pods, settle, probe a bottleneck, scale down after the delay and beyond the
tolerance, or hold). Pure: no I/O. The module docstring of :mod:`multilane.operator.decision.policy` describes
the rules; :mod:`multilane.operator.decision.explain` words them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from multilane.operator.decision.capacity import Recommendation, factor_for_pods
from multilane.operator.decision.explain import pods_note
from multilane.operator.decision.policy_model import Observation, PolicyConfig
from multilane.operator.decision.policy_state import PolicyState, ScaleUpRecord, prune_history

__all__ = [
    "BottleneckCap",
    "Choice",
    "DampingContext",
    "DampingRules",
    "PolicyState",
    "ScaleUpRecord",
    "prune_history",
]


@dataclass(frozen=True)
class BottleneckCap:
    """What :meth:`DampingRules.cap_by_bottleneck` found: the recommendation to go on with and why."""

    recommendation: Recommendation
    warning: str
    capped_by: str | None = None
    """``"RxF"`` when the cap lowered the recommendation."""
    lifted: str | None = None
    """Why the cap did not apply (the input is new demand), else None."""


@dataclass(frozen=True)
class DampingContext:
    """What :meth:`DampingRules.choose` decides from (sizes within bounds)."""

    now: float
    current_replicas: int
    current_factor: int
    ready: int
    needed: float
    input_rate: float
    rebalancing: bool
    shortfall: bool
    draining: bool
    capped: bool
    """The recommendation is capped by a bottleneck: the lanes above it are useless."""
    summary: str
    processing_rate: float = 0.0
    onset_input: float = 0.0
    """The input of the last interval: the rate the group ran at plus the lag's slope (0: unknown;
    ``AutoscalePolicy._size``)."""
    cpu_bound: bool = False
    """The pods' CPU is at or above ``target_cpu_utilisation``: more lanes do not help, pods do."""
    sizing_input: float = 0.0
    """The input the need was sized for (the windowed input, or the last interval's at an onset)."""
    measured_shortfall: bool = False
    """A shortfall that both signals show: the lag rising above a second of input (and 100
    records) and the input above the processing rate by ``shortfall_input_ratio``."""


@dataclass
class Choice:
    """A chosen size, the rule that fired and why; ``sized_for``: the needed rate the size answers
    (None: the current need)."""

    replicas: int
    factor: int
    rule: str
    reason: str
    sized_for: float | None = None
    resized_input: float | None = None
    """Only on a ``factor-follows``: the input rate the pending scale-up is sized for from now on
    (None: unchanged). Applied by the caller (step 8 of ``decide``)."""
    ends_pattern: bool = False
    """Only on a ``scale-down`` of a periodic load: the need stayed low for twice the delay, so the
    load is no longer taken as periodic. Applied by the caller (step 8)."""


DEMAND_MET_SLACK = 0.05
"""A scale-up met the demand when, without a backlog, the processing rate is within this share of
the input rate (the rates are windowed means: they never match exactly)."""
FOLLOW_MIN_GAIN = 0.05
"""A further ``factor-follows`` step needs the processing rate this share above the last step's."""


class DampingRules:
    """Steps 4, 5 and 7 of :meth:`multilane.operator.decision.policy.AutoscalePolicy.decide` (pure).

    Each rule returns what it found; the only thing written is the caller's own copy of the
    :class:`PolicyState` (the bottleneck fields and the pending scale-up, in :meth:`judge_scale_up`).
    """

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    def cap_by_bottleneck(
        self,
        state: PolicyState,
        rec: Recommendation,
        input_rate: float,
        now: float,
        processing_rate: float,
    ) -> BottleneckCap:
        """Step 5: cap the recommendation at the last effective size while a bottleneck holds and the
        input stays within ``shortfall_margin`` of what the ineffective scale-up was sized for."""
        cfg = self.config
        bottleneck = state.bottleneck
        assert bottleneck is not None
        warning = (
            f"scale-up {now - bottleneck.time:.0f}s ago from {bottleneck.lanes_before} to "
            f"{bottleneck.lanes_after} lanes ({bottleneck.replicas_before}->{bottleneck.replicas_after} "
            f"replicas) did not raise the processing rate (before {bottleneck.rate_before:.1f} rec/s, "
            f"now {processing_rate:.1f} rec/s): a bottleneck outside the consumer (downstream, CPU or a "
            "hot key?)"
        )
        if bottleneck.beyond(input_rate, cfg.shortfall_margin):
            lifted = (
                f"input {input_rate:.1f} rec/s is beyond the {bottleneck.sized_for or 0.0:.1f} rec/s the "
                "ineffective scale-up was sized for"
            )
            return BottleneckCap(rec, warning, lifted=lifted)
        cap_factor = max(cfg.min_factor, -(-bottleneck.lanes_before // cfg.partitions))
        cap_replicas = max(cfg.replica_floor, bottleneck.replicas_before)
        if state.bottleneck_hold_until is not None and now >= state.bottleneck_hold_until:
            # the hold is over: one probe, at most twice the last effective size
            cap_factor = min(2 * cap_factor, cfg.max_factor)
            cap_replicas = min(2 * cap_replicas, cfg.replica_ceiling)
        if rec.factor > cap_factor or rec.replicas > cap_replicas:
            capped = replace(
                rec, replicas=min(rec.replicas, cap_replicas), factor=min(rec.factor, cap_factor)
            )
            return BottleneckCap(capped, warning, capped_by=f"{cap_replicas}x{cap_factor}")
        return BottleneckCap(rec, warning)

    def judge_scale_up(
        self,
        obs: Observation,
        state: PolicyState,
        has_backlog: bool,
        current_lanes: int,
        shortfall: bool = False,
    ) -> str | None:
        """Step 4: judge the pending scale-up once settled; clear a bottleneck that no longer holds.

        Returns the verdict as a note (``None`` when nothing was judged)."""
        cfg = self.config
        now = float(obs.now)
        note: str | None = None
        bottleneck = state.bottleneck
        if bottleneck is not None:
            # 1. the ceiling lifted (the downstream recovered, say): forget the bottleneck. The
            #    reference is the limit measured when it was found, not the rate before the
            #    ineffective scale-up (an input growing up to the limit is no recovery)
            ceiling = state.bottleneck_ceiling or bottleneck.rate_before
            risen = obs.processing_rate > max(ceiling, bottleneck.rate_before) * (
                1.0 + max(cfg.min_scale_up_gain * bottleneck.expected_gain(), 0.05)
            )
            if risen:
                state.bottleneck, state.bottleneck_hold_until, state.bottleneck_strikes = None, None, 0
                state.bottleneck_ceiling = None
                note = "judged: the bottleneck lifted (the processing rate rose)"
        pending = state.pending_scale_up
        if pending is None or now - pending.time < cfg.settle_s or obs.rebalancing:
            return note
        state.pending_scale_up = None
        if current_lanes < pending.lanes_after and obs.replicas < pending.replicas_after:
            return note  # the scale-up was reverted: nothing to judge
        # 2. judge the settled scale-up (a probe after a hold included), whatever the backlog: the
        #    demand met (the processing keeps up with the input, no backlog, no shortfall) is a
        #    success; else the
        #    processing rate must have risen by its share of the expected gain
        gain = obs.processing_rate / pending.rate_before - 1.0 if pending.rate_before > 0 else math.inf
        expected = pending.expected_gain()
        met = (
            not has_backlog
            and not shortfall
            and obs.processing_rate >= obs.input_rate * (1.0 - DEMAND_MET_SLACK)
        )
        if not met and expected > 0 and gain < cfg.min_scale_up_gain * expected:
            if state.bottleneck is None:
                state.bottleneck, state.bottleneck_strikes = pending, 0
                state.bottleneck_ceiling = obs.processing_rate
            else:
                # a further attempt failed too: its demand is now what the bottleneck was seen at
                # (a demand beyond it lifts the cap again, not the demand of the first attempt)
                state.bottleneck_strikes += 1
                if pending.sized_for is not None:
                    state.bottleneck.sized_for = max(state.bottleneck.sized_for or 0.0, pending.sized_for)
            state.bottleneck_hold_until = now + cfg.bottleneck_retry_s * 2**state.bottleneck_strikes
            return f"judged: ineffective (gain {gain:.2f} of {expected:.2f} expected)"
        if state.bottleneck is not None:
            state.bottleneck, state.bottleneck_hold_until, state.bottleneck_strikes = None, None, 0
            state.bottleneck_ceiling = None
        return f"judged: effective (gain {gain:.2f} of {expected:.2f} expected)"

    def choose(
        self, obs: Observation, state: PolicyState, rec: Recommendation, ctx: DampingContext
    ) -> Choice:
        """Step 7: bounds first (a size outside the, possibly edited, bounds is corrected at once and
        the rest of the step starts from the corrected size; ``ctx`` holds the corrected size), then
        up, follow, down or hold."""
        r, f = ctx.current_replicas, ctx.current_factor
        if ctx.capped and rec.factor < f:
            # a factor raised without a gain is reverted at once: the lanes above the last
            # effective size wait on the bottleneck (downstream or CPU) and only add load to it
            choice = Choice(
                r,
                rec.factor,
                "reverted",
                f"factor {f} -> {rec.factor}: the lanes above the last effective size did not raise "
                "the processing rate",
            )
            choice.reason += f"; {ctx.summary}"
            return choice
        if ctx.measured_shortfall and not ctx.capped and rec.factor <= f and rec.replicas <= r:
            # a measured shortfall never ends in a hold: one step sized from the last interval
            rec = self._shortfall_step(ctx, rec)
        if rec.factor > f or rec.replicas > r:
            choice = self._up(ctx, state, rec)
        elif rec.factor < f or rec.replicas < r:
            choice = self._down(ctx, state, rec)
        else:
            choice = Choice(r, f, "at-recommendation", f"hold {r}x{f}: at the recommendation")
        choice.reason += f"; {ctx.summary}"
        if (r, f) != (obs.replicas, obs.factor):
            choice.reason = f"clamp {obs.replicas}x{obs.factor} into bounds -> {r}x{f}; " + choice.reason
        return choice

    def _shortfall_step(self, c: DampingContext, rec: Recommendation) -> Recommendation:
        """The lag rises measurably but the recommendation is the current size: grow by the
        shortfall's share, ``onset_input / processing_rate`` (at least one step), in pods when the
        pods are CPU-bound or the factor is at its maximum, else in lanes."""
        cfg = self.config
        r, f = c.current_replicas, c.current_factor
        ratio = c.onset_input / c.processing_rate if c.processing_rate > 0 else 2.0
        ratio = min(max(ratio, 1.0), 2.0)
        if c.cpu_bound or f >= cfg.max_factor:
            return replace(rec, replicas=min(max(math.ceil(r * ratio), r + 1), cfg.replica_ceiling))
        return replace(rec, factor=min(max(math.ceil(f * ratio), f + 1), cfg.max_factor))

    def within_bounds(self, replicas: int, factor: int) -> tuple[int, int]:
        """``replicas`` x ``factor`` clamped into the configured bounds."""
        cfg = self.config
        return (
            min(max(replicas, cfg.replica_floor), cfg.replica_ceiling),
            min(max(factor, cfg.min_factor), cfg.max_factor),
        )

    def _up(self, c: DampingContext, state: PolicyState, rec: Recommendation) -> Choice:
        """A scale-up is recommended: settle, follow, at once, after the window, or hold."""
        cfg = self.config
        cur_r, cur_f = c.current_replicas, c.current_factor
        pending = state.pending_scale_up
        age = c.now - pending.time if pending is not None else math.inf
        settling = pending is not None and (
            age < cfg.settle_s or (c.rebalancing and age < cfg.bottleneck_retry_s)
        )
        if settling and pending is not None and not pending.beyond(c.input_rate, cfg.shortfall_margin):
            # the pending scale-up covers this demand: its factor follows its pods, nothing more;
            # while the lag still rises, up to the current need (the factor is the cheap answer;
            # part of the two-speed policy: not with factor_first off)
            target = min(rec.factor, max(pending.factor_target, cur_f))
            if c.shortfall and cfg.factor_first:
                target = max(target, rec.factor)
            # never beyond the lane budget of the pods that run now (more pods wait for the settle)
            f = factor_for_pods(cfg, min(c.ready, cur_r), target, cur_f) if cfg.factor_first else target
            if f > cur_f and not self._follow_gained(c, pending):
                reference = pending.follow_rate if pending.follow_rate is not None else pending.rate_before
                return Choice(
                    cur_r,
                    cur_f,
                    "settling",
                    f"hold {cur_r}x{cur_f}: the last factor step of the scale-up {age:.0f}s ago did not "
                    f"raise the processing rate ({reference:.1f} -> {c.processing_rate:.1f} rec/s): no "
                    "further step",
                )
            if f > cur_f:
                return Choice(
                    cur_r,
                    f,
                    "factor-follows",
                    f"factor {cur_f} -> {f}: {c.ready} of {cur_r} pods ready for the scale-up "
                    f"{age:.0f}s ago (target factor {pending.factor_target})",
                )
            return Choice(
                cur_r,
                cur_f,
                "settling",
                f"hold {cur_r}x{cur_f}: scale-up to {rec.replicas}x{rec.factor} waits until the "
                f"scale-up {age:.0f}s ago (sized for {pending.sized_for or 0.0:.1f} rec/s) has settled "
                f"({cfg.settle_s:.0f}s, rollout {'in progress' if c.rebalancing else 'done'})",
            )
        if settling and pending is not None and c.shortfall and self._pods_carry(c, pending, rec):
            # demand grew beyond what the pending scale-up was sized for, but the pods it added
            # carry it: the factor follows them (in place, the same scale-up), now sized for it
            f = factor_for_pods(cfg, min(c.ready, cur_r), max(rec.factor, cur_f), cur_f)
            if f > cur_f and self._follow_gained(c, pending):
                why = (
                    f"factor {cur_f} -> {f}: input {c.input_rate:.1f} rec/s grew beyond the "
                    f"{pending.sized_for or 0.0:.1f} rec/s the scale-up {age:.0f}s ago was sized for, and "
                    f"its {c.ready} of {cur_r} pods carry it"
                )
                return Choice(
                    cur_r, f, "factor-follows", why, resized_input=max(c.input_rate, c.sizing_input)
                )
        if c.shortfall:
            r = max(rec.replicas, cur_r)
            f = self._factor_now(c, r, max(rec.factor, cur_f))
            if settling and pending is not None:
                rule = "beyond-pending"
                why = (
                    f"input {c.input_rate:.1f} rec/s is more than {cfg.shortfall_margin:.0%} above the "
                    f"{pending.sized_for or 0.0:.1f} rec/s the scale-up {age:.0f}s ago was sized for"
                )
            else:
                rule, why = "shortfall", "lag is rising"
            return Choice(
                r,
                f,
                rule,
                f"scale up {cur_r}x{cur_f} -> {r}x{f}: {why}" + pods_note(c.ready, r, f, rec.factor),
            )
        # The history holds at least this observation; right after a (re)start it is short and
        # the window is whatever has been seen (as in the HPA).
        window = [h for h in state.history if h[0] >= c.now - cfg.stabilisation_s]
        low_r = min(h[1] for h in window)
        low_f = min(h[2] for h in window)
        if low_f > cur_f or low_r > cur_r:
            span = c.now - window[0][0]
            seen = (
                f"recommended throughout the {cfg.stabilisation_s:.0f}s stabilisation window"
                if span >= cfg.stabilisation_s
                else f"recommended by every observation so far ({len(window)} in {span:.0f}s)"
            )
            r = max(low_r, cur_r)
            f = self._factor_now(c, r, max(low_f, cur_f))
            return Choice(
                r,
                f,
                "stabilised",
                f"scale up {cur_r}x{cur_f} -> {r}x{f}: {seen}" + pods_note(c.ready, r, f, rec.factor),
                sized_for=min(h[3] for h in window),  # the need the window's lowest answers
            )
        return Choice(
            cur_r,
            cur_f,
            "stabilising",
            f"hold {cur_r}x{cur_f}: scale-up to {rec.replicas}x{rec.factor} waits for the "
            f"{cfg.stabilisation_s:.0f}s stabilisation window",
        )

    def _follow_gained(self, c: DampingContext, pending: ScaleUpRecord) -> bool:
        """Each ``factor-follows`` step needs a measured gain from the step before (the first one
        follows the pods the scale-up added; without new pods it needs a gain over the rate before
        the scale-up)."""
        if c.current_factor * self.config.partitions < pending.lanes_after:
            return True  # the step before is not in effect (not applied yet): nothing to measure
        reference = pending.follow_rate
        if reference is None and pending.replicas_after <= pending.replicas_before:
            reference = pending.rate_before  # a factor-only scale-up: no pods to follow
        if reference is None:
            return True
        return c.processing_rate > reference * (1.0 + FOLLOW_MIN_GAIN)

    def _pods_carry(self, c: DampingContext, pending: ScaleUpRecord, rec: Recommendation) -> bool:
        """The pending scale-up added pods, all of them are ready, and the recommendation needs no
        more: a higher factor on them answers the demand (two-speed policy only)."""
        return (
            self.config.factor_first
            and pending.replicas_after > pending.replicas_before
            and c.current_replicas == pending.replicas_after
            and c.ready >= c.current_replicas
            and rec.replicas <= c.current_replicas
        )

    def _factor_now(self, c: DampingContext, replicas: int, wanted: int) -> int:
        """The factor to run now: ``wanted``, or what the ready pods carry while more are coming."""
        if replicas > c.ready and self.config.factor_first:
            return factor_for_pods(self.config, c.ready, wanted, c.current_factor)
        return wanted

    def _down(self, c: DampingContext, state: PolicyState, rec: Recommendation) -> Choice:
        """A smaller size is recommended: delay, tolerance and window max decide.

        The window is the scale-down delay, or for a periodic load (``state.recurring_since``: it
        came back within twice the delay after the last trough) twice the delay: the size keeps the
        floor of the last cycle and never scales down into the next trough. A scale-down whose long
        window is no higher than the short one ends the pattern (the load stayed low)."""
        cfg = self.config
        cur_r, cur_f = c.current_replicas, c.current_factor
        hold = f"hold {cur_r}x{cur_f}: scale-down to {rec.replicas}x{rec.factor}"
        if c.draining:
            return Choice(
                cur_r, cur_f, "draining", f"{hold} waits: no scale-down while a backlog is draining"
            )
        delay = cfg.scale_down_delay_s
        since_change = c.now - state.last_change_time if state.last_change_time is not None else 0.0
        covered = bool(state.history) and state.history[0][0] <= c.now - delay
        if since_change < delay or not covered:
            return Choice(cur_r, cur_f, "scale-down-delay", f"{hold} waits for the {delay:.0f}s delay")
        short = _window_max(state.history, c.now - delay)
        periodic = state.recurring_since is not None
        if periodic:
            long_covered = state.history[0][0] <= c.now - 2.0 * delay
            high = _window_max(state.history, c.now - 2.0 * delay)
            if not long_covered or (min(cur_r, high[0]), min(cur_f, high[1])) == (cur_r, cur_f):
                return Choice(
                    cur_r,
                    cur_f,
                    "periodic",
                    f"{hold} waits: the load came back within {2 * delay:.0f}s of the last trough "
                    f"(periodic): the size keeps the floor of the last {2 * delay:.0f}s",
                )
        else:
            high = short
        high_r, high_f, high_need = high
        sized = state.sized_need
        tolerated = sized is not None and high_need >= (1.0 - cfg.scale_down_tolerance) * sized
        if tolerated and not c.capped:
            return Choice(
                cur_r,
                cur_f,
                "within-tolerance",
                f"{hold} waits: the highest need of the last {delay:.0f}s, "
                f"{high_need:.1f} rec/s, is within {cfg.scale_down_tolerance:.0%} of the {sized:.1f} rec/s "
                f"the size was chosen for",
            )
        r, f = min(cur_r, high_r), min(cur_f, high_f)
        if (r, f) == (cur_r, cur_f):
            return Choice(
                cur_r,
                cur_f,
                "recently-higher",
                f"hold {cur_r}x{cur_f}: a higher size was recommended within the last {delay:.0f}s",
            )
        span = 2 * delay if periodic else delay
        return Choice(
            r,
            f,
            "scale-down",
            f"scale down {cur_r}x{cur_f} -> {r}x{f}: highest recommendation of the last {span:.0f}s"
            + (" (periodic load)" if periodic else ""),
            sized_for=high_need,
            ends_pattern=periodic and high[:2] == short[:2],
        )


def _window_max(history: list[tuple[float, int, int, float]], since: float) -> tuple[int, int, float]:
    """The highest replicas, factor and needed rate recommended at or after ``since``."""
    window = [h for h in history if h[0] >= since] or history[-1:]
    return max(h[1] for h in window), max(h[2] for h in window), max(h[3] for h in window)
