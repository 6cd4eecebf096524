"""The conformance test's request bodies, the table's words (:func:`row`, and one function per kind of
request: :func:`get`, :func:`create`, :func:`merge`, :func:`json_patch`, :func:`put`, :func:`delete`,
so that a row reads one line per request) and the rows of the operator's children and of RBAC
(``tests/cluster/test_conformance.py`` holds the table). Test support; pure (builds dicts)."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

from multilane.operator.k8s.kube import api_path
from multilane.operator.spec import children as ch
from multilane.operator.spec.network import NetworkPolicySettings, network_policy
from tests.cluster.conformance_harness import JSON_PATCH, MERGE, Body, Req, Row

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
RBAC_API = "rbac.authorization.k8s.io/v1"
ROLES, ROLEBINDINGS = path(RBAC_API, "roles"), path(RBAC_API, "rolebindings")
PVCS, EVENTS = path("v1", "persistentvolumeclaims"), path("v1", "events")
JOBS, CRONJOBS = path("batch/v1", "jobs"), path("batch/v1", "cronjobs")
POST, PATCH, PUT, DELETE, GET = "POST", "PATCH", "PUT", "DELETE", "GET"
LONG = "x" * 64
#: The context key of the operator's token: its ServiceAccount (the chart's, as rendered) on both
#: servers; kube-apiserver's RBAC and the double's :class:`~multilane.testing.kube_rbac.RbacAuthorizer`
#: judge the same rules.
OP = "operator-token"
RELEASE_NS = "conformance-operator"  # not the namespace a chart test installs into
RBAC_VALUES: dict[str, Any] = {"rbac": {"secretNamespaces": [NS]}}


# ---- the table's words -------------------------------------------------------------------------------


def at(collection: str, name: str, sub: str | None = None) -> str:
    """The path of the object ``name`` of ``collection`` (and of its subresource ``sub``)."""
    return f"{collection}/{name}" + (f"/{sub}" if sub else "")


def row(id: str, why: str, *steps: Req) -> Row:
    return Row(id, why, steps)


def get(where: str, **kw: Any) -> Req:
    return Req(GET, where, **kw)


def create(collection: str, body: Body, **kw: Any) -> Req:
    return Req(POST, collection, body, **kw)


def merge(where: str, body: Body, **kw: Any) -> Req:
    return Req(PATCH, where, body, MERGE, **kw)


def json_patch(where: str, ops: Body, **kw: Any) -> Req:
    return Req(PATCH, where, ops, JSON_PATCH, **kw)


def put(where: str, body: Body, **kw: Any) -> Req:
    return Req(PUT, where, body, **kw)


def delete(where: str, body: Body = None, **kw: Any) -> Req:
    return Req(DELETE, where, body, **kw)


def refused(id: str, why: str, collection: str, body: Body, **kw: Any) -> Row:
    """One create (that the double claims kube-apiserver refuses)."""
    return row(id, why, create(collection, body, **kw))


def changed(id: str, why: str, collection: str, body: dict[str, Any], patch: Body) -> Row:
    """An object created, then merge-patched (an immutable field, a rule on an update)."""
    return row(id, why, create(collection, body), merge(at(collection, body["metadata"]["name"]), patch))


def without(body: dict[str, Any], key: str) -> dict[str, Any]:
    """``body`` with ``spec.key`` left out."""
    return {**body, "spec": {k: v for k, v in body["spec"].items() if k != key}}


def worker_role(name: str, *rules: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": RBAC_API, "kind": "Role", "metadata": {"name": name}, "rules": list(rules)}


def rule(group: str, resource: str, *verbs: str) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}


ADMIN_BINDING = {
    **role_binding("admin-rb", "x"),
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
}

RBAC_ROWS: list[Row] = [
    row("rbac-bad-token", "an unknown bearer token: 401", get(SECRETS, token="bad-token")),
    row("rbac-list-pods", "the operator lists pods (granted)", get(path("v1", "pods"), token=OP)),
    row("rbac-get-pod", "the operator may not get one pod (list/watch/delete only)",
        get(path("v1", "pods", "nope"), token=OP)),
    row("rbac-delete-secret", "the operator may not delete Secrets",
        create(SECRETS, secret("keep-me")),
        delete(at(SECRETS, "keep-me"), token=OP)),
    row("rbac-secret-other-ns", "Secrets only in the namespaces the chart lists",
        get(api_path("v1", "secrets", "default", "x"), token=OP)),
    row("rbac-get-missing-sts", "granted and absent: 404 NotFound", get(at(STS, "absent"), token=OP)),
    row("rbac-delete-sts", "the operator deletes a StatefulSet (granted)",
        create(STS, sts("gone")),
        delete(at(STS, "gone"), token=OP)),
    row("rbac-escalate-role", "a Role granting what the operator lacks: 403 (escalation)",
        create(ROLES, worker_role("esc", rule("", "secrets", "delete")), token=OP)),
    row("rbac-role-held", "a Role granting only what the operator holds",
        create(ROLES, worker_role("held", rule("coordination.k8s.io", "leases", "get", "update")), token=OP)),
    row("rbac-bind-escalate", "a RoleBinding to cluster-admin: 403 (bind)",
        create(ROLEBINDINGS, ADMIN_BINDING, token=OP)),
    row("rbac-bind-missing-role", "a RoleBinding to a Role that does not exist: 404 (the role is looked up)",
        create(ROLEBINDINGS, role_binding("rb-none", "none"), token=OP)),
    row("rbac-scale-denied", "the operator has no /scale (it patches the StatefulSet)",
        merge(at(PCS, "owner", "scale"), {"spec": {"replicas": 2}}, token=OP)),
    row("rbac-cr-delete-denied", "the operator never deletes a ParallelConsumer",
        delete(at(PCS, "owner"), token=OP)),
]  # fmt: skip


#: Sent with the operator's children: kube-apiserver then refuses any field its schema does not know
#: (400), so a typo in a manifest of the operator fails here instead of being dropped.
STRICT = {"fieldValidation": "Strict"}


def operator_child_rows() -> list[Row]:
    """Each child the operator writes, as the operator: created, merge-patched to its manifest,
    created again (409)."""
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
        made = path(api, plural)
        rows.append(
            row(f"child-{kind}", f"the operator creates and patches its {kind}",
                create(made, child(kind), params=STRICT, save=f"child-{kind}", token=OP),
                merge(at(made, name), patched(kind), params=STRICT, token=OP),
                create(made, child(kind), params=STRICT, token=OP))
        )  # fmt: skip
    return rows


OWNER_STS = path("apps/v1", "statefulsets", "owner")


def sts_replicas(replicas: int) -> dict[str, Any]:
    return {"spec": {"replicas": replicas}}
