"""Prometheus metrics of the operator itself (the Kubernetes operator and the local control plane).
Does I/O only in :meth:`OperatorMetrics.serve` (HTTP) and in the worker-control calls that
:class:`MeteredWorkerControl` passes through.

Each :class:`OperatorMetrics` owns a registry, so several operators in one process (tests) do not
collide; the CLI serves it on ``--metrics-port``. Names follow Prometheus conventions (base units in
the name, counters end in ``_total``); per-consumer series carry ``namespace`` and ``consumer`` (the
ParallelConsumer's name; the worker PodMonitor gives worker series the same two labels).

- ``multilane_operator_reconcile_duration_seconds{handler}`` (histogram; ``reconcile``: children,
  ``tick``: one control-loop pass);
- ``multilane_operator_decision_duration_seconds`` (histogram): a scaling step (sample, the workers'
  busy lanes, the policy);
- ``multilane_operator_scaling_decisions_total{rule, direction}`` (``up``/``down``/``none``);
- ``multilane_operator_moves_in_flight{phase}`` (gauge; ``pending``, ``learning``, ``releasing``,
  ``promoting``; ``eager``: a release-then-grant change);
- ``multilane_operator_move_duration_seconds{mode}`` and ``multilane_operator_handoff_pause_seconds{mode}``
  (histograms of completed moves; ``mode`` ``restore`` or ``eager``): learn call to promotion, and
  release call to promotion (the pause: nobody processes the partition);
- ``multilane_operator_learner_timeouts_total``;
- ``multilane_operator_fencing_events_total{reason}`` (``generation_refused``, ``lease_lost``,
  ``heartbeat_expired``);
- ``multilane_operator_metric_source_errors_total{reason}`` (``unavailable``, ``invalid``);
- gauges ``multilane_operator_replicas``, ``_factor``, ``_replicas_max``, ``_factor_max``,
  ``_assignment_generation``;

- ``multilane_consumer_condition{namespace, consumer, type, status}`` (gauge): 1 for the status each
  condition of the ParallelConsumer has (``True``, ``False``, ``Unknown``), 0 for the other two; set
  from every status write (:meth:`OperatorMetrics.observe_conditions`), so it follows what
  ``kubectl get pcon`` shows;

plus ``multilane_operator_reconciles_total{result}``, ``_ticks_total``, ``_decisions_total{changed}``,
``_errors_total{kind}`` and ``multilane_operator_leader`` (operator-wide; 1 while this replica runs the
control loops: it holds the leader Lease, or runs without leader election; 0 while it waits).
Decisions count by ``rule``: the policy decision's ``rule`` (:func:`decision_rule`, one of
``policy_model.RULES``); ``bounds`` when the spec (changed bounds, a pinned replica count) moved the
size the policy held. Direction compares the decision with the previous decision
(:func:`decision_direction`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase

from multilane.formats.handover import Handover
from multilane.operator.decision.policy_model import RULES, Decision
from multilane.operator.rollout.handoff_control import HandoffControl
from multilane.operator.rollout.workers import ReleasedPartition, WorkerFencedError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from multilane.operator.controller import TickResult
    from multilane.operator.rollout.assignment import WorkerControl
    from multilane.operator.rollout.handoff import HandoffRecord

__all__ = [
    "FENCING_REASONS",
    "MOVE_PHASES",
    "MeteredHandoffControl",
    "MeteredWorkerControl",
    "OperatorMetrics",
    "decision_direction",
    "decision_rule",
]

#: Label values created at 0 for every consumer, so that rates and alerts see the series at once.
FENCING_REASONS = ("generation_refused", "lease_lost", "heartbeat_expired")
SOURCE_ERROR_REASONS = {"MetricsUnavailable": "unavailable", "MetricsInvalid": "invalid"}
MOVE_PHASES = ("pending", "learning", "releasing", "promoting", "eager")
#: Rules besides the policy's (``bounds``: a size changed by the spec, not the policy); with every
#: direction they start at 0, since ``increase()`` cannot see the first increment of a series that
#: appears with it.
DERIVED_RULES = ("bounds",)
DIRECTIONS = ("up", "down", "none")
CONDITION_STATUSES = ("True", "False", "Unknown")
ERROR_KINDS = ("metrics", "kafka", "kubernetes", "worker", "internal")

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_MOVE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
_LABEL_RE = re.compile(r"[^a-z0-9]+")


def _label(text: str) -> str:
    """A short label value: lower case, runs of other characters as one ``_``."""
    return _LABEL_RE.sub("_", text.lower()).strip("_")[:48] or "unknown"


def decision_rule(decision: Decision) -> str:
    """The rule that produced a policy decision (``Decision.rule``, a key of ``policy_model.RULES``)
    as a label value (``factor-follows`` -> ``factor_follows``)."""
    return _label(decision.rule)


def _policy_rules() -> tuple[str, ...]:
    """The rules a decision can name, as label values."""
    return tuple(_label(r) for r in RULES)


def decision_direction(before: tuple[int, int], decision: Any) -> str:
    """``up`` when the decision adds lanes (replicas x factor; at equal lanes, more replicas), ``down``
    when it removes them, ``none`` when (replicas, factor) stay."""
    after = (int(decision.replicas), int(decision.factor))
    if after == before:
        return "none"
    lanes_before, lanes_after = before[0] * before[1], after[0] * after[1]
    if lanes_after > lanes_before or (lanes_after == lanes_before and after[0] > before[0]):
        return "up"
    return "down"


class OperatorMetrics:
    """The operator's registry and its hooks: :meth:`observe_tick` after a control-loop pass,
    :meth:`timed` around a handler, :meth:`control` to count fencing seen through worker calls."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        consumer = ["namespace", "consumer"]
        self.reconciles = Counter(
            "multilane_operator_reconciles_total",
            "Reconciliations of ParallelConsumer children, by result (applied, held, error).",
            ["result"],
            registry=r,
        )
        self.ticks = Counter("multilane_operator_ticks_total", "Control-loop passes.", registry=r)
        self.decisions = Counter(
            "multilane_operator_decisions_total",
            "Autoscaling decisions, by whether they changed replicas or factor.",
            ["changed"],
            registry=r,
        )
        self.errors = Counter(
            "multilane_operator_errors_total",
            "Errors by kind (metrics, kafka, kubernetes, worker, internal).",
            ["kind"],
            registry=r,
        )
        for kind in ERROR_KINDS:
            self.errors.labels(kind)
        self.reconcile_duration = Histogram(
            "multilane_operator_reconcile_duration_seconds",
            "Duration of a handler: reconcile (children) or tick (one control-loop pass).",
            ["handler"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.decision_duration = Histogram(
            "multilane_operator_decision_duration_seconds",
            "Duration of a scaling step: metric sample, workers' busy lanes, policy.",
            consumer,
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.scaling_decisions = Counter(
            "multilane_operator_scaling_decisions_total",
            "Autoscaling decisions by the rule that fired and direction (up, down, none).",
            [*consumer, "rule", "direction"],
            registry=r,
        )
        self.moves_in_flight = Gauge(
            "multilane_operator_moves_in_flight",
            "Partition moves under way, by phase (eager: a release-then-grant change).",
            [*consumer, "phase"],
            registry=r,
        )
        self.move_duration = Histogram(
            "multilane_operator_move_duration_seconds",
            "Completed partition moves: from the target's learn call (or the release) to the promotion.",
            [*consumer, "mode"],
            buckets=_MOVE_BUCKETS,
            registry=r,
        )
        self.handoff_pause = Histogram(
            "multilane_operator_handoff_pause_seconds",
            "Completed partition moves: from the release call to the promotion (no owner processes).",
            [*consumer, "mode"],
            buckets=_MOVE_BUCKETS,
            registry=r,
        )
        self.learner_timeouts = Counter(
            "multilane_operator_learner_timeouts_total",
            "Moves given up because the learner did not catch up within learnerTimeoutSeconds.",
            consumer,
            registry=r,
        )
        self.fencing_events = Counter(
            "multilane_operator_fencing_events_total",
            "Fencing seen by the operator: a worker refused a stale generation (409), reported a lost "
            "Lease, or was killed after its heartbeat expired (local platform).",
            [*consumer, "reason"],
            registry=r,
        )
        self.metric_source_errors = Counter(
            "multilane_operator_metric_source_errors_total",
            "Scaling steps whose metric sample failed (unavailable, invalid); the last decision holds.",
            [*consumer, "reason"],
            registry=r,
        )
        self.replicas = Gauge("multilane_operator_replicas", "Alive workers.", consumer, registry=r)
        self.factor = Gauge(
            "multilane_operator_factor", "Decided factor (lanes per partition).", consumer, registry=r
        )
        self.replicas_max = Gauge(
            "multilane_operator_replicas_max",
            "spec.scaling.maxReplicas (or the pinned spec.scaling.replicas).",
            consumer,
            registry=r,
        )
        self.factor_max = Gauge(
            "multilane_operator_factor_max", "spec.scaling.maxFactor.", consumer, registry=r
        )
        self.assignment_generation = Gauge(
            "multilane_operator_assignment_generation",
            "Assignment generation in force.",
            consumer,
            registry=r,
        )
        self.consumer_condition = Gauge(
            "multilane_consumer_condition",
            "Conditions of a ParallelConsumer as last written to its status: 1 for the condition's "
            "status (True, False, Unknown), 0 for the others.",
            [*consumer, "type", "status"],
            registry=r,
        )
        self.leader = Gauge(
            "multilane_operator_leader",
            "1 while this operator replica runs the control loops (it holds the leader Lease, or runs "
            "without leader election); 0 while it waits as a standby.",
            registry=r,
        )
        self._per_consumer: tuple[MetricWrapperBase, ...] = (
            self.decision_duration, self.scaling_decisions, self.moves_in_flight, self.move_duration,
            self.handoff_pause, self.learner_timeouts, self.fencing_events, self.metric_source_errors,
            self.replicas, self.factor, self.replicas_max, self.factor_max, self.assignment_generation,
            self.consumer_condition,
        )  # fmt: skip
        # (namespace, consumer) -> label tuples created per metric (for forget)
        self._children: dict[tuple[str, str], set[tuple[int, tuple[str, ...]]]] = {}
        self._servers: list[Any] = []

    # -- serving ---------------------------------------------------------------------------------------

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` on a thread; returns the bound port (``port=0``: a free one)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._servers.append(server)
        return int(server.server_port)

    def stop(self) -> None:
        """Stop the HTTP servers started by :meth:`serve`."""
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()

    # -- per-consumer series ---------------------------------------------------------------------------

    def _child(self, metric: MetricWrapperBase, namespace: str, consumer: str, *extra: str) -> Any:
        values = (namespace, consumer, *extra)
        self._children.setdefault((namespace, consumer), set()).add((id(metric), values))
        return metric.labels(*values)

    def _known(self, namespace: str, consumer: str) -> None:
        """Create the per-consumer series at 0 (once): they exist before the first event, and
        ``increase()``/``rate()`` see the first event (a series that appears with it has no increase)."""
        if (namespace, consumer) in self._children:
            return
        self._child(self.learner_timeouts, namespace, consumer)
        for reason in FENCING_REASONS:
            self._child(self.fencing_events, namespace, consumer, reason)
        for reason in SOURCE_ERROR_REASONS.values():
            self._child(self.metric_source_errors, namespace, consumer, reason)
        for phase in MOVE_PHASES:
            self._child(self.moves_in_flight, namespace, consumer, phase).set(0)
        self._child(self.decision_duration, namespace, consumer)
        for mode in ("restore", "eager"):
            self._child(self.move_duration, namespace, consumer, mode)
            self._child(self.handoff_pause, namespace, consumer, mode)
        for rule in (*DERIVED_RULES, *_policy_rules()):
            for direction in DIRECTIONS:
                self._child(self.scaling_decisions, namespace, consumer, rule, direction)

    def forget(self, namespace: str, name: str) -> None:
        """Remove every series of a deleted consumer."""
        by_id = {id(m): m for m in self._per_consumer}
        for metric_id, values in self._children.pop((namespace, name), set()):
            try:
                by_id[metric_id].remove(*values)
            except KeyError:
                pass

    def set_leader(self, leading: bool) -> None:
        """This replica started (True) or stopped (False) running the control loops."""
        self.leader.set(1 if leading else 0)

    def observe_conditions(self, namespace: str, consumer: str, conditions: Iterable[Any]) -> None:
        """The conditions of a status just written (``status.conditions``): for each type, 1 on its
        status and 0 on the other two (an unknown status counts as ``Unknown``)."""
        for cond in conditions:
            if not isinstance(cond, Mapping) or not cond.get("type"):
                continue
            now = str(cond.get("status"))
            now = now if now in CONDITION_STATUSES else "Unknown"
            for status in CONDITION_STATUSES:
                child = self._child(self.consumer_condition, namespace, consumer, str(cond["type"]), status)
                child.set(1 if status == now else 0)

    def fencing(self, namespace: str, consumer: str, reason: str) -> None:
        self._known(namespace, consumer)
        self._child(self.fencing_events, namespace, consumer, reason).inc()

    @contextmanager
    def timed(self, handler: str) -> Iterator[None]:
        """Observe the duration of the block under ``handler`` (also when it raises)."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.reconcile_duration.labels(handler).observe(time.monotonic() - started)

    def control(
        self, inner: WorkerControl, namespace: str, consumer: str
    ) -> MeteredWorkerControl | MeteredHandoffControl:
        """``inner`` wrapped so that fencing seen through its calls is counted (keeps the learner
        calls when ``inner`` has them)."""
        self._known(namespace, consumer)

        def on_fence(reason: str) -> None:
            self.fencing(namespace, consumer, reason)

        if isinstance(inner, HandoffControl):
            return MeteredHandoffControl(inner, on_fence)
        return MeteredWorkerControl(inner, on_fence)

    def observe_tick(
        self,
        namespace: str,
        consumer: str,
        result: TickResult,
        max_replicas: int | None = None,
        max_factor: int | None = None,
    ) -> None:
        """Record what one ``ConsumerController.tick`` did (decision, moves, learner timeouts, source
        errors, the gauges) from its :class:`~multilane.operator.controller.TickResult`."""
        self._known(namespace, consumer)
        status = result.status
        # decisions
        if result.decided and result.decision is not None:
            self.decisions.labels(str(result.changed).lower()).inc()
            before = result.decided_from or (int(result.decision.replicas), int(result.decision.factor))
            direction = decision_direction(before, result.decision)
            # A size the policy held but that differs from the previous decision was moved by the
            # spec (changed bounds, a pinned replica count): rule "bounds".
            rule = "bounds" if direction != "none" and not result.changed else decision_rule(result.decision)
            self._child(self.scaling_decisions, namespace, consumer, rule, direction).inc()
            if result.decision_s is not None:
                self._child(self.decision_duration, namespace, consumer).observe(result.decision_s)
        if result.source_error in SOURCE_ERROR_REASONS:
            self.errors.labels("metrics").inc()
            reason = SOURCE_ERROR_REASONS[result.source_error]
            self._child(self.metric_source_errors, namespace, consumer, reason).inc()
        # moves
        for phase, count in moves_by_phase(status).items():
            self._child(self.moves_in_flight, namespace, consumer, phase).set(count)
        self.observe_handoffs(namespace, consumer, result.handoffs)
        timeouts = sum(1 for e in result.events if e.reason == "LearnerTimeout")
        if timeouts:
            self._child(self.learner_timeouts, namespace, consumer).inc(timeouts)
        # gauges
        if "replicas" in status:
            self._child(self.replicas, namespace, consumer).set(float(status["replicas"]))
        if "factor" in status:
            self._child(self.factor, namespace, consumer).set(float(status["factor"]))
        if max_replicas is not None:
            self._child(self.replicas_max, namespace, consumer).set(max_replicas)
        if max_factor is not None:
            self._child(self.factor_max, namespace, consumer).set(max_factor)
        generation = (status.get("assignment") or {}).get("generation")
        if generation is not None:
            self._child(self.assignment_generation, namespace, consumer).set(float(generation))

    def observe_handoffs(self, namespace: str, consumer: str, records: Iterable[HandoffRecord]) -> None:
        for record in records:
            mode = "eager" if record.eager else "restore"
            self._child(self.move_duration, namespace, consumer, mode).observe(
                max(0.0, record.learn_s + record.pause_s)
            )
            self._child(self.handoff_pause, namespace, consumer, mode).observe(max(0.0, record.pause_s))


def moves_by_phase(status: Mapping[str, Any]) -> dict[str, int]:
    """Moves under way per phase, from ``status.rollout`` (restore-before-handoff) and
    ``status.assignment.pending`` (an eager change: partitions whose owner changes). Pure."""
    counts = dict.fromkeys(MOVE_PHASES, 0)
    rollout = status.get("rollout") or {}
    for move in rollout.get("moves") or []:
        phase = str(move.get("phase", "pending")) if isinstance(move, Mapping) else ""
        if phase in counts:
            counts[phase] += 1
    pending = (status.get("assignment") or {}).get("pending")
    if isinstance(pending, Mapping):
        members = (status.get("assignment") or {}).get("members") or []
        owner_now = {p: m.get("worker") for m in members for p in m.get("partitions") or []}
        for member in pending.get("members") or []:
            for p in member.get("partitions") or []:
                if owner_now.get(p) != member.get("worker"):
                    counts["eager"] += 1
    return counts


class MeteredWorkerControl:
    """A worker control that reports fencing to ``on_fence(reason)``: a 409 on an assignment push
    (``generation_refused``: the worker has seen a higher generation) and a worker's status turning
    ``fenced`` (``lease_lost``; counted once per transition). Every other call passes through."""

    def __init__(self, inner: WorkerControl, on_fence: Callable[[str], None]) -> None:
        self.inner = inner
        self.on_fence = on_fence
        self._fenced: dict[str, bool] = {}  # base_url -> fenced in its last status

    async def status(self, base_url: str) -> dict[str, Any]:
        answer = await self.inner.status(base_url)
        fenced = bool(answer.get("fenced"))
        if fenced and not self._fenced.get(base_url, False):
            self.on_fence("lease_lost")
        self._fenced[base_url] = fenced
        return answer

    async def assign(
        self,
        base_url: str,
        generation: int,
        partitions: Iterable[str],
        release_deadline_s: float,
        handovers: Mapping[str, Handover] | None = None,
    ) -> list[ReleasedPartition]:
        try:
            if handovers:  # only when given: an inner control may take none
                return await self.inner.assign(
                    base_url, generation, partitions, release_deadline_s, handovers
                )
            return await self.inner.assign(base_url, generation, partitions, release_deadline_s)
        except WorkerFencedError:
            self.on_fence("generation_refused")
            raise

    async def set_factor(self, base_url: str, factor: int) -> int:
        return await self.inner.set_factor(base_url, factor)

    def __getattr__(self, name: str) -> Any:  # pause, resume, close, ...
        return getattr(self.inner, name)


class MeteredHandoffControl:
    """A :class:`MeteredWorkerControl` (its calls metered the same way) plus the learner calls of a
    ``HandoffControl``, passed through to ``inner``."""

    def __init__(self, inner: HandoffControl, on_fence: Callable[[str], None]) -> None:
        self.inner = inner
        self.metered = MeteredWorkerControl(inner, on_fence)

    async def status(self, base_url: str) -> dict[str, Any]:
        return await self.metered.status(base_url)

    async def assign(
        self,
        base_url: str,
        generation: int,
        partitions: Iterable[str],
        release_deadline_s: float,
        handovers: Mapping[str, Handover] | None = None,
    ) -> list[ReleasedPartition]:
        return await self.metered.assign(base_url, generation, partitions, release_deadline_s, handovers)

    async def set_factor(self, base_url: str, factor: int) -> int:
        return await self.metered.set_factor(base_url, factor)

    async def learn(self, base_url: str, partitions: Iterable[str]) -> None:
        await self.inner.learn(base_url, partitions)

    async def drop(self, base_url: str, partitions: Iterable[str]) -> None:
        await self.inner.drop(base_url, partitions)

    def __getattr__(self, name: str) -> Any:  # pause, resume, close, ...
        return getattr(self.inner, name)
