"""``ControlPass``: the control loop's kopf side, one pass of a ParallelConsumer around
:class:`ConsumerController`. Does I/O (Kubernetes API, Kafka admin, metric sources, worker control
endpoints, all through the parts it is given).

:meth:`ControlPass.tick` (the kopf timer) honours Paused, has the reconciler re-apply when the spec is
not applied yet, an environment problem may have gone or the pod template is stale, then runs one
:class:`ConsumerController` pass and writes its status (only what changed, through the status
writer), Events and metrics; pods that cannot run become Degraded.

Inputs: the API client (to read the object), the platform, the children's reconciler, the
environment check, the status writer, the leader gate, the clients (worker controls, metric sources,
handoff executors), the metrics, the consumer's lock (shared with the reconciler) and the release
deadline. It owns two memories of each consumer: the last control-loop error (Events only on change)
and the validated spec.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from multilane.operator.controller import ConsumerController
from multilane.operator.decision.planner import format_partition
from multilane.operator.decision.policy import PolicyState
from multilane.operator.k8s.clients import HandoffExecutors, MetricSources, WorkerControls
from multilane.operator.k8s.environment import EnvironmentCheck
from multilane.operator.k8s.kube import KubeClient, KubeError
from multilane.operator.k8s.leader_gate import LeaderGate
from multilane.operator.k8s.memory import Slot
from multilane.operator.k8s.reconcile import ChildrenReconciler
from multilane.operator.k8s.resource import (
    POLICY_STATE_ANNOTATION,
    TRANSIENT_REASONS,
    consumer_ref,
    cr_path,
    is_paused,
    post_event,
)
from multilane.operator.k8s.statefulset import recreate_allowed
from multilane.operator.k8s.status_writer import StatusWriter
from multilane.operator.metrics import OperatorMetrics
from multilane.operator.pass_model import EventRecord
from multilane.operator.platform import Platform, is_replacer
from multilane.operator.rollout.assignment import AssignmentState
from multilane.operator.spec.child_meta import ConsumerRef
from multilane.operator.spec.conditions import condition, now_iso, set_condition
from multilane.operator.spec.validation import ConsumerSpec, validate_spec

__all__ = ["ControlPass"]

log = logging.getLogger(__name__)


class ControlPass:
    def __init__(
        self,
        kube: KubeClient,
        platform: Platform,
        reconciler: ChildrenReconciler,
        environment: EnvironmentCheck,
        status: StatusWriter,
        gate: LeaderGate,
        metrics: OperatorMetrics,
        locks: Slot[asyncio.Lock],
        *,
        controls: WorkerControls,
        sources: MetricSources,
        handoffs: HandoffExecutors,
        release_deadline_s: float,
        last_errors: Slot[str],
        specs: Slot[tuple[Any, ConsumerSpec | None]],
    ) -> None:
        self._kube = kube
        self._platform = platform
        self._reconciler = reconciler
        self._environment = environment
        self._status = status
        self._gate = gate
        self._controls = controls  # each consumer's worker-control client
        self._sources = sources  # each consumer's metric source
        self._handoffs = handoffs  # each consumer's handoff executor (state enabled)
        self._metrics = metrics
        self._locks = locks  # uid -> the lock one reconcile or control pass of the consumer holds
        self._release_deadline_s = release_deadline_s
        self._last_errors = last_errors  # uid -> last control-loop error (Events only on change)
        self._specs = specs  # uid -> (raw spec, validated)

    async def tick(self, body: Mapping[str, Any], fresh: bool = True) -> None:
        """One pass. ``fresh``: GET the object first; kopf's timer passes False (its body is the
        watched object, as new as a GET)."""
        ref = consumer_ref(body)
        self._metrics.ticks.inc()
        current = await self._kube.get(cr_path(ref)) if fresh else body
        if current is None or (current.get("metadata") or {}).get("deletionTimestamp"):
            return
        await self._pass(ref, current)

    async def _pass(self, ref: ConsumerRef, fresh: Mapping[str, Any]) -> None:
        status = self._status.view(ref, fresh)
        generation = int((fresh.get("metadata") or {}).get("generation") or 1)
        degraded = condition(status.get("conditions"), "Degraded") or {}
        paused = is_paused(fresh)
        # Hold everything while paused; re-apply when the spec is not yet applied or may now apply.
        if (
            paused
            or status.get("observedGeneration") != generation
            or (degraded.get("status") == "True" and degraded.get("reason") in TRANSIENT_REASONS)
            or (self._reconciler.held(ref.uid) is not None and recreate_allowed(fresh))
            or await self._template_stale(ref, fresh)
        ):
            if not await self._reconciler.reconcile(fresh):
                return
            fresh = await self._kube.get(cr_path(ref)) or fresh
            status = dict(fresh.get("status") or {})
        elif (condition(status.get("conditions"), "Paused") or {}).get("status") == "True":
            stamp = now_iso()
            conditions = set_condition(status.get("conditions"), "Paused", False, "NotPaused", "", now=stamp)
            await self._status.patch(ref, {"conditions": conditions})
            status["conditions"] = conditions
            post_event(fresh, EventRecord("Normal", "Resumed", "pause annotation removed"))
        spec = self._valid_spec(ref, fresh.get("spec"))
        if spec is None:
            return
        self._gate.seen(ref, fresh)  # the control loop's writes are conditional on this read
        async with self._locks.setdefault(ref.uid, asyncio.Lock):
            started = time.monotonic()
            try:
                with self._metrics.timed("tick"):
                    await self._tick(ref, fresh, spec, status)
            except KubeError as exc:
                self._metrics.errors.labels("kubernetes").inc()
                log.warning("%s/%s: Kubernetes API error in control loop: %s", ref.namespace, ref.name, exc)
                if self._last_errors.get(ref.uid) != str(exc):  # one Event per distinct error
                    self._last_errors.set(ref.uid, str(exc))
                    post_event(fresh, EventRecord("Warning", "ControlLoopError", f"Kubernetes API: {exc}"))
            except Exception as exc:
                self._metrics.errors.labels("internal").inc()
                log.exception("%s/%s: control loop failed; retrying next tick", ref.namespace, ref.name)
                if self._last_errors.get(ref.uid) != repr(exc):
                    self._last_errors.set(ref.uid, repr(exc))
                    post_event(fresh, EventRecord("Warning", "ControlLoopError", f"internal error: {exc!r}"))
            else:
                self._last_errors.pop(ref.uid)
            finally:
                log.debug("%s/%s: pass took %.2fs", ref.namespace, ref.name, time.monotonic() - started)

    def _valid_spec(self, ref: ConsumerRef, raw: Any) -> ConsumerSpec | None:
        """:func:`validate_spec` of the pass, kept while the spec stays the same."""
        cached = self._specs.get(ref.uid)
        if cached is None or cached[0] != raw:
            cached = self._specs.set(ref.uid, (copy.deepcopy(raw), validate_spec(raw)[0]))
        return cached[1]

    async def _template_stale(self, ref: ConsumerRef, body: Mapping[str, Any]) -> bool:
        """The StatefulSet's pod template is not what this operator renders for the spec (an operator
        upgrade whose ``on.resume`` did not apply yet): re-apply, so the pods are replaced."""
        if not is_replacer(self._platform):
            return False
        applied = await self._platform.desired_revision(ref)
        if applied is None:
            return False
        rendered = self._reconciler.template_hash(ref, body.get("spec"))
        return rendered is not None and applied != rendered

    async def _workload_degraded(
        self,
        ref: ConsumerRef,
        before: Mapping[str, Any],
        status: dict[str, Any],
        events: list[EventRecord],
    ) -> None:
        """Pods that cannot run (:mod:`multilane.operator.spec.pod_health`) -> Degraded, naming each pod
        and reason, unless the pass degraded for its own reason; a Warning Event when they change."""
        problems_of = getattr(self._platform, "workload_problems", None)
        if problems_of is None:
            return
        problems: list[tuple[str, str]] = await problems_of(ref)
        conditions = list(status.get("conditions") or [])
        if not problems or (condition(conditions, "Degraded") or {}).get("status") == "True":
            return
        reason = problems[0][0]
        message = "; ".join(m for _, m in problems)[:1000]
        previous = condition(before.get("conditions"), "Degraded") or {}
        if previous.get("reason") != reason or previous.get("message") != message:
            events.append(EventRecord("Warning", reason, message))
        status["conditions"] = set_condition(conditions, "Degraded", True, reason, message, now=now_iso())

    async def _tick(
        self, ref: ConsumerRef, body: Mapping[str, Any], spec: ConsumerSpec, status: dict[str, Any]
    ) -> None:
        problems, config, topic_partitions = await self._environment.check(ref, spec, fresh=False)
        if problems or topic_partitions is None:
            await self._status.degrade(ref, body, list(status.get("conditions") or []), problems, 0)
            return
        partitions = [format_partition(t, i) for t, n in sorted(topic_partitions.items()) for i in range(n)]
        control = await self._controls.of(ref)
        if control is None:
            return  # the token Secret is created by reconcile; next tick
        policy_state = _policy_state(ref, body, status)

        async def persist(state: AssignmentState) -> None:
            await self._status.patch(ref, {"assignment": state.to_status()}, conditional=True)

        controller = ConsumerController(
            self._platform,
            control,
            release_deadline_s=self._release_deadline_s,
            handoff=self._handoffs.of(ref, spec, control),
        )
        result = await controller.tick(
            ref, spec, status, policy_state, partitions, self._sources.of(ref, spec, config), persist
        )
        if result.policy_state is not None:
            result.status["policy"] = result.policy_state.to_dict()
        held = self._reconciler.held(ref.uid)
        degraded_now = condition(result.status.get("conditions"), "Degraded") or {}
        if held and degraded_now.get("status") != "True":  # the control loop knows nothing of it
            result.status["conditions"] = set_condition(
                result.status.get("conditions"), "Degraded", True, "ImmutableFieldChange", held
            )
        await self._workload_degraded(ref, status, result.status, result.events)
        await self._status.write_pass(ref, body, result.status)
        for record in result.events:
            post_event(body, record)
        self._metrics.observe_tick(
            ref.namespace, ref.name, result, spec.replicas or spec.max_replicas, spec.max_factor
        )


def _policy_state(ref: ConsumerRef, body: Mapping[str, Any], status: Mapping[str, Any]) -> PolicyState:
    """The policy's memory: ``status.policy``; from the annotation an older operator wrote when the
    status has none yet; afresh when unreadable."""
    try:
        if status.get("policy"):
            return PolicyState.from_dict(dict(status["policy"]))
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        return PolicyState.from_dict(json.loads(annotations.get(POLICY_STATE_ANNOTATION) or "{}"))
    except (ValueError, TypeError, KeyError, AttributeError):
        log.warning("%s/%s: unreadable policy state; starting afresh", ref.namespace, ref.name)
        return PolicyState()
