"""The simulation loop: a trace, a policy and a simulated group, tick by tick.

Pure: no I/O. :func:`simulate` is deterministic for a given seed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from multilane.operator.decision.policy import Observation, PolicyConfig
from multilane.sim.metrics import RunMetrics, compute_metrics
from multilane.sim.model import Cluster, ScalingMode, SimConfig
from multilane.sim.policies import (
    FlinkStylePolicy,
    KedaHpaPolicy,
    MultilanePolicy,
    ScalingPolicy,
    StaticPolicy,
)
from multilane.sim.traces import Trace

__all__ = [
    "CAPPED_POLICIES",
    "DEFAULT_FIXED_FACTOR",
    "FAIR_POLICIES",
    "POLICY_NAMES",
    "SimResult",
    "default_policies",
    "make_policy",
    "peak_size",
    "simulate",
    "warning_template",
]


@dataclass(frozen=True)
class SimResult:
    """Per-second series of one run and its metrics.

    Invariant (conservation): ``produced_cum[i] == processed_cum[i] + lag[i]`` for every second i
    (up to float rounding).
    """

    policy: str
    trace: str
    time_s: np.ndarray
    lag: np.ndarray
    produced_cum: np.ndarray
    processed_cum: np.ndarray
    pods: np.ndarray
    """Pods alive (starting, ready or draining): what is paid for."""
    replicas: np.ndarray
    """Replicas asked for."""
    factor: np.ndarray
    metrics: RunMetrics
    decisions: list[tuple[float, str]]
    """(time, reason) of every decision that changed the size."""
    warnings: list[tuple[float, str]]
    """(time, warning) the first time each warning template (:func:`warning_template`) appeared."""
    processed: np.ndarray | None = None
    """Records processed per second (whole topic)."""
    rules: dict[str, int] | None = None
    """How often each ``Decision.rule`` fired (multilane's policy; others name none)."""
    event_time_s: float | None = None
    """The trace's event (time to drain counts from it)."""
    warning_counts: dict[str, int] = field(default_factory=dict)
    """How often each warning template (:func:`warning_template`) was given."""


_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


def warning_template(text: str) -> str:
    """A warning with its numbers replaced by ``#``: the warnings that differ only in figures
    (``scale-up 45s ago ...``, ``scale-up 60s ago ...``) are one template."""
    return _NUMBER.sub("#", text)


FAIR_POLICIES = ("multilane", "keda-hpa", "flink-on-lanes", "flink-style", "factor-only", "static")
"""The fair comparison: every group runs multilane workers (F lanes per partition)."""
CAPPED_POLICIES = ("keda-hpa-serial", "flink-style-serial")
"""The partition-capped baselines: a plain consumer, one record at a time per partition."""
POLICY_NAMES = FAIR_POLICIES + CAPPED_POLICIES
DEFAULT_FIXED_FACTOR = 16
"""The factor the fixed-factor baselines (keda-hpa, flink-style) keep."""


def peak_size(
    trace: Trace, sim: SimConfig, utilisation: float = 0.7, lanes_per_pod: int | None = None
) -> tuple[int, int]:
    """(replicas, factor) that run the trace's worst second at ``utilisation``: lanes for the peak
    demand (rate x service time x slowdown, and the busiest partition's own share of it), at least
    the simulation's initial factor; pods for the busiest pod's CPU at the peak (it carries
    ``ceil(partitions / R)`` partitions, the busiest of them counted) and the per-pod lane budget
    (default: partitions x initial factor, as in the comparison). The ``static`` row's size."""
    p = sim.partitions
    if not trace.duration_s:
        return sim.initial_replicas, sim.initial_factor
    demand = trace.rate * trace.service_factor * sim.service_time_s / utilisation  # lanes, whole topic
    total = math.ceil(float(demand.max()))
    hottest = math.ceil(float((demand[:, None] * trace.shares).max()))
    factor = max(-(-total // p), hottest, sim.initial_factor, 1)
    budget = lanes_per_pod or p * sim.initial_factor
    # the busiest pod carries ceil(p / r) partitions: size for its CPU, not the mean's
    per_partition = np.sort((trace.rate[:, None] * trace.shares).max(axis=0))[::-1]
    for_cpu = next(
        (
            r
            for r in range(1, p + 1)
            if float(per_partition[: -(-p // r)].sum()) <= sim.pod_max_rate * utilisation
        ),
        p,
    )
    for_lanes = next((r for r in range(1, p + 1) if -(-p // r) * factor <= budget), p)
    return min(max(for_cpu, for_lanes, 1), p), factor


def make_policy(
    name: str,
    sim: SimConfig,
    overrides: dict[str, Any] | None = None,
    trace: Trace | None = None,
    factor: int = DEFAULT_FIXED_FACTOR,
) -> ScalingPolicy:
    """A policy by name (:data:`POLICY_NAMES`), sized for ``sim``; ``overrides`` set fields of its
    config (``factor`` in them: the fixed factor of keda-hpa / flink-style; ``replicas``/``factor``
    for static). ``static`` without overrides is sized for ``trace``'s peak (:func:`peak_size`),
    else it runs the simulation's initial size."""
    from dataclasses import replace

    from multilane.sim.policies import FlinkStyleConfig, KedaHpaConfig

    o = dict(overrides or {})
    if name in ("multilane", "factor-only"):
        cfg = PolicyConfig(
            partitions=sim.partitions,
            min_replicas=1,
            max_replicas=sim.partitions,
            min_factor=min(factor, 64),
            max_factor=64,
            max_lanes_per_replica=sim.partitions * min(factor, 64),
        )
        if name == "factor-only":
            cfg = replace(cfg, min_replicas=sim.initial_replicas, max_replicas=sim.initial_replicas)
        interval = float(o.pop("interval_s", 15.0))
        return MultilanePolicy(replace(cfg, **o), interval_s=interval, name=name)
    if name == "flink-on-lanes":
        # the Flink policy driving multilane workers: rescaling moves partitions (restore-before-
        # handoff), no job restart, so no restart time in its need either
        flink = replace(FlinkStyleConfig(restart_s=0.0), **{k: v for k, v in o.items() if k != "factor"})
        return FlinkStylePolicy(
            sim.partitions, flink, name, ScalingMode.MULTILANE, False, int(o.get("factor", factor))
        )
    if name in ("keda-hpa", "keda-hpa-serial", "flink-style", "flink-style-serial"):
        serial = name.endswith("-serial")
        f = 1 if serial else int(o.pop("factor", factor))
        if name.startswith("keda"):
            # lanes: the multilane workers' own moves (as the burst benchmark's keda-hpa variant);
            # serial: a plain consumer group's eager rebalances
            mode = ScalingMode.KEDA if serial else ScalingMode.MULTILANE
            return KedaHpaPolicy(sim.partitions, replace(KedaHpaConfig(), **o), name, mode, serial, f)
        flink = replace(FlinkStyleConfig(), **o)
        return FlinkStylePolicy(sim.partitions, flink, name, ScalingMode.FLINK, serial, f)
    if name == "static":
        if "replicas" in o or "factor" in o:
            size = (int(o.pop("replicas", sim.initial_replicas)), int(o.pop("factor", sim.initial_factor)))
        elif trace is not None:
            size = peak_size(trace, sim)
        else:
            size = (sim.initial_replicas, sim.initial_factor)
        return StaticPolicy(start_size=size, **o)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")


def default_policies(sim: SimConfig, trace: Trace | None = None) -> list[ScalingPolicy]:
    return [make_policy(n, sim, trace=trace) for n in FAIR_POLICIES]


def simulate(trace: Trace, policy: ScalingPolicy, sim: SimConfig, seed: int) -> SimResult:
    """Run ``policy`` on ``trace``.

    Each second:
    1. the cluster advances (pods become ready, moves hand off, rebalances happen);
    2. on the policy's interval, an :class:`Observation` is built from the last ``rate_window_s``
       of arrivals, processing and busy lanes, the policy decides, the cluster applies it;
    3. arrivals are drawn (Poisson around the trace's rate x partition share, seeded) and processed.
    """
    if trace.partitions != sim.partitions:
        raise ValueError(f"trace has {trace.partitions} partitions, simulation {sim.partitions}")
    rng = np.random.default_rng(seed)
    n = trace.duration_s
    p = sim.partitions
    start = getattr(policy, "start_size", None)
    if start is None:
        start = (sim.initial_replicas, int(getattr(policy, "factor", sim.initial_factor)))
    serial = bool(getattr(policy, "serial", policy.mode is not ScalingMode.MULTILANE))
    cluster = Cluster(sim, policy.mode, serial, start[0], start[1])
    state = policy.initial_state()
    scale_up_times: list[float] = []
    rules: dict[str, int] = {}
    window = int(sim.rate_window_s)
    arr_hist = np.zeros((n, p))
    proc_hist = np.zeros((n, p))
    busy_hist = np.zeros(n)
    cpu_hist = np.zeros(n)
    ready_now = sim.initial_replicas
    lag = np.zeros(n)
    pods = np.zeros(n, dtype=int)
    replicas = np.zeros(n, dtype=int)
    factor = np.zeros(n, dtype=int)
    decisions: list[tuple[float, str]] = []
    warnings: list[tuple[float, str]] = []
    warning_counts: dict[str, int] = {}
    lanes = np.zeros(n)
    calls = np.zeros(n)
    next_decision = float(policy.interval_s)
    for i in range(n):
        now = float(i)
        # 1.
        cluster.advance(now)
        # 2.
        if now >= next_decision:
            next_decision += policy.interval_s
            lo = max(0, i - window)
            span = max(i - lo, 1)
            obs = Observation(
                now=now,
                lag_by_partition={q: round(float(cluster.backlog[q])) for q in range(p)},
                input_rate=float(arr_hist[lo:i].sum() / span),
                processing_rate=float(proc_hist[lo:i].sum() / span),
                replicas=cluster.replicas,
                factor=cluster.factor,
                busy_lanes=float(busy_hist[lo:i].mean()) if i > lo and sim.observe_busy_lanes else None,
                input_rate_by_partition={q: float(arr_hist[lo:i, q].sum() / span) for q in range(p)},
                cpu_utilisation=float(cpu_hist[lo:i].mean()) if i > lo and sim.observe_cpu else None,
                ready_replicas=ready_now,
                rebalancing=cluster.rebalancing(now),
            )
            decision, state = policy.decide(obs, state)
            rules[decision.rule] = rules.get(decision.rule, 0) + 1
            if decision.changed:
                decisions.append((now, decision.reason))
            for w in decision.warnings:
                key = warning_template(w)
                if key not in warning_counts:
                    warnings.append((now, w))
                warning_counts[key] = warning_counts.get(key, 0) + 1
            before = (cluster.replicas, cluster.factor)
            cluster.apply(now, decision.replicas, decision.factor)
            if cluster.replicas > before[0] or cluster.factor > before[1]:
                scale_up_times.append(now)
        # 3.
        mean = trace.rate[i] * trace.shares[i] * sim.tick_s
        arrivals = rng.poisson(mean).astype(float) if sim.noise else mean.astype(float)
        result = cluster.tick(now, arrivals, float(trace.service_factor[i]))
        arr_hist[i] = arrivals
        proc_hist[i] = result.processed
        busy_hist[i] = result.busy_lanes
        cpu_hist[i] = result.cpu_utilisation
        ready_now = result.pods_ready
        lag[i] = cluster.backlog.sum()
        pods[i] = result.pods_alive
        replicas[i] = cluster.replicas
        factor[i] = cluster.factor
        lanes[i] = cluster.lanes_alive()
        calls[i] = result.busy_lanes
    produced_cum = arr_hist.sum(axis=1).cumsum()
    processed_cum = proc_hist.sum(axis=1).cumsum()
    time_s = np.arange(n, dtype=float)
    metrics = compute_metrics(
        time_s=time_s,
        lag=lag,
        pods=pods,
        input_rate=trace.rate,
        event_time_s=trace.event_time_s,
        scaling_actions=cluster.scaling_actions,
        partition_moves=cluster.partition_moves,
        produced=float(produced_cum[-1]) if n else 0.0,
        processed=float(processed_cum[-1]) if n else 0.0,
        processed_per_s=proc_hist.sum(axis=1),
        events=trace.events,
        decision_times=scale_up_times,
        replica_changes=cluster.replica_changes,
        factor_changes=cluster.factor_changes,
        slo_lag=sim.slo_lag,
        lanes=lanes,
        calls=calls,
    )
    return SimResult(
        policy=policy.name,
        trace=trace.name,
        time_s=time_s,
        lag=lag,
        produced_cum=produced_cum,
        processed_cum=processed_cum,
        pods=pods,
        replicas=replicas,
        factor=factor,
        metrics=metrics,
        decisions=decisions,
        warnings=warnings,
        processed=proc_hist.sum(axis=1),
        rules=rules,
        event_time_s=trace.event_time_s,
        warning_counts=warning_counts,
    )
