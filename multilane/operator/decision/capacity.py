"""The capacity model of the autoscaling policy: how much work there is and what a lane, a pod and a
size (replicas x factor) can do. Pure: no I/O, no state; :mod:`multilane.operator.decision.policy` adds the
damping (history, settle, bottleneck probes) on top, and the simulator uses both unchanged.

- needed capacity (rec/s) = ``input_rate / target_utilisation + backlog / target_catchup_s``; when
  ``max_lag`` is set and the backlog exceeds it, at least ``input_rate + (backlog - max_lag) /
  max_lag_catchup_s`` (:func:`needed_capacity`);
- ``r`` = records/s of one busy lane (:func:`estimate_lane_rate`);
- lanes ``L = ceil(needed / r)``, ``F = clamp(ceil(L / partitions), min_factor, max_factor)``, raised
  for the busiest partition's own need; ``R`` from the per-pod lane budget and, when the pods' CPU is
  observed, from the busiest pod's CPU: ``ceil(partitions / R)`` partitions (:func:`recommend`);
- the factor the pods running *now* can carry within their lane budget (:func:`factor_for_pods`):
  the policy's first speed, while new pods start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multilane.operator.decision.policy_model import Observation, PolicyConfig

__all__ = [
    "MIN_LANE_RATE",
    "LaneRateEstimate",
    "Recommendation",
    "backlog_threshold",
    "estimate_lane_rate",
    "estimate_pod_rate",
    "factor_for_pods",
    "hottest_partition_need",
    "needed_capacity",
    "recommend",
    "replicas_for",
    "replicas_for_cpu",
]


@dataclass(frozen=True)
class LaneRateEstimate:
    """The records/s one lane completes, and where the number came from."""

    rate: float
    """> 0."""
    source: str
    """``observed`` (rate / busy lanes), ``saturated`` (rate / all lanes while a backlog stands),
    ``cpu-bound`` (the last estimate, kept while the pods' CPU is saturated), ``limited`` (half the
    last estimate: the measured rate fell faster than that), ``previous`` (last estimate) or
    ``default`` (configured; nothing observed yet)."""


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


CPU_SATURATED = 0.9
"""Mean CPU utilisation of the pods at or above which a lane-rate measurement shows the CPU's limit."""

MAX_LANE_RATE_DROP = 0.5
"""A new lane-rate estimate is at least this share of the previous one."""

MIN_LANE_RATE = 1e-6
"""Records/s; lane-rate estimates below this are treated as "not observed" (they would explode L)."""


def backlog_threshold(config: PolicyConfig, input_rate: float) -> float:
    """The lag (records) above which the lag counts as a backlog, not as records in flight."""
    return max(100.0, input_rate * config.backlog_threshold_s)


def estimate_lane_rate(obs: Observation, config: PolicyConfig, previous: float | None) -> LaneRateEstimate:
    """Records/s one lane completes (the key input of the policy).

    0. While the pods' CPU is saturated (at or above :data:`CPU_SATURATED`), the previous estimate:
       lanes then wait for the CPU, not for their records, and a rate per busy lane measured there
       is the CPU's limit spread over the lanes (a lane counts as useful only up to the CPU's
       measured limit; more lanes would not help, pods do).
    1. ``processing_rate / busy_lanes`` when busy lanes are reported (>= 0.5 lane busy on average)
       and records were processed: the service rate of a busy lane, independent of the load.
    2. Else, while a backlog stands, every lane is busy: ``processing_rate / (partitions x factor)``.

    In 1 and 2 the estimate falls by at most :data:`MAX_LANE_RATE_DROP` per decision (source
    ``limited``): a sudden collapse of the rate per busy lane is lanes waiting on a limit that more
    lanes do not raise (the CPU before its windowed mean shows it, a saturated downstream); a real
    slowdown still shows within a few decisions.
    3. Else the previous estimate, else ``config.default_lane_rate``.

    Estimates below :data:`MIN_LANE_RATE` are discarded at each step.
    """
    lanes = config.partitions * max(obs.factor, 1)
    backlog = sum(obs.lag_by_partition.values())
    # 0.
    cpu_bound = obs.cpu_utilisation is not None and obs.cpu_utilisation >= CPU_SATURATED
    if cpu_bound and previous is not None and previous >= MIN_LANE_RATE:
        return LaneRateEstimate(previous, "cpu-bound")
    floor = previous * MAX_LANE_RATE_DROP if previous is not None else 0.0
    # 1.
    if obs.busy_lanes is not None and obs.busy_lanes >= 0.5:
        rate = obs.processing_rate / obs.busy_lanes
        if rate >= MIN_LANE_RATE:
            return LaneRateEstimate(rate, "observed") if rate >= floor else LaneRateEstimate(floor, "limited")
    # 2.
    if backlog > backlog_threshold(config, obs.input_rate) and obs.replicas > 0:
        rate = obs.processing_rate / lanes
        if rate >= MIN_LANE_RATE:
            return (
                LaneRateEstimate(rate, "saturated") if rate >= floor else LaneRateEstimate(floor, "limited")
            )
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


