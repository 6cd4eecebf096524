"""The API-server double meets kube-apiserver: each row of :data:`ROWS` sends the same requests to the
double (:mod:`multilane.testing.kube_api`, served as the operator tests serve it) and to the real
kube-apiserver v1.34.4 of the cluster tier (as its administrator), and fails on any difference in
HTTP status code or ``Status`` reason (and, where a step asks, in a part of the answer).

The rows are every write the operator makes (its children, the ParallelConsumer's status, the
conditional patches, kopf's finalizer and Event writes) and every refusal the double claims
(:mod:`multilane.testing.kube_rules`, :mod:`multilane.testing.kube_crd`). Disagreements found, and
their fixes: docs/real-cluster.md, "The double against kube-apiserver".
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from multilane.operator.k8s.kube import api_path
from multilane.operator.spec import children as ch
from multilane.operator.spec.network import NetworkPolicySettings, network_policy
from multilane.testing.cluster import LocalCluster
from multilane.testing.kube_rbac import RbacAuthorizer, RuleUsage, service_account_user
from tests.cluster.conformance_harness import JSON_PATCH, MERGE, Req, Row, Target, served_double
from tests.operator.conftest import render_chart

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "parallelconsumers.multilane.dev.yaml"
NS = "conformance"
CR_API = "multilane.dev/v1alpha1"
Ctx = dict[str, Any]


def path(api: str, plural: str, name: str | None = None, sub: str | None = None) -> str:
    return api_path(api, plural, NS, name, sub)


def pc(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": CR_API,
        "kind": "ParallelConsumer",
        "metadata": {"name": name},
        "spec": {
            "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "consumerGroup": "g"},
            "workload": {"image": "ghcr.io/example/app:1.0", "processor": "app.handlers:process"},
            "state": {"enabled": True, "snapshot": {"schedule": "*/5 * * * *", "uri": "s3://b/snap"}},
        },
    }
    for key, value in spec.items():
        body["spec"][key] = value
    return body


def ref(ctx: Ctx) -> ch.ConsumerRef:
    """The operator's children hang off the ParallelConsumer ``owner`` made once per server."""
    return ch.ConsumerRef("owner", NS, str(ctx["owner"]["metadata"]["uid"]))


def child(kind: str, change: Callable[[dict[str, Any]], None] | None = None) -> Callable[[Ctx], Any]:
    """The operator's own manifest of ``kind`` (:func:`multilane.operator.spec.children.children`)."""

    def body(ctx: Ctx) -> dict[str, Any]:
        built = {c["kind"]: c for c in ch.children(ref(ctx), pc("owner")["spec"], 1)}
        built["Secret"] = ch.control_token_secret(ref(ctx), "t0k3n" * 8)
        built["Lease"] = ch.lease_manifest(ref(ctx), "owner-0")
        built["NetworkPolicy"] = network_policy(ref(ctx), NetworkPolicySettings())
        out = copy.deepcopy(built[kind])
        if change is not None:
            change(out)
        return out

    return body


def patched(kind: str) -> Callable[[Ctx], Any]:
    """The operator's merge patch bringing an existing child to its manifest (``patch_body``)."""
    return lambda ctx: ch.patch_body(child(kind)(ctx))


def with_rv(key: str, patch: dict[str, Any]) -> Callable[[Ctx], Any]:
    """``patch`` conditional on the resourceVersion saved under ``key`` (:mod:`...k8s.writes`)."""

    def body(ctx: Ctx) -> dict[str, Any]:
        out = copy.deepcopy(patch)
        out.setdefault("metadata", {})["resourceVersion"] = ctx[key]["metadata"]["resourceVersion"]
        return out

    return body


def stale(patch: dict[str, Any]) -> dict[str, Any]:
    return {**patch, "metadata": {**(patch.get("metadata") or {}), "resourceVersion": "1"}}


def kopf_event(ctx: Ctx) -> dict[str, Any]:
    """An Event as kopf posts it (kopf/_cogs/clients/events.py)."""
    now = dt.datetime.now(dt.UTC).isoformat()
    owner = ctx["owner"]["metadata"]
    return {
        "metadata": {"namespace": NS, "generateName": "kopf-event-"},
        "action": "Action?",
        "type": "Normal",
        "reason": "Scaled",
        "message": "replicas 1 -> 2",
        "reportingComponent": "kopf",
        "reportingInstance": "dev",
        "source": {"component": "kopf"},
        "involvedObject": {
            "apiVersion": CR_API,
            "kind": "ParallelConsumer",
            "name": "owner",
            "uid": owner["uid"],
            "namespace": NS,
        },
        "firstTimestamp": now,
        "lastTimestamp": now,
        "eventTime": now,
    }


