"""Scaling policies the simulator compares, all with the ``decide(obs, state)`` shape.

Pure: no I/O.

- :class:`MultilanePolicy` wraps :class:`multilane.operator.policy.AutoscalePolicy` unchanged (also
  as ``factor-only``: its replicas held fixed).
- :class:`KedaHpaPolicy`: KEDA's Kafka scaler under the Kubernetes HPA's default behaviour; it sets
  the replicas and keeps a fixed factor (``factor``: lanes per partition of the workers it scales).
- :class:`FlinkStylePolicy`: a rate-based autoscaler on parallelism capped at the partition count, in
  the manner of the Flink Kubernetes operator's autoscaler, also at a fixed factor (``flink-style``:
  every rescale restarts the job; ``flink-on-lanes``: the same policy driving multilane workers,
  whose rescales move partitions without a restart).
- :class:`StaticPolicy`: a fixed size.

``serial`` on a policy says the group it drives processes one record at a time per partition (the
partition-capped baselines); otherwise its workers run ``factor`` lanes per partition.

A policy's state is a JSON-like ``dict`` (the baselines) or a :class:`PolicyState` (multilane).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from multilane.operator.decision.policy import (
    AutoscalePolicy,
    Decision,
    Observation,
    PolicyConfig,
    PolicyState,
)
from multilane.sim.model import ScalingMode

__all__ = [
    "FlinkStyleConfig",
    "FlinkStylePolicy",
    "KedaHpaConfig",
    "KedaHpaPolicy",
    "MultilanePolicy",
    "ScalingPolicy",
    "StaticPolicy",
]


class ScalingPolicy(Protocol):
    """What the simulator needs of a policy."""

    name: str
    mode: ScalingMode
    serial: bool

    @property
    def interval_s(self) -> float:
        """Seconds between two ``decide`` calls."""
        ...

    def initial_state(self) -> Any: ...

    def decide(self, obs: Observation, state: Any) -> tuple[Decision, Any]: ...


@dataclass
class MultilanePolicy:
    """multilane's :class:`AutoscalePolicy`, called exactly as the operator calls it."""

    config: PolicyConfig
    interval_s: float = 15.0
    name: str = "multilane"
    mode: ScalingMode = ScalingMode.MULTILANE
    serial: bool = False
    _policy: AutoscalePolicy = field(init=False)

    def __post_init__(self) -> None:
        self._policy = AutoscalePolicy(self.config)

    def initial_state(self) -> PolicyState:
        return PolicyState()

    def decide(self, obs: Observation, state: PolicyState) -> tuple[Decision, PolicyState]:
        return self._policy.decide(obs, state)


@dataclass
class StaticPolicy:
    """Never scales: multilane workers at a fixed size (``start_size``; None: the simulation's
    initial size), to separate the policy's contribution from the mechanism's."""

    start_size: tuple[int, int] | None = None
    """(replicas, factor) the group runs at from the start."""
    interval_s: float = 15.0
    name: str = "static"
    mode: ScalingMode = ScalingMode.MULTILANE
    serial: bool = False

    def initial_state(self) -> None:
        return None

    def decide(self, obs: Observation, state: None) -> tuple[Decision, None]:
        return Decision(obs.replicas, obs.factor, "static: never scales", {}, False, []), state


@dataclass(frozen=True)
class KedaHpaConfig:
    """KEDA Kafka scaler + HPA defaults (KEDA docs; Kubernetes HPA behaviour defaults)."""

    lag_threshold: float = 10.0
    """KEDA ``lagThreshold`` (its documented default): target lag per replica."""
    activation_lag_threshold: float = 0.0
    """KEDA ``activationLagThreshold`` (default 0): at or below it the scaler is inactive, which
    matters only with ``min_replicas`` 0 (scale to zero): the HPA's count then goes to 0."""
    polling_interval_s: float = 30.0
    """KEDA ``pollingInterval``: how often KEDA itself polls the scaler (for activation); the HPA's
    reads go to the scaler directly unless ``use_cached_metrics``."""
    use_cached_metrics: bool = False
    """KEDA ``useCachedMetrics`` (default false): false, every HPA sync (15 s) queries the scaler, so
    the lag is fresh; true, the HPA gets the value of the last poll (every ``polling_interval_s``)."""
    sync_period_s: float = 15.0
    """HPA ``--horizontal-pod-autoscaler-sync-period``."""
    tolerance: float = 0.1
    """HPA: no change while |metric / target - 1| <= tolerance."""
    scale_up_percent: float = 100.0
    scale_up_pods: int = 4
    scale_up_period_s: float = 15.0
    """HPA default scale-up: the larger of +100% and +4 pods per 15 s."""
    scale_down_stabilisation_s: float = 300.0
    """HPA default: scale down to the highest recommendation of the last 300 s."""
    min_replicas: int = 1
    """KEDA's ``minReplicaCount`` is 0 by default; 1 here (scale-to-zero is not compared)."""
    max_replicas: int = 100
    """``maxReplicaCount``; KEDA caps the replicas at the partition count anyway."""


