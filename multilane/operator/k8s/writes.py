"""Conditional writes of the operator's children: every patch of an existing child carries the
``resourceVersion`` its decision was based on, so a child another writer changed since (a previous
leader waking up, a user's ``kubectl edit``) answers 409 and is never overwritten. Does I/O
(Kubernetes API).

:func:`apply_child` (the children of a reconcile), in steps:

1. Create the child; done unless it exists (409 AlreadyExists).
2. Read it (GET).
3. Decide the patch from what was read (``decide(current)``; None: nothing to write).
4. Merge-patch it with ``metadata.resourceVersion`` = the one read in step 2. A 409 (it changed since
   step 2): back to step 2 and decide again, at most ``attempts`` rounds; then
   :class:`~multilane.operator.k8s.kube.KubeConflictError` (the pass fails; the next one re-reads).

:func:`conditional_patch` is steps 2-4 alone (a child that must exist already). Writes decided on a
view read earlier (the control loop's replicas, from the watch) use :func:`with_version`: their 409
fails the pass, and the next pass decides again from a fresh view.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from multilane.operator.k8s.kube import KubeClient, KubeConflictError

__all__ = ["apply_child", "conditional_patch", "patch_to", "with_version"]

log = logging.getLogger(__name__)

Decide = Callable[[Mapping[str, Any]], Mapping[str, Any] | None]


def patch_to(patch: Mapping[str, Any]) -> Decide:
    """The decision of a child whose wanted state does not depend on what is there (its manifest)."""
    return lambda _current: patch


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
    """Steps 2-4. The object as written (or as read, when nothing was to write); None: it is absent."""
    for attempt in range(attempts):
        # 2. Read.
        current = await kube.get(path)
        if current is None:
            return None
        # 3. Decide from what was read.
        patch = decide(current)
        if patch is None:
            return current
        # 4. Write, conditional on the read.
        try:
            return await kube.patch(path, with_version(patch, current))
        except KubeConflictError:
            log.info("%s changed since read (attempt %d): re-reading", path, attempt + 1)
    raise KubeConflictError(409, f"{path} kept changing; not overwritten")


async def apply_child(
    kube: KubeClient, collection: str, path: str, manifest: Mapping[str, Any], decide: Decide
) -> dict[str, Any] | None:
    """Steps 1-4: create ``manifest``, or patch the existing child by ``decide``."""
    # 1. Create.
    try:
        return await kube.create(collection, manifest)
    except KubeConflictError:
        pass  # it exists
    return await conditional_patch(kube, path, decide)
