"""``WatchCache``: the operator's reads of pods, Leases and StatefulSets from watches (kopf indexes)
instead of a GET or LIST per control pass. Does I/O only through kopf (the watches it runs).

kopf keeps one watch per resource kind and, before it runs any timer, fills every index from a LIST
(so a restarted operator never acts on an empty view). The indexes registered here
(:func:`register_indexes`) key each object by ``(namespace, consumer)`` -- the label
``multilane.dev/consumer`` every child carries -- and keep only the fields the operator reads:

- pods: name, annotations, labels, ``deletionTimestamp``, status (readiness, container states);
- Leases: name and spec (the workers' renewals);
- StatefulSets: name, ``resourceVersion``, ``spec.replicas``, the pod template's annotations, status.

Writes the operator makes itself (a replica count) are remembered (:meth:`WatchCache.remember`) until
the watch delivers a version at least as new, so the next pass never reads its own write stale.
Without kopf (tests that call the platform directly) the cache is unbound and the platform reads the
API server instead.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import kopf

from multilane.operator.spec.children import CONSUMER_LABEL, ConsumerRef

__all__ = ["INDEX_NAMES", "WatchCache", "register_indexes"]

INDEX_NAMES = ("multilane_pods", "multilane_leases", "multilane_statefulsets")

Index = Mapping[Any, Collection[Mapping[str, Any]]]


def _meta(body: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {k: meta[k] for k in ("name", *keys) if k in meta}


def _key(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace", "")), str((meta.get("labels") or {}).get(CONSUMER_LABEL, ""))


def register_indexes(registry: kopf.OperatorRegistry) -> None:
    """The three kopf indexes of the module docstring (objects with the consumer label only). Async:
    kopf runs them on its loop, not in its thread pool (they only copy a few fields)."""
    labelled = {CONSUMER_LABEL: kopf.PRESENT}

    @kopf.index("v1", "pods", labels=labelled, id="multilane_pods", registry=registry)
    async def multilane_pods(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
        meta = _meta(body, "annotations", "labels", "deletionTimestamp")
        return {_key(body): {"metadata": meta, "status": dict(body.get("status") or {})}}

    @kopf.index(
        "coordination.k8s.io", "v1", "leases", labels=labelled, id="multilane_leases", registry=registry
    )
    async def multilane_leases(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
        return {_key(body): {"metadata": _meta(body), "spec": dict(body.get("spec") or {})}}

    @kopf.index("apps", "v1", "statefulsets", labels=labelled, id="multilane_statefulsets", registry=registry)
    async def multilane_statefulsets(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
        spec = body.get("spec") or {}
        template_meta = (spec.get("template") or {}).get("metadata") or {}
        return {
            _key(body): {
                "metadata": _meta(body, "resourceVersion", "generation"),
                "spec": {
                    "replicas": spec.get("replicas"),
                    "template": {"metadata": {"annotations": dict(template_meta.get("annotations") or {})}},
                },
                "status": dict(body.get("status") or {}),
            }
        }


def _version(obj: Mapping[str, Any] | None) -> int:
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class WatchCache:
    """Reads of the kopf indexes for one consumer. Unbound (``bound`` False) until :meth:`bind`."""

    def __init__(self) -> None:
        self._indexes: dict[str, Index] = {}
        # (namespace, name) -> StatefulSet as the operator last wrote it (until the watch catches up)
        self._written: dict[tuple[str, str], dict[str, Any]] = {}

    @property
    def bound(self) -> bool:
        return all(name in self._indexes for name in INDEX_NAMES)

    def bind(self, indexes: Mapping[str, Any]) -> None:
        """Keep the kopf indexes (live objects: kopf updates them in place) from a handler's kwargs."""
        for name in INDEX_NAMES:
            if name in indexes:
                self._indexes[name] = indexes[name]

    def _items(self, name: str, ref: ConsumerRef) -> list[Mapping[str, Any]]:
        store = self._indexes[name].get((ref.namespace, ref.name))
        return list(store) if store is not None else []

    def pods(self, ref: ConsumerRef) -> list[Mapping[str, Any]]:
        return self._items("multilane_pods", ref)

    def leases(self, ref: ConsumerRef) -> list[Mapping[str, Any]]:
        return self._items("multilane_leases", ref)

    def statefulset(self, ref: ConsumerRef) -> Mapping[str, Any] | None:
        """The consumer's StatefulSet ``NAME`` (the newer of the watched one and the last written)."""
        found = [s for s in self._items("multilane_statefulsets", ref) if _meta(s).get("name") == ref.name]
        watched = found[0] if found else None
        written = self._written.get((ref.namespace, ref.name))
        if written is not None and _version(written) > _version(watched):
            return written
        self._written.pop((ref.namespace, ref.name), None)
        return watched

    def remember(self, ref: ConsumerRef, sts: Mapping[str, Any]) -> None:
        """A StatefulSet the operator just wrote (the API server's answer, with its resourceVersion)."""
        if _version(sts):
            self._written[(ref.namespace, ref.name)] = dict(sts)
