"""The control loop's kopf side: one pass of a ParallelConsumer around :class:`ConsumerController`.
Does I/O (Kubernetes API, Kafka admin, metric sources, worker control endpoints).

:meth:`ControlPass.tick` (the kopf timer) honours Paused, re-runs the reconcile when the spec is not
applied yet, an environment problem may have gone or the pod template is stale, then runs one
:class:`ConsumerController` pass and writes its status (only what changed, :class:`StatusMemory`),
Events and metrics; pods that cannot run become Degraded.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from multilane.operator.controller import ConsumerController, EventRecord
from multilane.operator.decision.planner import format_partition
from multilane.operator.decision.policy import PolicyState
from multilane.operator.k8s.handler_core import (
    POLICY_STATE_ANNOTATION,
    TRANSIENT_REASONS,
    _event,
    _paused,
    _ref,
)
from multilane.operator.k8s.kube import KubeError, api_path
from multilane.operator.k8s.reconcile import ReconcileSteps
from multilane.operator.k8s.statefulset import recreate_allowed
from multilane.operator.platform import is_replacer
from multilane.operator.rollout.assignment import AssignmentState, WorkerControl
from multilane.operator.rollout.handoff import HandoffConfig, HandoffControl, HandoffExecutor
from multilane.operator.rollout.protocol import Rollout
from multilane.operator.sources import MetricSource
from multilane.operator.spec import children as ch
from multilane.operator.spec.conditions import condition, now_iso, set_condition
from multilane.operator.spec.validation import ConsumerSpec, validate_spec

log = logging.getLogger(__name__)


class ControlPass(ReconcileSteps):
    """The timer's pass: caches of the sources, worker-control clients and handoff executors."""

    def _source(self, ref: ch.ConsumerRef, spec: ConsumerSpec, config: Mapping[str, str]) -> MetricSource:
        key = (spec.metrics, spec.bootstrap_servers, spec.consumer_group, tuple(sorted(config.items())))
        cached = self._sources.get(ref.uid)
        if cached is None or cached[0] != key:
            cached = (key, self.source_factory(spec, config))
            self._sources[ref.uid] = cached
        return cached[1]

    async def _control(self, ref: ch.ConsumerRef) -> WorkerControl | None:
        """The worker-control client with the consumer's token. The token Secret is never overwritten,
        so it is read once per consumer (and again only while it is missing)."""
        if ref.uid in self._controls:
            _, control, inner = self._controls[ref.uid]
            if self.settings.control_tls.enabled:
                await self.certs.wire(ref, inner)  # a due rotation step; the current client context
            return control
        secret = await self.kube.get(api_path("v1", "secrets", ref.namespace, ref.token_secret))
        if secret is None:
            return None
        data = secret.get("data") or {}
        token = (
            base64.b64decode(data["token"]).decode()
            if "token" in data
            else (secret.get("stringData") or {}).get("token", "")
        )
        if not token:
            return None
        cached = self._controls.get(ref.uid)
        if cached is None or cached[0] != token:
            inner = self.control_factory(token)
            cached = (token, self.metrics.control(inner, ref.namespace, ref.name), inner)
            self._controls[ref.uid] = cached
        if self.settings.control_tls.enabled:
            await self.certs.wire(ref, cached[2])  # a due rotation step; the current client context
        return cached[1]

    async def tick(self, body: Mapping[str, Any], fresh: bool = True) -> None:
        """One pass. ``fresh``: GET the object first; kopf's timer passes False (its body is the
        watched object, as new as a GET)."""
        ref = _ref(body)
        self.metrics.ticks.inc()
        current = await self.kube.get(self._cr_path(ref)) if fresh else body
        if current is None or (current.get("metadata") or {}).get("deletionTimestamp"):
            return
        await self._pass(ref, current)

    async def _pass(self, ref: ch.ConsumerRef, fresh: Mapping[str, Any]) -> None:
        status = self.status_memory.view(ref.uid, fresh)
        generation = int((fresh.get("metadata") or {}).get("generation") or 1)
        degraded = condition(status.get("conditions"), "Degraded") or {}
        paused = _paused(fresh)
        # Hold everything while paused; re-apply when the spec is not yet applied or may now apply.
        if (
            paused
            or status.get("observedGeneration") != generation
            or (degraded.get("status") == "True" and degraded.get("reason") in TRANSIENT_REASONS)
            or (ref.uid in self._immutable and recreate_allowed(fresh))
            or await self._template_stale(ref, fresh)
        ):
            if not await self.reconcile(fresh):
                return
            fresh = await self.kube.get(self._cr_path(ref)) or fresh
            status = dict(fresh.get("status") or {})
        elif (condition(status.get("conditions"), "Paused") or {}).get("status") == "True":
            stamp = now_iso()
            conditions = set_condition(status.get("conditions"), "Paused", False, "NotPaused", "", now=stamp)
            await self._patch_status(ref, {"conditions": conditions})
            status["conditions"] = conditions
            _event(fresh, EventRecord("Normal", "Resumed", "pause annotation removed"))
        spec = self._valid_spec(ref, fresh.get("spec"))
        if spec is None:
            return
        self._seen(ref, fresh)  # the control loop's writes are conditional on this read
        async with self._lock(ref.uid):
            started = time.monotonic()
            try:
                with self.metrics.timed("tick"):
                    await self._tick(ref, fresh, spec, status)
            except KubeError as exc:
                self.metrics.errors.labels("kubernetes").inc()
                log.warning("%s/%s: Kubernetes API error in control loop: %s", ref.namespace, ref.name, exc)
                if self._last_errors.get(ref.uid) != str(exc):  # one Event per distinct error
                    self._last_errors[ref.uid] = str(exc)
                    _event(fresh, EventRecord("Warning", "ControlLoopError", f"Kubernetes API: {exc}"))
            except Exception as exc:
                self.metrics.errors.labels("internal").inc()
                log.exception("%s/%s: control loop failed; retrying next tick", ref.namespace, ref.name)
                if self._last_errors.get(ref.uid) != repr(exc):
                    self._last_errors[ref.uid] = repr(exc)
                    _event(fresh, EventRecord("Warning", "ControlLoopError", f"internal error: {exc!r}"))
            else:
                self._last_errors.pop(ref.uid, None)
            finally:
                log.debug("%s/%s: pass took %.2fs", ref.namespace, ref.name, time.monotonic() - started)

    def _valid_spec(self, ref: ch.ConsumerRef, raw: Any) -> ConsumerSpec | None:
        """:func:`validate_spec` of the pass, kept while the spec stays the same."""
        cached = self._specs.get(ref.uid)
        if cached is None or cached[0] != raw:
            cached = (copy.deepcopy(raw), validate_spec(raw)[0])
            self._specs[ref.uid] = cached
        return cached[1]

    async def _template_stale(self, ref: ch.ConsumerRef, body: Mapping[str, Any]) -> bool:
        """The StatefulSet's pod template is not what this operator renders for the spec (an operator
        upgrade whose ``on.resume`` did not apply yet): re-apply, so the pods are replaced."""
        if not is_replacer(self.platform):
            return False
        applied = await self.platform.desired_revision(ref)
        if applied is None:
            return False
        raw = body.get("spec")
        cached = self._rendered.get(ref.uid)
        if cached is None or cached[0] != raw:
            spec, _ = validate_spec(raw)
            if spec is None:
                return False
            template = self._with_tls(ref, ch.stateful_set(ref, dict(raw or {}), 0))["spec"]["template"]
            cached = (copy.deepcopy(raw), template["metadata"]["annotations"][ch.TEMPLATE_HASH_ANNOTATION])
            self._rendered[ref.uid] = cached
        return applied != cached[1]

    async def _workload_degraded(
        self,
        ref: ch.ConsumerRef,
        before: Mapping[str, Any],
        status: dict[str, Any],
        events: list[EventRecord],
    ) -> None:
        """Pods that cannot run (:mod:`multilane.operator.spec.pod_health`) -> Degraded, naming each pod
        and reason, unless the pass degraded for its own reason; a Warning Event when they change."""
        problems_of = getattr(self.platform, "workload_problems", None)
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

    def _handoff(
        self, ref: ch.ConsumerRef, spec: ConsumerSpec, control: WorkerControl
    ) -> HandoffExecutor | None:
        """The restore-before-handoff executor of a consumer with state enabled (None otherwise, or
        when the control client cannot make workers learn). It persists ``status.assignment`` and
        ``status.rollout`` together before every ownership change."""
        if not spec.state_enabled or not isinstance(control, HandoffControl):
            self._handoffs.pop(ref.uid, None)
            return None
        config = HandoffConfig(
            acceptable_recovery_lag=spec.acceptable_recovery_lag,
            learner_timeout_s=spec.learner_timeout_s,
            max_concurrent_warmups=spec.max_moves,
            release_deadline_s=self.settings.release_deadline_s,
        )
        cached = self._handoffs.get(ref.uid)
        if cached is not None and cached[0] is control and cached[1] == config:
            return cached[2]

        async def persist(state: AssignmentState, rollout: Rollout | None) -> None:
            await self._patch_status(
                ref,
                {"assignment": state.to_status(), "rollout": rollout.to_dict() if rollout else None},
                conditional=True,
            )

        executor = HandoffExecutor(control, persist, config)
        self._handoffs[ref.uid] = (control, config, executor)
        return executor

    async def _tick(
        self, ref: ch.ConsumerRef, body: Mapping[str, Any], spec: ConsumerSpec, status: dict[str, Any]
    ) -> None:
        problems, config, topic_partitions = await self._check_environment(ref, spec, fresh=False)
        if problems or topic_partitions is None:
            await self._degrade(ref, body, list(status.get("conditions") or []), problems, 0)
            return
        partitions = [format_partition(t, i) for t, n in sorted(topic_partitions.items()) for i in range(n)]
        control = await self._control(ref)
        if control is None:
            return  # the token Secret is created by reconcile; next tick
        policy_state = _policy_state(ref, body, status)

        async def persist(state: AssignmentState) -> None:
            await self._patch_status(ref, {"assignment": state.to_status()}, conditional=True)

        controller = ConsumerController(
            self.platform,
            control,
            release_deadline_s=self.settings.release_deadline_s,
            handoff=self._handoff(ref, spec, control),
        )
        result = await controller.tick(
            ref, spec, status, policy_state, partitions, self._source(ref, spec, config), persist
        )
        if result.policy_state is not None:
            result.status["policy"] = result.policy_state.to_dict()
        held = self._immutable.get(ref.uid)
        degraded_now = condition(result.status.get("conditions"), "Degraded") or {}
        if held and degraded_now.get("status") != "True":  # the control loop knows nothing of it
            result.status["conditions"] = set_condition(
                result.status.get("conditions"), "Degraded", True, "ImmutableFieldChange", held
            )
        await self._workload_degraded(ref, status, result.status, result.events)
        patch = self.status_memory.to_write(ref.uid, body, result.status)
        if patch is not None:
            await self._patch_status(ref, patch, conditional=True)
        for record in result.events:
            _event(body, record)
        self.metrics.observe_tick(
            ref.namespace, ref.name, result, spec.replicas or spec.max_replicas, spec.max_factor
        )


def _policy_state(ref: ch.ConsumerRef, body: Mapping[str, Any], status: Mapping[str, Any]) -> PolicyState:
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