def spec_of(answer: Any) -> Any:
    return answer.get("spec")


def status_of(answer: Any) -> Any:
    return answer.get("status")


def finalizers_of(answer: Any) -> Any:
    return (answer.get("metadata") or {}).get("finalizers")


def sts(name: str, **spec: Any) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "serviceName": name,
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "w", "image": "i:1"}]},
            },
            **spec,
        },
    }


def svc(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"ports": [{"port": 80}], **spec},
    }


def cronjob(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name},
        "spec": {
            "schedule": "*/5 * * * *",
            "jobTemplate": {
                "spec": {
                    "template": {
                        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i:1"}]}
                    }
                }
            },
        },
    }


def job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i:1"}]}}
        },
    }


def pvc(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "none",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def secret(name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, **meta}, "data": {}}


def role_binding(name: str, role: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": NS}],
    }


STS, SVC, SECRETS = path("apps/v1", "statefulsets"), path("v1", "services"), path("v1", "secrets")
PCS = path(CR_API, "parallelconsumers")
POST, PATCH, PUT, DELETE, GET = "POST", "PATCH", "PUT", "DELETE", "GET"
LONG = "x" * 64
#: The context key of the operator's token: its ServiceAccount (the chart's, as rendered) on both
#: servers; kube-apiserver's RBAC and the double's :class:`~multilane.testing.kube_rbac.RbacAuthorizer`
#: judge the same rules.
OP = "operator-token"
RELEASE_NS = "multilane-system"
RBAC_VALUES: dict[str, Any] = {"rbac": {"secretNamespaces": [NS]}}


def worker_role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name},
        "rules": rules,
    }


RBAC_ROWS: list[Row] = [
    Row("rbac-bad-token", "an unknown bearer token: 401", (Req(GET, SECRETS, token="bad-token"),)),
    Row("rbac-list-pods", "the operator lists pods (granted)", (Req(GET, path("v1", "pods"), token=OP),)),
    Row(
        "rbac-get-pod",
        "the operator may not get one pod (list/watch/delete only)",
        (Req(GET, path("v1", "pods", "nope"), token=OP),),
    ),
    Row(
        "rbac-delete-secret",
        "the operator may not delete Secrets",
        (
            Req(POST, SECRETS, secret("keep-me")),
            Req(DELETE, path("v1", "secrets", "keep-me"), token=OP),
        ),
    ),
    Row(
        "rbac-secret-other-ns",
        "Secrets only in the namespaces the chart lists",
        (Req(GET, api_path("v1", "secrets", "default", "x"), token=OP),),
    ),
    Row(
        "rbac-get-missing-sts",
        "granted and absent: 404 NotFound",
        (Req(GET, path("apps/v1", "statefulsets", "absent"), token=OP),),
    ),
    Row(
        "rbac-delete-sts",
        "the operator deletes a StatefulSet (granted)",
        (
            Req(POST, STS, sts("gone")),
            Req(DELETE, path("apps/v1", "statefulsets", "gone"), token=OP),
        ),
    ),
    Row(
        "rbac-escalate-role",
        "a Role granting what the operator lacks: 403 (escalation)",
        (
            Req(
                POST,
                path("rbac.authorization.k8s.io/v1", "roles"),
                worker_role("esc", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["delete"]}]),
                token=OP,
            ),
        ),
    ),
    Row(
        "rbac-role-held",
        "a Role granting only what the operator holds",
        (
            Req(
                POST,
                path("rbac.authorization.k8s.io/v1", "roles"),
                worker_role(
                    "held",
                    [
                        {
                            "apiGroups": ["coordination.k8s.io"],
                            "resources": ["leases"],
                            "verbs": ["get", "update"],
                        }
                    ],
                ),
                token=OP,
            ),
        ),
    ),
    Row(
        "rbac-bind-escalate",
        "a RoleBinding to cluster-admin: 403 (bind)",
        (
            Req(
                POST,
                path("rbac.authorization.k8s.io/v1", "rolebindings"),
                {
                    **role_binding("admin-rb", "x"),
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "cluster-admin",
                    },
                },
                token=OP,
            ),
        ),
    ),
    Row(
        "rbac-bind-missing-role",
        "a RoleBinding to a Role that does not exist: 404 (the role is looked up)",
        (
            Req(
                POST,
                path("rbac.authorization.k8s.io/v1", "rolebindings"),
                role_binding("rb-none", "none"),
                token=OP,
            ),
        ),
    ),
    Row(
        "rbac-scale-denied",
        "the operator has no /scale (it patches the StatefulSet)",
        (
            Req(
                PATCH,
                path(CR_API, "parallelconsumers", "owner", "scale"),
                {"spec": {"replicas": 2}},
                MERGE,
                token=OP,
            ),
        ),
    ),
    Row(
        "rbac-cr-delete-denied",
        "the operator never deletes a ParallelConsumer",
        (Req(DELETE, path(CR_API, "parallelconsumers", "owner"), token=OP),),
    ),
]


