"""What a write does to a stored object in the API-server double (:mod:`multilane.testing.kube_api`):
the object a PATCH or PUT makes, a DELETE's options, and which objects the garbage collector takes.
Pure (dicts in, dicts out; refusals raised as :class:`~multilane.testing.kube_rules.RefusalError`).

- :func:`scale_patch`: a write to ``/scale`` of a custom resource, as a patch of its
  ``specReplicasPath``;
- :func:`written_object`: the object after a JSON patch, a PUT or a merge patch, with a status
  subresource's rule (a write to the object keeps the stored ``status``, a write to ``/status``
  changes only ``status``); :func:`next_generation`: ``generation`` + 1 when anything outside
  ``metadata``/``status`` changed;
- :func:`delete_orphans`: a DELETE's ``preconditions`` (409 when they do not hold) and its
  ``propagationPolicy`` (the uid whose dependents are orphaned);
- :func:`dangling`: the live objects an owner reference of which names no live object (background
  cascading deletion, https://kubernetes.io/docs/concepts/architecture/garbage-collection/).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import jsonpatch

from multilane.testing.kube_crd import apply_merge_patch
from multilane.testing.kube_rules import RefusalError

__all__ = ["dangling", "delete_orphans", "next_generation", "scale_patch", "written_object"]

log = logging.getLogger(__name__)


def scale_patch(replicas_path: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``{"spec": {"replicas": N}}`` sent to ``/scale``, as a merge patch of ``replicas_path``
    (``.spec.scaling.replicas``)."""
    replicas = (body.get("spec") or {}).get("replicas")
    patch: dict[str, Any] = {}
    node = patch
    parts = replicas_path.strip(".").split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = replicas
    return patch


def written_object(
    old: dict[str, Any], body: Any, *, put: bool, status_write: bool, has_status: bool, where: str = ""
) -> dict[str, Any]:
    """The object that ``body`` makes of ``old``: a JSON patch (a list), a PUT (``put``) or a merge
    patch. ``status_write``: the request went to ``/status``; ``has_status``: the resource has a status
    subresource. ``where``: the request's path, for the log."""
    if isinstance(body, list):
        try:
            new = jsonpatch.apply_patch(copy.deepcopy(old), body)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            # A patch that does not apply, a failed "test" op too (kopf tests
            # /metadata/resourceVersion before writing its finalizer and annotations): 422, which
            # kopf expects and retries on its next cycle; a 409 there would be an "unexpected
            # error" to kopf. Verified in kube-apiserver: jsonPatcher.applyJSPatch
            # (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go, kubernetes/kubernetes
            # at 00f75347) answers any error of patchObj.Apply with
            # errors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", {}, "", msg, 0,
            # false): reason Invalid, this fixed message, and no causes (isUnexpectedResponse is
            # false), so the failed op is not named in the answer; it is logged here instead.
            log.debug("JSON patch on %s refused (422): %s", where, exc)
            raise RefusalError(
                422, "Invalid", "the server rejected our request due to an error in our request"
            ) from None
    elif put:
        new = copy.deepcopy(body)
        new.setdefault("metadata", {})
        for key in ("uid", "creationTimestamp", "namespace", "name", "generation"):
            if key in old["metadata"]:
                new["metadata"][key] = old["metadata"][key]
    else:
        new = apply_merge_patch(copy.deepcopy(old), body)
    if has_status:
        if status_write:
            new = {**old, "status": new.get("status"), "metadata": {**old["metadata"], **new["metadata"]}}
            if new["status"] is None:
                new.pop("status")
        elif "status" in old:
            new["status"] = old["status"]
        else:
            new.pop("status", None)
    return dict(new)


def next_generation(old: Mapping[str, Any], new: Mapping[str, Any]) -> int | None:
    """``old``'s generation + 1 when anything outside ``metadata``/``status`` changed, else None."""
    strip = ("metadata", "status")
    if {k: v for k, v in new.items() if k not in strip} == {k: v for k, v in old.items() if k not in strip}:
        return None
    return int(old["metadata"].get("generation") or 1) + 1


def delete_orphans(
    stored: Mapping[str, Any],
    options: Mapping[str, Any],
    params: Mapping[str, Any],
    plural: str | None,
    group: str | None,
    name: str,
) -> str | None:
    """DeleteOptions of a DELETE of ``stored``: ``preconditions`` (``resourceVersion``, ``uid``: 409
    ``Conflict`` when one differs) and ``propagationPolicy`` (in the body or the query). Returns the
    uid whose dependents lose their reference (``Orphan``), else None."""
    meta = stored.get("metadata") or {}
    pre = options.get("preconditions") or {}
    for key in ("resourceVersion", "uid"):
        if pre.get(key) is not None and str(pre[key]) != str(meta.get(key)):
            raise RefusalError.conflict(plural, group, name)
    policy = options.get("propagationPolicy") or params.get("propagationPolicy")
    return str(meta.get("uid")) if policy == "Orphan" else None


def dangling(objects: Iterable[tuple[Any, Mapping[str, Any], bool]]) -> list[Any]:
    """The keys of the live objects (``(key, object, deleted)``) with an owner reference whose uid
    names no live object: what background cascading deletion takes next."""
    listed = list(objects)
    live = {(obj.get("metadata") or {}).get("uid") for _, obj, deleted in listed if not deleted}
    return [
        key
        for key, obj, deleted in listed
        if not deleted and any(ref.get("uid") not in live for ref in _owner_refs(obj))
    ]


def _owner_refs(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((obj.get("metadata") or {}).get("ownerReferences") or [])