@dataclass
class KedaHpaPolicy:
    """desired = ceil(total lag / lagThreshold), capped at the partition count, through the HPA.

    1. read the total lag on every HPA sync (KEDA queries the scaler for each metrics request); with
       ``use_cached_metrics``, only every ``polling_interval_s`` (between polls the HPA sees the last
       value);
    2. KEDA caps the metric so that the desired count never exceeds the partition count; at or below
       the activation threshold with ``min_replicas`` 0, the desired count is 0;
    3. HPA: ratio = metric / (threshold x current); within the tolerance, keep the current count;
       else desired = ceil(metric / threshold);
    4. scale-down stabilisation: the highest desired count of the last 300 s;
    5. scale-up rate limit: at most max(+100 %, +4 pods) per 15 s; clamp to [min, max].
    """

    partitions: int
    config: KedaHpaConfig = field(default_factory=KedaHpaConfig)
    name: str = "keda-hpa"
    mode: ScalingMode = ScalingMode.KEDA
    serial: bool = True
    factor: int = 1
    """Lanes per partition of the workers it scales (kept; 1 for a serial group)."""

    @property
    def interval_s(self) -> float:
        return self.config.sync_period_s

    def initial_state(self) -> dict[str, Any]:
        return {"metric": None, "polled_at": None, "recs": [], "ups": []}

    def decide(self, obs: Observation, state: dict[str, Any]) -> tuple[Decision, dict[str, Any]]:
        cfg = self.config
        st: dict[str, Any] = {k: (list(v) if isinstance(v, list) else v) for k, v in state.items()}
        now = obs.now
        current = max(obs.replicas, 1)
        # 1.
        stale = st["polled_at"] is None or now - st["polled_at"] >= cfg.polling_interval_s
        if stale or not cfg.use_cached_metrics:
            st["metric"] = float(sum(obs.lag_by_partition.values()))
            st["polled_at"] = now
        # 2.
        metric = min(float(st["metric"]), cfg.lag_threshold * self.partitions)
        # 3.
        ratio = metric / (cfg.lag_threshold * current)
        if cfg.min_replicas == 0 and metric <= cfg.activation_lag_threshold:
            desired = 0
        elif abs(ratio - 1.0) <= cfg.tolerance:
            desired = current
        else:
            desired = max(math.ceil(metric / cfg.lag_threshold), 0)
        desired = min(max(desired, cfg.min_replicas), cfg.max_replicas, self.partitions)
        # 4.
        st["recs"] = [r for r in st["recs"] if r[0] > now - cfg.scale_down_stabilisation_s] + [[now, desired]]
        if desired < current:
            desired = min(current, max(r[1] for r in st["recs"]))
        # 5.
        if desired > current:
            st["ups"] = [u for u in st["ups"] if u[0] > now - cfg.scale_up_period_s]
            base = min([u[1] for u in st["ups"]] + [current])
            limit = max(math.floor(base * (1 + cfg.scale_up_percent / 100)), base + cfg.scale_up_pods)
            desired = min(desired, limit)
            st["ups"].append([now, current])
        reason = (
            f"lag {metric:.0f} (polled t={st['polled_at']:.0f}) / lagThreshold {cfg.lag_threshold:g} "
            f"-> {desired} replicas"
        )
        decision = Decision(
            replicas=desired,
            factor=self.factor,
            reason=reason,
            inputs={"metric": metric, "ratio": ratio},
            changed=desired != obs.replicas,
            warnings=[],
        )
        return decision, st


@dataclass(frozen=True)
class FlinkStyleConfig:
    """The Flink autoscaler's knobs. Defaults here use multilane's timings (see docs/autoscaling.md):
    Flink's own defaults are slower (stabilisation 5 min, metrics window 15 min, catch-up 30 min in
    older releases, scale-down delayed up to 1 h)."""

    target_utilisation: float = 0.7
    catchup_s: float = 300.0
    restart_s: float = 60.0
    """Expected rescale downtime (Flink's ``restart.time``), added to the catch-up need."""
    stabilisation_s: float = 60.0
    """No new rescale this long after the last one."""
    metrics_window_s: float = 60.0
    scale_down_delay_s: float = 300.0
    interval_s: float = 15.0
    max_parallelism: int = 100