def operator_child_rows() -> list[Row]:
    """Each child the operator writes: created, merge-patched to its manifest, created again (409)."""
    rows = []
    for kind, api, plural, name in (
        ("ServiceAccount", "v1", "serviceaccounts", "owner-worker"),
        ("Role", "rbac.authorization.k8s.io/v1", "roles", "owner-worker"),
        ("RoleBinding", "rbac.authorization.k8s.io/v1", "rolebindings", "owner-worker"),
        ("Service", "v1", "services", "owner-workers"),
        ("PodDisruptionBudget", "policy/v1", "poddisruptionbudgets", "owner"),
        ("StatefulSet", "apps/v1", "statefulsets", "owner"),
        ("CronJob", "batch/v1", "cronjobs", ch.snapshot_cronjob_name(ch.ConsumerRef("owner", NS, "u"))),
        ("Secret", "v1", "secrets", "owner-control-token"),
        ("Lease", "coordination.k8s.io/v1", "leases", "owner-0"),
        ("NetworkPolicy", "networking.k8s.io/v1", "networkpolicies", "owner-workers"),
    ):
        rows.append(
            Row(
                f"child-{kind}",
                f"the operator creates and patches its {kind}",
                (
                    Req(POST, path(api, plural), child(kind), save=f"child-{kind}"),
                    Req(PATCH, path(api, plural, name), patched(kind), MERGE),
                    Req(POST, path(api, plural), child(kind)),
                ),
            )
        )
    return rows


OWNER_STS = path("apps/v1", "statefulsets", "owner")


def _sts_replicas(replicas: int) -> dict[str, Any]:
    return {"spec": {"replicas": replicas}}


