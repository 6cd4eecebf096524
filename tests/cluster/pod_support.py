"""What the tier's pod tests share: a namespace of their own for the pods they start, kubectl as JSON,
a bounded wait. Does I/O (the cluster's kubectl).

:func:`pod_namespace` is the one pod-start frame: a fresh namespace (PodSecurity ``restricted``
enforced when asked), the test's objects applied into it, and the namespace deleted at the end
whatever happened in between (``--wait=false``: the next test does not wait for its finalizers).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from multilane.testing.cluster import LocalCluster

__all__ = ["RESTRICTED", "apply", "conditions", "get", "pod_namespace", "until"]

# A container's securityContext that PodSecurity `restricted` admits.
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def get(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    """``kubectl get -o json ARGS``, parsed."""
    return dict(json.loads(cluster.kubectl("get", "-o", "json", *args)))


def apply(cluster: LocalCluster, *objects: dict[str, Any]) -> None:
    """``kubectl apply`` of ``objects`` as one List (a refusal raises ``ClusterError``)."""
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )


def conditions(obj: dict[str, Any]) -> dict[str, str]:
    """An object's status conditions, type -> status (``{}`` before it has any)."""
    return {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions") or []}


def until(what: str, check: Callable[[], Any], timeout_s: float = 120.0) -> Any:
    """Poll ``check`` every 0.5 s until it returns something true, and return that; AssertionError
    naming ``what`` and the last value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")


@contextmanager
def pod_namespace(
    cluster: LocalCluster, prefix: str, *objects: dict[str, Any], restricted: bool = False
) -> Iterator[str]:
    """A namespace ``PREFIX-xxxxxx`` with ``objects`` applied in it (each object's
    ``metadata.namespace`` is set to it); yields its name, deletes it on exit (steps 1-3).

    1. Create the namespace (label ``pod-security.kubernetes.io/enforce: restricted`` when asked).
    2. Apply ``objects`` in one List.
    3. On exit, also when step 2 or the test failed: delete the namespace without waiting.
    """
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    labels = {"pod-security.kubernetes.io/enforce": "restricted"} if restricted else {}
    # 1.
    apply(cluster, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}})
    try:
        # 2.
        if objects:
            apply(cluster, *({**o, "metadata": {**o["metadata"], "namespace": ns}} for o in objects))
        yield ns
    finally:
        # 3.
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
