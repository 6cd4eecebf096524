"""The Helm chart charts/multilane: lint, rendering under several value sets, values.schema.json,
manifest validity, CRD sync with crds/, least-privilege RBAC, pod security, NetworkPolicies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from .conftest import (
    CHART_DIR,
    CRD_FILE,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    Manifest,
    find,
    helm,
    load_sync_module,
    one,
)

FULLNAME = f"{RELEASE}-multilane"

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced": {"operator": {"watchNamespaces": ["team-a", "team-b"]}},
    "peering-clusterwide": {"peering": {"enabled": True, "priority": 200}},
    "peering-namespaced": {"peering": {"enabled": True}, "operator": {"watchNamespaces": ["team-a"]}},
    "monitoring": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
            "workerPodMonitor": {"enabled": True},
        }
    },
    "minimal-footprint": {
        "metrics": {"enabled": False},
        "networkPolicy": {"enabled": False},
        "crds": {"enabled": False},
    },
    "external-sa-no-rbac": {
        "serviceAccount": {"create": False, "name": "platform-sa"},
        "rbac": {"create": False},
    },
    "pinned-image": {
        "image": {"repository": "registry.example.com/ml", "digest": "sha256:" + "a" * 64},
        "imagePullSecrets": [{"name": "regcred"}],
        "operator": {"extraEnv": [{"name": "EXTRA", "value": "1"}], "extraArgs": ["--debug"]},
        "networkPolicy": {
            "namespaces": ["apps"],
            "metrics": {"podSelector": {"matchLabels": {"app": "prom"}}},
        },
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
    },
}

# Documents already validated (the same CRD comes out of every value set).
_VALIDATED: set[str] = set()

# Kinds without a schema in kubernetes-validate (custom resources of other projects).
UNVALIDATED_GROUPS = ("monitoring.coreos.com/", "kopf.dev/")


# --- lint, render, schema ----------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_lint_is_clean(value_set: str) -> None:
    report = helm.lint(str(CHART_DIR), VALUE_SETS[value_set], strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == []


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_rendered_manifests_are_valid_kubernetes_objects(render: Any, value_set: str) -> None:
    docs = render(VALUE_SETS[value_set])
    assert docs
    validated = 0
    for doc in docs:
        assert doc["metadata"].get("name"), doc
        if doc["apiVersion"].startswith(UNVALIDATED_GROUPS):
            assert doc["kind"] in {"ServiceMonitor", "PodMonitor", "ClusterKopfPeering", "KopfPeering"}
            continue
        key = json.dumps(doc, sort_keys=True)
        if key not in _VALIDATED:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            _VALIDATED.add(key)
        validated += 1
    assert validated >= 3


def test_default_render_has_the_expected_objects(render: Any) -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in render())
    assert kinds == sorted(
        [
            ("ClusterRole", FULLNAME),
            ("ClusterRoleBinding", FULLNAME),
            ("CustomResourceDefinition", "parallelconsumers.multilane.dev"),
            ("Deployment", FULLNAME),
            ("NetworkPolicy", f"{FULLNAME}-operator"),
            ("NetworkPolicy", f"{FULLNAME}-workers"),
            ("PodDisruptionBudget", FULLNAME),
            ("Role", f"{FULLNAME}-leader-election"),
            ("Role", f"{FULLNAME}-secrets"),
            ("RoleBinding", f"{FULLNAME}-leader-election"),
            ("RoleBinding", f"{FULLNAME}-secrets"),
            ("Service", f"{FULLNAME}-metrics"),
            ("ServiceAccount", FULLNAME),
        ]
    )
    for doc in render():
        if doc["kind"] not in {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}:
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["kind"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


def test_chart_has_no_crds_folder(chart: Any) -> None:
    """The CRD is a template (upgradable); a crds/ folder would be installed once and never upgraded."""
    assert chart.crds == []
    assert not (CHART_DIR / "crds").exists()


SCHEMA_REJECTS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "unknown top-level key": ({"replicaCount": 2}, ["additional properties 'replicaCount' not allowed"]),
    "unknown nested key (typo)": (
        {"metrics": {"serviceMonitr": {"enabled": True}}},
        ["/metrics", "additional properties 'serviceMonitr' not allowed"],
    ),
    "wrong type": ({"metrics": {"port": "9465"}}, ["/metrics/port", "got string, want integer"]),
    "port out of range": ({"operator": {"healthPort": 70000}}, ["/operator/healthPort", "maximum"]),
    "bad enum": ({"operator": {"logFormat": "xml"}}, ["/operator/logFormat"]),
    "root allowed": ({"securityContext": {"runAsNonRoot": False}}, ["/securityContext/runAsNonRoot"]),
    "privilege escalation": (
        {"securityContext": {"allowPrivilegeEscalation": True}},
        ["/securityContext/allowPrivilegeEscalation"],
    ),
    "removed key worker.rules": (
        {"worker": {"rules": []}},
        ["additional properties 'worker' not allowed"],
    ),
    "secret list verb": ({"rbac": {"secretVerbs": ["get", "list"]}}, ["/rbac/secretVerbs/1"]),
    "added capability": (
        {"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}},
        ["/securityContext/capabilities/add/0"],
    ),
    "capabilities kept": (
        {"securityContext": {"capabilities": {"drop": ["NET_RAW"]}}},
        ["/securityContext/capabilities/drop"],
    ),
    "privileged": ({"securityContext": {"privileged": True}}, ["/securityContext/privileged"]),
    "run as uid 0": ({"securityContext": {"runAsUser": 0}}, ["/securityContext/runAsUser"]),
    "pod runs as root": (
        {"podSecurityContext": {"runAsNonRoot": False}},
        ["/podSecurityContext/runAsNonRoot"],
    ),
    "pod uid 0": ({"podSecurityContext": {"runAsUser": 0}}, ["/podSecurityContext/runAsUser"]),
    "seccomp unconfined": (
        {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
        ["/securityContext/seccompProfile/type"],
    ),
    "pod seccomp unconfined": (
        {"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}},
        ["/podSecurityContext/seccompProfile/type"],
    ),
    "image digest not sha256": ({"image": {"digest": "latest"}}, ["/image/digest"]),
    "bad secret namespace": ({"rbac": {"secretNamespaces": ["Team_A"]}}, ["/rbac/secretNamespaces/0"]),
    "bad namespace name": ({"operator": {"watchNamespaces": ["Team_A"]}}, ["/operator/watchNamespaces/0"]),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_REJECTS))
def test_values_schema_rejects(chart: Any, case: str) -> None:
    values, fragments = SCHEMA_REJECTS[case]
    with pytest.raises(helm.HelmValuesError) as excinfo:
        chart.validate_schema(values)
    message = str(excinfo.value)
    for fragment in fragments:
        assert fragment in message, message
    # render (what helm install/template does) refuses the same values
    with pytest.raises(helm.HelmValuesError):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_values_schema_accepts_every_value_set(chart: Any) -> None:
    for values in VALUE_SETS.values():
        chart.validate_schema(values)


def test_values_schema_accepts_net_bind_service_only(chart: Any) -> None:
    chart.validate_schema(
        {"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}
    )
    chart.validate_schema(
        {"securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "p"}}}
    )


def test_notes_explain_next_steps(render_notes: Any) -> None:
    notes = render_notes()
    assert "kubectl get pcon -A -w" in notes
    assert "all namespaces" in notes
    assert "team-a, team-b" in render_notes(VALUE_SETS["namespaced"])
    assert "NOT installed" in render_notes({"crds": {"enabled": False}})


# --- the CRD template ---------------------------------------------------------------------------------


def test_crd_template_is_generated_from_crds_folder() -> None:
    sync = load_sync_module()
    template = (CHART_DIR / "templates" / "crd-parallelconsumers.yaml").read_text(encoding="utf-8")
    assert template == sync.render_template(CRD_FILE.read_text(encoding="utf-8")), (
        "run: python charts/multilane/hack/sync_crd.py"
    )
    assert sync.main(["--check"]) == 0


def test_rendered_crd_equals_crds_folder(render: Any, crd: Manifest) -> None:
    rendered = one(render(), "CustomResourceDefinition", "parallelconsumers.multilane.dev")
    metadata = rendered["metadata"]
    assert metadata["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert metadata["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    stripped = dict(rendered, metadata={"name": metadata["name"]})
    assert stripped == crd


def test_crd_switches(render: Any) -> None:
    unkept = one(render({"crds": {"keep": False}}), "CustomResourceDefinition")
    assert "annotations" not in unkept["metadata"]
    assert find(render({"crds": {"enabled": False}}), "CustomResourceDefinition") == []


def test_sync_script_refuses_template_braces() -> None:
    sync = load_sync_module()
    with pytest.raises(ValueError, match="must not contain"):
        sync.render_template(CRD_FILE.read_text(encoding="utf-8").replace("Comma-separated", "{{ x }}"))


# --- RBAC ---------------------------------------------------------------------------------------------


def _roles(docs: list[Manifest]) -> list[Manifest]:
    return [d for d in docs if d["kind"] in {"Role", "ClusterRole"}]


def _operator_rules(docs: list[Manifest]) -> list[Manifest]:
    return [rule for role in _roles(docs) for rule in role.get("rules", [])]


def _grants(rules: list[Manifest], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"]
        and resource in r["resources"]
        and verb in r["verbs"]
        and not r.get("resourceNames")
        for r in rules
    )


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_rbac_has_no_wildcards_and_no_escalation(render: Any, value_set: str) -> None:
    for role in _roles(render(VALUE_SETS[value_set])):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(key, []), (role["metadata"]["name"], rule)
            assert not {"escalate", "impersonate", "deletecollection"} & set(rule["verbs"]), rule
            assert not any(r.endswith("/*") for r in rule["resources"]), rule


def test_secrets_verbs_are_limited(render: Any) -> None:
    rules = _operator_rules(render())
    secret_rules = [r for r in rules if "secrets" in r["resources"]]
    assert len(secret_rules) == 1
    assert set(secret_rules[0]["verbs"]) == {"get", "create", "patch"}  # patch: the TLS rotation
    for verb in ("list", "watch", "update", "delete"):
        assert not _grants(rules, "", "secrets", verb), verb
    narrowed = _operator_rules(render({"rbac": {"secretVerbs": ["get", "create"]}}))  # --no-control-tls
    assert [set(r["verbs"]) for r in narrowed if "secrets" in r["resources"]] == [{"get", "create"}]


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_no_cluster_wide_secret_rule(render: Any, value_set: str) -> None:
    """Secrets only through namespaced Roles, in the namespaces granted (no confused deputy across
    namespaces; docs/security.md)."""
    docs = render(VALUE_SETS[value_set])
    for role in find(docs, "ClusterRole"):
        assert not any("secrets" in r["resources"] for r in role["rules"]), role["metadata"]["name"]
    secret_roles = [r for r in find(docs, "Role") if any("secrets" in x["resources"] for x in r["rules"])]
    watched = VALUE_SETS[value_set].get("operator", {}).get("watchNamespaces") or [NAMESPACE]
    if VALUE_SETS[value_set].get("rbac", {}).get("create", True):
        assert sorted(r["metadata"]["namespace"] for r in secret_roles) == sorted(watched)


def test_secret_namespaces_are_granted_explicitly(render: Any) -> None:
    docs = render({"rbac": {"secretNamespaces": ["apps", "billing"]}})
    roles = [r for r in find(docs, "Role") if r["metadata"]["name"] == f"{FULLNAME}-secrets"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["apps", "billing"]
    bindings = [b for b in find(docs, "RoleBinding") if b["metadata"]["name"] == f"{FULLNAME}-secrets"]
    for b in bindings:
        assert b["roleRef"]["kind"] == "Role"
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]


def test_operator_has_what_kopf_and_the_controller_need(render: Any) -> None:
    rules = _operator_rules(render())
    needed = [
        ("multilane.dev", "parallelconsumers", "list"),
        ("multilane.dev", "parallelconsumers", "watch"),
        ("multilane.dev", "parallelconsumers", "patch"),
        ("multilane.dev", "parallelconsumers/status", "patch"),
        # blockOwnerDeletion on the children's owner references (OwnerReferencesPermissionEnforcement)
        ("multilane.dev", "parallelconsumers/finalizers", "update"),
        # the opt-in recreate of a StatefulSet on an immutable change (orphan delete)
        ("apps", "statefulsets", "delete"),
        ("", "events", "create"),
        ("apps", "statefulsets", "create"),
        ("apps", "statefulsets", "patch"),
        ("", "services", "create"),
        ("policy", "poddisruptionbudgets", "create"),
        ("", "serviceaccounts", "create"),
        ("", "secrets", "create"),
        ("", "pods", "list"),
        ("coordination.k8s.io", "leases", "update"),
        ("rbac.authorization.k8s.io", "rolebindings", "create"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ]
    missing = [n for n in needed if not _grants(rules, *n)]
    assert missing == []


def test_names_fit_with_the_longest_full_name(render: Any) -> None:
    """A 63-character full name still gives valid names: a Service name is a DNS-1035 label of at most
    63 characters (https://kubernetes.io/docs/concepts/overview/working-with-objects/names/), so a
    suffixed name (``-metrics``, ``-dashboard``, ``-workers``) cuts the full name, not the suffix."""
    from multilane.testing.kube_rules import name_causes, object_label_causes

    values = {
        "fullnameOverride": "m" * 63,
        "metrics": {"serviceMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": True}},
    }
    docs = render(values)
    names = {d["metadata"]["name"] for d in docs}
    assert "m" * 55 + "-metrics" in names and "m" * 53 + "-dashboard" in names
    for doc in docs:
        assert name_causes(doc["kind"], doc["metadata"]["name"]) == [], (doc["kind"], doc["metadata"]["name"])
        assert object_label_causes(doc) == [], doc["kind"]


def test_operator_cannot_write_crds_or_cluster_rbac(render: Any) -> None:
    rules = _operator_rules(render())
    for verb in ("create", "update", "patch", "delete"):
        assert not _grants(rules, "apiextensions.k8s.io", "customresourcedefinitions", verb)
        assert not _grants(rules, "rbac.authorization.k8s.io", "clusterroles", verb)
        assert not _grants(rules, "rbac.authorization.k8s.io", "clusterrolebindings", verb)


def test_operator_can_create_every_child_the_controller_builds(render: Any) -> None:
    """Cross-check with multilane.operator.spec.children: each child kind is creatable and patchable, and
    the worker Role grants nothing the operator lacks (Kubernetes refuses to let a subject grant
    permissions it does not hold, unless it has escalate, which it must not)."""
    from multilane.operator.spec import children as ch

    ref = ch.ConsumerRef(name="orders", namespace="apps", uid="0000-1111")
    spec = {
        "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "consumerGroup": "g"},
        "workload": {"image": "app:1", "processor": "app:process"},
        "scaling": {"maxReplicas": 4},
        "state": {"enabled": True, "snapshot": {"uri": "s3://b/p", "schedule": "0 * * * *"}},
    }
    built = [
        *ch.children(ref, spec, 2),
        ch.control_token_secret(ref, "t" * 48),
        ch.lease_manifest(ref, "orders-0"),
    ]
    assert "CronJob" in [m["kind"] for m in built]
    rules = _operator_rules(render())
    plurals = {"Role": "roles", "RoleBinding": "rolebindings", "Service": "services", "Secret": "secrets"}
    for manifest in built:
        group = manifest["apiVersion"].rpartition("/")[0]
        plural = plurals.get(manifest["kind"], manifest["kind"].lower() + "s")
        assert _grants(rules, group, plural, "create"), manifest["kind"]
        if manifest["kind"] not in {"Secret", "Lease"}:  # created once
            assert _grants(rules, group, plural, "patch"), manifest["kind"]
    worker_roles = [m for m in built if m["kind"] == "Role"]
    assert worker_roles
    for worker_rule in worker_roles[0]["rules"]:
        for group in worker_rule["apiGroups"]:
            for resource in worker_rule["resources"]:
                for verb in worker_rule["verbs"]:
                    assert _grants(rules, group, resource, verb), (group, resource, verb)
    assert not any({"bind", "escalate"} & set(r["verbs"]) for r in rules)


def test_cluster_role_is_bound_to_the_operator_service_account(render: Any) -> None:
    docs = render()
    binding = one(docs, "ClusterRoleBinding", FULLNAME)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": FULLNAME,
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]


def test_namespaced_mode_grants_only_inside_watched_namespaces(render: Any) -> None:
    docs = render(VALUE_SETS["namespaced"])
    roles = find(docs, "Role")
    assert sorted((r["metadata"]["namespace"], r["metadata"]["name"]) for r in roles) == [
        (NAMESPACE, f"{FULLNAME}-leader-election"),
        *((ns, name) for ns in ("team-a", "team-b") for name in (FULLNAME, f"{FULLNAME}-secrets")),
    ]
    assert sorted(b["metadata"]["namespace"] for b in find(docs, "RoleBinding")) == [
        NAMESPACE,
        "team-a",
        "team-a",
        "team-b",
        "team-b",
    ]
    # the only cluster-wide grant is read-only discovery
    discovery = one(docs, "ClusterRole", f"{FULLNAME}-discovery")
    assert {v for r in discovery["rules"] for v in r["verbs"]} <= {"get", "list", "watch"}
    assert {res for r in discovery["rules"] for res in r["resources"]} == {
        "customresourcedefinitions",
        "namespaces",
    }
    assert [b["roleRef"]["name"] for b in find(docs, "ClusterRoleBinding")] == [f"{FULLNAME}-discovery"]
    args = _container(docs)["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    # NetworkPolicies follow the watched namespaces
    worker_policies = [p for p in find(docs, "NetworkPolicy") if p["metadata"]["name"].endswith("-workers")]
    assert sorted(p["metadata"]["namespace"] for p in worker_policies) == ["team-a", "team-b"]


def test_no_rbac_when_disabled(render: Any) -> None:
    docs = render(VALUE_SETS["external-sa-no-rbac"])
    assert (
        _roles(docs) == [] and find(docs, "ClusterRoleBinding") == [] and find(docs, "ServiceAccount") == []
    )
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "platform-sa"


# --- the operator Deployment --------------------------------------------------------------------------


def _container(docs: list[Manifest]) -> Manifest:
    containers = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    container: Manifest = containers[0]
    return container


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_deployment_security_context(render: Any, value_set: str) -> None:
    docs = render(VALUE_SETS[value_set])
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    sc = _container(docs)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # the read-only root filesystem needs a writable /tmp (HOME and TMPDIR)
    mounts = {m["mountPath"]: m["name"] for m in _container(docs)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    env = {e["name"]: e.get("value") for e in _container(docs)["env"]}
    assert env["HOME"] == "/tmp" and env["TMPDIR"] == "/tmp" and env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_deployment_runs_the_operator_with_kopf_liveness(render: Any) -> None:
    docs = render()
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    container = _container(docs)
    assert container["image"] == "ghcr.io/multilane/multilane:0.1.0"
    args = container["args"]
    assert args[0] == "operator"
    assert "--liveness=http://0.0.0.0:8080/healthz" in args
    # cluster-wide (no --namespace) and standalone (no --peering): the CLI's defaults
    assert not any(a.startswith(("--namespace", "--peering", "--priority")) for a in args)
    assert "--metrics-port=9465" in args and "--log-format=json" in args
    assert "--leader-election" in args and f"--leader-election-name={FULLNAME}" in args
    assert "--lease-duration=15" in args and "--renew-deadline=10" in args and "--retry-period=2" in args
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_ID"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"  # identity
    probe = container["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe["path"] == "/healthz" and ports[probe["port"]] == 8080
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    assert selector["app.kubernetes.io/component"] == "operator"


def test_leader_election_and_replicas(render: Any, chart: Any) -> None:
    single = render({"replicas": 1, "leaderElection": {"enabled": False}})
    assert not find(single, "PodDisruptionBudget")
    pdb = one(render(), "PodDisruptionBudget", FULLNAME)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert (
        pdb["spec"]["selector"]["matchLabels"]
        == one(render(), "Deployment")["spec"]["selector"]["matchLabels"]
    )
    deployment = one(single, "Deployment")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "--leader-election" not in _container(single)["args"]
    assert not find(single, "Role", f"{FULLNAME}-leader-election")
    role = one(render(), "Role", f"{FULLNAME}-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert {"get", "update"} == {
        v for r in role["rules"] if r.get("resourceNames") == [FULLNAME] for v in r["verbs"]
    }
    # two operators without leader election: refused, with kopf peering too (both replicas would have
    # the same priority, and kopf pauses every operator of the highest priority when there are several)
    for values in (
        {"replicas": 2, "leaderElection": {"enabled": False}},
        {"replicas": 2, "leaderElection": {"enabled": False}, "peering": {"enabled": True}},
        {"replicas": 3, "leaderElection": {"enabled": False}, "peering": {"enabled": True, "priority": 5}},
    ):
        with pytest.raises(helm.HelmValuesError) as excinfo:
            chart.validate_schema(values)
        assert "leaderElection" in str(excinfo.value) or "enabled" in str(excinfo.value), str(excinfo.value)
    # one replica with peering and no election: Recreate too (a surge pod would pause both)
    peered = one(render({"replicas": 1, "leaderElection": {"enabled": False}, "peering": {"enabled": True}}),
                 "Deployment")
    assert peered["spec"]["strategy"] == {"type": "Recreate"}


def test_global_values_are_admitted_for_use_as_a_subchart(
    render: Any, chart: Any, tmp_path: Path
) -> None:
    """Helm hands every subchart a ``global`` key (``{}`` when the parent sets none) and validates it
    against the subchart's schema: without ``global`` in the schema, no parent chart could depend on
    this one at all (Helm: "additional properties 'global' not allowed")."""
    values = {"global": {"imageRegistry": "registry.example.com", "storageClass": "fast"}}
    chart.validate_schema(values)
    docs = render(values)
    assert one(docs, "Deployment")["spec"]["replicas"] == 2
    assert [d["kind"] for d in docs] == [d["kind"] for d in render()]
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"global": "not-an-object"})
    # a parent chart with multilane as its dependency, with and without global values of its own
    parent = tmp_path / "platform"
    shutil.copytree(CHART_DIR, parent / "charts" / "multilane")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: platform\nversion: 1.0.0\n"
        "dependencies:\n  - name: multilane\n    version: 0.1.0\n"
    )
    loaded = helm.Chart.load(str(parent))
    for parent_values in ({}, {**values, "multilane": {"replicas": 3}}):
        out = loaded.render(parent_values, name="platform", namespace=NAMESPACE, is_install=True)
        [deployment] = [
            doc
            for path, text in out.items()
            if path.endswith("templates/deployment.yaml")
            for doc in yaml.safe_load_all(text)
            if doc
        ]
        assert deployment["metadata"]["name"] == "platform-multilane"
        assert deployment["spec"]["replicas"] == parent_values.get("multilane", {}).get("replicas", 2)


def test_image_digest_wins_over_tag(render: Any) -> None:
    container = _container(render(VALUE_SETS["pinned-image"]))
    assert container["image"] == "registry.example.com/ml@sha256:" + "a" * 64
    assert container["args"][-1] == "--debug"
    assert {"name": "EXTRA", "value": "1"} in container["env"]


def test_metrics_service_and_monitors(render: Any) -> None:
    docs = render(VALUE_SETS["monitoring"])
    service = one(docs, "Service", f"{FULLNAME}-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9465, "targetPort": "metrics", "protocol": "TCP"}
    ]
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["spec"]["selector"].items()
    pod_monitor = one(docs, "PodMonitor")
    assert pod_monitor["spec"]["namespaceSelector"] == {"any": True}
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    off = render(VALUE_SETS["minimal-footprint"])
    assert find(off, "Service") == [] and "--metrics-port=0" in _container(off)["args"]


# --- peering ------------------------------------------------------------------------------------------


def test_peering_clusterwide(render: Any) -> None:
    docs = render(VALUE_SETS["peering-clusterwide"])
    crds = {d["metadata"]["name"] for d in find(docs, "CustomResourceDefinition")}
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= crds
    peering = one(docs, "ClusterKopfPeering", "multilane")
    # created after its CRD exists: a post-install/upgrade hook
    assert "post-install" in peering["metadata"]["annotations"]["helm.sh/hook"]
    args = _container(docs)["args"]
    assert "--peering=multilane" in args and "--priority=200" in args
    assert _grants(_operator_rules(docs), "kopf.dev", "clusterkopfpeerings", "patch")
    assert not _grants(_operator_rules(render()), "kopf.dev", "clusterkopfpeerings", "patch")


def test_peering_namespaced(render: Any) -> None:
    docs = render(VALUE_SETS["peering-namespaced"])
    assert one(docs, "KopfPeering")["metadata"]["namespace"] == "team-a"
    assert find(docs, "ClusterKopfPeering") == []
    assert _grants(one(docs, "Role", FULLNAME)["rules"], "kopf.dev", "kopfpeerings", "patch")
    without_crds = render({"peering": {"enabled": True, "installCRDs": False}})
    assert [d["metadata"]["name"] for d in find(without_crds, "CustomResourceDefinition")] == [
        "parallelconsumers.multilane.dev"
    ]


# --- NetworkPolicies ----------------------------------------------------------------------------------


def test_worker_network_policy(render: Any) -> None:
    docs = render()
    policy = one(docs, "NetworkPolicy", f"{FULLNAME}-workers")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["podSelector"] == {
        "matchExpressions": [
            {"key": "app.kubernetes.io/component", "operator": "In", "values": ["worker"]},
            {"key": "multilane.dev/consumer", "operator": "Exists"},
        ]
    }
    control, metrics = policy["spec"]["ingress"]
    assert control["ports"] == [{"protocol": "TCP", "port": 8471}]
    (peer,) = control["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    operator_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert peer["podSelector"]["matchLabels"].items() <= operator_labels.items()
    assert metrics["ports"] == [{"protocol": "TCP", "port": 9464}]
    assert metrics["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    # no rule opens the control port to anyone else
    assert all(8471 not in [p["port"] for p in rule["ports"]] for rule in policy["spec"]["ingress"][1:])


def test_network_policy_namespaces_and_prometheus_selector(render: Any) -> None:
    docs = render(VALUE_SETS["pinned-image"])
    policy = one(docs, "NetworkPolicy", f"{FULLNAME}-workers")
    assert policy["metadata"]["namespace"] == "apps"
    assert policy["spec"]["ingress"][1]["from"][0]["podSelector"] == {"matchLabels": {"app": "prom"}}
    operator_policy = one(docs, "NetworkPolicy", f"{FULLNAME}-operator")
    assert operator_policy["metadata"]["namespace"] == NAMESPACE
    assert find(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy") == []


def test_values_yaml_is_commented() -> None:
    text = (CHART_DIR / "values.yaml").read_text(encoding="utf-8")
    values = yaml.safe_load(text)
    comments = [line for line in text.splitlines() if line.strip().startswith("# --")]
    assert len(comments) >= len(values)


# --- cross-checks with the operator's code ------------------------------------------------------------


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_operator_cli_accepts_the_rendered_arguments(render: Any, value_set: str) -> None:
    """The Deployment's args parse with `multilane operator`'s own argument parser."""
    import argparse

    from multilane.operator.k8s import cli

    args = _container(render(VALUE_SETS[value_set]))["args"]
    assert args[0] == "operator"
    parser = argparse.ArgumentParser(prog="multilane operator", exit_on_error=False)
    cli.add_arguments(parser)
    known = [a for a in args[1:] if a != "--debug"]  # extraArgs of the pinned-image set are free-form
    parsed = parser.parse_args(known)
    assert parsed.liveness == "http://0.0.0.0:8080/healthz"
    watch = VALUE_SETS[value_set].get("operator", {}).get("watchNamespaces", [])
    assert parsed.namespace == watch
    peering = VALUE_SETS[value_set].get("peering", {}).get("enabled", False)
    assert bool(parsed.peering) == peering


def test_network_policy_matches_the_worker_pods_the_operator_builds(render: Any) -> None:
    from multilane.operator.spec import children as ch

    ref = ch.ConsumerRef(name="orders", namespace=NAMESPACE, uid="0000-1111")
    spec = {
        "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "consumerGroup": "g"},
        "workload": {"image": "app:1", "processor": "app:process"},
    }
    sts = ch.stateful_set(ref, spec, 2)
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    ports = {
        p["name"]: p["containerPort"]
        for c in sts["spec"]["template"]["spec"]["containers"]
        for p in c["ports"]
    }
    policy = one(render(), "NetworkPolicy", f"{FULLNAME}-workers")
    for expression in policy["spec"]["podSelector"]["matchExpressions"]:
        assert expression["key"] in pod_labels
        if expression["operator"] == "In":
            assert pod_labels[expression["key"]] in expression["values"]
    control, metrics = policy["spec"]["ingress"]
    assert control["ports"][0]["port"] == ports["control"] == ch.CONTROL_PORT
    assert metrics["ports"][0]["port"] == ports["metrics"] == ch.METRICS_PORT
    # the PodMonitor scrapes the port by name
    pod_monitor = one(render(VALUE_SETS["monitoring"]), "PodMonitor")
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports
