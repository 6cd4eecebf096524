"""Conditional writes of the operator's children: a patch decided on what the operator read of a
child carries that read's ``resourceVersion``, so a child another writer changed since (a previous
leader waking up, a user's ``kubectl scale``) answers 409 and is never overwritten. Does I/O
(Kubernetes API). Users: the StatefulSet's update and replicas, the snapshot CronJob's suspension,
the control-TLS Secret (:mod:`multilane.operator.k8s.certs`, its own loop of the same steps).

:func:`conditional_patch`, in steps:

1. Read the child (GET).
2. Decide the patch from what was read (``decide(current)``; None: nothing to write).
3. Merge-patch it with ``metadata.resourceVersion`` = the one read in step 1. A 409 (it changed since
   step 1): back to step 1 and decide again, at most ``attempts`` rounds; then
   :class:`~multilane.operator.k8s.kube.KubeConflictError` (the pass fails; the next one re-reads).

The children that are a function of the spec alone (ServiceAccount, Role, RoleBinding, Service,
PodDisruptionBudget, NetworkPolicy, the CronJob's manifest) are merge-patched to their manifest on
no read (the chart grants no ``get`` on most of them): there is no decision on their state to be
stale.

A write decided on a view read earlier (the control loop's replicas, from the watch; the StatefulSet
a reconcile read first) decides with :func:`while_same`: re-read and written while the field its
decision started from is unchanged, so the controllers' status writes (which change the
``resourceVersion`` too) cost a re-read, and a changed field fails the pass: the next one decides
again from a fresh view.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from multilane.operator.k8s.kube import KubeClient, KubeConflictError

__all__ = ["conditional_patch", "replicas_of", "while_same", "with_version"]

log = logging.getLogger(__name__)

Decide = Callable[[Mapping[str, Any]], Mapping[str, Any] | None]


def replicas_of(obj: Mapping[str, Any] | None) -> Any:
    return ((obj or {}).get("spec") or {}).get("replicas")


def while_same(
    read: Mapping[str, Any] | None, basis: Callable[[Any], Any], patch: Mapping[str, Any]
) -> Decide:
    """The decision ``patch``, made from ``read``, holds while ``basis`` of the child is what it was in
    ``read`` (e.g. the replicas a scaling decision started from): other changes (the controllers'
    status writes, which change the resourceVersion too) only cost a re-read; a changed basis raises
    :class:`KubeConflictError`, so the caller's pass fails and the next one decides again."""
    before = basis(read)

    def decide(current: Mapping[str, Any]) -> Mapping[str, Any] | None:
        if basis(current) != before:
            raise KubeConflictError(409, f"changed since the decision: {before!r} -> {basis(current)!r}")
        return patch

    return decide


def with_version(patch: Mapping[str, Any], read: Mapping[str, Any] | None) -> dict[str, Any]:
    """``patch`` conditional on the ``resourceVersion`` of ``read`` (unchanged without one)."""
    out = dict(patch)
    rv = ((read or {}).get("metadata") or {}).get("resourceVersion")
    if rv:
        out["metadata"] = {**dict(out.get("metadata") or {}), "resourceVersion": str(rv)}
    return out


async def conditional_patch(
    kube: KubeClient, path: str, decide: Decide, attempts: int = 3
) -> dict[str, Any] | None:
    """Steps 1-3. The object as written (or as read, when nothing was to write); None: it is absent."""
    for attempt in range(attempts):
        # 1. Read.
        current = await kube.get(path)
        if current is None:
            return None
        # 2. Decide from what was read.
        patch = decide(current)
        if patch is None:
            return current
        # 3. Write, conditional on the read.
        try:
            return await kube.patch(path, with_version(patch, current))
        except KubeConflictError:
            log.info("%s changed since read (attempt %d): re-reading", path, attempt + 1)
    raise KubeConflictError(409, f"{path} kept changing; not overwritten")