@dataclass
class FlinkStylePolicy:
    """Parallelism from the true processing rate, capped at the partition count.

    1. average input rate, processing rate and busy subtasks over the metrics window (serial: a busy
       lane is a busy subtask; with lanes a subtask is a pod, busy by the larger of its CPU share and
       its lanes' busy share, as Flink's busy time counts both);
    2. true rate of one subtask = processing rate / busy subtasks (else the last known one);
    3. needed = input / utilisation + backlog / catch-up + input x restart / catch-up;
       parallelism = ceil(needed / subtask rate), clamped to [1, min(max, partitions)];
    4. no rescale within the stabilisation time after the last one; scale up at once; scale down
       only after the delay, to the highest recommendation of the delay window.
    """

    partitions: int
    config: FlinkStyleConfig = field(default_factory=FlinkStyleConfig)
    name: str = "flink-style"
    mode: ScalingMode = ScalingMode.FLINK
    serial: bool = True
    factor: int = 1
    """Lanes per partition of each subtask's partitions (kept; 1 for a serial group)."""

    @property
    def interval_s(self) -> float:
        return self.config.interval_s

    def initial_state(self) -> dict[str, Any]:
        return {"samples": [], "rate": None, "last_rescale": None, "recs": []}

    def decide(self, obs: Observation, state: dict[str, Any]) -> tuple[Decision, dict[str, Any]]:
        cfg = self.config
        st: dict[str, Any] = {k: (list(v) if isinstance(v, list) else v) for k, v in state.items()}
        now = obs.now
        current = max(obs.replicas, 1)
        # 1.
        if self.serial:
            busy_now = obs.busy_lanes or 0.0
        else:
            ready = obs.replicas if obs.ready_replicas is None else obs.ready_replicas
            lane_share = (obs.busy_lanes or 0.0) / (self.partitions * max(obs.factor, 1))
            busy_now = ready * min(max(obs.cpu_utilisation or 0.0, lane_share), 1.0)
        st["samples"] = [s for s in st["samples"] if s[0] > now - cfg.metrics_window_s] + [
            [now, obs.input_rate, obs.processing_rate, busy_now]
        ]
        n = len(st["samples"])
        input_rate = sum(s[1] for s in st["samples"]) / n
        proc = sum(s[2] for s in st["samples"]) / n
        busy = sum(s[3] for s in st["samples"]) / n
        # 2.
        if busy >= (0.5 if self.serial else 0.05) and proc > 0:
            st["rate"] = proc / busy
        rate = st["rate"] or 1.0
        # 3.
        backlog = float(sum(obs.lag_by_partition.values()))
        needed = (
            input_rate / cfg.target_utilisation
            + backlog / cfg.catchup_s
            + input_rate * cfg.restart_s / cfg.catchup_s
        )
        ceiling = min(cfg.max_parallelism, self.partitions)
        rec = min(max(math.ceil(needed / rate), 1), ceiling)
        st["recs"] = [r for r in st["recs"] if r[0] > now - cfg.scale_down_delay_s] + [[now, rec]]
        # 4.
        last = st["last_rescale"]
        desired = current
        why = "hold"
        if last is not None and now - last < cfg.stabilisation_s:
            why = "stabilising after the last rescale"
        elif rec > current:
            desired, why = rec, "scale up"
        elif rec < current and (last is None or now - last >= cfg.scale_down_delay_s):
            high = max(r[1] for r in st["recs"])
            covered = st["recs"][0][0] <= now - cfg.scale_down_delay_s + cfg.interval_s
            if high < current and covered:
                desired, why = high, "scale down to the window max"
        if desired != current:
            st["last_rescale"] = now
        reason = f"{why}: need {needed:.1f} rec/s at {rate:.2f} rec/s/subtask -> {rec} (now {current})"
        decision = Decision(
            replicas=desired,
            factor=self.factor,
            reason=reason,
            inputs={"needed": needed, "subtask_rate": rate, "recommended": rec},
            changed=desired != obs.replicas,
            warnings=["demand exceeds the partition-capped parallelism"] if needed > ceiling * rate else [],
        )
        return decision, st
