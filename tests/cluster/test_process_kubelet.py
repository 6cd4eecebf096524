"""The process kubelet on the real API server, the parts the StatefulSet test does not reach: env
from a Secret and a ConfigMap and both in one projected volume, an ``exec`` readiness probe inside
the container's mount namespace, a crash restarted by ``restartPolicy: Always`` (restart count, last
state) with the ``emptyDir`` kept across the restart, a claim's volume removed with its directory
once the claim is deleted (reclaim ``Delete``), a Deployment's pods, and a liveness restart."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from multilane.testing.cluster import LocalCluster
from multilane.testing.kubelet_node import STORAGE_CLASS
from multilane.testing.process_kubelet import ProcessKubelet

RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
# First run: record what it sees, then crash (exit 3). Second run: record again, become ready, wait.
SCRIPT = (
    'echo "$PASSWORD $MODE $(cat /media/password) $(cat /media/mode) $(id -u)" >> /srv/out; '
    "if [ ! -f /srv/crashed ]; then touch /srv/crashed; exit 3; fi; "
    "touch /srv/ready; exec sleep 3600"
)


def _get(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", "-o", "json", *args)))


def _apply(cluster: LocalCluster, *objects: dict[str, Any]) -> None:
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )


def _until(what: str, check: Callable[[], Any], timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")


def test_secrets_config_probe_and_restart(
    real_cluster: LocalCluster, process_kubelet: ProcessKubelet
) -> None:
    cluster, ns = real_cluster, f"pk-{uuid.uuid4().hex[:6]}"
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    _apply(cluster, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}})
    container = {
        "name": "app",
        "image": "example.invalid/app:1",
        "command": ["sh", "-c", SCRIPT],
        "env": [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}}],
        "envFrom": [{"configMapRef": {"name": "settings"}}],
        "volumeMounts": [
            {"name": "config", "mountPath": "/media", "readOnly": True},
            {"name": "work", "mountPath": "/srv"},
        ],
        "readinessProbe": {"exec": {"command": ["test", "-f", "/srv/ready"]}, "periodSeconds": 1},
        "securityContext": RESTRICTED,
    }
    _apply(
        cluster,
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds", "namespace": ns},
         "stringData": {"password": "s3cret"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": ns},
         "data": {"MODE": "fast", "mode": "fast"}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app", "namespace": ns},
         "spec": {"securityContext": {"runAsUser": 1234, "fsGroup": 1234}, "containers": [container],
                  "volumes": [{"name": "config", "projected": {"defaultMode": 0o400, "sources": [
                      {"secret": {"name": "creds"}}, {"configMap": {"name": "settings"}}]}},
                              {"name": "work", "emptyDir": {}}]}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": "scratch", "namespace": ns},
         "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}},
    )  # fmt: skip
    try:

        def ready() -> dict[str, Any] | None:
            pod = _get(cluster, "-n", ns, "pod", "app")
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            return pod if conditions.get("Ready") == "True" else None

        pod = _until("the pod Ready after one crash", ready)
        [status] = pod["status"]["containerStatuses"]
        assert status["restartCount"] == 1
        assert status["lastState"]["terminated"]["exitCode"] == 3
        assert "running" in status["state"]
        worker = process_kubelet.worker(ns, "app")
        assert worker is not None
        out = (worker.files.volumes["work"] / "out").read_text().splitlines()
        assert out == ["s3cret fast s3cret fast 1234"] * 2  # the emptyDir outlived the crash

        # the claim: provisioned by the local-path class (the default), bound, then removed with its dir
        def bound() -> dict[str, Any] | None:
            pvc = _get(cluster, "-n", ns, "pvc", "scratch")
            return pvc if pvc["status"].get("phase") == "Bound" else None

        pvc = _until("the claim Bound", bound)
        assert pvc["spec"]["storageClassName"] == STORAGE_CLASS
        pv = _get(cluster, "pv", pvc["spec"]["volumeName"])
        directory = Path(pv["spec"]["hostPath"]["path"])
        assert directory.is_dir()
        cluster.kubectl("-n", ns, "delete", "pvc", "scratch", "--wait=false")
        _until(
            "the volume deleted",
            lambda: not cluster.kubectl("get", "pv", "-o", "name").count(pv["metadata"]["name"]),
        )
        assert not directory.exists()
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_a_deployment_gets_its_pod_running(
    real_cluster: LocalCluster, process_kubelet: ProcessKubelet
) -> None:
    """The chart runs the operator as a Deployment: deployment and replicaset controllers, then a
    pod on the process kubelet (as the chart's operator would be)."""
    cluster, ns = real_cluster, f"dep-{uuid.uuid4().hex[:6]}"
    _apply(cluster, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    container = {"name": "c", "image": "example.invalid/c:1", "command": ["sleep", "3600"],
                 "securityContext": RESTRICTED}  # fmt: skip
    _apply(cluster, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "op", "namespace": ns},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "op"}},
                 "template": {"metadata": {"labels": {"app": "op"}}, "spec": {"containers": [container]}}},
    })  # fmt: skip
    try:
        _until(
            "2 ready replicas",
            lambda: _get(cluster, "-n", ns, "deploy", "op")["status"].get("readyReplicas") == 2,
        )
        pods = _get(cluster, "-n", ns, "pods")["items"]
        assert [len(process_kubelet.pids(ns, p["metadata"]["name"])) for p in pods] == [1, 1]
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_a_failing_liveness_probe_restarts_the_container(
    real_cluster: LocalCluster, process_kubelet: ProcessKubelet
) -> None:
    """The probe fails twice in a row: SIGTERM (ignored here), SIGKILL after the grace period, exit
    code 137, and a restart by ``restartPolicy: Always``."""
    cluster, ns = real_cluster, f"live-{uuid.uuid4().hex[:6]}"
    _apply(cluster, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    script = "trap '' TERM; touch /srv/alive; (sleep 2; rm /srv/alive) & while true; do sleep 1; done"
    container = {"name": "c", "image": "example.invalid/c:1", "command": ["sh", "-c", script],
                 "volumeMounts": [{"name": "w", "mountPath": "/srv"}],
                 "livenessProbe": {"exec": {"command": ["test", "-f", "/srv/alive"]}, "periodSeconds": 1,
                                   "failureThreshold": 2}}  # fmt: skip
    _apply(cluster, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
                     "spec": {"terminationGracePeriodSeconds": 1, "containers": [container],
                              "volumes": [{"name": "w", "emptyDir": {}}]}})  # fmt: skip
    try:

        def restarted() -> dict[str, Any] | None:
            statuses = _get(cluster, "-n", ns, "pod", "p")["status"].get("containerStatuses") or [{}]
            return statuses[0] if statuses[0].get("restartCount", 0) >= 1 else None

        status = _until("a restart after the liveness probe failed", restarted, 60)
        assert status["lastState"]["terminated"]["exitCode"] == 137
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# Mount paths are existing, empty directories of the host (/srv, /media) where possible: a bind mount
# needs its mount point, and one that is missing is created on the host (docs/real-cluster.md).
