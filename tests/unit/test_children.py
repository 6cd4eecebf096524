"""Unit tests of the pure child-manifest builders (multilane.operator.spec.children)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from multilane.operator.spec import children as ch
from multilane.testing import kube_rules

REF = ch.ConsumerRef(name="orders", namespace="team-a", uid="1234")
SPEC: dict[str, Any] = {
    "kafka": {
        "bootstrapServers": "kafka:9092",
        "topics": ["orders"],
        "consumerGroup": "orders-processor",
        "config": {"security.protocol": "SASL_SSL"},
        "credentialsSecretRef": {"name": "kafka-creds"},
    },
    "workload": {
        "image": "ghcr.io/example/app:1.0",
        "processor": "app.handlers:process",
        "ordering": "unordered",
        "env": [{"name": "APP_MODE", "value": "fast"}],
        "resources": {"requests": {"cpu": "500m"}},
    },
    "scaling": {"maxReplicas": 3, "minFactor": 2},
}


def test_every_child_is_owned_and_labelled() -> None:
    manifests = [
        *ch.children(REF, SPEC, 2),
        ch.control_token_secret(REF, "x" * 40),
        ch.lease_manifest(REF, "orders-0"),
    ]
    kinds = [m["kind"] for m in manifests]
    assert kinds == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Service",
        "PodDisruptionBudget",
        "StatefulSet",
        "Secret",
        "Lease",
    ]
    for m in manifests:
        meta = m["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["labels"][ch.CONSUMER_LABEL] == "orders"
        (owner,) = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "multilane.dev/v1alpha1",
            "kind": "ParallelConsumer",
            "name": "orders",
            "uid": "1234",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    names = {m["kind"]: m["metadata"]["name"] for m in manifests}
    assert names["Service"] == "orders-workers" and names["ServiceAccount"] == "orders-worker"
    assert names["Secret"] == "orders-control-token" and names["StatefulSet"] == "orders"


def test_worker_pod_is_locked_down_and_gets_credentials_by_reference_only() -> None:
    sts = ch.stateful_set(REF, SPEC, 2)
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["serviceName"] == "orders-workers"
    assert sts["spec"]["selector"] == {"matchLabels": {ch.CONSUMER_LABEL: "orders"}}
    pod = sts["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "orders-worker"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert c["envFrom"] == [{"prefix": "MULTILANE_KAFKA_", "secretRef": {"name": "kafka-creds"}}]
    assert {"name": "APP_MODE", "value": "fast"} in c["env"]
    assert c["resources"] == {"requests": {"cpu": "500m"}}
    args = c["args"]
    for flag, value in [
        ("--control-port", "8471"),
        ("--metrics-port", "9464"),
        ("--control-token-file", "/var/run/multilane/token"),
        ("--ordering", "unordered"),
        ("--factor", "2"),
        ("--assign", ""),
    ]:
        assert args[args.index(flag) + 1] == value
    assert "security.protocol=SASL_SSL" in args
    token_volume = next(v for v in pod["volumes"] if v["name"] == "control-token")
    assert token_volume["secret"]["secretName"] == "orders-control-token"
    assert {"name": "control-token", "mountPath": "/var/run/multilane", "readOnly": True} in c["volumeMounts"]
    assert {p["containerPort"] for p in c["ports"]} == {8471, 9464}
    assert "volumeClaimTemplates" not in sts["spec"]


def test_state_enabled_adds_a_volume_claim() -> None:
    spec = {**SPEC, "state": {"enabled": True, "storage": {"size": "5Gi", "storageClassName": "fast"}}}
    sts = ch.stateful_set(REF, spec, 1)
    (pvc,) = sts["spec"]["volumeClaimTemplates"]
    assert (
        pvc["spec"]["resources"]["requests"]["storage"] == "5Gi" and pvc["spec"]["storageClassName"] == "fast"
    )
    assert "--state-dir" in sts["spec"]["template"]["spec"]["containers"][0]["args"]


def test_state_flags_come_from_the_spec_and_parse_with_the_worker_cli() -> None:
    import argparse

    from multilane.worker import cli

    state = {
        "enabled": True,
        "snapshot": {"uri": "s3://bucket/snaps", "schedule": "0 * * * *"},
        "changelogConfig": {"min.insync.replicas": "2", "retention.ms": "-1"},
    }
    args = ch.worker_args({**SPEC, "state": state})
    assert args[args.index("--state-dir") + 1] == ch.STATE_DIR
    assert args[args.index("--snapshot-uri") + 1] == "s3://bucket/snaps"
    changelog = [args[i + 1] for i, a in enumerate(args) if a == "--changelog-config"]
    assert changelog == ["min.insync.replicas=2", "retention.ms=-1"]
    # the worker's own parser takes them as they are
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    parsed = parser.parse_args(args[1:])
    assert parsed.snapshot_uri == "s3://bucket/snaps" and parsed.state_dir == ch.STATE_DIR
    assert parsed.changelog_config == changelog
    # no snapshot URI, no changelog config: no flags
    bare = ch.worker_args({**SPEC, "state": {"enabled": True, "snapshot": {"uri": ""}}})
    assert "--snapshot-uri" not in bare and "--changelog-config" not in bare and "--state-dir" in bare
    # state disabled: none of the state flags (the worker refuses them without --state-dir)
    off = ch.worker_args({**SPEC, "state": {**state, "enabled": False}})
    assert not {"--state-dir", "--snapshot-uri", "--changelog-config"} & set(off)
    cli.check_state_args(parser.parse_args(off[1:]))


def test_role_allows_only_get_update_of_the_workers_own_leases() -> None:
    (rule,) = ch.role(REF, 3)["rules"]
    assert rule == {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["orders-0", "orders-1", "orders-2"],
        "verbs": ["get", "update"],
    }
    binding = ch.role_binding(REF)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "orders-worker", "namespace": "team-a"}]


def test_service_is_headless_and_token_must_be_long() -> None:
    svc = ch.service(REF)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    with pytest.raises(ValueError):
        ch.control_token_secret(REF, "short")


STATE_SPEC: dict[str, Any] = {
    **SPEC,
    "state": {
        "enabled": True,
        "snapshot": {"uri": "s3://bucket/orders", "schedule": "0 * * * *", "retention": 5},
    },
}


def test_snapshot_cronjob_is_a_child_when_a_schedule_is_set() -> None:
    built = ch.children(REF, STATE_SPEC, 2)
    assert [m["kind"] for m in built][-1] == "CronJob"
    cronjob = built[-1]
    assert cronjob["apiVersion"] == "batch/v1"
    meta = cronjob["metadata"]
    assert meta["name"] == "orders-snapshot" == ch.snapshot_cronjob_name(REF)
    assert meta["namespace"] == "team-a"
    assert meta["labels"][ch.CONSUMER_LABEL] == "orders"
    assert meta["ownerReferences"] == [ch.owner_reference(REF)]
    assert cronjob["spec"]["schedule"] == "0 * * * *"
    assert cronjob["spec"]["suspend"] is False
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/example/app:1.0"  # the workload image (needs pyspark + JRE)
    assert container["command"][:2] == ["multilane", "snapshot"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert {"/tmp", "/scratch"} <= writable
    # the snapshot Job's pods take the workers' identity from spec.podTemplate.securityContext
    worker_pod = ch.stateful_set(REF, STATE_SPEC, 1)["spec"]["template"]["spec"]
    assert pod["securityContext"] == worker_pod["securityContext"]
    openshift = dict(STATE_SPEC, podTemplate={"securityContext": {"platformAssignsIds": True}})
    job_pod = ch.children(REF, openshift, 2)[-1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert job_pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


@pytest.mark.parametrize(
    "state",
    [
        None,
        {"enabled": False, "snapshot": {"uri": "s3://b/p", "schedule": "0 * * * *"}},
        {"enabled": True, "snapshot": {"uri": "s3://b/p", "schedule": ""}},
        {"enabled": True, "snapshot": {"uri": "", "schedule": "0 * * * *"}},
        {"enabled": True},
    ],
)
def test_no_snapshot_cronjob_without_a_schedule(state: Any) -> None:
    spec = {**SPEC, "state": state} if state is not None else SPEC
    assert ch.snapshot_cronjob(REF, spec) is None
    assert "CronJob" not in [m["kind"] for m in ch.children(REF, spec, 2)]


def _stateful(**state: Any) -> dict[str, Any]:
    return {**SPEC, "state": {"enabled": True, **state}}


def test_pvc_retention_defaults_and_owner_uid() -> None:
    """Defaults: whenDeleted=Delete (a re-created consumer starts on empty volumes), whenScaled=Retain
    (a scale-up starts warm); the worker gets the consumer's uid for its state directory stamp."""
    sts = ch.stateful_set(REF, _stateful(), 2)
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Delete",
        "whenScaled": "Retain",
    }
    env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MULTILANE_STATE_OWNER"] == REF.uid
    kept = ch.stateful_set(REF, _stateful(pvcRetention={"whenDeleted": "Retain", "whenScaled": "Delete"}), 2)
    assert kept["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Delete",
    }
    assert "persistentVolumeClaimRetentionPolicy" not in ch.stateful_set(REF, SPEC, 2)["spec"]


