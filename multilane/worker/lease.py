"""``LeaseKeeper``: the worker's side of operator liveness. Does I/O (Kubernetes API over HTTP).

The operator creates a ``coordination.k8s.io/v1`` Lease named after each worker pod and treats the
worker as alive while the Lease's ``renewTime`` is younger than ``leaseDurationSeconds``; once it is
older, the operator hands the worker's partitions to others without waiting for a release. So the
worker must stop processing *before* that point if it cannot renew. Protocol of the keeper:

1. Every ``renew_interval_s``: GET the Lease, set ``holderIdentity`` (this pod), ``renewTime``
   (now, MicroTime) and ``leaseDurationSeconds`` (this keeper's duration), PUT it back with the
   ``resourceVersion`` just read (optimistic concurrency: a 409 means it changed in between; it is
   retried at the next interval).
2. On success, remember the monotonic time of the renewal.
3. When ``lease_duration - stop_margin`` seconds pass without a successful renewal, call
   ``on_lost()`` once: the worker stops processing (the engine wires this). The operator will treat
   it as dead ``stop_margin`` seconds later at the earliest.
4. The keeper goes on trying. After a loss it calls ``on_renewed()`` (if given) on the next success;
   the worker must still wait for a new assignment (a higher generation) before processing again,
   since its partitions may have moved.

The keeper needs RBAC get/update on its own Lease only (the chart's Role for ``NAME-worker``).

Token: with ``token_file`` (the projected service-account token of the pod) the bearer token is
re-read from the file every ``token_refresh_s`` (60 s) and at the next renewal after a 401, so the
kubelet's rotation (and an expired token) is picked up without a restart.

Lease duration (``MULTILANE_LEASE_DURATION_SECONDS``, set from the ParallelConsumer's
``spec.workload.leaseDurationSeconds``): the trade-off. A worker cut off from the API server keeps
processing until ``lease_duration - stop_margin`` (2/3 of the duration) and the operator moves its
partitions only after the full duration: a longer lease rides out longer API-server hiccups without
stopping work, but a partitioned or hung worker holds its partitions (no progress on them) that much
longer. The fencing (generation, the operator's wait for expiry) keeps ownership single either way.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

__all__ = ["LeaseKeeper", "LeaseSettings"]

log = logging.getLogger(__name__)

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Test-only: where the service account files are when not at SA_DIR (the operator tests' pod double
# writes a pod's token and CA elsewhere). Unset in a real pod.
SA_DIR_ENV = "MULTILANE_SERVICE_ACCOUNT_DIR"


@dataclass(frozen=True)
class LeaseSettings:
    """Where the Lease is. Invariants: ``0 < stop_margin_s < lease_duration_s`` and
    ``0 < renew_interval_s < lease_duration_s - stop_margin_s``."""

    api_url: str  # e.g. https://kubernetes.default.svc
    namespace: str
    name: str  # the Lease name = the pod name
    holder: str  # holderIdentity to write (the pod name)
    lease_duration_s: float = 15.0
    stop_margin_s: float = 5.0
    renew_interval_s: float = 3.0
    token: str = ""
    ca_file: str | None = None
    request_timeout_s: float = 2.0
    token_file: str | None = None  # re-read (module docstring); wins over ``token`` when set
    token_refresh_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.stop_margin_s < self.lease_duration_s:
            raise ValueError("need 0 < stop_margin_s < lease_duration_s")
        if not 0 < self.renew_interval_s < self.lease_duration_s - self.stop_margin_s:
            raise ValueError("need 0 < renew_interval_s < lease_duration_s - stop_margin_s")

    @classmethod
    def from_environment(cls) -> LeaseSettings:
        """In a worker pod: pod name/namespace and lease duration from the env the operator sets."""
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        duration = float(os.environ.get("MULTILANE_LEASE_DURATION_SECONDS", "15"))
        pod = os.environ["MULTILANE_POD_NAME"]
        sa_dir = Path(os.environ.get(SA_DIR_ENV) or SA_DIR)
        return cls(
            api_url=f"https://{host}:{port}",
            namespace=os.environ["MULTILANE_POD_NAMESPACE"],
            name=pod,
            holder=pod,
            lease_duration_s=duration,
            stop_margin_s=duration / 3,
            renew_interval_s=duration / 5,
            token=(sa_dir / "token").read_text().strip(),
            ca_file=str(sa_dir / "ca.crt"),
            token_file=str(sa_dir / "token"),
        )


def _micro_time(now: dt.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseKeeper:
    """Run with ``await keeper.run()`` (until cancelled) or ``start()``/``stop()``."""

    def __init__(
        self,
        settings: LeaseSettings,
        on_lost: Callable[[], None],
        on_renewed: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.on_lost = on_lost
        self.on_renewed = on_renewed
        self.clock = clock
        self.last_renewal: float | None = None  # monotonic time of the last successful renewal
        self.lost = False  # on_lost was called and no renewal succeeded since
        self.renewals = 0
        self._started = clock()
        self._task: asyncio.Task[None] | None = None
        self._token = settings.token
        self._token_read_at: float | None = None  # monotonic time token_file was last read
        self.token_reads = 0

    def _headers(self) -> dict[str, str]:
        """The Authorization header, with the token re-read from ``token_file`` when due."""
        s = self.settings
        if s.token_file:
            now = time.monotonic()
            if self._token_read_at is None or now - self._token_read_at >= s.token_refresh_s:
                try:
                    self._token = Path(s.token_file).read_text().strip()
                    self.token_reads += 1
                except OSError as exc:
                    log.warning("lease %s: cannot read the token file: %s", s.name, exc)
                self._token_read_at = now
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    @property
    def _path(self) -> str:
        s = self.settings
        return f"/apis/coordination.k8s.io/v1/namespaces/{s.namespace}/leases/{s.name}"

    def _session(self) -> aiohttp.ClientSession:
        s = self.settings
        ssl_ctx: ssl.SSLContext | bool = False
        if s.api_url.startswith("https"):
            ssl_ctx = ssl.create_default_context(cafile=s.ca_file)
        return aiohttp.ClientSession(
            base_url=s.api_url.rstrip("/") + "/",
            timeout=aiohttp.ClientTimeout(total=s.request_timeout_s),
            connector=aiohttp.TCPConnector(ssl=ssl_ctx),
        )

    async def renew_once(self, session: aiohttp.ClientSession) -> bool:
        """Steps 1-2 once. Returns True when the Lease was renewed."""
        # 1. GET, stamp, PUT with the resourceVersion just read.
        try:
            async with session.get(self._path.lstrip("/"), headers=self._headers()) as resp:
                if resp.status == 401:
                    self._token_read_at = None  # re-read the token file before the next call
                if resp.status != 200:
                    log.warning("lease %s: GET answered %d", self.settings.name, resp.status)
                    return False
                lease: dict[str, Any] = await resp.json()
            spec = lease.setdefault("spec", {})
            now = dt.datetime.now(dt.UTC)
            if spec.get("holderIdentity") != self.settings.holder or not spec.get("acquireTime"):
                spec["acquireTime"] = _micro_time(now)
            spec["holderIdentity"] = self.settings.holder
            spec["renewTime"] = _micro_time(now)
            # The holder states its own duration (as Kubernetes leader election does): the operator
            # judges expiry with the duration written here.
            spec["leaseDurationSeconds"] = max(1, int(self.settings.lease_duration_s))
            async with session.put(self._path.lstrip("/"), json=lease, headers=self._headers()) as resp:
                if resp.status == 401:
                    self._token_read_at = None
                if resp.status != 200:
                    log.warning("lease %s: PUT answered %d", self.settings.name, resp.status)
                    return False
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("lease %s: renewal failed: %s", self.settings.name, exc)
            return False
        # 2. Remember when.
        self.last_renewal = self.clock()
        self.renewals += 1
        return True

    def check_deadline(self) -> None:
        """Step 3: call ``on_lost`` once when the stop deadline passed without a renewal."""
        since = self.last_renewal if self.last_renewal is not None else self._started
        deadline = self.settings.lease_duration_s - self.settings.stop_margin_s
        if not self.lost and self.clock() - since >= deadline:
            self.lost = True
            log.error("lease %s not renewed in time: stopping processing", self.settings.name)
            self.on_lost()

    async def _watchdog(self) -> None:
        # 3. Deadline: checked on its own, so a hanging renewal cannot delay the stop.
        while True:
            self.check_deadline()
            await asyncio.sleep(min(0.2, self.settings.stop_margin_s / 4))

    async def run(self) -> None:
        watchdog = asyncio.create_task(self._watchdog())
        try:
            async with self._session() as session:
                while True:
                    renewed = await self.renew_once(session)
                    # 4. Regained after a loss.
                    if renewed and self.lost:
                        self.lost = False
                        if self.on_renewed is not None:
                            self.on_renewed()
                    await asyncio.sleep(self.settings.renew_interval_s)
        finally:
            watchdog.cancel()

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.create_task(self.run(), name=f"lease-keeper-{self.settings.name}")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
