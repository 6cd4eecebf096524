"""``WatchCache``: the operator's reads from kopf indexes, and its own writes never read back stale."""

from __future__ import annotations

from typing import Any

from multilane.operator.k8s.cache import WatchCache
from multilane.operator.spec.children import ConsumerRef

REF = ConsumerRef("orders", "team-a", "uid-1")


def sts(rv: int, replicas: int) -> dict[str, Any]:
    return {"metadata": {"name": "orders", "resourceVersion": str(rv)}, "spec": {"replicas": replicas}}


def test_unbound_until_every_index_is_given() -> None:
    cache = WatchCache()
    assert not cache.bound
    cache.bind({"multilane_pods": {}, "multilane_leases": {}})
    assert not cache.bound
    cache.bind({"multilane_statefulsets": {}, "other_kwarg": 1})
    assert cache.bound


def test_reads_by_namespace_and_consumer() -> None:
    cache = WatchCache()
    pods = {("team-a", "orders"): [{"metadata": {"name": "orders-0"}}], ("team-b", "orders"): [{}]}
    cache.bind({"multilane_pods": pods, "multilane_leases": {}, "multilane_statefulsets": {}})
    assert [p["metadata"]["name"] for p in cache.pods(REF)] == ["orders-0"]
    assert cache.leases(REF) == [] and cache.statefulset(REF) is None


def test_a_write_wins_until_the_watch_delivers_it() -> None:
    index: dict[Any, list[dict[str, Any]]] = {("team-a", "orders"): [sts(10, 2)]}
    cache = WatchCache()
    cache.bind({"multilane_pods": {}, "multilane_leases": {}, "multilane_statefulsets": index})
    cache.remember(REF, sts(11, 3))  # the operator scaled to 3
    assert cache.statefulset(REF)["spec"]["replicas"] == 3  # type: ignore[index]
    index[("team-a", "orders")] = [sts(12, 3)]  # the watch caught up (and beyond)
    assert cache.statefulset(REF)["metadata"]["resourceVersion"] == "12"  # type: ignore[index]
