"""The worker StatefulSet's create-or-update, which meets kube-apiserver's immutable fields. Does I/O
(Kubernetes API).

A StatefulSet's ``selector``, ``serviceName``, ``volumeClaimTemplates`` and ``podManagementPolicy``
cannot change: a spec change that would change them (``spec.state.enabled``, the storage size or
class) is held, with a message for the Degraded condition (reason ``ImmutableFieldChange``), unless
the ParallelConsumer opts in to recreating the StatefulSet with the annotation
:data:`RECREATE_ANNOTATION` (orphan delete: the pods and volumes stay).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from multilane.operator.controller import EventRecord
from multilane.operator.k8s.kube import KubeClient, KubeConflictError, api_path
from multilane.operator.k8s.writes import conditional_patch, replicas_of, while_same
from multilane.operator.spec.children import (
    ConsumerRef,
    statefulset_immutable_changes,
    statefulset_update,
)

__all__ = ["RECREATE_ANNOTATION", "apply_stateful_set", "recreate_allowed"]

#: Opt-in: recreate the worker StatefulSet (orphaning its pods) when the spec changes an immutable field.
RECREATE_ANNOTATION = "multilane.dev/recreate-on-immutable-change"


def recreate_allowed(body: Mapping[str, Any]) -> bool:
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(RECREATE_ANNOTATION, "")).lower() == "true"


async def apply_stateful_set(
    kube: KubeClient,
    ref: ConsumerRef,
    manifest: dict[str, Any],
    existing: Mapping[str, Any] | None,
    body: Mapping[str, Any],
    on_event: Callable[[EventRecord], None],
    replicas_for: Callable[[Mapping[str, Any] | None], int] | None = None,
) -> str | None:
    """Create or update the worker StatefulSet; returns the message of a held immutable change.

    1. Absent: create it.
    2. Being deleted (an earlier recreate waits for its orphaning): wait for the next pass.
    3. No immutable field changes: merge-patch the fields an update may change, conditional on the
       ``resourceVersion`` of a fresh read, the replicas decided from that read by ``replicas_for``
       (a 409 re-reads and decides again; :mod:`multilane.operator.k8s.writes`).
    4. Immutable fields would change and no opt-in: hold the StatefulSet as it is (the control
       loop still scales it and moves partitions); the message names the fields.
    5. Opt-in (annotation ``multilane.dev/recreate-on-immutable-change: "true"``): delete it with
       ``propagationPolicy: Orphan`` (pods and volumes stay, running; precondition: the uid read
       in step 1), then create the new one with the same replicas. Its controller adopts the pods
       (same selector) and their volumes (same claim names); the pods change to the new template
       as the update strategy replaces them.
    """
    collection = api_path("apps/v1", "statefulsets", ref.namespace)
    path = api_path("apps/v1", "statefulsets", ref.namespace, ref.name)
    # 1. Absent: create.
    if existing is None:
        try:
            await kube.create(collection, manifest)
            return None
        except KubeConflictError:
            existing = await kube.get(path)
            if existing is None:
                return None  # gone again: the next pass creates it
    # 2. An earlier recreate still orphaning: wait.
    if (existing.get("metadata") or {}).get("deletionTimestamp"):
        return f"StatefulSet {ref.name} is being recreated: waiting for the old one to be deleted"
    changed = statefulset_immutable_changes(existing, manifest)
    # 3. Nothing immutable changes: update, conditional on the StatefulSet as read; the replicas are
    # decided again from each read (a 409 re-reads), so another writer's count is never overwritten.
    if not changed:

        def decide(current: Mapping[str, Any]) -> Mapping[str, Any]:
            update = statefulset_update(manifest)
            if replicas_for is not None:
                update["spec"]["replicas"] = replicas_for(current)
                return update
            # no rule given: the manifest's count holds only while the read one is unchanged
            return while_same(existing, replicas_of, update)(current) or update

        await conditional_patch(kube, path, decide)
        return None
    fields = ", ".join(changed)
    # 4. No opt-in: hold.
    if not recreate_allowed(body):
        return (
            f"the spec changes {fields} of StatefulSet {ref.name}, which Kubernetes does not allow to "
            f"change: the StatefulSet is kept as it is. Revert the change, or set the annotation "
            f'{RECREATE_ANNOTATION}="true" to recreate the StatefulSet (pods and volumes are kept)'
        )
    # 5. Opt-in: orphan-delete and recreate.
    uid = (existing.get("metadata") or {}).get("uid")
    await kube.delete(path, {"propagationPolicy": "Orphan", "preconditions": {"uid": uid} if uid else {}})
    try:
        await kube.create(collection, manifest)
    except KubeConflictError:
        return f"StatefulSet {ref.name} is being recreated: waiting for the old one to be deleted"
    on_event(EventRecord("Normal", "StatefulSetRecreated", f"recreated to change {fields}; pods kept"))
    return None
