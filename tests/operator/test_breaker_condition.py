"""A worker's open circuit breaker shows on its ParallelConsumer: Degraded=True, reason
``CircuitBreakerOpen``, naming the pod and the breaker's reason, with a Warning Event; a reset clears it
(Degraded=False, Event ``CircuitBreakerClosed``).

1. The pure parts: a worker status's breaker (:func:`open_breaker`) and the Event of a pass
   (:func:`breaker_event`); the breakers read while a change is pending (``open_breakers``).
2. End to end: the real kopf operator on the emulated API server, a real ``multilane worker`` process
   (StatefulSet double) whose handler raises on every record, ``--breaker-dead-letters 2``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from confluent_kafka import Producer

from multilane.operator.decision.planner import AssignmentPlanner
from multilane.operator.k8s.kube import KubeClient
from multilane.operator.pass_model import BREAKER_OPEN, ConditionValue, breaker_event, breaker_message
from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.assignment import AssignmentCoordinator, AssignmentState, open_breaker
from multilane.operator.rollout.workers import WorkerUnreachableError
from multilane.testing.broker import EmbeddedBroker
from tests.operator.conftest import CR_COLLECTION, NS, TOKEN, cond, consumer_body, cr_path, events
from tests.operator.doubles import RealWorkerFleet, StatefulSetControllerDouble, wait_for

REASON = "2 consecutive records dead-lettered, the last t/0@1: HandlerBugError: boom"


def test_open_breaker_reads_the_workers_status() -> None:
    assert open_breaker({"breaker": {"open": True, "reason": REASON}}) == REASON
    assert open_breaker({"breaker": {"open": False, "reason": ""}}) is None
    assert open_breaker({"partitions": []}) is None  # a worker without a breaker (or an older one)
    assert open_breaker({"breaker": {"open": "yes"}}) is None  # only a JSON true counts


def test_breaker_event_on_open_change_and_close() -> None:
    opened = ConditionValue("Degraded", True, BREAKER_OPEN, breaker_message([f"app-0: {REASON}"]))
    as_read = {"type": "Degraded", "status": "True", "reason": BREAKER_OPEN, "message": opened.message}
    fine = ConditionValue("Degraded", False, "AsExpected", "")
    first = breaker_event({"type": "Degraded", "status": "False", "reason": "AsExpected"}, opened)
    assert first is not None and first.type == "Warning" and first.reason == BREAKER_OPEN
    assert "app-0" in first.message and REASON in first.message
    assert breaker_event(as_read, opened) is None  # unchanged: no Event
    more = ConditionValue("Degraded", True, BREAKER_OPEN, breaker_message([f"app-0: {REASON}", "app-1: x"]))
    changed = breaker_event(as_read, more)
    assert changed is not None and "app-1" in changed.message
    closed = breaker_event(as_read, fine)
    assert closed is not None and (closed.type, closed.reason) == ("Normal", "CircuitBreakerClosed")
    # another reason taking over Degraded says nothing of the breaker
    assert breaker_event(as_read, ConditionValue("Degraded", True, "WorkerUnreachable", "x")) is None


class _Statuses:
    """A WorkerControl that only answers ``status`` (from a dict; a missing URL is unreachable)."""

    def __init__(self, statuses: dict[str, dict[str, Any]]) -> None:
        self.statuses = statuses

    async def status(self, base_url: str) -> dict[str, Any]:
        if base_url not in self.statuses:
            raise WorkerUnreachableError(f"{base_url}: connection refused")
        return self.statuses[base_url]


@pytest.mark.asyncio(loop_scope="function")
async def test_open_breakers_read_while_a_change_is_pending() -> None:
    """With a change pending ``sync`` does not run; ``open_breakers`` still reads them (no flapping)."""
    control = _Statuses(
        {"u0": {"breaker": {"open": True, "reason": REASON}}, "u1": {"breaker": {"open": False}}}
    )

    async def persist(_state: AssignmentState) -> None:
        return None

    coordinator = AssignmentCoordinator(control, AssignmentPlanner(), persist)  # type: ignore[arg-type]
    workers = [
        WorkerInfo("app-0", 0, True, "u0"),
        WorkerInfo("app-1", 1, True, "u1"),
        WorkerInfo("app-2", 2, True, "u2"),  # unreachable: left to the change's own steps
        WorkerInfo("app-3", 3, False, "u0"),  # not alive: not asked
    ]
    assert await coordinator.open_breakers(workers) == [f"app-0: {REASON}"]


@pytest.mark.broker
@pytest.mark.asyncio(loop_scope="function")
async def test_open_breaker_degrades_the_consumer_until_reset(
    api: Any, kube: KubeClient, broker: EmbeddedBroker, topic_name: str, operator_factory: Any, tmp_path: Path
) -> None:
    broker.create_topic(topic_name, partitions=1)
    broker.create_topic(f"{topic_name}.dlq", partitions=1)
    real = RealWorkerFleet(
        TOKEN, broker.bootstrap, "bk-group", tmp_path,
        processor="multilane.testing.faulty:always_fails",
        extra_args=["--breaker-dead-letters", "2", "--max-retries", "0"],
    )  # fmt: skip
    sts = StatefulSetControllerDouble(kube, real, api[1], NS)  # type: ignore[arg-type]
    sts.start()
    try:
        await operator_factory(control_url=real.control_url).start()
        body = consumer_body("bk", broker.bootstrap, topic_name, replicas=1, maxReplicas=1)
        await kube.create(CR_COLLECTION, body)

        async def owned() -> bool:
            try:
                return bool((await real.status("bk-0"))["partitions"])
            except Exception:
                return False

        await wait_for(owned, timeout=90, what="bk-0 owns the partition")

        async def degraded() -> dict[str, Any]:
            return cond(((await kube.get(cr_path("bk"))) or {}).get("status") or {}, "Degraded")

        assert (await degraded()).get("status") != "True"
        # Two records, both dead-lettered (no retry): the breaker opens on the second, nothing is held.
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(2):
            producer.produce(topic_name, value=b"v", key=str(i).encode(), partition=0)
        producer.flush(10)

        async def breaker_shown() -> dict[str, Any] | None:
            c = await degraded()
            return c if c.get("status") == "True" and c.get("reason") == BREAKER_OPEN else None

        shown = await wait_for(breaker_shown, timeout=60, what="Degraded=True CircuitBreakerOpen")
        assert "bk-0" in shown["message"] and "2 consecutive records dead-lettered" in shown["message"]
        status = ((await kube.get(cr_path("bk"))) or {}).get("status") or {}
        assert cond(status, "Ready").get("status") == "True", status  # the pod still owns its partition
        warned = await wait_for(lambda: events(kube, BREAKER_OPEN), timeout=10, what="the Warning Event")
        assert warned[0]["type"] == "Warning" and "bk-0" in warned[0]["message"]

        # Reset the breaker on the pod: the condition clears, with an Event.
        async with aiohttp.ClientSession() as session, session.post(
            f"{real.control_url(None, 'bk-0')}/breaker/reset", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as resp:
            assert resp.status == 200 and (await resp.json())["was_open"] is True

        async def cleared() -> bool:
            c = await degraded()
            return c.get("status") == "False" and c.get("reason") == "AsExpected"

        await wait_for(cleared, timeout=60, what="Degraded=False after the reset")
        await wait_for(lambda: events(kube, "CircuitBreakerClosed"), timeout=10, what="CircuitBreakerClosed")
        assert len(await events(kube, BREAKER_OPEN)) == 1  # one Warning for the one opening
    finally:
        await sts.stop()
        await real.stop()
