"""lease-lost: a pod's Lease lost and renewed, through the real operator and real pods.

The pod's process keeps running and its control endpoint stays reachable, but its path to the API
server is cut (``StatefulSetProcessDouble.cut_api``: the pod's TLS front closes every connection), so
its own ``LeaseKeeper`` cannot renew. After ``leaseDurationSeconds - stop margin`` (15 - 5 s) the
worker fences itself: it reports ``fenced: true`` and starts no record. The cut heals after 13 s;
the worker renews, stays fenced until the operator pushes a higher generation (either because it
saw ``fenced`` with nothing moved, or after it saw the Lease expire and moved the partitions), then
processes again. Every delivery checker (no key ever runs in two places at once; nothing lost) and
the state reference hold; the fenced process started no record while fenced.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from multilane.operator.rollout.handoff import HandoffControlClient
from multilane.testing.processors import read_event_log
from tests.operator.conftest import TOKEN
from tests.operator.k8s_harness import NAME, K8sHarness, finish, k8s, wait_until

__all__ = ["k8s"]

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="function")]

CUT_S = 13.0


async def test_lease_lost_and_renewed_fences_without_double_processing(k8s: K8sHarness) -> None:
    h = k8s
    runner = h.operator()
    await runner.start()
    await h.create(h.body(replicas=2))
    await wait_until(lambda: h.balanced(2), 90, "2 pods with 2 partitions each", h)
    victim = f"{NAME}-1"
    url = h.double.control_url(None, victim)
    client = HandoffControlClient(TOKEN, timeout_s=5)
    try:
        generation = int((await client.status(url))["generation"])
        h.start_load(150, 30)
        await asyncio.sleep(3)
        pid = h.double.pods[victim].pid
        cut_at = time.time()
        h.double.cut_api(victim)

        async def fenced() -> bool:  # the status, or the log line (the fence may be brief)
            return bool((await client.status(url)).get("fenced")) or "fenced at generation" in h.double.logs(
                victim
            )

        await wait_until(fenced, CUT_S, f"{victim} fenced itself", h)
        fenced_at = time.time()
        assert fenced_at - cut_at >= 15 - 5 - 3.5, "fenced before its Lease could have run out"
        await asyncio.sleep(max(0.0, cut_at + CUT_S - time.time()))
        h.double.heal_api(victim)

        async def resumed() -> bool:
            st = await client.status(url)
            return not st.get("fenced") and int(st["generation"]) > generation

        await wait_until(resumed, 60, f"{victim} unfenced by a higher generation", h)
        resumed_at = time.time()
        assert h.double.pods[victim].pid == pid, "the process was not restarted: it fenced itself"
        await wait_until(lambda: h.balanced(2), 60, "balanced again", h)
        v = await finish(h, runner)
    finally:
        await client.close()
    # While fenced (from the moment it reported it until a new generation resumed it), the victim's
    # process started nothing.
    events = read_event_log(h.events)
    window = (fenced_at, resumed_at - 1.0)
    started = [e for e in events if e.pid == pid and e.kind == "start" and window[0] < e.time < window[1]]
    assert not started, f"{len(started)} records started while fenced, e.g. {started[:3]}"
    print(
        f"lease-lost: fenced {fenced_at - cut_at:.1f}s after the cut, resumed "
        f"{resumed_at - cut_at:.1f}s after; produced {v.produced}, replayed {v.replayed}"
    )
