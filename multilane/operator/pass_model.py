"""What each step of a control-loop pass found, typed, the one rendering of a pass's status, and the
decide step's pure parts (the policy's input and its decision as status). No I/O of its own (it
imports types of modules that do: ``MetricSample``, ``AssignmentState``).

:class:`~multilane.operator.controller.ConsumerController` runs a pass as four steps, each returning
one of these: ``observe`` -> :class:`PassView`, ``decide`` -> :class:`ScalingStep`, ``act`` ->
:class:`ActStep`, ``report`` -> :class:`ConsumerStatus`. Only :func:`render_status` turns the typed
status into the ``status`` merge-patch of the ParallelConsumer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from multilane.operator.decision.planner import parse_partition
from multilane.operator.decision.policy import Decision, Observation, PolicyConfig, PolicyState
from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.assignment import AssignmentState
from multilane.operator.rollout.handoff_model import HandoffRecord
from multilane.operator.rollout.protocol import Rollout
from multilane.operator.sources import MetricSample
from multilane.operator.spec.conditions import set_condition
from multilane.operator.spec.validation import ConsumerSpec

__all__ = [
    "BREAKER_OPEN",
    "ActStep",
    "ConditionValue",
    "ConsumerStatus",
    "DecidingPolicy",
    "DecisionStatus",
    "EventRecord",
    "PassView",
    "SampleStatus",
    "ScalingStep",
    "breaker_event",
    "breaker_message",
    "decide_scaling",
    "global_index",
    "json_safe",
    "policy_config",
    "rebalancing_before",
    "render_status",
]


@dataclass(frozen=True, slots=True)
class EventRecord:
    type: str  # "Normal" | "Warning"
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class ConditionValue:
    """One condition a pass sets (its ``lastTransitionTime`` is kept by :func:`set_condition`)."""

    type: str
    status: bool
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class SampleStatus:
    """The metric sample's figures: ``status.lag``, ``inputRate``, ``processingRate`` (None: unknown,
    not written)."""

    lag: int
    input_rate: float | None
    processing_rate: float | None

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lag": self.lag}
        if self.input_rate is not None:
            out["inputRate"] = round(self.input_rate, 3)
        if self.processing_rate is not None:
            out["processingRate"] = round(self.processing_rate, 3)
        return out


@dataclass(frozen=True, slots=True)
class DecisionStatus:
    """``status.lastDecision``: the policy's decision of a pass, with its JSON-safe inputs."""

    time: str
    replicas: int
    factor: int
    rule: str
    reason: str
    inputs: Mapping[str, Any]
    warnings: tuple[str, ...]

    def to_status(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "replicas": self.replicas,
            "factor": self.factor,
            "rule": self.rule,
            "reason": self.reason,
            "inputs": dict(self.inputs),
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class PassView:
    """Step 1 (observe): what the pass starts from. ``replicas``/``factor``: the last decision within
    the spec's bounds (a pinned ``spec.scaling.replicas`` wins)."""

    now: float  # clock seconds (epoch)
    stamp: str  # the pass's time for conditions and the decision
    last: Mapping[str, Any]  # status.lastDecision as read
    replicas: int
    factor: int
    workers: Sequence[WorkerInfo]
    alive: Sequence[WorkerInfo]
    conditions: Sequence[Mapping[str, Any]]  # status.conditions as read


@dataclass
class ScalingStep:
    """Step 2 (decide): the size the pass goes on with, and what the policy found when it ran."""

    replicas: int  # the decided replica count (the observed one when no decision ran)
    factor: int
    sample: SampleStatus | None = None  # None: not due, or the source failed
    last_decision: DecisionStatus | None = None  # set exactly when the policy decided
    decision: Decision | None = None
    policy_state: PolicyState | None = None
    decided_from: tuple[int, int] | None = None  # (replicas, factor) of the previous decision
    decision_s: float | None = None
    changed: bool = False  # the decision changed replicas or factor
    degraded: ConditionValue | None = None  # MetricsUnavailable / MetricsInvalid
    events: list[EventRecord] = field(default_factory=list)


@dataclass
class ActStep:
    """Step 3 (act): workers started or removed, the assignment after one protocol step."""

    current: int  # workers the platform ran before this step scaled
    assignment: AssignmentState
    blocked: str  # why a pending change could not finish ("" when it could)
    handoff: bool  # a restore-before-handoff executor ran the step (status.rollout is written)
    rollout: Rollout | None  # the rollout after the step (None: none runs)
    sync_problems: list[str] = field(default_factory=list)
    breakers: list[str] = field(default_factory=list)  # "POD: reason" of each open circuit breaker
    handoffs: list[HandoffRecord] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)

    @property
    def rebalancing(self) -> bool:
        return self.assignment.pending is not None or self.rollout is not None


