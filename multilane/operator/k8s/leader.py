"""``LeaseElector``: one leader among operator replicas, by a ``coordination.k8s.io/v1`` Lease. Does
I/O (Kubernetes API through :class:`~multilane.operator.k8s.kube.KubeClient`).

Every replica runs the elector; only the leader runs the operator (``multilane operator
--leader-election``). One round (:meth:`LeaseElector.try_acquire_or_renew`), every ``retry_period_s``:

1. Read the Lease; when it does not exist, create it holding it (409: another replica created it
   first; read it next round).
2. Held by this replica: renew (``renewTime`` = now) with an update carrying the ``resourceVersion``
   just read. A 409 means someone else wrote it since: never overwrite, read again next round.
3. Held by another replica: it counts as expired once its (holder, ``renewTime``) has not changed for
   ``leaseDurationSeconds`` as measured on this replica's monotonic clock since it was first seen (no
   comparison of two machines' wall clocks). Not expired: stay standby.
4. Expired (or released: no holder): take it over with an update carrying the ``resourceVersion``
   read (``holderIdentity`` = this replica, ``acquireTime``, ``leaseTransitions`` + 1); 409: another
   standby was faster, read again next round.

Leading, :meth:`LeaseElector.run` runs the leader's work beside the renewals and stops it when no
renewal succeeded for ``renew_deadline_s`` (< the lease duration, so the old leader stops before a
standby may take over); the caller then exits (the kubelet restarts it as a standby). A standby takes
over at most ``lease_duration_s + retry_period_s`` after the leader's last renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from multilane.operator.k8s.kube import KubeClient, KubeConflictError, KubeError, api_path

__all__ = ["LeaderLostError", "LeaseElector", "LeaseElectorSettings"]

log = logging.getLogger(__name__)


class LeaderLostError(RuntimeError):
    """Leadership was lost (no renewal within the renew deadline)."""


@dataclass(frozen=True)
class LeaseElectorSettings:
    namespace: str
    name: str = "multilane-operator"
    identity: str = ""  # this replica (the pod name); must be unique among replicas
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election needs an identity (the pod name)")
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("need 0 < retry_period_s < renew_deadline_s < lease_duration_s")


def _micro_time(now: dt.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    def __init__(
        self, kube: KubeClient, settings: LeaseElectorSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.clock = clock
        self.leading = False  # the last round held or took the Lease (owned by the round loop)
        self.transitions = 0  # takeovers this replica made
        self._observed: tuple[Any, Any] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0  # monotonic time it was first seen
        self._last_renewal: float | None = None  # monotonic time of this replica's last successful write

    @property
    def path(self) -> str:
        s = self.settings
        return api_path("coordination.k8s.io/v1", "leases", s.namespace, s.name)

    def _spec(self, old: dict[str, Any] | None, acquire: bool) -> dict[str, Any]:
        now = _micro_time(dt.datetime.now(dt.UTC))
        spec = dict(old or {})
        spec.update(
            holderIdentity=self.settings.identity,
            leaseDurationSeconds=max(1, round(self.settings.lease_duration_s)),
            renewTime=now,
        )
        if acquire:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if old else 0)
        return spec

    async def try_acquire_or_renew(self) -> bool:
        """One round (steps 1-4 of the module docstring). True when this replica holds the Lease."""
        s = self.settings
        # 1. Read (or create).
        lease = await self.kube.get(self.path)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": s.name, "namespace": s.namespace},
                "spec": self._spec(None, acquire=True),
            }
            try:
                await self.kube.create(api_path("coordination.k8s.io/v1", "leases", s.namespace), body)
            except KubeConflictError:
                return self._set_leading(False)
            self._last_renewal = self.clock()
            return self._set_leading(True)
        spec = dict(lease.get("spec") or {})
        holder = spec.get("holderIdentity")
        observed = (holder, spec.get("renewTime"))
        now = self.clock()
        if observed != self._observed:
            self._observed, self._observed_at = observed, now
        if holder == s.identity:
            # 2. Renew, with the resourceVersion read.
            return await self._write(lease, self._spec(spec, acquire=False))
        # 3. Another holder, not expired: standby.
        duration = float(spec.get("leaseDurationSeconds") or s.lease_duration_s)
        if holder and now - self._observed_at < duration:
            return self._set_leading(False)
        # 4. Expired or released: take over, with the resourceVersion read.
        log.info("lease %s/%s: taking over from %r", s.namespace, s.name, holder)
        took = await self._write(lease, self._spec(spec, acquire=True))
        if took:
            self.transitions += 1
        return took

    async def _write(self, lease: dict[str, Any], spec: dict[str, Any]) -> bool:
        body = {**lease, "spec": spec}
        try:
            await self.kube.update(self.path, body)
        except KubeConflictError:
            return self._set_leading(False)  # someone wrote since our read: re-read next round
        self._last_renewal = self.clock()
        return self._set_leading(True)

    def _set_leading(self, leading: bool) -> bool:
        self.leading = leading
        return leading

    async def acquire(self) -> None:
        """Return once this replica leads (standby until then)."""
        while True:
            try:
                if await self.try_acquire_or_renew():
                    log.info("lease %s/%s: leading as %s", self.settings.namespace, self.settings.name,
                             self.settings.identity)  # fmt: skip
                    return
            except (KubeError, OSError, TimeoutError) as exc:
                log.warning("leader election: %s", exc)
            await asyncio.sleep(self.settings.retry_period_s)

    async def _keep(self) -> None:
        """Renew every retry period; raise :class:`LeaderLostError` past the renew deadline."""
        while True:
            await asyncio.sleep(self.settings.retry_period_s)
            try:
                renewed = await self.try_acquire_or_renew()
            except (KubeError, OSError, TimeoutError) as exc:
                log.warning("leader election: renewal failed: %s", exc)
                renewed = False
            if renewed:
                continue
            since = self._last_renewal if self._last_renewal is not None else 0.0
            if not self.leading and self._observed and self._observed[0] != self.settings.identity:
                raise LeaderLostError(f"lease taken by {self._observed[0]!r}")
            if self.clock() - since >= self.settings.renew_deadline_s:
                raise LeaderLostError("no renewal within the renew deadline")

    async def release(self) -> None:
        """Give the Lease up (a clean shutdown: a standby takes over at its next round)."""
        with contextlib.suppress(KubeError, OSError, TimeoutError):
            lease = await self.kube.get(self.path)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.settings.identity:
                spec = {**lease["spec"], "holderIdentity": None, "renewTime": None}
                await self.kube.update(self.path, {**lease, "spec": spec})
        self.leading = False

    async def run(self, work: Callable[[], Awaitable[Any]]) -> None:
        """Standby until leading, then ``work()`` beside the renewals. Raises
        :class:`LeaderLostError` (after cancelling the work) when leadership is lost; releases the
        Lease when the work returns or is cancelled."""
        await self.acquire()
        keeper = asyncio.create_task(self._keep(), name="lease-elector")
        worker = asyncio.ensure_future(work())
        try:
            done, _ = await asyncio.wait({keeper, worker}, return_when=asyncio.FIRST_COMPLETED)
            if keeper in done:
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
                keeper.result()  # raises LeaderLostError
            else:
                worker.result()
        finally:
            for task in (keeper, worker):
                task.cancel()
            lost = keeper.done() and not keeper.cancelled() and keeper.exception() is not None
            if not lost:
                await self.release()