ROWS: list[Row] = [
    *operator_child_rows(),
    *RBAC_ROWS,
    # ---- the operator's conditional writes (multilane/operator/k8s/writes.py) --------------------
    Row(
        "conditional-patch",
        "a patch with the resourceVersion read succeeds; with an older one, 409",
        (
            Req(GET, OWNER_STS, save="read"),
            Req(PATCH, OWNER_STS, with_rv("read", _sts_replicas(0)), MERGE),
            Req(PATCH, OWNER_STS, with_rv("read", _sts_replicas(1)), MERGE),
            Req(PATCH, OWNER_STS, stale(_sts_replicas(1)), MERGE),
        ),
    ),
    Row(
        "conditional-put",
        "PUT with a stale resourceVersion: 409",
        (
            Req(POST, SECRETS, secret("put-me"), save="s"),
            Req(PUT, path("v1", "secrets", "put-me"), lambda c: {**c["s"], "data": {"k": "dg=="}}),
            Req(PUT, path("v1", "secrets", "put-me"), lambda c: {**c["s"], "data": {"k": "dg=="}}),
        ),
    ),
    Row(
        "delete-precondition",
        "DELETE with a stale resourceVersion precondition: 409; then 200; then 404",
        (
            Req(POST, SECRETS, secret("del-me")),
            Req(
                DELETE,
                path("v1", "secrets", "del-me"),
                {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": "1"}},
            ),
            Req(DELETE, path("v1", "secrets", "del-me")),
            Req(DELETE, path("v1", "secrets", "del-me")),
        ),
    ),
    Row(
        "sts-ondelete-switch",
        "the StatefulSet patched to OnDelete with rollingUpdate: null",
        (
            Req(POST, STS, sts("switch")),
            Req(
                PATCH,
                path("apps/v1", "statefulsets", "switch"),
                {"spec": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": None}}},
                MERGE,
            ),
        ),
    ),
    Row(
        "sts-ondelete-with-rolling",
        "OnDelete beside a rollingUpdate block is refused",
        (
            Req(POST, STS, sts("switch2")),
            Req(
                PATCH,
                path("apps/v1", "statefulsets", "switch2"),
                {"spec": {"updateStrategy": {"type": "OnDelete"}}},
                MERGE,
            ),
        ),
    ),
    Row("event", "kopf's Event", (Req(POST, path("v1", "events"), kopf_event, token=OP),)),
    # ---- the ParallelConsumer: status, scale, finalizers, CEL, defaulting, pruning ----------------
    Row(
        "pc-create-defaults",
        "defaulting of the CRD's schema",
        (Req(POST, PCS, pc("defaults"), project=spec_of),),
    ),
    Row(
        "pc-status-patch",
        "the operator's status patch; a status in a patch of the object is ignored",
        (
            Req(POST, PCS, pc("stat")),
            Req(
                PATCH,
                path(CR_API, "parallelconsumers", "stat", "status"),
                {
                    "status": {
                        "replicas": 2,
                        "conditions": [
                            {
                                "type": "Ready",
                                "status": "True",
                                "reason": "Running",
                                "message": "",
                                "lastTransitionTime": "2026-01-01T00:00:00Z",
                            }
                        ],
                    }
                },
                MERGE,
                project=status_of,
                token=OP,
            ),
            Req(
                PATCH,
                path(CR_API, "parallelconsumers", "stat"),
                {"status": {"replicas": 5}},
                MERGE,
                project=status_of,
            ),
        ),
    ),
    Row(
        "pc-scale",
        "the /scale subresource writes spec.scaling.replicas path",
        (
            Req(POST, PCS, pc("scaled")),
            Req(
                PATCH, path(CR_API, "parallelconsumers", "scaled", "scale"), {"spec": {"replicas": 3}}, MERGE
            ),
            Req(GET, path(CR_API, "parallelconsumers", "scaled"), project=spec_of),
        ),
    ),
    Row(
        "pc-finalizer",
        "kopf's finalizer JSON patch, guarded by a test of the resourceVersion",
        (
            Req(POST, PCS, pc("fin"), save="fin"),
            Req(
                PATCH,
                path(CR_API, "parallelconsumers", "fin"),
                lambda c: [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
                    {"op": "add", "path": "/metadata/finalizers", "value": ["multilane.dev/x"]},
                ],
                JSON_PATCH,
                token=OP,
            ),
            Req(
                PATCH,
                path(CR_API, "parallelconsumers", "fin"),
                lambda c: [
                    {
                        "op": "test",
                        "path": "/metadata/resourceVersion",
                        "value": c["fin"]["metadata"]["resourceVersion"],
                    },
                    {"op": "add", "path": "/metadata/finalizers", "value": ["multilane.dev/x"]},
                ],
                JSON_PATCH,
                project=finalizers_of,
                token=OP,
            ),
            Req(DELETE, path(CR_API, "parallelconsumers", "fin")),
            Req(GET, path(CR_API, "parallelconsumers", "fin"), project=finalizers_of),
            Req(
                PATCH,
                path(CR_API, "parallelconsumers", "fin"),
                {"metadata": {"finalizers": None}},
                MERGE,
                token=OP,
            ),
            Req(GET, path(CR_API, "parallelconsumers", "fin")),
        ),
    ),
    Row(
        "pc-stale-merge",
        "a merge patch of the custom resource with a stale resourceVersion: 409",
        (
            Req(POST, PCS, pc("stale")),
            Req(
                PATCH,
                path(CR_API, "parallelconsumers", "stale"),
                stale({"spec": {"scaling": {"maxReplicas": 4}}}),
                MERGE,
            ),
        ),
    ),
    Row(
        "pc-cel-min-max",
        "CEL: minReplicas <= maxReplicas",
        (Req(POST, PCS, pc("celmm", scaling={"minReplicas": 5, "maxReplicas": 2})),),
    ),
    Row("pc-cel-name", "CEL: a name of at most 52 characters", (Req(POST, PCS, pc("n" * 53)),)),
    Row(
        "pc-cel-snapshot",
        "CEL: a snapshot schedule needs a uri",
        (Req(POST, PCS, pc("celsnap", state={"enabled": True, "snapshot": {"schedule": "* * * * *"}})),),
    ),
    Row(
        "pc-prune",
        "unknown fields of the custom resource are pruned, not refused",
        (Req(POST, PCS, {**pc("pruned"), "spec": {**pc("pruned")["spec"], "bogus": 1}}, project=spec_of),),
    ),
    Row(
        "pc-schema-type",
        "a wrong type in the custom resource: 422",
        (Req(POST, PCS, pc("badtype", scaling={"maxReplicas": "ten"})),),
    ),
    Row(
        "pc-already-exists",
        "creating an existing custom resource: 409 AlreadyExists",
        (
            Req(POST, PCS, pc("twice")),
            Req(POST, PCS, pc("twice")),
        ),
    ),
    # ---- the double's names and labels (kube_rules.name_causes, label_causes) ---------------------
    Row("name-service-dns1035", "a Service name must be a DNS-1035 label", (Req(POST, SVC, svc("9lives")),)),
    Row("name-subdomain", "other names must be DNS-1123 subdomains", (Req(POST, SECRETS, secret("Upper")),)),
    Row(
        "name-cronjob-52",
        "a CronJob name of 53 characters",
        (Req(POST, path("batch/v1", "cronjobs"), cronjob("c" * 53)),),
    ),
    Row("name-job-63", "a Job name of 64 characters", (Req(POST, path("batch/v1", "jobs"), job("j" * 64)),)),
    Row("name-missing", "no name and no generateName", (Req(POST, SECRETS, secret("")),)),
    Row(
        "label-value-long",
        "a label value over 63 characters",
        (Req(POST, SECRETS, secret("lv", labels={"a": LONG})),),
    ),
    Row(
        "label-key-bad",
        "a label key with a bad name part",
        (Req(POST, SECRETS, secret("lk", labels={"example.com/-bad": "v"})),),
    ),
    Row(
        "label-selector-long",
        "a StatefulSet selector value over 63 characters",
        (
            Req(
                POST,
                STS,
                {**sts("sel"), "spec": {**sts("sel")["spec"], "selector": {"matchLabels": {"app": LONG}}}},
            ),
        ),
    ),
    # ---- the double's immutable fields (kube_rules.immutable_causes) ------------------------------
    Row(
        "immutable-sts",
        "a StatefulSet's serviceName",
        (
            Req(POST, STS, sts("imm")),
            Req(PATCH, path("apps/v1", "statefulsets", "imm"), {"spec": {"serviceName": "other"}}, MERGE),
        ),
    ),
    Row(
        "immutable-service-clusterip",
        "a Service's clusterIP",
        (
            Req(POST, SVC, svc("cip", clusterIP="10.0.0.77")),
            Req(PATCH, path("v1", "services", "cip"), {"spec": {"clusterIP": "10.0.0.78"}}, MERGE),
        ),
    ),
    Row(
        "immutable-pvc",
        "a PVC's access modes; its storage request while unbound",
        (
            Req(POST, path("v1", "persistentvolumeclaims"), pvc("claim")),
            Req(
                PATCH,
                path("v1", "persistentvolumeclaims", "claim"),
                {"spec": {"accessModes": ["ReadWriteMany"]}},
                MERGE,
            ),
            Req(
                PATCH,
                path("v1", "persistentvolumeclaims", "claim"),
                {"spec": {"resources": {"requests": {"storage": "2Gi"}}}},
                MERGE,
            ),
        ),
    ),
    Row(
        "immutable-job-template",
        "a Job's template",
        (
            Req(POST, path("batch/v1", "jobs"), job("jt")),
            Req(
                PATCH,
                path("batch/v1", "jobs", "jt"),
                {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i:2"}]}}}},
                MERGE,
            ),
        ),
    ),
    Row(
        "immutable-rolebinding",
        "a RoleBinding's roleRef",
        (
            Req(POST, path("rbac.authorization.k8s.io/v1", "rolebindings"), role_binding("rb", "a")),
            Req(
                PATCH,
                path("rbac.authorization.k8s.io/v1", "rolebindings", "rb"),
                {"roleRef": {"name": "b"}},
                MERGE,
            ),
        ),
    ),
    # ---- the double's built-in schemas (kube_rules.BuiltinSchemas) --------------------------------
    Row(
        "schema-unknown-field",
        "an unknown field, no fieldValidation (what the operator sends)",
        (Req(POST, SECRETS, {**secret("unk"), "bogus": 1}),),
    ),
    Row(
        "schema-unknown-field-strict",
        "an unknown field with fieldValidation=Strict (what kubectl sends)",
        (Req(POST, SECRETS, {**secret("unk2"), "bogus": 1}, params={"fieldValidation": "Strict"}),),
    ),
    Row(
        "schema-wrong-type",
        "a wrong type in a built-in kind",
        (Req(POST, STS, {**sts("wt"), "spec": {**sts("wt")["spec"], "replicas": "two"}}),),
    ),
    Row(
        "schema-required-spec",
        "a StatefulSet without its selector",
        (
            Req(
                POST,
                STS,
                {**sts("nosel"), "spec": {k: v for k, v in sts("nosel")["spec"].items() if k != "selector"}},
            ),
        ),
    ),
    Row(
        "schema-enum",
        "an unsupported enum value (podManagementPolicy)",
        (Req(POST, STS, sts("enum", podManagementPolicy="Sometimes")),),
    ),
]


def _admin_ssl(cluster: LocalCluster) -> ssl.SSLContext:
    assert cluster.pki is not None and cluster.admin is not None
    ctx = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
    ctx.load_cert_chain(str(cluster.admin.cert), str(cluster.admin.key))
    return ctx


@pytest.fixture(scope="module")
def targets(real_cluster: LocalCluster) -> Iterator[tuple[Target, Target]]:
    """(double, real): each with the CRD, the namespace and the ParallelConsumer ``owner``."""
    real_cluster.kubectl("apply", "-f", str(CRD_PATH))
    real_cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/parallelconsumers.multilane.dev"
    )
    real_cluster.kubectl("create", "namespace", NS)
    real_cluster.kubectl("create", "namespace", RELEASE_NS)
    manifests = [
        doc
        for doc in render_chart(RBAC_VALUES, RELEASE_NS)
        if doc["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    ]
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
    real_cluster.kubectl("apply", "-f", "-", input=listed)
    sa = next(d for d in manifests if d["kind"] == "ServiceAccount")["metadata"]["name"]
    token = real_cluster.kubectl("create", "token", sa, "-n", RELEASE_NS, "--duration=1h").strip()
    assert real_cluster.pki is not None
    for gen in served_double(CRD_PATH):
        authz = RbacAuthorizer(manifests, RuleUsage(), anonymous_user="system:admin")
        authz.add_token(token, service_account_user(RELEASE_NS, sa))
        gen[0].authorizer = authz  # no token: the harness as the administrator, as on the cluster
        double = Target("double", gen[1])
        ca = str(real_cluster.pki.ca_cert)
        real = Target("kube-apiserver", real_cluster.server, _admin_ssl(real_cluster), ca)
        for target in (double, real):
            target.ctx.update({OP: token, "bad-token": "not-a-token"})
        for target in (double, real):
            deadline = time.monotonic() + 30  # the CRD's resource may take a moment to be served
            while True:
                answer = target.send(Req(POST, PCS, pc("owner"), save="owner"))
                if answer.code == 201 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert answer.code == 201, (target.name, answer)
        yield double, real
    real_cluster.kubectl("delete", "namespace", NS, RELEASE_NS, "--wait=false")
    real_cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input=listed)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_double_answers_as_kube_apiserver(targets: tuple[Target, Target], row: Row) -> None:
    double, real = targets
    seen: list[str] = []
    for i, step in enumerate(row.steps):
        ours, theirs = double.send(step), real.send(step)
        seen.append(
            f"{i}: {step.method} {step.path} -> double {ours.code} {ours.reason}, "
            f"kube-apiserver {theirs.code} {theirs.reason}"
        )
        if ours != theirs:
            detail = json.dumps({"double": ours.body, "kube-apiserver": theirs.body}, default=str)[:3000]
            pytest.fail(
                f"{row.id} ({row.why}) differs at step\n"
                + "\n".join(seen)
                + f"\nprojections: {ours.projection!r} vs {theirs.projection!r}\n{detail}"
            )