@dataclass(frozen=True)
class ConsumerStatus:
    """Step 4 (report): the status a pass writes, typed; :func:`render_status` is its one rendering."""

    replicas: int  # alive workers
    factor: int
    assignment: AssignmentState
    conditions: tuple[ConditionValue, ...]  # set in this order onto the conditions read
    sample: SampleStatus | None = None
    last_decision: DecisionStatus | None = None
    handoff: bool = False  # write status.rollout (None when no rollout runs)
    rollout: Rollout | None = None

    def condition(self, type_: str) -> ConditionValue | None:
        return next((c for c in self.conditions if c.type == type_), None)


def render_status(
    status: ConsumerStatus, previous: Sequence[Mapping[str, Any]], stamp: str
) -> dict[str, Any]:
    """The status merge-patch of a pass: the typed status over the conditions read (``previous``)."""
    out: dict[str, Any] = {}
    if status.sample is not None:
        out.update(status.sample.to_status())
    if status.last_decision is not None:
        out["lastDecision"] = status.last_decision.to_status()
    if status.handoff:
        out["rollout"] = status.rollout.to_dict() if status.rollout is not None else None
    conditions: Sequence[Mapping[str, Any]] = previous
    for c in status.conditions:
        conditions = set_condition(conditions, c.type, c.status, c.reason, c.message, now=stamp)
    out.update(
        {
            "replicas": status.replicas,
            "factor": status.factor,
            "conditions": list(conditions),
            "assignment": status.assignment.to_status(),
        }
    )
    return out


BREAKER_OPEN = "CircuitBreakerOpen"  # Degraded's reason while a worker's circuit breaker is open


def breaker_message(breakers: Sequence[str]) -> str:
    """Degraded's message for open breakers ("POD: reason" each), at most 1000 characters."""
    return ("circuit breaker open (POST /breaker/reset on the pod, or restart it): "
            + "; ".join(breakers))[:1000]


def breaker_event(previous: Mapping[str, Any] | None, degraded: ConditionValue | None) -> EventRecord | None:
    """The Event of a pass for the circuit breaker, from Degraded as read and as the pass sets it:
    Warning ``CircuitBreakerOpen`` when it becomes the reason or its message (the pods, their
    reasons) changes; Normal ``CircuitBreakerClosed`` when it was the reason and Degraded clears
    (another reason taking over Degraded posts its own Event, or none: the breaker may still be open)."""
    was = previous is not None and previous.get("status") == "True" and previous.get("reason") == BREAKER_OPEN
    now = degraded is not None and degraded.status and degraded.reason == BREAKER_OPEN
    if now and degraded is not None and (not was or (previous or {}).get("message") != degraded.message):
        return EventRecord("Warning", BREAKER_OPEN, degraded.message)
    if was and (degraded is None or not degraded.status):
        return EventRecord("Normal", "CircuitBreakerClosed", "no worker's circuit breaker is open")
    return None


# ---- the decide step's pure parts ---------------------------------------------------------------


