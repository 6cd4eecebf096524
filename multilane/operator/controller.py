"""``ConsumerController``: one control-loop pass for one consumer, platform-agnostic. Does I/O only
through what it is given (a :class:`Platform`, a :class:`WorkerControl`, a :class:`MetricSource`, a
persist callback), so the Kubernetes handlers and a local subprocess platform share it.

A pass (:meth:`ConsumerController.tick`), numbered as in the code:

1. Scaling, when due (``interval_s`` since the last decision): sample the metric source. A source
   that is unreachable or answers nonsense holds the last decision (condition Degraded with reason
   ``MetricsUnavailable``/``MetricsInvalid``); otherwise feed :class:`AutoscalePolicy` and record the
   decision (``status.lastDecision``, the new PolicyState, and an Event when it changes replicas or
   factor: a hold posts none).
2. Replicas: scale up at once (``ensure_workers``); scale down only after the assignment no longer
   gives partitions to the workers that go away (release before removal). Day-2 replacement (a
   platform that is a :class:`WorkerReplacer`): one worker on an outdated pod template is kept out
   of the eligible workers, so step 3 moves its partitions to warm owners; it is deleted once it owns
   nothing and no change runs (:mod:`multilane.operator.rollout.replacement`).
3. Assignment: one step of the :class:`AssignmentCoordinator` protocol over the workers that stay
   (or, when a :class:`~multilane.operator.handoff.HandoffExecutor` is given -- state enabled -- one
   step of its restore-before-handoff rollout, persisted in ``status.rollout``); when no change is
   pending, ``sync`` re-pushes the assignment and the factor where a worker disagrees (restarted
   workers).
4. Status: replicas, factor, lag, rates, conditions Ready/Scaling/Rebalancing/Degraded.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from multilane.operator.decision.planner import AssignmentPlanner, parse_partition
from multilane.operator.decision.policy import (
    AutoscalePolicy,
    Decision,
    Observation,
    PolicyConfig,
    PolicyState,
)
from multilane.operator.platform import Platform, WorkerInfo, WorkerReplacer, parse_time
from multilane.operator.rollout.assignment import (
    AssignmentCoordinator,
    AssignmentState,
    Persist,
    StepResult,
    WorkerControl,
)
from multilane.operator.rollout.handoff import HandoffExecutor, HandoffRecord
from multilane.operator.rollout.protocol import Rollout
from multilane.operator.rollout.replacement import ReplacementChoice, choose_replacement, ready_to_delete
from multilane.operator.rollout.workers import WorkerUnreachableError
from multilane.operator.sources import (
    MetricSample,
    MetricsInvalidError,
    MetricSource,
    MetricsUnavailableError,
    QueryContext,
)
from multilane.operator.spec.children import ConsumerRef
from multilane.operator.spec.conditions import condition, now_iso, set_condition
from multilane.operator.spec.validation import ConsumerSpec

__all__ = ["ConsumerController", "DecidingPolicy", "EventRecord", "TickResult", "policy_config"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EventRecord:
    type: str  # "Normal" | "Warning"
    reason: str
    message: str


@dataclass
class TickResult:
    """What the pass wants written: a status merge-patch, Events, and the PolicyState to keep."""

    status: dict[str, Any] = field(default_factory=dict)
    events: list[EventRecord] = field(default_factory=list)
    policy_state: PolicyState | None = None
    decided: bool = False
    changed: bool = False  # the decision changed replicas or factor
    # For the operator's metrics (multilane.operator.metrics.OperatorMetrics.observe_tick):
    decision: Decision | None = None  # the policy's decision of this pass
    decided_from: tuple[int, int] | None = None  # (replicas, factor) of the previous decision
    decision_s: float | None = None  # step 1 when it ran: sample, workers' busy lanes, policy
    source_error: str | None = None  # "MetricsUnavailable" / "MetricsInvalid" when the sample failed
    handoffs: list[HandoffRecord] = field(default_factory=list)  # moves completed in this pass


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


def _global_index(partitions: Sequence[str]) -> dict[str, int]:
    """Topics in order, partitions in order: one index per partition for the policy."""
    ordered = sorted(partitions, key=parse_partition)
    return {p: i for i, p in enumerate(ordered)}


class ConsumerController:
    """Stateless across passes except for what callers persist; ``clock`` is seconds (epoch)."""

    def __init__(
        self,
        platform: Platform,
        control: WorkerControl,
        release_deadline_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        handoff: HandoffExecutor | None = None,
        policy_factory: Callable[[PolicyConfig], DecidingPolicy] | None = None,
    ) -> None:
        self.platform = platform
        self.control = control
        self.release_deadline_s = release_deadline_s
        self.clock = clock
        # With state enabled: restore-before-handoff rollouts replace the eager change of step 3.
        self.handoff = handoff
        # The policy for a config: AutoscalePolicy; benchmarks give baselines (same decide shape).
        self.policy_factory: Callable[[PolicyConfig], DecidingPolicy] = policy_factory or AutoscalePolicy

    async def tick(
        self,
        ref: ConsumerRef,
        spec: ConsumerSpec,
        status: Mapping[str, Any],
        policy_state: PolicyState,
        partitions: Sequence[str],
        source: MetricSource,
        persist_assignment: Persist,
    ) -> TickResult:
        result = TickResult()
        conditions: list[dict[str, Any]] = list(status.get("conditions") or [])
        now = self.clock()
        stamp = now_iso()
        last = dict(status.get("lastDecision") or {})
        target_replicas = int(last.get("replicas") or spec.replicas or spec.min_replicas)
        if spec.replicas is not None:
            target_replicas = spec.replicas  # pinned through the scale subresource
        factor = int(status.get("factor") or last.get("factor") or spec.min_factor)
        target_replicas = min(max(target_replicas, spec.min_replicas), spec.max_replicas)
        factor = min(max(factor, spec.min_factor), spec.max_factor)
        workers = await self.platform.list_workers(ref)
        alive = [w for w in workers if w.alive]

        # 1. Scaling, when due.
        degraded: tuple[str, str] | None = None
        decided_at = parse_time(last.get("time"))
        last_time = decided_at.timestamp() if decided_at else 0.0
        if now - last_time >= spec.interval_s:
            decision_started = time.monotonic()
            ctx = QueryContext(ref.namespace, ref.name, spec.consumer_group, list(partitions))
            try:
                sample = await source.sample(ctx)
            except MetricsUnavailableError as exc:
                degraded = (
                    "MetricsUnavailable",
                    f"metric source unreachable, holding the last decision: {exc}",
                )
            except MetricsInvalidError as exc:
                degraded = (
                    "MetricsInvalid",
                    f"metric source answered nonsense, holding the last decision: {exc}",
                )
            else:
                result.status.update(self._sample_status(sample))
                if sample.input_rate is None or sample.processing_rate is None:
                    log.info("%s/%s: metrics warming up (no rates yet)", ref.namespace, ref.name)
                else:
                    decision_status, event, state, result.decision = self._decide(
                        spec,
                        partitions,
                        sample,
                        policy_state,
                        target_replicas,
                        factor,
                        len(alive),
                        now,
                        stamp,
                        busy_lanes=await self._busy_lanes(alive, sample),
                        rebalancing=_rebalancing(status, workers, target_replicas),
                    )
                    result.status["lastDecision"] = decision_status
                    if result.decision.changed:  # Events only for changes, never for a hold
                        result.events.append(event)
                    result.policy_state = state
                    result.decided = True
                    # the size decided before (bounds and a pinned count may have moved it since)
                    result.decided_from = (
                        int(last.get("replicas") or target_replicas),
                        int(last.get("factor") or factor),
                    )
                    result.decision_s = time.monotonic() - decision_started
                    result.changed = (int(decision_status["replicas"]), int(decision_status["factor"])) != (
                        target_replicas,
                        factor,
                    )
                    target_replicas = int(decision_status["replicas"])
                    factor = int(decision_status["factor"])
            result.source_error = degraded[0] if degraded else None
            previous = condition(conditions, "Degraded") or {}
            if degraded and (previous.get("status") != "True" or previous.get("reason") != degraded[0]):
                result.events.append(EventRecord("Warning", degraded[0], degraded[1]))  # on transition only

        # 2. Replicas: up at once, down after release.
        assignment = AssignmentState.from_status(status.get("assignment"))
        current = await self.platform.current_workers(ref)
        if target_replicas > current:
            await self.platform.ensure_workers(ref, target_replicas)
            result.events.append(EventRecord("Normal", "ScaledUp", f"workers {current} -> {target_replicas}"))
        stays = {w.name for w in workers if w.ordinal < target_replicas}
        replacement = await self._replacement(ref, workers, target_replicas)
        if replacement.drain:
            stays.discard(replacement.drain)  # its partitions move to warm owners first

        # 3. Assignment.
        coordinator = AssignmentCoordinator(
            self.control,
            AssignmentPlanner(max_moves=spec.max_moves),
            persist_assignment,
            release_deadline_s=self.release_deadline_s,
        )
        if self.handoff is not None:
            rollout_status = status.get("rollout")
            hstep = await self.handoff.step(
                assignment,
                Rollout.from_dict(rollout_status) if rollout_status else None,
                workers,
                partitions,
                eligible=stays,
                replicas=target_replicas,
            )
            result.status["rollout"] = hstep.rollout.to_dict() if hstep.rollout is not None else None
            result.events.extend(EventRecord(k, r, m) for k, r, m in hstep.events)
            result.handoffs = list(hstep.handoffs)
            step = StepResult(
                state=hstep.assignment,
                in_progress=hstep.in_progress,
                committed=bool(hstep.handoffs),
                moves=len(hstep.handoffs),
                blocked=hstep.blocked,
            )
            rollout_running = hstep.rollout is not None
        else:
            step = await coordinator.step(assignment, workers, partitions, eligible=stays)
            rollout_running = False
        assignment = step.state
        sync_problems: list[str] = []
        if assignment.pending is None:
            sync_problems = await coordinator.sync(assignment, alive, factor)
        if step.committed:
            result.events.append(
                EventRecord(
                    "Normal",
                    "Rebalanced",
                    f"assignment generation {assignment.generation} in force "
                    f"({step.moves} partition(s) moved)",
                )
            )
        await self._replace(ref, replacement, assignment, rollout_running, result)
        leaving_own = any(assignment.members.get(w.name) for w in workers if w.name not in stays)
        if target_replicas < current and assignment.pending is None and not leaving_own:
            await self.platform.ensure_workers(ref, target_replicas)
            result.events.append(
                EventRecord("Normal", "ScaledDown", f"workers {current} -> {target_replicas}")
            )

        # 4. Status.
        covered = {p for ps in assignment.members.values() for p in ps}
        all_assigned = bool(partitions) and set(partitions) <= covered and assignment.pending is None
        scaling = target_replicas != current or any(
            not w.alive for w in workers if w.ordinal < target_replicas
        )
        conditions = set_condition(
            conditions,
            "Scaling",
            scaling,
            "ScalingWorkers" if scaling else "Stable",
            f"{len(alive)} of {target_replicas} workers alive" if scaling else f"{target_replicas} workers",
            now=stamp,
        )
        rebalancing = assignment.pending is not None or rollout_running
        conditions = set_condition(
            conditions,
            "Rebalancing",
            rebalancing,
            "HandoffInProgress" if rebalancing else "Assigned",
            step.blocked or ("change pending" if rebalancing else f"generation {assignment.generation}"),
            now=stamp,
        )
        if degraded:
            conditions = set_condition(conditions, "Degraded", True, degraded[0], degraded[1], now=stamp)
        elif sync_problems:
            conditions = set_condition(
                conditions, "Degraded", True, "WorkerUnreachable", "; ".join(sync_problems)[:1000], now=stamp
            )
        else:
            conditions = set_condition(conditions, "Degraded", False, "AsExpected", "", now=stamp)
        ready = all_assigned and not sync_problems
        reason = "AllPartitionsAssigned" if ready else ("Rebalancing" if rebalancing else "WaitingForWorkers")
        message = (
            f"{len(covered)} partitions on {len(assignment.members)} workers, factor {factor}"
            if ready
            else step.blocked
            or f"{len(alive)} workers alive, {len(covered)}/{len(partitions)} partitions assigned"
        )
        conditions = set_condition(conditions, "Ready", ready, reason, message, now=stamp)
        result.status.update(
            {
                "replicas": len(alive),
                "factor": factor,
                "conditions": conditions,
                "assignment": assignment.to_status(),
            }
        )
        return result

    async def _replacement(
        self, ref: ConsumerRef, workers: Sequence[WorkerInfo], replicas: int
    ) -> ReplacementChoice:
        """Step 2's replacement choice (nothing on a platform without pod templates)."""
        if not isinstance(self.platform, WorkerReplacer):
            return ReplacementChoice()
        return choose_replacement(workers, await self.platform.desired_revision(ref), replicas)

    async def _replace(
        self,
        ref: ConsumerRef,
        replacement: ReplacementChoice,
        assignment: AssignmentState,
        rollout_running: bool,
        result: TickResult,
    ) -> None:
        """Delete the replacement's worker once it owns nothing (or at once: dead, or alone)."""
        running = assignment.pending is not None or rollout_running
        victim = ready_to_delete(replacement, assignment.members, running)
        if victim is None or not isinstance(self.platform, WorkerReplacer):
            return
        await self.platform.replace_worker(ref, victim)
        left = len(replacement.outdated) - 1
        how = (
            "deleted at once (not alive, or no other worker to hand its partitions to)"
            if replacement.delete_now
            else "deleted after handing its partitions to warm owners"
        )
        result.events.append(
            EventRecord(
                "Normal", "WorkerReplaced", f"{victim} ran an outdated pod template: {how} ({left} more)"
            )
        )

    async def _busy_lanes(self, alive: Sequence[WorkerInfo], sample: MetricSample) -> float | None:
        """Lanes busy on average, for the policy's per-lane rate (steps 1-3); None when unknown.

        1. Ask every alive worker for ``/v1/status`` (in parallel): its ``busy_lanes`` (processing
           seconds completed per second) and ``processing_rate``, over the same window.
        2. Unknown (None) when a worker does not answer or report them, or nothing was processed:
           the policy then falls back to its own estimate.
        3. Scale to the metric source's processing rate: ``busy = sample rate / (sum of worker rates /
           sum of busy lanes)``, so that ``processing_rate / busy_lanes`` in the policy is exactly
           the per-lane rate the workers measured, whatever window the source uses.
        """
        if not alive or not sample.processing_rate:
            return None

        # 1. statuses
        async def one(worker: WorkerInfo) -> tuple[float, float] | None:
            try:
                st = await self.control.status(worker.control_url)
                return float(st["busy_lanes"]), float(st["processing_rate"])
            except (WorkerUnreachableError, KeyError, TypeError, ValueError) as exc:
                log.info("no busy lanes from %s: %s", worker.name, exc)
                return None

        answers = await asyncio.gather(*(one(w) for w in alive))
        # 2. unknown?
        if any(a is None for a in answers):
            return None
        busy = sum(a[0] for a in answers if a is not None)
        rate = sum(a[1] for a in answers if a is not None)
        if not (math.isfinite(busy) and math.isfinite(rate)) or busy <= 0 or rate <= 0:
            return None
        # 3. per-lane rate of the workers, applied to the source's rate
        return float(sample.processing_rate) * busy / rate

    @staticmethod
    def _sample_status(sample: MetricSample) -> dict[str, Any]:
        out: dict[str, Any] = {"lag": sample.total_lag}
        if sample.input_rate is not None:
            out["inputRate"] = round(sample.input_rate, 3)
        if sample.processing_rate is not None:
            out["processingRate"] = round(sample.processing_rate, 3)
        return out

    def _decide(
        self,
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
    ) -> tuple[dict[str, Any], EventRecord, PolicyState, Decision]:
        index = _global_index(partitions)
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
        policy = self.policy_factory(policy_config(spec, len(partitions)))
        decision, new_state = policy.decide(obs, state)
        inputs = {k: v for k, v in decision.inputs.items() if _json_safe(v)}
        inputs.update({"aliveWorkers": alive, "totalLag": sample.total_lag, "rebalancing": rebalancing})
        status = {
            "time": stamp,
            "replicas": decision.replicas,
            "factor": decision.factor,
            "rule": decision.rule,
            "reason": decision.reason,
            "inputs": inputs,
            "warnings": list(decision.warnings),
        }
        verb = "scale" if decision.changed else "hold"
        event = EventRecord(
            "Normal",
            "ScalingDecision",
            f"{verb} [{decision.rule}]: replicas {replicas}->{decision.replicas}, factor "
            f"{factor}->{decision.factor}: {decision.reason}",
        )
        return status, event, new_state, decision


def _rebalancing(status: Mapping[str, Any], workers: Sequence[WorkerInfo], replicas: int) -> bool:
    """Pods are starting or partitions moving, as of the last pass: an assignment change is pending
    (``status.assignment.pending``), a restore-before-handoff rollout runs (``status.rollout``), or a
    worker the decided size includes is not alive (starting or restarting)."""
    if AssignmentState.from_status(status.get("assignment")).pending is not None or status.get("rollout"):
        return True
    alive = {w.ordinal for w in workers if w.alive}
    return any(i not in alive for i in range(replicas))


def _json_safe(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str | int | bool) or value is None:
        return True
    if isinstance(value, list | tuple):
        return all(_json_safe(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_safe(v) for k, v in value.items())
    return False
