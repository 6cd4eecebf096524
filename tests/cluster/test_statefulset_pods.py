"""A StatefulSet on the real control plane: the real StatefulSet controller makes its pods, the
process kubelet binds and runs them as processes under PodSecurity ``restricted``, with their claims
provisioned, a real projected service-account token, readiness from an HTTP probe, and SIGTERM on
delete before the controller makes the pod again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from multilane.testing.cluster import ClusterError, LocalCluster
from multilane.testing.process_kubelet import ProcessKubelet
from tests.cluster.pod_support import RESTRICTED, apply, conditions, get, pod_namespace, until

# The container: reads its projected service-account files, asks the API server for its own pod with
# that token, writes what it found into its claim, serves HTTP on its pod IP, and records SIGTERM.
SERVER = r"""
import http.server, json, os, signal, ssl, sys, urllib.error, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
ns, name = open(sa + "/namespace").read(), os.environ["POD_NAME"]
url = "https://%s:%s/api/v1/namespaces/%s/pods/%s" % (
    os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"], ns, name)
req = urllib.request.Request(url, headers={"Authorization": "Bearer " + open(sa + "/token").read()})
try:
    with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=sa + "/ca.crt")) as r:
        status, uid = r.status, json.load(r)["metadata"]["uid"]
except urllib.error.HTTPError as e:
    status, uid = e.code, e.read().decode()[:300]
facts = {"pod": name, "namespace": ns, "uid": os.getuid(), "api_status": status, "pod_uid": uid,
         "pod_ip": os.environ["POD_IP"], "greeting": os.environ["GREETING"]}
with open("/srv/facts-%d.json" % os.getpid(), "w") as f:
    json.dump(facts, f)
def term(*_):
    with open("/srv/terminated", "a") as f:
        f.write(name + "\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer((os.environ["POD_IP"], 8080), H).serve_forever()
"""


def _statefulset(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 2,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 10,
                    "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000},
                    "containers": [
                        {
                            "name": "server",
                            "image": "example.invalid/server:1",
                            "command": ["python3", "-c", SERVER],
                            "env": [
                                {
                                    "name": "POD_NAME",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                                },
                                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                                {"name": "WHO", "value": "world"},
                                {"name": "GREETING", "value": "hello $(WHO)"},
                            ],
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
                            "volumeMounts": [{"name": "data", "mountPath": "/srv"}],
                            "securityContext": RESTRICTED,
                        }
                    ],
                },
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
                }
            ],
        },
    }


def _facts(cluster: LocalCluster, namespace: str, pod: str) -> list[dict[str, Any]]:
    pvc = get(cluster, "-n", namespace, "pvc", f"data-{pod}")
    pv = get(cluster, "pv", pvc["spec"]["volumeName"])
    return [
        json.loads(p.read_text()) for p in sorted(Path(pv["spec"]["hostPath"]["path"]).glob("facts-*.json"))
    ]


def test_statefulset_pods_run_as_processes_and_come_back_after_delete(
    real_cluster: LocalCluster, process_kubelet: ProcessKubelet
) -> None:
    cluster = real_cluster
    # the user's choice for the workers' namespace: PodSecurity `restricted`, enforced
    with pod_namespace(cluster, "workers", restricted=True) as ns:
        bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": ns},
                "spec": {"containers": [{"name": "c", "image": "x", "command": ["true"]}]}}  # fmt: skip
        with pytest.raises(ClusterError, match="violates PodSecurity"):
            apply(cluster, bare)
        # the pods' service account may read pods: the container proves its token with a real request
        apply(
            cluster,
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "pod-reader", "namespace": ns},
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "pod-reader", "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
             "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}]},
            _statefulset("web", ns),
        )  # fmt: skip
        until(
            "2 ready replicas",
            lambda: get(cluster, "-n", ns, "sts", "web")["status"].get("readyReplicas") == 2,
        )
        pods = {p["metadata"]["name"]: p for p in get(cluster, "-n", ns, "pods")["items"]}
        assert sorted(pods) == ["web-0", "web-1"]
        for name, pod in pods.items():
            assert pod["spec"]["nodeName"] == process_kubelet.name
            assert pod["status"]["phase"] == "Running"
            assert conditions(pod)["Ready"] == "True"
            assert len(process_kubelet.pids(ns, name)) == 1
            [facts] = until(f"{name}'s facts", lambda name=name: _facts(cluster, ns, name), 30)
            assert facts == {"pod": name, "namespace": ns, "uid": 1000, "api_status": 200,
                             "pod_uid": pod["metadata"]["uid"], "pod_ip": pod["status"]["podIP"],
                             "greeting": "hello world"}  # fmt: skip
        assert pods["web-0"]["status"]["podIP"] != pods["web-1"]["status"]["podIP"]
        # the node: Ready, its Lease renewed by the kubelet
        node = get(cluster, "node", process_kubelet.name)
        assert conditions(node)["Ready"] == "True"
        lease = get(cluster, "-n", "kube-node-lease", "lease", process_kubelet.name)
        assert lease["spec"]["holderIdentity"] == process_kubelet.name

        # delete web-0: SIGTERM reaches the process, the controller makes it again, it is Ready again
        old_pid, old_uid = process_kubelet.pids(ns, "web-0")[0], pods["web-0"]["metadata"]["uid"]
        cluster.kubectl("-n", ns, "delete", "pod", "web-0", "--wait=false")

        def again() -> bool:
            pod = get(cluster, "-n", ns, "pods")["items"]
            new = [p for p in pod if p["metadata"]["name"] == "web-0" and p["metadata"]["uid"] != old_uid]
            return bool(new) and conditions(new[0]).get("Ready") == "True"

        until("web-0 made again and Ready", again)
        assert process_kubelet.pids(ns, "web-0") and process_kubelet.pids(ns, "web-0")[0] != old_pid
        claim_facts = _facts(cluster, ns, "web-0")  # the same claim, one facts file per incarnation
        assert len(claim_facts) == 2
        pvc = get(cluster, "-n", ns, "pvc", "data-web-0")
        terminated = (
            Path(get(cluster, "pv", pvc["spec"]["volumeName"])["spec"]["hostPath"]["path"]) / "terminated"
        )
        assert terminated.read_text() == "web-0\n"
