"""The API-server double meets kube-apiserver: each row of :data:`ROWS` sends the same requests to the
double (:mod:`multilane.testing.kube_api`, served as the operator tests serve it) and to the real
kube-apiserver v1.34.4 of the cluster tier (as its administrator, or, for the operator's own
writes, with a token of the chart's ServiceAccount under the chart's rendered RBAC), and fails on
any difference in HTTP status code or ``Status`` reason (and, where a step asks, in a part of the answer).

The rows are every write the operator makes (its children, the ParallelConsumer's status, the
conditional patches, kopf's finalizer and Event writes) and every refusal the double claims
(:mod:`multilane.testing.kube_rules`, :mod:`multilane.testing.kube_crd`). Disagreements found, and
their fixes: docs/real-cluster.md, "The double against kube-apiserver".
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from multilane.testing.cluster import LocalCluster
from multilane.testing.kube_rbac import RbacAuthorizer, RuleUsage, service_account_user
from tests.cluster.conformance_harness import JSON_PATCH, MERGE, Req, Row, Target, served_double
from tests.cluster.conformance_rows import (
    CR_API,
    CRD_PATH,
    DELETE,
    GET,
    LONG,
    NS,
    OP,
    OWNER_STS,
    PATCH,
    PCS,
    POST,
    PUT,
    RBAC_ROWS,
    RBAC_VALUES,
    RELEASE_NS,
    SECRETS,
    STS,
    SVC,
    cronjob,
    finalizers_of,
    job,
    kopf_event,
    operator_child_rows,
    path,
    pc,
    pvc,
    role_binding,
    secret,
    spec_of,
    stale,
    status_of,
    sts,
    sts_replicas,
    svc,
    with_rv,
)
from tests.operator.conftest import render_chart

ROWS: list[Row] = [
    *operator_child_rows(),
    *RBAC_ROWS,
    # ---- the operator's conditional writes (multilane/operator/k8s/writes.py) --------------------
    Row(
        "conditional-patch",
        "a patch with the resourceVersion read succeeds; with an older one, 409",
        (
            Req(GET, OWNER_STS, save="read", token=OP),
            Req(PATCH, OWNER_STS, with_rv("read", sts_replicas(0)), MERGE, token=OP),
            Req(PATCH, OWNER_STS, with_rv("read", sts_replicas(1)), MERGE, token=OP),
            Req(PATCH, OWNER_STS, stale(sts_replicas(1)), MERGE, token=OP),
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
def conformance_cluster(k8s_bin_dir: Path) -> Iterator[LocalCluster]:
    """A control plane of this module's own: the session's cluster also runs the chart's operator
    (tests/cluster/test_helm_chart.py), which watches every namespace and would act on the
    ParallelConsumer ``owner`` and its children while the rows compare answers (seen in CI)."""
    with LocalCluster(k8s_bin_dir, start_timeout_s=240) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def targets(conformance_cluster: LocalCluster) -> Iterator[tuple[Target, Target]]:
    """(double, real): each with the CRD, the namespace and the ParallelConsumer ``owner``."""
    real_cluster = conformance_cluster
    crd = "crd/parallelconsumers.multilane.dev"
    # Made here only when absent, and then removed at the end: a later test installs the chart, whose
    # Helm release must own the CRD (Helm refuses to adopt one it did not make).
    made_crd = not real_cluster.kubectl("get", crd, "--ignore-not-found", "-o", "name").strip()
    real_cluster.kubectl("apply", "-f", str(CRD_PATH))
    real_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", crd)
    real_cluster.kubectl("create", "namespace", NS)
    real_cluster.kubectl("create", "namespace", RELEASE_NS)
    # The chart's RBAC as rendered, under names of its own: other tests of the session install the
    # chart itself (release "ml"), whose cluster-scoped roles must not be these.
    rendered = [
        doc
        for doc in render_chart(RBAC_VALUES, RELEASE_NS)
        if doc["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    ]
    manifests = json.loads(json.dumps(rendered).replace('"ml-multilane', '"conformance-multilane'))
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
    if made_crd:
        real_cluster.kubectl("delete", crd, "--timeout=60s")
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
