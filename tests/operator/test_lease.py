"""The worker-side ``LeaseKeeper`` against the emulated API server, and the operator's view of the
same Lease through ``KubernetesPlatform``.

Emulated: the API server (multilane/testing/kube_api.py; PUT with optimistic concurrency is emulated
there). Real: LeaseKeeper, KubernetesPlatform, the Lease manifest the operator creates.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kmock
import pytest

from multilane.operator.k8s.kube import KubeClient, api_path
from multilane.operator.k8s.platform import KubernetesPlatform
from multilane.operator.spec.children import ConsumerRef, lease_manifest
from multilane.testing.kube_api import ApiServerEmulator
from multilane.worker.lease import LeaseKeeper, LeaseSettings
from tests.operator.conftest import NS
from tests.operator.doubles import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="function")

REF = ConsumerRef(name="app", namespace=NS, uid="uid-1")


async def test_keeper_renews_and_stops_processing_before_the_operator_calls_it_dead(
    api: tuple[ApiServerEmulator, str], kube: KubeClient
) -> None:
    emu, url = api
    await kube.create(
        api_path("v1", "pods", NS),
        {"metadata": {"name": "app-0", "labels": {"multilane.dev/consumer": "app"}}},
    )
    platform = KubernetesPlatform(kube, clock_skew_s=0.0)
    # The operator's first look creates the Lease (no renewTime: not alive yet).
    workers = await platform.list_workers(REF)
    assert [(w.name, w.alive, w.reason) for w in workers] == [("app-0", False, "no lease yet")]
    workers = await platform.list_workers(REF)
    assert [(w.name, w.alive, w.reason) for w in workers] == [("app-0", False, "lease never renewed")]
    lease = await kube.get(api_path("coordination.k8s.io/v1", "leases", NS, "app-0"))
    assert lease is not None and lease["spec"] == lease_manifest(REF, "app-0")["spec"]

    lost: list[float] = []
    keeper = LeaseKeeper(
        LeaseSettings(
            api_url=url,
            namespace=NS,
            name="app-0",
            holder="app-0",
            lease_duration_s=6.0,
            stop_margin_s=2.0,
            renew_interval_s=0.5,
        ),
        on_lost=lambda: lost.append(time.monotonic()),
    )
    keeper.start()
    try:
        await wait_for(lambda: keeper.renewals >= 2, what="two renewals")
        renewed = await kube.get(api_path("coordination.k8s.io/v1", "leases", NS, "app-0"))
        assert renewed is not None
        assert renewed["spec"]["holderIdentity"] == "app-0" and renewed["spec"]["renewTime"].endswith("Z")
        assert renewed["spec"]["leaseDurationSeconds"] == 6
        assert int(renewed["metadata"]["resourceVersion"]) > int(lease["metadata"]["resourceVersion"])
        assert [w.alive for w in await platform.list_workers(REF)] == [True]

        # The API server stops answering the worker's Lease calls (its named GET); the operator's
        # list of Leases still works.
        def fail_leases(request: Any) -> Any:
            if (
                request.name == "app-0"
                and request.resource is not None
                and request.resource.group == "coordination.k8s.io"
            ):
                raise kmock.KubernetesError(status=503, reason="ServiceUnavailable", message="test: API down")
            raise NotImplementedError  # not for us: fall through to the emulator

        emu["get"] << fail_leases
        last_renewal = time.monotonic()
        await wait_for(lambda: lost, timeout=20, what="on_lost")
        assert keeper.lost
        # Stopped after lease_duration - stop_margin without a renewal, i.e. before the Lease expires.
        assert 3.0 <= lost[0] - last_renewal <= 5.9
        assert [w.alive for w in await platform.list_workers(REF)] == [True]  # not yet expired
        # The operator sees it dead once the Lease expired (pod still there: known dead by Lease).
        await asyncio.sleep(max(0.0, 6.5 - (time.monotonic() - last_renewal)))
        workers = await platform.list_workers(REF)
        assert [w.alive for w in workers] == [False] and "expired" in workers[0].reason
    finally:
        await keeper.stop()


async def test_settings_reject_a_margin_that_leaves_no_time_to_renew() -> None:
    with pytest.raises(ValueError):
        LeaseSettings(
            api_url="http://x", namespace="n", name="p", holder="p", lease_duration_s=5, stop_margin_s=5
        )
    with pytest.raises(ValueError):
        LeaseSettings(
            api_url="http://x",
            namespace="n",
            name="p",
            holder="p",
            lease_duration_s=10,
            stop_margin_s=3,
            renew_interval_s=8,
        )
