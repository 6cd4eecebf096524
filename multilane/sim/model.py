"""The simulated consumer group: pods, partition ownership, pauses and per-tick processing.

Pure: no I/O. Time advances in fixed ticks (1 s by default) and every quantity is an aggregate rate
per partition per tick, not individual records (a simulated hour is 3,600 small numpy steps instead
of ~10^6 record events; see docs/autoscaling.md for why this is accurate enough here).

Two independent choices describe a group:

- the **lanes**: F lanes per partition (multilane workers; ``serial=False``), or one record at a time
  per partition (``serial=True``: a plain consumer with ``baseline_lanes_per_pod`` concurrency per
  pod, at most one lane per partition: the partition-capped baselines);
- the **mechanism** that applies a (replicas, factor) decision, one per :class:`ScalingMode`:

  - ``multilane``: a factor change pauses partitions for ``factor_pause_s``; new pods start in
    ``pod_start_s``, a moved partition's new owner warms its state up while the old owner keeps
    processing (restore-before-handoff, ``restore_s``), then the partition pauses only for the
    hand-off (``handoff_pause_s``); at most ``max_moves_at_once`` moves run at a time;
  - ``keda``: every membership change (a pod becomes ready or leaves) is a stop-the-world consumer
    group rebalance (``rebalance_pause_s`` for all partitions), after which moved partitions restore
    their state before processing (``restore_s``);
  - ``flink``: parallelism = replicas (one slot per pod); every rescale restarts the job: all
    partitions pause for ``flink_restart_s`` (and until the new pods are up) plus ``restore_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

__all__ = ["Cluster", "ScalingMode", "SimConfig", "TickResult", "balanced_assignment"]


class ScalingMode(StrEnum):
    MULTILANE = "multilane"
    KEDA = "keda"
    FLINK = "flink"


@dataclass(frozen=True)
class SimConfig:
    """The simulated application and platform. Every field is a modelling assumption (documented in
    docs/autoscaling.md); all durations in seconds."""

    partitions: int = 12
    """> 0."""
    service_time_s: float = 0.05
    """> 0: time one lane spends on one record (a downstream call): 20 rec/s per lane."""
    pod_max_rate: float = 400.0
    """> 0: records/s one pod handles at 100 % of its CPU limit (2.5 ms CPU per record: client,
    deserialisation, the call's own CPU), whatever its lane count."""
    downstream_concurrency: int = 48
    """>= 1: concurrent requests the downstream serves; more lanes than this wait."""
    pod_start_s: float = 1.0
    """>= 0: from creating a pod to its consumer being ready. Measured: a worker process is ready
    ~1 s after it is started (:data:`multilane.sim.calibration.MEASURED`); a Kubernetes pod takes
    longer (scheduling, image pull): the sweep also runs 30 s."""
    move_warmup_s: float = 0.37
    """>= 0: a moved partition's new owner warms up (learner restore and catch-up) for this long
    before the hand-off, plus the state restore below. Measured: 0.37 s (the burst benchmark's
    stateful processor, a few MB of state per partition)."""
    state_mb_per_partition: float = 0.0
    """>= 0: state restored when a partition moves, beyond what ``move_warmup_s`` covers (the sweep
    also runs 100 MB)."""
    restore_mb_per_s: float = 10.0
    """> 0: restore throughput of one pod for one partition."""
    handoff_pause_s: float = 0.31
    """>= 0: multilane: a moved partition pauses from the release call to its promotion. Measured:
    0.31 s per move (moves run in parallel)."""
    factor_pause_s: float = 0.05
    """>= 0: multilane: partitions pause while lanes are re-split: the resize quiesces the lanes, i.e.
    waits for the running records (at most one service time, 50 ms). Not measured on its own."""
    rebalance_pause_s: float = 5.0
    """>= 0: baselines: a consumer-group rebalance stops every partition for this long."""
    flink_restart_s: float = 30.0
    """>= 0: Flink-style baseline: a rescale restarts the job."""
    baseline_lanes_per_pod: int = 1
    """>= 1: baselines: records one pod processes at a time (at most one per partition)."""
    max_moves_at_once: int = 4
    """>= 1: multilane: partition moves in progress at once (spec.scaling.maxPartitionsMovedAtOnce,
    default 4)."""
    rate_window_s: float = 30.0
    """> 0: window of the rates the policies observe."""
    noise: bool = True
    """Poisson arrivals (seeded) instead of the exact mean rate."""
    observe_busy_lanes: bool = True
    """Policies see busy lanes (the workers' lane utilisation); false: ``busy_lanes=None``."""
    observe_cpu: bool = True
    """Policies see the pods' CPU utilisation; false: ``cpu_utilisation=None``."""
    initial_replicas: int = 1
    initial_factor: int = 16
    """The start of every lane-equipped group: 1 x 16 (the fixed-factor baselines' factor, and
    multilane's ``min_factor`` in the comparison)."""
    slo_lag: float = 1000.0
    """> 0: the lag (records, whole topic) above which a second counts as "above the SLO"."""
    tick_s: float = 1.0
    """> 0: the trace is per second, so 1 s; kept explicit for the docs and tests."""

    def __post_init__(self) -> None:
        if self.partitions < 1 or self.service_time_s <= 0 or self.pod_max_rate <= 0:
            raise ValueError("partitions, service_time_s and pod_max_rate must be > 0")
        if self.downstream_concurrency < 1 or self.baseline_lanes_per_pod < 1 or self.max_moves_at_once < 1:
            raise ValueError("concurrencies must be >= 1")
        if self.restore_mb_per_s <= 0 or self.rate_window_s <= 0 or self.tick_s != 1.0:
            raise ValueError("restore_mb_per_s and rate_window_s must be > 0; tick_s must be 1")
        if not 1 <= self.initial_replicas <= self.partitions or self.initial_factor < 1:
            raise ValueError("initial size out of range")
        if min(self.pod_start_s, self.move_warmup_s, self.state_mb_per_partition) < 0 or self.slo_lag <= 0:
            raise ValueError("durations and state must be >= 0, slo_lag > 0")

    @property
    def restore_s(self) -> float:
        """Time to make one moved partition's state ready: the warm-up plus the state restore."""
        return self.move_warmup_s + self.state_mb_per_partition / self.restore_mb_per_s

    def max_capacity(self, max_factor: int = 64) -> tuple[float, str]:
        """The most records/s (at the base service time) any policy can get out of this group, and
        what limits it: the downstream's concurrency, the lanes, or the pods' CPU."""
        limits = {
            "downstream concurrency": self.downstream_concurrency / self.service_time_s,
            "lanes": self.partitions * max_factor / self.service_time_s,
            "pod CPU": self.partitions * self.pod_max_rate,
        }
        name = min(limits, key=lambda k: limits[k])
        return limits[name], name


def balanced_assignment(partitions: int, pods: list[int], current: np.ndarray) -> np.ndarray:
    """A sticky, balanced owner per partition over ``pods``.

    1. quota: every pod gets ``partitions // n`` partitions, the first ``partitions % n`` one more;
    2. a partition stays on its current owner while that owner is in ``pods`` and under quota;
    3. the rest go, in partition order, to pods under quota (lowest pod id first).
    """
    n = len(pods)
    if n == 0:
        return np.full(partitions, -1, dtype=int)
    # 1.
    quota = {pod: partitions // n + (1 if i < partitions % n else 0) for i, pod in enumerate(sorted(pods))}
    held = dict.fromkeys(pods, 0)
    owner = np.full(partitions, -1, dtype=int)
    # 2.
    for p in range(partitions):
        c = int(current[p])
        if c in held and held[c] < quota[c]:
            owner[p] = c
            held[c] += 1
    # 3.
    for p in range(partitions):
        if owner[p] == -1:
            pod = next(k for k in sorted(pods) if held[k] < quota[k])
            owner[p] = pod
            held[pod] += 1
    return owner


@dataclass
class _Move:
    partition: int
    target: int
    restore_done_at: float | None = None
    """Set when the target pod started restoring."""


@dataclass(frozen=True)
class TickResult:
    """What happened in one tick (arrays per partition)."""

    arrivals: np.ndarray
    processed: np.ndarray
    busy_lanes: float
    pods_alive: int
    pods_ready: int
    cpu_utilisation: float
    """Mean over ready pods of processed / pod_max_rate (0 when no pod is ready)."""


@dataclass
class Cluster:
    """The group's moving parts. Invariants: ``owner[p]`` is a ready pod or -1; ``backlog >= 0``."""

    config: SimConfig
    mode: ScalingMode
    serial: bool = False
    """One record at a time per partition (the partition-capped baselines) instead of F lanes."""
    start_replicas: int | None = None
    """Initial size (None: the config's ``initial_replicas`` / ``initial_factor``)."""
    start_factor: int | None = None
    backlog: np.ndarray = field(init=False)
    owner: np.ndarray = field(init=False)
    paused_until: np.ndarray = field(init=False)
    pods: dict[int, float] = field(init=False, default_factory=dict)
    """pod id -> time it is (or was) ready."""
    draining: set[int] = field(init=False, default_factory=set)
    """Pods being removed (multilane: once their partitions have moved away)."""
    factor: int = field(init=False)
    replicas: int = field(init=False)
    """The size asked for (what the policies observe)."""
    moves: list[_Move] = field(init=False, default_factory=list)
    pending_rebalance: bool = field(init=False, default=False)
    partition_moves: int = field(init=False, default=0)
    scaling_actions: int = field(init=False, default=0)
    replica_changes: int = field(init=False, default=0)
    factor_changes: int = field(init=False, default=0)
    _next_pod: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        cfg = self.config
        p = cfg.partitions
        self.backlog = np.zeros(p)
        self.paused_until = np.zeros(p)
        start_f = cfg.initial_factor if self.start_factor is None else self.start_factor
        self.factor = 1 if self.serial else max(start_f, 1)
        self.replicas = cfg.initial_replicas if self.start_replicas is None else self.start_replicas
        self.replicas = max(1, min(self.replicas, p))
        for _ in range(self.replicas):
            self.pods[self._new_pod_id()] = -cfg.tick_s  # ready (and in the group) before the run
        self.owner = balanced_assignment(p, sorted(self.pods), np.full(p, -1))

    def _new_pod_id(self) -> int:
        self._next_pod += 1
        return self._next_pod - 1

    # -- decisions ---------------------------------------------------------------------------

    def apply(self, now: float, replicas: int, factor: int) -> None:
        """Start moving to ``replicas`` x ``factor`` (the factor is 1 for a serial group)."""
        if self.serial:
            factor = 1
        factor = max(factor, 1)
        replicas = max(1, min(replicas, self.config.partitions))
        if (replicas, factor) == (self.replicas, self.factor):
            return
        self.scaling_actions += 1
        self.replica_changes += replicas != self.replicas
        self.factor_changes += factor != self.factor
        if self.mode is ScalingMode.MULTILANE:
            self._apply_multilane(now, replicas, factor)
        elif self.mode is ScalingMode.KEDA:
            self._apply_keda(now, replicas)
            self._factor_in_place(now, factor)
        else:
            self._apply_flink(now, replicas)
        self.replicas, self.factor = replicas, factor

    def _factor_in_place(self, now: float, factor: int) -> None:
        if factor != self.factor:
            self.paused_until = np.maximum(self.paused_until, now + self.config.factor_pause_s)
            self.factor = factor

    def _active_pods(self) -> list[int]:
        return sorted(k for k in self.pods if k not in self.draining)

    def _apply_multilane(self, now: float, replicas: int, factor: int) -> None:
        cfg = self.config
        # 1. the factor changes in place: every partition pauses while its lanes are re-split
        self._factor_in_place(now, factor)
        # 2. pods: add new ones, or mark the highest ids for removal
        active = self._active_pods()
        for _ in range(replicas - len(active)):
            self.pods[self._new_pod_id()] = now + cfg.pod_start_s
        for k in active[replicas:] if replicas < len(active) else []:
            self.draining.add(k)
        # 3. plan moves from the current owners to a balanced layout (pending moves are replanned;
        #    moves whose restore already runs continue when their target is still wanted)
        target = balanced_assignment(cfg.partitions, self._active_pods(), self.owner)
        running = {m.partition: m for m in self.moves if m.restore_done_at is not None}
        self.moves = []
        for p in range(cfg.partitions):
            if target[p] == self.owner[p]:
                continue
            m = running.get(p)
            self.moves.append(m if m is not None and m.target == target[p] else _Move(p, int(target[p])))

    def _apply_keda(self, now: float, replicas: int) -> None:
        cfg = self.config
        pods = sorted(self.pods)
        if replicas > len(pods):
            for _ in range(replicas - len(pods)):
                self.pods[self._new_pod_id()] = now + cfg.pod_start_s
        else:
            for k in pods[replicas:]:  # terminated pods leave the group at once
                del self.pods[k]
            self._rebalance(now)

    def _apply_flink(self, now: float, replicas: int) -> None:
        cfg = self.config
        pods = sorted(self.pods)
        for k in pods[replicas:]:
            del self.pods[k]
        ready_at = now
        for _ in range(replicas - len(pods)):
            self.pods[self._new_pod_id()] = now + cfg.pod_start_s
            ready_at = now + cfg.pod_start_s
        # the job restarts with the new parallelism: nothing runs until it is back and restored
        resume = max(now + cfg.flink_restart_s, ready_at) + cfg.restore_s
        self.paused_until[:] = np.maximum(self.paused_until, resume)
        new_owner = balanced_assignment(cfg.partitions, sorted(self.pods), self.owner)
        self.partition_moves += int((new_owner != self.owner).sum())
        self.owner = new_owner

    def _rebalance(self, now: float) -> None:
        """Baseline rebalance over the ready pods: everyone stops; moved partitions also restore."""
        cfg = self.config
        ready = sorted(k for k, t in self.pods.items() if t <= now)
        new_owner = balanced_assignment(cfg.partitions, ready, self.owner)
        moved = new_owner != self.owner
        self.partition_moves += int(moved.sum())
        resume = now + cfg.rebalance_pause_s
        self.paused_until = np.maximum(self.paused_until, resume)
        self.paused_until[moved] = np.maximum(self.paused_until[moved], resume + cfg.restore_s)
        self.owner = new_owner

    def lanes_alive(self) -> int:
        """Lanes the group runs now: F per owned partition (1 for a serial group)."""
        return int((self.owner >= 0).sum()) * (1 if self.serial else self.factor)

    # -- time --------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Progress pod start-up, moves and rebalances up to ``now``.

        1. keda: a pod that became ready joins the group (one rebalance per tick);
        2. multilane: moves whose restore finished hand off (drain pause, new owner); moves start
           restoring on ready targets while fewer than ``max_moves_at_once`` run;
        3. multilane: draining pods without partitions are removed.
        """
        cfg = self.config
        # 1.
        if self.mode is ScalingMode.KEDA:
            joined = [k for k, t in self.pods.items() if now - cfg.tick_s < t <= now]
            unowned = bool((self.owner == -1).any())
            if joined or unowned:
                self._rebalance(now)
            return
        if self.mode is not ScalingMode.MULTILANE:
            return
        # 2.
        remaining: list[_Move] = []
        for m in self.moves:
            if m.restore_done_at is not None and m.restore_done_at <= now:
                self.paused_until[m.partition] = max(
                    self.paused_until[m.partition], now + cfg.handoff_pause_s
                )
                self.owner[m.partition] = m.target
                self.partition_moves += 1
            else:
                remaining.append(m)
        self.moves = remaining
        running = sum(1 for m in self.moves if m.restore_done_at is not None)
        for m in self.moves:
            if running >= cfg.max_moves_at_once:
                break
            if m.restore_done_at is None and self.pods.get(m.target, np.inf) <= now:
                m.restore_done_at = now + cfg.restore_s
                running += 1
        # 3.
        for k in list(self.draining):
            if not (self.owner == k).any() and not any(m.target == k for m in self.moves):
                del self.pods[k]
                self.draining.discard(k)

    def tick(self, now: float, arrivals: np.ndarray, service_factor: float) -> TickResult:
        """Process one tick: arrivals join the backlog, each partition processes what its lanes can.

        1. lanes per partition (0 while paused, unowned or the owner is not ready; a partly paused
           tick counts its unpaused share);
        2. capacity = lanes x tick / service time; baselines share a pod's lanes among its partitions
           in proportion to their backlog (at most one lane each);
        3. the pod CPU ceiling and the downstream concurrency cut processing proportionally;
        4. busy lanes: lanes of a partition left with a backlog are all busy (waiting on the
           downstream counts as busy); otherwise processed x service time (Little's law).
        """
        cfg = self.config
        dt = cfg.tick_s
        service = cfg.service_time_s * service_factor
        demand = self.backlog + arrivals
        # 1.
        ready_at = np.full(max(self._next_pod, 1), np.inf)
        for k, t in self.pods.items():
            ready_at[k] = t
        owned = self.owner >= 0
        owner = np.where(owned, self.owner, 0)
        ready = owned & (ready_at[owner] <= now)
        avail = np.clip((now + dt - self.paused_until) / dt, 0.0, 1.0) * ready
        # 2.
        if not self.serial:
            lanes = avail * self.factor
        else:
            per_pod = np.bincount(owner, weights=demand * owned, minlength=len(ready_at))
            total = per_pod[owner]
            share = np.divide(demand, total, out=np.zeros_like(demand), where=total > 0)
            lanes = np.minimum(cfg.baseline_lanes_per_pod * share, 1.0) * avail
        capacity = lanes * dt / service
        processed = np.minimum(demand, capacity)
        # 3.
        pod_sum = np.bincount(owner, weights=processed * owned, minlength=len(ready_at))
        cap = cfg.pod_max_rate * dt
        scale = np.divide(cap, pod_sum, out=np.ones_like(pod_sum), where=pod_sum > cap)
        processed = processed * scale[owner]
        limit = cfg.downstream_concurrency * dt / service
        total_processed = processed.sum()
        if total_processed > limit:
            processed *= limit / total_processed
        # 4.
        self.backlog = demand - processed
        saturated = self.backlog > 1e-9
        busy = np.where(saturated, lanes, processed * service / dt)
        pods_ready = sum(1 for t in self.pods.values() if t <= now)
        cpu = float(processed.sum()) / (pods_ready * cfg.pod_max_rate * dt) if pods_ready else 0.0
        return TickResult(arrivals, processed, float(busy.sum()), len(self.pods), pods_ready, cpu)

    def rebalancing(self, now: float) -> bool:
        """Pods starting, partitions moving or (baselines) partitions paused by a rebalance/restart."""
        if any(t > now for t in self.pods.values()) or self.moves or self.draining:
            return True
        return bool((self.paused_until > now).any())
