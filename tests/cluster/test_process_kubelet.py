"""The process kubelet on the real API server, the parts the StatefulSet test does not reach: env
from a Secret and a ConfigMap and both in one projected volume, an ``exec`` readiness probe inside
the container's mount namespace, a crash restarted by ``restartPolicy: Always`` (restart count, last
state) with the ``emptyDir`` kept across the restart, a claim's volume removed with its directory
once the claim is deleted (reclaim ``Delete``), a Deployment's pods, and a liveness restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from multilane.testing.cluster import LocalCluster
from multilane.testing.kubelet_node import STORAGE_CLASS
from multilane.testing.process_kubelet import ProcessKubelet
from tests.cluster.pod_support import RESTRICTED, conditions, get, pod_namespace, until

# First run: record what it sees, then crash (exit 3). Second run: record again, become ready, wait.
SCRIPT = (
    'echo "$PASSWORD $MODE $(cat /media/password) $(cat /media/mode) $(id -u)" >> /srv/out; '
    "if [ ! -f /srv/crashed ]; then touch /srv/crashed; exit 3; fi; "
    "touch /srv/ready; exec sleep 3600"
)


def test_secrets_config_probe_and_restart(
    real_cluster: LocalCluster, process_kubelet: ProcessKubelet
) -> None:
    cluster = real_cluster
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
    objects = (
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
         "stringData": {"password": "s3cret"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
         "data": {"MODE": "fast", "mode": "fast"}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app"},
         "spec": {"securityContext": {"runAsUser": 1234, "fsGroup": 1234}, "containers": [container],
                  "volumes": [{"name": "config", "projected": {"defaultMode": 0o400, "sources": [
                      {"secret": {"name": "creds"}}, {"configMap": {"name": "settings"}}]}},
                              {"name": "work", "emptyDir": {}}]}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "scratch"},
         "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}},
    )  # fmt: skip
    with pod_namespace(cluster, "pk", *objects, restricted=True) as ns:

        def ready() -> dict[str, Any] | None:
            pod = get(cluster, "-n", ns, "pod", "app")
            return pod if conditions(pod).get("Ready") == "True" else None

        pod = until("the pod Ready after one crash", ready, 90)
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
            pvc = get(cluster, "-n", ns, "pvc", "scratch")
            return pvc if pvc["status"].get("phase") == "Bound" else None

        pvc = until("the claim Bound", bound, 90)
        assert pvc["spec"]["storageClassName"] == STORAGE_CLASS
        pv = get(cluster, "pv", pvc["spec"]["volumeName"])
        directory = Path(pv["spec"]["hostPath"]["path"])
        assert directory.is_dir()
        cluster.kubectl("-n", ns, "delete", "pvc", "scratch", "--wait=false")
        until(
            "the volume deleted",
            lambda: not cluster.kubectl("get", "pv", "-o", "name").count(pv["metadata"]["name"]),
            90,
        )
        assert not directory.exists()


def test_a_deployment_gets_its_pod_running(
    real_cluster: LocalCluster, process_kubelet: ProcessKubelet
) -> None:
    """The chart runs the operator as a Deployment: deployment and replicaset controllers, then a
    pod on the process kubelet (as the chart's operator would be)."""
    cluster = real_cluster
    container = {"name": "c", "image": "example.invalid/c:1", "command": ["sleep", "3600"],
                 "securityContext": RESTRICTED}  # fmt: skip
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "op"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "op"}},
                 "template": {"metadata": {"labels": {"app": "op"}}, "spec": {"containers": [container]}}},
    }  # fmt: skip
    with pod_namespace(cluster, "dep", deployment) as ns:
        until(
            "2 ready replicas",
            lambda: get(cluster, "-n", ns, "deploy", "op")["status"].get("readyReplicas") == 2,
            90,
        )
        pods = get(cluster, "-n", ns, "pods")["items"]
        assert [len(process_kubelet.pids(ns, p["metadata"]["name"])) for p in pods] == [1, 1]


def test_a_failing_liveness_probe_restarts_the_container(
    real_cluster: LocalCluster, process_kubelet: ProcessKubelet
) -> None:
    """The probe fails: SIGTERM (ignored here), SIGKILL after the grace period, exit code 137, and a
    restart by ``restartPolicy: Always``.

    The probe passes until a ``dead`` marker appears, and only a child the script forks *after* its
    ``trap`` makes that marker: a probe that ran before the shell did (a loaded machine) would have
    killed it before the trap, with SIGTERM (143). The probe consumes the marker and the restarted
    container (``once`` already there) makes none, so ``lastState`` stays the first termination's."""
    cluster = real_cluster
    script = ("trap '' TERM; [ -f /srv/once ] || { touch /srv/once; (sleep 2; touch /srv/dead) & }; "
              "while true; do sleep 1; done")
    probe = "test ! -f /srv/dead || { rm -f /srv/dead; false; }"
    container = {"name": "c", "image": "example.invalid/c:1", "command": ["sh", "-c", script],
                 "volumeMounts": [{"name": "w", "mountPath": "/srv"}],
                 "livenessProbe": {"exec": {"command": ["sh", "-c", probe]}, "periodSeconds": 1,
                                   "failureThreshold": 1}}  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"terminationGracePeriodSeconds": 1, "containers": [container],
                    "volumes": [{"name": "w", "emptyDir": {}}]}}  # fmt: skip
    with pod_namespace(cluster, "live", pod) as ns:

        def restarted() -> dict[str, Any] | None:
            statuses = get(cluster, "-n", ns, "pod", "p")["status"].get("containerStatuses") or [{}]
            return statuses[0] if statuses[0].get("restartCount", 0) >= 1 else None

        status = until("a restart after the liveness probe failed", restarted, 60)
        assert status["lastState"]["terminated"]["exitCode"] == 137


# Mount paths are existing, empty directories of the host (/srv, /media) where possible: a bind mount
# needs its mount point, and one that is missing is created on the host (docs/real-cluster.md).