def replicas_for_cpu(config: PolicyConfig, rate: float, pod_rate: float, current: int | None = None) -> int:
    """The fewest pods whose *busiest* pod stays within ``target_cpu_utilisation`` at ``rate``.

    Partitions are whole: ``R`` pods give the busiest one ``ceil(partitions / R)`` partitions, i.e.
    ``rate x ceil(P / R) / P`` (10 pods on 12 partitions: two pods carry 2/12 each, not the mean
    1.2/12). Returns ``partitions + 1`` when even one partition per pod is too much.

    With ``current`` (the replicas set now): that count when its busiest pod stays within
    ``cpu_tolerance`` above the target and fewer pods would not do (no pod is added for a CPU just
    above the target, as the HPA's tolerance).
    """
    p = config.partitions
    limit = pod_rate * config.target_cpu_utilisation
    if current is not None and 1 <= current <= p:
        at_current = rate * -(-p // current) / p
        if limit < at_current <= limit * (1.0 + config.cpu_tolerance):
            return current
    for r in range(1, p + 1):
        if rate * -(-p // r) / p <= limit:
            return r
    return p + 1


def recommend(
    config: PolicyConfig,
    needed: float,
    lane_rate: float,
    hottest_needed: float = 0.0,
    pod_rate: float | None = None,
    cpu_needed: float | None = None,
    current_replicas: int | None = None,
) -> Recommendation:
    """Replicas and factor whose capacity covers ``needed`` (or the maximum, with a warning).

    ``hottest_needed`` is the rate the busiest partition alone needs: lanes belong to one partition,
    so a skewed load needs ``F >= hottest_needed / lane_rate`` even when the total is covered.

    1. lanes needed ``L = ceil(needed / lane_rate)`` (at least one lane per partition);
    2. ``F = clamp(max(ceil(L / partitions), ceil(hottest_needed / lane_rate)), min_factor,
       max_factor)`` (rounded up: never one step short);
    3. ``R`` from the per-pod lane budget (:func:`replicas_for`), raised to the fewest pods whose
       busiest pod (``ceil(partitions / R)`` partitions) stays within ``target_cpu_utilisation``
       when a pod's CPU capacity is known (:func:`replicas_for_cpu`; ``cpu_needed``: the rate
       without the lane headroom; defaults to ``needed``); ``current_replicas`` are kept while
       their busiest pod is within ``cpu_tolerance`` above that target.
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
        for_cpu = replicas_for_cpu(config, cpu_rate, pod_rate, current_replicas)
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


def factor_for_pods(config: PolicyConfig, pods: int, wanted: int, current: int) -> int:
    """The factor to run now, when ``wanted`` is the recommendation and ``pods`` pods are ready.

    The lane budget of the pods that run now caps the factor at ``max_lanes_per_replica //
    ceil(partitions / pods)``: more lanes than that wait for the new pods (the factor follows them as
    they become ready). Never below ``current`` (a scale-up never lowers the factor), never above
    ``wanted``; without any ready pod nothing can be overloaded, so ``wanted``.
    """
    if pods < 1:
        return wanted
    share = -(-config.partitions // pods)
    budget = max(config.max_lanes_per_replica // share, config.min_factor)
    return max(min(wanted, budget), min(current, wanted))