@pytest.mark.parametrize(
    ("before", "after", "changed"),
    [
        (SPEC, _stateful(), ["spec.volumeClaimTemplates"]),
        (_stateful(), SPEC, ["spec.volumeClaimTemplates"]),
        (
            _stateful(storage={"size": "1Gi"}),
            _stateful(storage={"size": "2Gi"}),
            ["spec.volumeClaimTemplates"],
        ),
        (
            _stateful(storage={"storageClassName": "a"}),
            _stateful(storage={"storageClassName": "b"}),
            ["spec.volumeClaimTemplates"],
        ),
        (_stateful(), _stateful(pvcRetention={"whenScaled": "Delete"}), []),
        (SPEC, {**SPEC, "workload": {**SPEC["workload"], "image": "app:2"}}, []),
    ],
)
def test_statefulset_immutable_changes(
    before: dict[str, Any], after: dict[str, Any], changed: list[str]
) -> None:
    existing = ch.stateful_set(REF, before, 2)
    # The API server adds defaults to the stored claim templates: not a change.
    for claim in existing["spec"].get("volumeClaimTemplates") or []:
        claim["spec"]["volumeMode"] = "Filesystem"
        claim["status"] = {"phase": "Pending"}
    assert ch.statefulset_immutable_changes(existing, ch.stateful_set(REF, after, 3)) == changed


