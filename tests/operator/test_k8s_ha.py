"""High availability: two operator replicas, one leader by a ``coordination.k8s.io/v1`` Lease
(:class:`~multilane.operator.k8s.leader.LeaseElector`, as ``multilane operator --leader-election``
runs it), real worker pods (``multilane/testing/pods.py``), paced load, a stateful scale-up.

The leader is killed (its kopf task cancelled, its renewals stopped, no release: ``kill -9``) while a
rollout waits on a worker call at one step (``learn``, ``release``, ``promote``). The standby takes the
Lease once it expired (within the lease duration plus one round of the standby's own observation),
starts its operator, resumes the rollout from ``status.rollout``/``status.assignment`` and completes
it: every delivery checker holds (nothing lost, no key processed twice at once) and the state
restored from the changelogs equals the reference (``tests/operator/k8s_harness.py``).

Every step is ``slow``: in the default suite the leader is killed mid-rollout on the real cluster
(``tests/cluster/test_helm_chart.py::test_leader_killed_mid_rollout_the_other_replica_finishes_it``:
the chart's two replicas, the Lease changing hands, the rollout finished, every checker). Here the
kill lands on a chosen step, and the takeover is timed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from multilane.operator.k8s.kube import KubeClient, KubeSettings
from multilane.operator.k8s.leader import LeaseElector, LeaseElectorSettings
from multilane.testing.kopf_runner import OperatorRunner
from tests.operator.conftest import OPERATOR_TOKEN, RELEASE_NS
from tests.operator.k8s_harness import Hook, K8sHarness, finish, k8s, wait_until

__all__ = ["k8s"]

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="function")]

DURATION, DEADLINE, RETRY = 4.0, 3.0, 0.5


class _Elector(LeaseElector):
    killed = False

    async def release(self) -> None:
        if not self.killed:  # kill -9 releases nothing
            await super().release()


class ElectedOperator:
    """One operator replica: its elector and, while it leads, its kopf operator."""

    def __init__(self, h: K8sHarness, identity: str, hook: Hook | None = None) -> None:
        self.identity = identity
        self.kube = KubeClient(KubeSettings(host=h.api_url, token=OPERATOR_TOKEN))
        settings = LeaseElectorSettings(
            namespace=RELEASE_NS,
            name="ml-multilane",
            identity=identity,
            lease_duration_s=DURATION,
            renew_deadline_s=DEADLINE,
            retry_period_s=RETRY,
        )
        self.elector = _Elector(self.kube, settings)
        self.runner: OperatorRunner = h.operator(hook=hook)
        self.led_at: float | None = None
        self.task = asyncio.create_task(self.elector.run(self._operate))

    async def _operate(self) -> None:
        self.led_at = time.monotonic()
        await self.runner.start()
        await asyncio.Event().wait()  # until cancelled (killed) or leadership lost

    async def kill(self) -> None:
        self.elector.killed = True
        await self.runner.stop()
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.kube.close()

    async def close(self) -> None:
        if not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.runner.stop()
        await self.kube.close()


@pytest.mark.slow
@pytest.mark.parametrize("at", ["learn", "release", "promote"])
async def test_leader_killed_mid_rollout_the_standby_finishes_it(k8s: K8sHarness, at: str) -> None:
    h = k8s
    stuck = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def hang(kind: str, pod: str, partitions: list[str]) -> None:
        if kind == at and not stuck.is_set():
            loop.call_soon_threadsafe(stuck.set)
            await asyncio.sleep(3600)  # the leader dies here (its kopf task is cancelled)

    a = ElectedOperator(h, "operator-a", hook=hang)
    await wait_until(lambda: a.elector.leading, 30, "operator-a leading")
    b = ElectedOperator(h, "operator-b")
    try:
        await asyncio.sleep(RETRY * 3)
        assert not b.elector.leading and b.led_at is None, "two leaders"
        await h.create()
        await wait_until(lambda: h.balanced(1), 90, "every partition on orders-0", h)
        h.start_load(200, 14)
        await asyncio.sleep(2)
        await h.scale(2)
        await asyncio.wait_for(stuck.wait(), 60)
        persisted = await h.status()
        assert persisted.get("rollout"), f"no rollout in status when the leader died: {persisted}"
        killed_at = time.monotonic()
        await a.kill()
        assert b.led_at is None, "the standby led while the leader renewed"
        await wait_until(lambda: b.led_at is not None, DURATION + 30, "operator-b leading")
        assert b.led_at is not None
        takeover = b.led_at - killed_at
        # The Lease's last renewal was at most one round before the kill; the standby takes over one
        # lease duration after it saw that renewal, at its next round (slack: a loaded machine).
        assert takeover <= DURATION + 2 * RETRY + 3.0, takeover
        lease: Any = await h.kube.get(a.elector.path)
        assert lease["spec"]["holderIdentity"] == "operator-b" and lease["spec"]["leaseTransitions"] >= 1
        await wait_until(lambda: h.balanced(2), 90, "rollout completed by the new leader", h)
        after = await h.status()
        assert not (after.get("rollout") or {}).get("moves"), f"rollout not finished: {after.get('rollout')}"
        v = await finish(h, b.runner)
        print(
            f"leader killed at {at}: takeover {takeover:.1f}s, produced {v.produced}, replayed {v.replayed}"
        )
    finally:
        await a.close()
        await b.close()
