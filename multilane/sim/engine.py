"""The simulation loop: a trace, a policy and a simulated group, tick by tick.

Pure: no I/O. :func:`simulate` is deterministic for a given seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from multilane.operator.policy import Observation, PolicyConfig
from multilane.sim.metrics import RunMetrics, compute_metrics
from multilane.sim.model import Cluster, SimConfig
from multilane.sim.policies import (
    FlinkStylePolicy,
    KedaHpaPolicy,
    MultilanePolicy,
    ScalingPolicy,
    StaticPolicy,
)
from multilane.sim.traces import Trace

__all__ = ["POLICY_NAMES", "SimResult", "default_policies", "make_policy", "simulate"]


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
    """(time, warning) the first time each distinct warning text prefix appeared."""
    event_time_s: float | None = None
    """The trace's event (time to drain counts from it)."""


POLICY_NAMES = ("multilane", "keda-hpa", "flink-style")
"""The policies compared by default; ``static`` (never scales) is also available by name."""


def make_policy(name: str, sim: SimConfig, overrides: dict[str, Any] | None = None) -> ScalingPolicy:
    """A policy by name, sized for ``sim``; ``overrides`` set fields of its config."""
    from dataclasses import replace

    from multilane.sim.policies import FlinkStyleConfig, KedaHpaConfig

    o = dict(overrides or {})
    if name == "multilane":
        cfg = PolicyConfig(
            partitions=sim.partitions,
            min_replicas=1,
            max_replicas=sim.partitions,
            min_factor=1,
            max_factor=64,
        )
        return MultilanePolicy(replace(cfg, **o))
    if name == "keda-hpa":
        return KedaHpaPolicy(sim.partitions, replace(KedaHpaConfig(), **o))
    if name == "static":
        return StaticPolicy(**o)
    if name == "flink-style":
        return FlinkStylePolicy(sim.partitions, replace(FlinkStyleConfig(), **o))
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")


def default_policies(sim: SimConfig) -> list[ScalingPolicy]:
    return [make_policy(n, sim) for n in POLICY_NAMES]


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
    cluster = Cluster(sim, policy.mode)
    state = policy.initial_state()
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
    seen_warnings: set[str] = set()
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
            if decision.changed:
                decisions.append((now, decision.reason))
            for w in decision.warnings:
                key = w[:40]
                if key not in seen_warnings:
                    seen_warnings.add(key)
                    warnings.append((now, w))
            cluster.apply(now, decision.replicas, decision.factor)
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
        event_time_s=trace.event_time_s,
    )
