"""Where workers run: the ``Platform`` protocol that the controller sees workers through. Pure: no I/O.

The assignment and scaling code sees workers only through :class:`Platform`: ensure N workers, list
them with liveness, give a worker's control URL. A later issue adds a local subprocess platform.
Implementations: :class:`multilane.operator.k8s.platform.KubernetesPlatform` (pods and Leases) and
:class:`multilane.operator.local.platform.LocalPlatform` (worker subprocesses).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Protocol, TypeGuard, runtime_checkable

from multilane.operator.spec.children import ConsumerRef

__all__ = ["Platform", "WorkerInfo", "WorkerReplacer", "is_replacer", "parse_time"]


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker as the platform sees it. ``ordinal`` orders workers (StatefulSet index)."""

    name: str
    ordinal: int
    alive: bool  # lease fresh: the process runs and may own partitions; False = known dead
    control_url: str
    terminating: bool = False  # alive but going away: may release partitions, gets no new ones
    reason: str = ""  # why not alive
    # The pod template this worker runs (children.TEMPLATE_HASH_ANNOTATION); "" when unknown or the
    # platform has no templates (local). Compared with the desired one by the replacement planner.
    revision: str = ""
    ready: bool | None = None  # the pod's Ready condition (readiness probe); None: not reported

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


@runtime_checkable
class WorkerReplacer(Protocol):
    """A platform whose workers run a versioned template (Kubernetes: the StatefulSet's pod template,
    ``updateStrategy: OnDelete``), replaced by the operator (``operator.rollout.replacement``)."""

    async def desired_revision(self, ref: ConsumerRef) -> str | None:
        """The template hash new workers get (None: unknown, nothing is replaced)."""

    async def replace_worker(self, ref: ConsumerRef, name: str) -> None:
        """Delete the worker; the platform starts it again on the desired template."""


def is_replacer(platform: object) -> TypeGuard[WorkerReplacer]:
    """``isinstance(platform, WorkerReplacer)`` for platforms whose methods are their class's, answered
    once per class: a runtime ``Protocol`` check walks the protocol's members on every call, and a
    pass asks several times."""
    cls = type(platform)
    known = _REPLACER_CLASSES.get(cls)
    if known is None:
        known = _REPLACER_CLASSES[cls] = issubclass(cls, WorkerReplacer)
    return known


_REPLACER_CLASSES: dict[type, bool] = {}  # class -> whether it is a WorkerReplacer (is_replacer's)


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
