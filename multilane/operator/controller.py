"""``ConsumerController``: one control-loop pass for one consumer, platform-agnostic. Does I/O only
through what it is given (a :class:`Platform`, a :class:`WorkerControl`, a :class:`MetricSource`, a
persist callback), so the Kubernetes handlers and a local subprocess platform share it.

A pass (:meth:`ConsumerController.tick`) is four named steps, numbered as in the code; each is a
method that returns what it found, typed (:mod:`multilane.operator.pass_model`), and the status
merge-patch is rendered in one place (:func:`~multilane.operator.pass_model.render_status`):

1. ``observe`` -> :class:`PassView`: the clock, the last decision's size within the spec's bounds,
   the workers and which are alive.
2. ``decide`` -> :class:`ScalingStep`: scaling, when due (``interval_s`` since the last decision):
   sample the metric source. A source that is unreachable or answers nonsense holds the last
   decision (condition Degraded with reason ``MetricsUnavailable``/``MetricsInvalid``); otherwise feed
   :class:`AutoscalePolicy` and record the decision (``status.lastDecision``, the new PolicyState, and
   an Event when it changes replicas or factor: a hold posts none).
3. ``act`` -> :class:`ActStep`: replicas up at once (``ensure_workers``), down only after the
   assignment no longer gives partitions to the workers that go away (release before removal).
   Day-2 replacement (a platform that is a :class:`WorkerReplacer`): one worker on an outdated pod
   template is kept out of the eligible workers, so its partitions move to warm owners; it is deleted
   once it owns nothing and no change runs (:mod:`multilane.operator.rollout.replacement`).
   Assignment: one step of the :class:`AssignmentCoordinator` protocol over the workers that stay
   (or, when a :class:`~multilane.operator.rollout.handoff.HandoffExecutor` is given -- state enabled
   -- one step of its restore-before-handoff rollout, persisted in ``status.rollout``); when no change
   is pending, ``sync`` re-pushes the assignment and the factor where a worker disagrees.
4. ``report`` -> :class:`ConsumerStatus`: replicas, factor, lag, rates, conditions
   Scaling/Rebalancing/Degraded/Ready (Degraded ``CircuitBreakerOpen`` while a worker's breaker is
   open, read by ``sync``; an Event when it opens, changes or closes).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from multilane.operator.decision.planner import AssignmentPlanner
from multilane.operator.decision.policy import AutoscalePolicy, Decision, PolicyConfig, PolicyState
from multilane.operator.pass_model import (
    BREAKER_OPEN,
    ActStep,
    ConditionValue,
    ConsumerStatus,
    DecidingPolicy,
    EventRecord,
    PassView,
    SampleStatus,
    ScalingStep,
    breaker_event,
    breaker_message,
    decide_scaling,
    policy_config,
    rebalancing_before,
    render_status,
)
from multilane.operator.platform import Platform, WorkerInfo, is_replacer, parse_time
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
from multilane.operator.spec.conditions import condition, now_iso
from multilane.operator.spec.validation import ConsumerSpec

__all__ = ["ConsumerController", "DecidingPolicy", "EventRecord", "TickResult", "policy_config"]

log = logging.getLogger(__name__)


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
    decision_s: float | None = None  # step 2 when it ran: sample, workers' busy lanes, policy
    source_error: str | None = None  # "MetricsUnavailable" / "MetricsInvalid" when the sample failed
    handoffs: list[HandoffRecord] = field(default_factory=list)  # moves completed in this pass


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
        """One pass: the four steps of the module docstring, each a method returning what it found."""
        # 1. Observe.
        view = await self.observe(ref, spec, status)
        # 2. Decide.
        scaling = await self.decide(ref, spec, status, view, policy_state, partitions, source)
        # 3. Act.
        acted = await self.act(ref, spec, status, view, scaling, partitions, persist_assignment)
        # 4. Report.
        report = self.report(view, scaling, acted, partitions)
        breaker = breaker_event(condition(view.conditions, "Degraded"), report.condition("Degraded"))
        return TickResult(
            status=render_status(report, view.conditions, view.stamp),
            events=[*scaling.events, *acted.events, *([breaker] if breaker else [])],
            policy_state=scaling.policy_state,
            decided=scaling.last_decision is not None,
            changed=scaling.changed,
            decision=scaling.decision,
            decided_from=scaling.decided_from,
            decision_s=scaling.decision_s,
            source_error=scaling.degraded.reason if scaling.degraded else None,
            handoffs=acted.handoffs,
        )

    async def observe(self, ref: ConsumerRef, spec: ConsumerSpec, status: Mapping[str, Any]) -> PassView:
        """Step 1: what the pass starts from.

        1. The clock, and the size of the last decision within the spec's bounds (a pinned
           ``spec.scaling.replicas`` wins).
        2. The workers the platform runs, and which of them are alive.
        """
        # 1. clock and size
        last = dict(status.get("lastDecision") or {})
        replicas = int(last.get("replicas") or spec.replicas or spec.min_replicas)
        if spec.replicas is not None:
            replicas = spec.replicas  # pinned through the scale subresource
        factor = int(status.get("factor") or last.get("factor") or spec.min_factor)
        now, stamp = self.clock(), now_iso()
        # 2. workers
        workers = await self.platform.list_workers(ref)
        return PassView(
            now=now,
            stamp=stamp,
            last=last,
            replicas=min(max(replicas, spec.min_replicas), spec.max_replicas),
            factor=min(max(factor, spec.min_factor), spec.max_factor),
            workers=workers,
            alive=[w for w in workers if w.alive],
            conditions=list(status.get("conditions") or []),
        )

    async def decide(
        self,
        ref: ConsumerRef,
        spec: ConsumerSpec,
        status: Mapping[str, Any],
        view: PassView,
        policy_state: PolicyState,
        partitions: Sequence[str],
        source: MetricSource,
    ) -> ScalingStep:
        """Step 2: scaling, when due (``interval_s`` since the last decision); else the observed size.

        1. Sample the metric source. Unreachable or nonsense: hold the last decision, Degraded
           (``MetricsUnavailable`` / ``MetricsInvalid``), a Warning Event on the transition only.
        2. No rates yet (warming up): the sample's figures only.
        3. Feed the policy (with the workers' busy lanes); an Event only when the decision changes
           replicas or factor.
        """
        step = ScalingStep(replicas=view.replicas, factor=view.factor)
        decided_at = parse_time(view.last.get("time"))
        last_time = decided_at.timestamp() if decided_at else 0.0
        if view.now - last_time < spec.interval_s:
            return step
        decision_started = time.monotonic()
        # 1. sample
        ctx = QueryContext(ref.namespace, ref.name, spec.consumer_group, list(partitions))
        try:
            sample = await source.sample(ctx)
        except MetricsUnavailableError as exc:
            step.degraded = ConditionValue(
                "Degraded",
                True,
                "MetricsUnavailable",
                f"metric source unreachable, holding the last decision: {exc}",
            )
        except MetricsInvalidError as exc:
            step.degraded = ConditionValue(
                "Degraded",
                True,
                "MetricsInvalid",
                f"metric source answered nonsense, holding the last decision: {exc}",
            )
        else:
            step.sample = SampleStatus(sample.total_lag, sample.input_rate, sample.processing_rate)
            if sample.input_rate is None or sample.processing_rate is None:
                # 2. warming up
                log.info("%s/%s: metrics warming up (no rates yet)", ref.namespace, ref.name)
            else:
                # 3. the policy
                decided, event, step.policy_state, step.decision = decide_scaling(
                    self.policy_factory,
                    spec,
                    partitions,
                    sample,
                    policy_state,
                    view.replicas,
                    view.factor,
                    len(view.alive),
                    view.now,
                    view.stamp,
                    busy_lanes=await self._busy_lanes(view.alive, sample),
                    rebalancing=rebalancing_before(status, view.workers, view.replicas),
                )
                step.last_decision = decided
                if step.decision.changed:  # Events only for changes, never for a hold
                    step.events.append(event)
                # the size decided before (bounds and a pinned count may have moved it since)
                step.decided_from = (
                    int(view.last.get("replicas") or view.replicas),
                    int(view.last.get("factor") or view.factor),
                )
                step.decision_s = time.monotonic() - decision_started
                step.changed = (decided.replicas, decided.factor) != (view.replicas, view.factor)
                step.replicas, step.factor = decided.replicas, decided.factor
        previous = condition(view.conditions, "Degraded") or {}
        degraded = step.degraded
        if degraded and (previous.get("status") != "True" or previous.get("reason") != degraded.reason):
            step.events.append(
                EventRecord("Warning", degraded.reason, degraded.message)
            )  # on transition only
        return step

    async def act(
        self,
        ref: ConsumerRef,
        spec: ConsumerSpec,
        status: Mapping[str, Any],
        view: PassView,
        scaling: ScalingStep,
        partitions: Sequence[str],
        persist_assignment: Persist,
    ) -> ActStep:
        """Step 3: workers and assignment.

        1. Scale up at once (``ensure_workers``).
        2. Day-2 replacement (a :class:`WorkerReplacer` platform): one worker on an outdated pod
           template is kept out of the eligible workers, so step 3 moves its partitions away.
        3. One assignment step: the :class:`AssignmentCoordinator` protocol over the workers that stay,
           or one step of the restore-before-handoff rollout (a handoff executor: state enabled).
        4. No change pending: ``sync`` re-pushes assignment and factor where a worker disagrees and
           reports the workers whose circuit breaker is open; a change pending: only the breakers.
        5. Delete the replaced worker once it owns nothing.
        6. Scale down only once the workers that go away own no partition (release before removal).
        """
        target, events = scaling.replicas, []
        assignment = AssignmentState.from_status(status.get("assignment"))
        current = await self.platform.current_workers(ref)
        # 1. up at once
        if target > current:
            await self.platform.ensure_workers(ref, target)
            events.append(EventRecord("Normal", "ScaledUp", f"workers {current} -> {target}"))
        # 2. replacement
        stays = {w.name for w in view.workers if w.ordinal < target}
        replacement = await self._replacement(ref, view.workers, target)
        if replacement.drain:
            stays.discard(replacement.drain)  # its partitions move to warm owners first
        # 3. assignment step
        coordinator = AssignmentCoordinator(
            self.control,
            AssignmentPlanner(max_moves=spec.max_moves),
            persist_assignment,
            release_deadline_s=self.release_deadline_s,
        )
        rollout: Rollout | None = None
        handoffs: list[HandoffRecord] = []
        if self.handoff is not None:
            rollout_status = status.get("rollout")
            hstep = await self.handoff.step(
                assignment,
                Rollout.from_dict(rollout_status) if rollout_status else None,
                view.workers,
                partitions,
                eligible=stays,
                replicas=target,
            )
            rollout = hstep.rollout
            events.extend(EventRecord(k, r, m) for k, r, m in hstep.events)
            handoffs = list(hstep.handoffs)
            step = StepResult(
                state=hstep.assignment,
                in_progress=hstep.in_progress,
                committed=bool(hstep.handoffs),
                moves=len(hstep.handoffs),
                blocked=hstep.blocked,
            )
        else:
            step = await coordinator.step(assignment, view.workers, partitions, eligible=stays)
        assignment = step.state
        # 4. sync
        sync_problems: list[str] = []
        breakers: list[str] = []
        if assignment.pending is None:
            synced = await coordinator.sync(assignment, view.alive, scaling.factor)
            sync_problems, breakers = synced.problems, synced.breakers
        else:  # no sync while a change runs: the breakers are still read, so Degraded does not flap
            breakers = await coordinator.open_breakers(view.alive)
        if step.committed:
            events.append(
                EventRecord(
                    "Normal",
                    "Rebalanced",
                    f"assignment generation {assignment.generation} in force "
                    f"({step.moves} partition(s) moved)",
                )
            )
        # 5. replaced worker
        replaced = await self._replace(ref, replacement, assignment, rollout is not None)
        if replaced is not None:
            events.append(replaced)
        # 6. down after release
        leaving_own = any(assignment.members.get(w.name) for w in view.workers if w.name not in stays)
        if target < current and assignment.pending is None and not leaving_own:
            await self.platform.ensure_workers(ref, target)
            events.append(EventRecord("Normal", "ScaledDown", f"workers {current} -> {target}"))
        return ActStep(
            current=current,
            assignment=assignment,
            blocked=step.blocked,
            handoff=self.handoff is not None,
            rollout=rollout,
            sync_problems=sync_problems,
            breakers=breakers,
            handoffs=handoffs,
            events=events,
        )

    @staticmethod
    def report(
        view: PassView, scaling: ScalingStep, acted: ActStep, partitions: Sequence[str]
    ) -> ConsumerStatus:
        """Step 4: the status, typed (rendered by :func:`render_status`).

        1. Scaling: the platform runs another count, or a worker of the decided size is not alive.
        2. Rebalancing: an assignment change is pending or a rollout runs.
        3. Degraded: the metric source failed, else workers unreachable by ``sync``, else workers whose
           circuit breaker is open (``CircuitBreakerOpen``, naming each pod and its breaker's reason),
           else AsExpected.
        4. Ready: every partition assigned, no change pending, every worker in sync.
        """
        assignment, factor, alive = acted.assignment, scaling.factor, len(view.alive)
        target = scaling.replicas
        covered = {p for ps in assignment.members.values() for p in ps}
        # 1. Scaling
        resizing = target != acted.current or any(not w.alive for w in view.workers if w.ordinal < target)
        scaling_condition = ConditionValue(
            "Scaling",
            resizing,
            "ScalingWorkers" if resizing else "Stable",
            f"{alive} of {target} workers alive" if resizing else f"{target} workers",
        )
        # 2. Rebalancing
        rebalancing = acted.rebalancing
        rebalancing_condition = ConditionValue(
            "Rebalancing",
            rebalancing,
            "HandoffInProgress" if rebalancing else "Assigned",
            acted.blocked or ("change pending" if rebalancing else f"generation {assignment.generation}"),
        )
        # 3. Degraded
        if scaling.degraded:
            degraded = scaling.degraded
        elif acted.sync_problems:
            degraded = ConditionValue(
                "Degraded", True, "WorkerUnreachable", "; ".join(acted.sync_problems)[:1000]
            )
        elif acted.breakers:
            degraded = ConditionValue("Degraded", True, BREAKER_OPEN, breaker_message(acted.breakers))
        else:
            degraded = ConditionValue("Degraded", False, "AsExpected", "")
        # 4. Ready
        all_assigned = bool(partitions) and set(partitions) <= covered and assignment.pending is None
        ready = all_assigned and not acted.sync_problems
        reason = "AllPartitionsAssigned" if ready else ("Rebalancing" if rebalancing else "WaitingForWorkers")
        message = (
            f"{len(covered)} partitions on {len(assignment.members)} workers, factor {factor}"
            if ready
            else acted.blocked
            or f"{alive} workers alive, {len(covered)}/{len(partitions)} partitions assigned"
        )
        return ConsumerStatus(
            replicas=alive,
            factor=factor,
            assignment=assignment,
            conditions=(
                scaling_condition,
                rebalancing_condition,
                degraded,
                ConditionValue("Ready", ready, reason, message),
            ),
            sample=scaling.sample,
            last_decision=scaling.last_decision,
            handoff=acted.handoff,
            rollout=acted.rollout,
        )

    async def _replacement(
        self, ref: ConsumerRef, workers: Sequence[WorkerInfo], replicas: int
    ) -> ReplacementChoice:
        """Step 2's replacement choice (nothing on a platform without pod templates)."""
        if not is_replacer(self.platform):
            return ReplacementChoice()
        return choose_replacement(workers, await self.platform.desired_revision(ref), replicas)

    async def _replace(
        self,
        ref: ConsumerRef,
        replacement: ReplacementChoice,
        assignment: AssignmentState,
        rollout_running: bool,
    ) -> EventRecord | None:
        """Delete the replacement's worker once it owns nothing (or at once: dead, or alone)."""
        running = assignment.pending is not None or rollout_running
        victim = ready_to_delete(replacement, assignment.members, running)
        if victim is None or not is_replacer(self.platform):
            return None
        await self.platform.replace_worker(ref, victim)
        left = len(replacement.outdated) - 1
        how = (
            "deleted at once (not alive, or no other worker to hand its partitions to)"
            if replacement.delete_now
            else "deleted after handing its partitions to warm owners"
        )
        return EventRecord(
            "Normal", "WorkerReplaced", f"{victim} ran an outdated pod template: {how} ({left} more)"
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
