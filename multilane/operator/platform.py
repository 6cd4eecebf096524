"""Where workers run: the ``Platform`` protocol that the controller sees workers through. Pure: no I/O.

The assignment and scaling code sees workers only through :class:`Platform`: ensure N workers, list
them with liveness, give a worker's control URL. A later issue adds a local subprocess platform.
Implementations: :class:`multilane.operator.k8s.platform.KubernetesPlatform` (pods and Leases) and
:class:`multilane.operator.local.platform.LocalPlatform` (worker subprocesses).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Protocol

from multilane.operator.spec.children import ConsumerRef

__all__ = ["Platform", "WorkerInfo", "parse_time"]


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker as the platform sees it. ``ordinal`` orders workers (StatefulSet index)."""

    name: str
    ordinal: int
    alive: bool  # lease fresh: the process runs and may own partitions; False = known dead
    control_url: str
    terminating: bool = False  # alive but going away: may release partitions, gets no new ones
    reason: str = ""  # why not alive

    @property
    def eligible(self) -> bool:
        """May receive partitions."""
        return self.alive and not self.terminating


class Platform(Protocol):
    async def ensure_workers(self, ref: ConsumerRef, replicas: int) -> None:
        """Make the platform run ``replicas`` workers (ordinals ``0 .. replicas-1``)."""

    async def current_workers(self, ref: ConsumerRef) -> int:
        """How many workers the platform is asked to run now."""

    async def list_workers(self, ref: ConsumerRef) -> list[WorkerInfo]:
        """Every worker that exists, alive or not, in ordinal order."""


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