def test_statefulset_update_sends_only_mutable_fields() -> None:
    patch = ch.statefulset_update(ch.stateful_set(REF, _stateful(), 3))
    assert set(patch["spec"]) == {
        "replicas", "template", "updateStrategy", "persistentVolumeClaimRetentionPolicy"
    }
    assert set(patch["metadata"]) == {"labels", "ownerReferences"}


def test_the_operators_mutable_statefulset_fields_are_the_api_servers() -> None:
    """Two lists on purpose (the API-server double must not trust the operator): they must agree, and
    the double's refusal message names the same fields."""
    assert list(ch.STATEFULSET_MUTABLE) == list(kube_rules.STATEFULSET_MUTABLE)
    assert len(set(ch.STATEFULSET_MUTABLE)) == len(ch.STATEFULSET_MUTABLE)
    named = set(re.findall(r"'([A-Za-z]+)'", kube_rules._FORBIDDEN_STS))
    assert named == set(kube_rules.STATEFULSET_MUTABLE)


def test_worker_lease_duration_follows_the_spec() -> None:
    def env(spec: dict[str, Any]) -> str:
        container = ch.stateful_set(REF, spec, 1)["spec"]["template"]["spec"]["containers"][0]
        return next(e["value"] for e in container["env"] if e["name"] == "MULTILANE_LEASE_DURATION_SECONDS")

    assert env(SPEC) == str(ch.LEASE_DURATION_S)
    assert env({**SPEC, "workload": {**SPEC["workload"], "leaseDurationSeconds": 40}}) == "40"


def test_workers_listen_on_the_pod_ip() -> None:
    container = ch.stateful_set(REF, SPEC, 1)["spec"]["template"]["spec"]["containers"][0]
    refs = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert refs["MULTILANE_POD_IP"] == "status.podIP"


def test_statefulset_is_on_delete_with_a_template_hash_that_follows_the_template() -> None:
    sts = ch.stateful_set(REF, SPEC, 2)
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    probe = sts["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"]["path"] == "/readyz"  # engine started and assigned partitions restored
    digest = sts["spec"]["template"]["metadata"]["annotations"][ch.TEMPLATE_HASH_ANNOTATION]
    assert digest == ch.template_hash(sts["spec"]["template"])
    # the same spec renders the same hash (an operator restart replaces nothing); replicas are no
    # part of the template; an image change is
    assert ch.stateful_set(REF, SPEC, 5)["spec"]["template"] == sts["spec"]["template"]
    changed = {**SPEC, "workload": {**SPEC["workload"], "image": "ghcr.io/example/app:1.1"}}
    other = ch.stateful_set(REF, changed, 2)["spec"]["template"]["metadata"]["annotations"]
    assert other[ch.TEMPLATE_HASH_ANNOTATION] != digest


def test_patch_removes_the_default_rolling_update_block() -> None:
    body = ch.patch_body(ch.stateful_set(REF, SPEC, 2))
    assert body["spec"]["updateStrategy"] == {"type": "OnDelete", "rollingUpdate": None}
    service = ch.service(REF)
    assert ch.patch_body(service) == service


