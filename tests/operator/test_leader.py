"""``LeaseElector`` (multilane.operator.k8s.leader) against the emulated API server, under the chart's
RBAC with the operator's token: one leader; a standby takes over within the lease duration (plus one
round) after the leader dies; a 409 never overwrites; a leader that loses the Lease stops its work."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from multilane.operator.k8s.kube import KubeClient, KubeSettings
from multilane.operator.k8s.leader import LeaderLostError, LeaseElector, LeaseElectorSettings
from multilane.testing.kube_api import ApiServerEmulator
from tests.operator.conftest import OPERATOR_TOKEN, RELEASE_NS

pytestmark = pytest.mark.asyncio(loop_scope="function")

DURATION, DEADLINE, RETRY = 4.0, 3.0, 0.3


@pytest_asyncio.fixture
async def operator_kube(api: tuple[ApiServerEmulator, str]) -> AsyncIterator[KubeClient]:
    async with KubeClient(KubeSettings(host=api[1], token=OPERATOR_TOKEN)) as client:
        yield client


def elector(kube: KubeClient, identity: str) -> LeaseElector:
    settings = LeaseElectorSettings(
        namespace=RELEASE_NS,
        name="ml-multilane",  # the chart's leaderElection.leaseName default (its RBAC names it)
        identity=identity,
        lease_duration_s=DURATION,
        renew_deadline_s=DEADLINE,
        retry_period_s=RETRY,
    )
    return LeaseElector(kube, settings)


async def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="identity"):
        LeaseElectorSettings(namespace="ns")
    with pytest.raises(ValueError, match="renew_deadline_s < lease_duration_s"):
        LeaseElectorSettings(namespace="ns", identity="a", lease_duration_s=5, renew_deadline_s=5)


async def test_one_leader_and_the_standby_takes_over_within_the_lease_duration(
    operator_kube: KubeClient,
) -> None:
    a, b = elector(operator_kube, "op-a"), elector(operator_kube, "op-b")
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    # While a renews, b stays standby (well beyond the lease duration).
    end = time.monotonic() + DURATION * 1.5
    while time.monotonic() < end:
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
        await asyncio.sleep(RETRY)
    lease = await operator_kube.get(a.path)
    assert lease is not None and lease["spec"]["holderIdentity"] == "op-a"
    # a dies (kill -9: no release). b takes over within the lease duration plus one round.
    died = time.monotonic()
    b_task = asyncio.create_task(b.acquire())
    await asyncio.wait_for(b_task, DURATION + 10)
    took = time.monotonic() - died
    assert DURATION * 0.9 <= took <= DURATION + RETRY + 1.5, took  # slack: a loaded machine
    lease = await operator_kube.get(a.path)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "op-b" and lease["spec"]["leaseTransitions"] == 1
    # The old leader, back, does not take it back: it sees another live holder.
    assert not await a.try_acquire_or_renew()


async def test_a_conflict_means_re_read_never_overwrite(operator_kube: KubeClient) -> None:
    a = elector(operator_kube, "op-a")
    assert await a.try_acquire_or_renew()
    lease = await operator_kube.get(a.path)
    assert lease is not None
    # Someone else writes the Lease between a's read and a's write: a's write (with the old
    # resourceVersion) must be refused, and a must not count itself leader.
    stale = dict(lease)
    await operator_kube.update(a.path, {**lease, "spec": {**lease["spec"], "holderIdentity": "op-x"}})
    assert not await a._write(stale, a._spec(lease["spec"], acquire=False))
    assert not a.leading
    fresh = await operator_kube.get(a.path)
    assert fresh is not None and fresh["spec"]["holderIdentity"] == "op-x"


async def test_two_standbys_racing_for_an_expired_lease_make_one_leader(operator_kube: KubeClient) -> None:
    old = elector(operator_kube, "op-old")
    assert await old.try_acquire_or_renew()
    b, c = elector(operator_kube, "op-b"), elector(operator_kube, "op-c")
    await asyncio.gather(b.try_acquire_or_renew(), c.try_acquire_or_renew())  # both observe it
    await asyncio.sleep(DURATION + RETRY)
    results = await asyncio.gather(b.try_acquire_or_renew(), c.try_acquire_or_renew())
    assert sorted(results) == [False, True], results
    assert b.transitions + c.transitions == 1


async def test_a_leader_that_loses_the_lease_stops_its_work(operator_kube: KubeClient) -> None:
    a = elector(operator_kube, "op-a")
    work_cancelled = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            work_cancelled.set()

    run = asyncio.create_task(a.run(work))
    for _ in range(50):
        if a.leading:
            break
        await asyncio.sleep(0.1)
    assert a.leading
    lease = await operator_kube.get(a.path)
    assert lease is not None
    await operator_kube.update(a.path, {**lease, "spec": {**lease["spec"], "holderIdentity": "usurper"}})
    with pytest.raises(LeaderLostError):
        await asyncio.wait_for(run, DURATION + 5)
    assert work_cancelled.is_set()


async def test_a_clean_stop_releases_the_lease(operator_kube: KubeClient) -> None:
    a, b = elector(operator_kube, "op-a"), elector(operator_kube, "op-b")

    async def work() -> None:
        await asyncio.sleep(0.3)

    await asyncio.wait_for(a.run(work), 10)
    lease = await operator_kube.get(a.path)
    assert lease is not None and not lease["spec"].get("holderIdentity")
    started = time.monotonic()
    assert await b.try_acquire_or_renew()  # at once: no wait for expiry
    assert time.monotonic() - started < DURATION
    with contextlib.suppress(Exception):
        await b.release()


async def test_a_stale_control_loop_write_is_refused_not_overwriting(
    api: tuple[ApiServerEmulator, str], operator_kube: KubeClient, kube: KubeClient
) -> None:
    """The control loop's status writes carry the resourceVersion the operator last read or wrote: a
    deposed leader that wakes up with a stale view gets 409 and the new leader's status stays."""
    from multilane.operator.k8s.handlers import OperatorHandlers
    from multilane.operator.k8s.kube import KubeConflictError
    from multilane.operator.spec.children import ConsumerRef
    from tests.operator.conftest import CR_COLLECTION, consumer_body, cr_path

    created = await kube.create(CR_COLLECTION, consumer_body("stale", "127.0.0.1:1", "t"))
    ref = ConsumerRef("stale", created["metadata"]["namespace"], created["metadata"]["uid"])
    old_leader = OperatorHandlers(operator_kube)
    old_leader.gate.seen(ref, created)  # its last read
    await old_leader.status.patch(ref, {"factor": 2}, conditional=True)  # fine: nothing changed since
    # The new leader writes the assignment; the old one, with its view from before, tries to.
    new_assignment = {"generation": 7, "members": [{"worker": "stale-1", "partitions": ["t/0"]}]}
    await kube.patch(cr_path("stale", "status"), {"status": {"assignment": new_assignment}})
    stale = {"generation": 6, "members": [{"worker": "stale-0", "partitions": ["t/0"]}]}
    with pytest.raises(KubeConflictError):
        await old_leader.status.patch(ref, {"assignment": stale}, conditional=True)
    status = (await kube.get(cr_path("stale")) or {}).get("status") or {}
    assert status["assignment"]["generation"] == 7 and status["factor"] == 2
    # After a re-read, its write goes through (now based on what is there).
    old_leader.gate.seen(ref, await operator_kube.get(cr_path("stale")))
    await old_leader.status.patch(ref, {"factor": 3}, conditional=True)
