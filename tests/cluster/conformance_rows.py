"""The conformance test's request bodies and the rows of the operator's children and of RBAC
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
from tests.cluster.conformance_harness import MERGE, Req, Row

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
RELEASE_NS = "conformance-operator"  # not the namespace a chart test installs into
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
        rows.append(
            Row(
                f"child-{kind}",
                f"the operator creates and patches its {kind}",
                (
                    Req(POST, path(api, plural), child(kind), params=STRICT, save=f"child-{kind}", token=OP),
                    Req(PATCH, path(api, plural, name), patched(kind), MERGE, params=STRICT, token=OP),
                    Req(POST, path(api, plural), child(kind), params=STRICT, token=OP),
                ),
            )
        )
    return rows


OWNER_STS = path("apps/v1", "statefulsets", "owner")


def sts_replicas(replicas: int) -> dict[str, Any]:
    return {"spec": {"replicas": replicas}}