def test_pod_template_fits_the_pods_to_a_cluster() -> None:
    fit = {
        "labels": {"team": "payments", ch.CONSUMER_LABEL: "hijack"},
        "annotations": {"prometheus.io/scrape": "true"},
        "imagePullSecrets": [{"name": "registry"}],
        "nodeSelector": {"pool": "workers"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "kafka", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
            }
        ],
        "priorityClassName": "high",
        "volumes": [{"name": "certs", "secret": {"secretName": "ca"}}],
        "volumeMounts": [{"name": "certs", "mountPath": "/etc/certs", "readOnly": True}],
    }
    template = ch.stateful_set(REF, {**SPEC, "podTemplate": fit}, 2)["spec"]["template"]
    labels, pod = template["metadata"]["labels"], template["spec"]
    assert labels["team"] == "payments" and labels[ch.CONSUMER_LABEL] == "orders"  # the operator's wins
    assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert ch.TEMPLATE_HASH_ANNOTATION in template["metadata"]["annotations"]
    for key in ("imagePullSecrets", "nodeSelector", "tolerations", "affinity", "priorityClassName"):
        assert pod[key] == fit[key]
    spread = pod["topologySpreadConstraints"][0]
    assert spread["labelSelector"] == {"matchLabels": {ch.CONSUMER_LABEL: "orders"}}  # this consumer's pods
    assert [v["name"] for v in pod["volumes"]] == ["control-token", "tmp", "certs"]
    mounts = pod["containers"][0]["volumeMounts"]
    assert mounts[-1] == {"name": "certs", "mountPath": "/etc/certs", "readOnly": True}
    # a podTemplate change is a template change: the pods are replaced
    plain = ch.stateful_set(REF, SPEC, 2)["spec"]["template"]["metadata"]["annotations"]
    assert (
        plain[ch.TEMPLATE_HASH_ANNOTATION] != template["metadata"]["annotations"][ch.TEMPLATE_HASH_ANNOTATION]
    )


def test_default_requests_when_the_workload_names_none() -> None:
    bare = {**SPEC, "workload": {k: v for k, v in SPEC["workload"].items() if k != "resources"}}
    container = ch.stateful_set(REF, bare, 1)["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == ch.DEFAULT_RESOURCES
    limits_only = {**SPEC, "workload": {**SPEC["workload"], "resources": {"limits": {"cpu": "1"}}}}
    container = ch.stateful_set(REF, limits_only, 1)["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"cpu": "1"}}  # Kubernetes takes requests from limits


def _pod_security(pod_template: dict[str, Any] | None) -> dict[str, Any]:
    spec = dict(SPEC, podTemplate=pod_template) if pod_template is not None else SPEC
    context: dict[str, Any] = ch.stateful_set(REF, spec, 1)["spec"]["template"]["spec"]["securityContext"]
    return context


def test_worker_ids_default_are_set_or_left_to_the_platform() -> None:
    """uid, gid and fsGroup: 65532 by default, the spec's when it sets them, none at all with
    platformAssignsIds (OpenShift's restricted SCCs assign them); non-root and seccomp always."""
    locked = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert _pod_security(None) == {**locked, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532}
    chosen = _pod_security(
        {"securityContext": {"runAsUser": 1000, "fsGroup": 0, "fsGroupChangePolicy": "OnRootMismatch",
                             "supplementalGroups": [2000]}}
    )  # fmt: skip
    assert chosen == {
        **locked, "runAsUser": 1000, "runAsGroup": 65532, "fsGroup": 0,
        "fsGroupChangePolicy": "OnRootMismatch", "supplementalGroups": [2000],
    }  # fmt: skip
    openshift = _pod_security({"securityContext": {"platformAssignsIds": True}})
    assert openshift == locked
    assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(openshift)
    # the container keeps its own lock-down whatever the pod's ids
    sts = ch.stateful_set(REF, dict(SPEC, podTemplate={"securityContext": {"platformAssignsIds": True}}), 1)
    container = sts["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert container["runAsNonRoot"] is True and container["capabilities"] == {"drop": ["ALL"]}
    assert container["readOnlyRootFilesystem"] is True and container["allowPrivilegeEscalation"] is False
    # a change of the ids is a template change: the pods are replaced one at a time
    fits: list[dict[str, Any]] = [
        {}, {"securityContext": {"runAsUser": 1000}}, {"securityContext": {"platformAssignsIds": True}},
    ]  # fmt: skip
    templates = [ch.stateful_set(REF, dict(SPEC, podTemplate=f), 1)["spec"]["template"] for f in fits]
    hashes = {ch.template_hash(t) for t in templates}
    assert len(hashes) == 3