class DecidingPolicy(Protocol):
    """What the controller calls: :class:`AutoscalePolicy` or a baseline with the same shape."""

    def decide(self, obs: Observation, state: PolicyState) -> tuple[Decision, PolicyState]: ...


def policy_config(spec: ConsumerSpec, partitions: int) -> PolicyConfig:
    """The policy's bounds; a fixed ``spec.scaling.replicas`` (scale subresource) pins replicas."""
    min_r, max_r = spec.min_replicas, spec.max_replicas
    if spec.replicas is not None:
        min_r = max_r = spec.replicas
    return PolicyConfig(
        partitions=max(1, partitions),
        min_replicas=min_r,
        max_replicas=max_r,
        min_factor=spec.min_factor,
        max_factor=spec.max_factor,
        target_catchup_s=spec.target_catchup_s,
        max_lag=spec.max_lag,
        target_utilisation=spec.target_utilisation,
        scale_down_delay_s=spec.scale_down_delay_s,
        stabilisation_s=spec.stabilisation_s,
        max_lanes_per_replica=spec.max_lanes_per_replica,
    )


def global_index(partitions: Sequence[str]) -> dict[str, int]:
    """Topics in order, partitions in order: one index per partition for the policy."""
    ordered = sorted(partitions, key=parse_partition)
    return {p: i for i, p in enumerate(ordered)}


def decide_scaling(
    policy_factory: Callable[[PolicyConfig], DecidingPolicy],
    spec: ConsumerSpec,
    partitions: Sequence[str],
    sample: MetricSample,
    state: PolicyState,
    replicas: int,
    factor: int,
    alive: int,
    now: float,
    stamp: str,
    busy_lanes: float | None = None,
    rebalancing: bool = False,
) -> tuple[DecisionStatus, EventRecord, PolicyState, Decision]:
    """Step 2.3 of a pass: the policy over the sample; the decision as status and as an Event."""
    index = global_index(partitions)
    obs = Observation(
        now=now,
        lag_by_partition={index[p]: v for p, v in sample.lag.items() if p in index},
        input_rate=float(sample.input_rate or 0.0),
        processing_rate=float(sample.processing_rate or 0.0),
        replicas=replicas,
        factor=factor,
        busy_lanes=busy_lanes,
        rebalancing=rebalancing,
        ready_replicas=alive,
    )
    policy = policy_factory(policy_config(spec, len(partitions)))
    decision, new_state = policy.decide(obs, state)
    inputs = {k: v for k, v in decision.inputs.items() if json_safe(v)}
    inputs.update({"aliveWorkers": alive, "totalLag": sample.total_lag, "rebalancing": rebalancing})
    status = DecisionStatus(
        time=stamp,
        replicas=decision.replicas,
        factor=decision.factor,
        rule=decision.rule,
        reason=decision.reason,
        inputs=inputs,
        warnings=tuple(decision.warnings),
    )
    verb = "scale" if decision.changed else "hold"
    event = EventRecord(
        "Normal",
        "ScalingDecision",
        f"{verb} [{decision.rule}]: replicas {replicas}->{decision.replicas}, factor "
        f"{factor}->{decision.factor}: {decision.reason}",
    )
    return status, event, new_state, decision


def rebalancing_before(status: Mapping[str, Any], workers: Sequence[WorkerInfo], replicas: int) -> bool:
    """Pods are starting or partitions moving, as of the last pass: an assignment change is pending
    (``status.assignment.pending``), a restore-before-handoff rollout runs (``status.rollout``), or a
    worker the decided size includes is not alive (starting or restarting)."""
    if AssignmentState.from_status(status.get("assignment")).pending is not None or status.get("rollout"):
        return True
    alive = {w.ordinal for w in workers if w.alive}
    return any(i not in alive for i in range(replicas))


def json_safe(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str | int | bool) or value is None:
        return True
    if isinstance(value, list | tuple):
        return all(json_safe(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and json_safe(v) for k, v in value.items())
    return False
