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
from typing import Any

import pytest

from multilane.testing.cluster import LocalCluster
from multilane.testing.kube_rbac import RbacAuthorizer, RuleUsage, service_account_user
from tests.cluster.conformance_harness import Req, Row, Target, served_double
from tests.cluster.conformance_rows import (
    CRD_PATH,
    CRONJOBS,
    EVENTS,
    JOBS,
    LONG,
    NS,
    OP,
    OWNER_STS,
    PCS,
    POST,
    PVCS,
    RBAC_ROWS,
    RBAC_VALUES,
    RELEASE_NS,
    ROLEBINDINGS,
    SECRETS,
    STS,
    SVC,
    at,
    changed,
    create,
    cronjob,
    delete,
    finalizers_of,
    get,
    job,
    json_patch,
    kopf_event,
    merge,
    operator_child_rows,
    pc,
    put,
    pvc,
    refused,
    role_binding,
    row,
    secret,
    spec_of,
    stale,
    status_of,
    sts,
    sts_replicas,
    svc,
    with_rv,
    without,
)
from tests.operator.conftest import render_chart

FIN_OPS = [{"op": "add", "path": "/metadata/finalizers", "value": ["multilane.dev/x"]}]
READY = {"type": "Ready", "status": "True", "reason": "Running", "message": "",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
JOB_IMAGE_2 = {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i:2"}]}}}}
STALE_PRECONDITION = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": "1"}}


def rv_test(value: Any) -> Any:
    """kopf's finalizer patch, guarded by a test of the resourceVersion (``value``: of the context)."""
    return lambda c: [{"op": "test", "path": "/metadata/resourceVersion", "value": value(c)}, *FIN_OPS]


def secret_put(c: dict[str, Any]) -> dict[str, Any]:
    return {**c["s"], "data": {"k": "dg=="}}


# One row per line of requests: what the operator relies on, or what the double claims.
ROWS: list[Row] = [
    *operator_child_rows(),
    *RBAC_ROWS,
    # ---- the operator's conditional writes (multilane/operator/k8s/writes.py) --------------------
    row("conditional-patch", "a patch with the resourceVersion read succeeds; with an older one, 409",
        get(OWNER_STS, save="read", token=OP),
        merge(OWNER_STS, with_rv("read", sts_replicas(0)), token=OP),
        merge(OWNER_STS, with_rv("read", sts_replicas(1)), token=OP),
        merge(OWNER_STS, stale(sts_replicas(1)), token=OP)),
    row("conditional-put", "PUT with a stale resourceVersion: 409",
        create(SECRETS, secret("put-me"), save="s"),
        put(at(SECRETS, "put-me"), secret_put),
        put(at(SECRETS, "put-me"), secret_put)),
    row("delete-precondition", "DELETE with a stale resourceVersion precondition: 409; then 200; then 404",
        create(SECRETS, secret("del-me")),
        delete(at(SECRETS, "del-me"), STALE_PRECONDITION),
        delete(at(SECRETS, "del-me")),
        delete(at(SECRETS, "del-me"))),
    changed("sts-ondelete-switch", "the StatefulSet patched to OnDelete with rollingUpdate: null",
            STS, sts("switch"), {"spec": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": None}}}),
    changed("sts-ondelete-with-rolling", "OnDelete beside a rollingUpdate block is refused",
            STS, sts("switch2"), {"spec": {"updateStrategy": {"type": "OnDelete"}}}),
    row("event", "kopf's Event", create(EVENTS, kopf_event, token=OP)),
    # ---- the ParallelConsumer: status, scale, finalizers, CEL, defaulting, pruning ----------------
    row("pc-create-defaults", "defaulting of the CRD's schema", create(PCS, pc("defaults"), project=spec_of)),
    row("pc-status-patch", "the operator's status patch; a status in a patch of the object is ignored",
        create(PCS, pc("stat")),
        merge(at(PCS, "stat", "status"), {"status": {"replicas": 2, "conditions": [READY]}},
              project=status_of, token=OP),
        merge(at(PCS, "stat"), {"status": {"replicas": 5}}, project=status_of)),
    row("pc-scale", "the /scale subresource writes spec.scaling.replicas",
        create(PCS, pc("scaled")),
        merge(at(PCS, "scaled", "scale"), {"spec": {"replicas": 3}}),
        get(at(PCS, "scaled"), project=spec_of)),
    row("pc-finalizer", "kopf's finalizer JSON patch, guarded by a test of the resourceVersion",
        create(PCS, pc("fin"), save="fin"),
        json_patch(at(PCS, "fin"), rv_test(lambda c: "1"), token=OP),
        json_patch(at(PCS, "fin"), rv_test(lambda c: c["fin"]["metadata"]["resourceVersion"]),
                   project=finalizers_of, token=OP),
        delete(at(PCS, "fin")),
        get(at(PCS, "fin"), project=finalizers_of),
        merge(at(PCS, "fin"), {"metadata": {"finalizers": None}}, token=OP),
        get(at(PCS, "fin"))),
    changed("pc-stale-merge", "a merge patch of the custom resource with a stale resourceVersion: 409",
            PCS, pc("stale"), stale({"spec": {"scaling": {"maxReplicas": 4}}})),
    refused("pc-cel-min-max", "CEL: minReplicas <= maxReplicas",
            PCS, pc("celmm", scaling={"minReplicas": 5, "maxReplicas": 2})),
    refused("pc-cel-name", "CEL: a name of at most 52 characters", PCS, pc("n" * 53)),
    refused("pc-cel-snapshot", "CEL: a snapshot schedule needs a uri",
            PCS, pc("celsnap", state={"enabled": True, "snapshot": {"schedule": "* * * * *"}})),
    refused("pc-prune", "unknown fields of the custom resource are pruned, not refused",
            PCS, pc("pruned", bogus=1), project=spec_of),
    refused("pc-schema-type", "a wrong type in the custom resource: 422",
            PCS, pc("badtype", scaling={"maxReplicas": "ten"})),
    row("pc-already-exists", "creating an existing custom resource: 409 AlreadyExists",
        create(PCS, pc("twice")),
        create(PCS, pc("twice"))),
    # ---- the double's names and labels (kube_rules.name_causes, label_causes) ---------------------
    refused("name-service-dns1035", "a Service name must be a DNS-1035 label", SVC, svc("9lives")),
    refused("name-subdomain", "other names must be DNS-1123 subdomains", SECRETS, secret("Upper")),
    refused("name-cronjob-52", "a CronJob name of 53 characters", CRONJOBS, cronjob("c" * 53)),
    refused("name-job-63", "a Job name of 64 characters", JOBS, job("j" * 64)),
    refused("name-missing", "no name and no generateName", SECRETS, secret("")),
    refused("label-value-long", "a label value over 63 characters",
            SECRETS, secret("lv", labels={"a": LONG})),
    refused("label-key-bad", "a label key with a bad name part",
            SECRETS, secret("lk", labels={"example.com/-bad": "v"})),
    refused("label-selector-long", "a StatefulSet selector value over 63 characters",
            STS, sts("sel", selector={"matchLabels": {"app": LONG}})),
    # ---- the double's immutable fields (kube_rules.immutable_causes) ------------------------------
    changed("immutable-sts", "a StatefulSet's serviceName",
            STS, sts("imm"), {"spec": {"serviceName": "other"}}),
    changed("immutable-service-clusterip", "a Service's clusterIP",
            SVC, svc("cip", clusterIP="10.0.0.77"), {"spec": {"clusterIP": "10.0.0.78"}}),
    row("immutable-pvc", "a PVC's access modes; its storage request while unbound",
        create(PVCS, pvc("claim")),
        merge(at(PVCS, "claim"), {"spec": {"accessModes": ["ReadWriteMany"]}}),
        merge(at(PVCS, "claim"), {"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
    changed("immutable-job-template", "a Job's template",
            JOBS, job("jt"), JOB_IMAGE_2),
    changed("immutable-rolebinding", "a RoleBinding's roleRef",
            ROLEBINDINGS, role_binding("rb", "a"), {"roleRef": {"name": "b"}}),
    # ---- the double's built-in schemas (kube_rules.BuiltinSchemas) --------------------------------
    refused("schema-unknown-field", "an unknown field, no fieldValidation (what the operator sends)",
            SECRETS, {**secret("unk"), "bogus": 1}),
    refused("schema-unknown-field-strict", "an unknown field, fieldValidation=Strict (what kubectl sends)",
            SECRETS, {**secret("unk2"), "bogus": 1}, params={"fieldValidation": "Strict"}),
    refused("schema-wrong-type", "a wrong type in a built-in kind", STS, sts("wt", replicas="two")),
    refused("schema-required-spec", "a StatefulSet without its selector",
            STS, without(sts("nosel"), "selector")),
    refused("schema-enum", "an unsupported enum value (podManagementPolicy)",
            STS, sts("enum", podManagementPolicy="Sometimes")),
]  # fmt: skip


def _admin_ssl(cluster: LocalCluster) -> ssl.SSLContext:
    assert cluster.pki is not None and cluster.admin is not None
    ctx = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
    ctx.load_cert_chain(str(cluster.admin.cert), str(cluster.admin.key))
    return ctx


def _wait_established(cluster: LocalCluster, crd: str, limit_s: float = 60.0) -> None:
    """Until the CRD is Established. Not ``kubectl wait --for=condition=Established``: on a CRD whose
    status has no conditions yet (just applied), kubectl 1.34 exits 1 at once (".status.conditions
    accessor error: <nil>") instead of waiting."""
    query = '{.status.conditions[?(@.type=="Established")].status}'
    deadline = time.monotonic() + limit_s
    while cluster.kubectl("get", crd, "-o", f"jsonpath={query}").strip() != "True":
        if time.monotonic() > deadline:
            raise AssertionError(f"{crd} not Established within {limit_s:.0f}s")
        time.sleep(0.2)


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
    _wait_established(real_cluster, crd)
    real_cluster.kubectl("create", "namespace", NS)
    real_cluster.kubectl("create", "namespace", RELEASE_NS)
    # The chart's RBAC as rendered, under names of its own: other tests of the session install the
    # chart itself (release "multilane", as docs/operator-install.md installs it), whose
    # cluster-scoped roles must not be these.
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
        if step.save and (ours.code >= 400 or theirs.code >= 400):  # later steps read what it saves
            pytest.fail(f"{row.id}: step {i} must succeed on both servers\n" + "\n".join(seen))
        if ours != theirs:
            detail = json.dumps({"double": ours.body, "kube-apiserver": theirs.body}, default=str)[:3000]
            pytest.fail(
                f"{row.id} ({row.why}) differs at step\n"
                + "\n".join(seen)
                + f"\nprojections: {ours.projection!r} vs {theirs.projection!r}\n{detail}"
            )
