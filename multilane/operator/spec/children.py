"""Manifests of a ParallelConsumer's children. Pure: builds dicts, no I/O.

Every child carries the label ``multilane.dev/consumer: NAME`` and an owner reference to the
ParallelConsumer (controller=true, blockOwnerDeletion=true), so Kubernetes' garbage collector deletes
them with it. Children:

- StatefulSet ``NAME`` (the workers; ``updateStrategy: OnDelete``: the operator replaces pods
  itself, handing each pod's partitions to warm owners first, see
  :mod:`multilane.operator.rollout.replacement`; the pod template carries
  :data:`TEMPLATE_HASH_ANNOTATION`, the hash of the rendered template, which pods inherit),
  headless Service ``NAME-workers``, PodDisruptionBudget ``NAME``;
- ServiceAccount ``NAME-worker`` with Role/RoleBinding ``NAME-worker``: get/update of the workers'
  own Leases only (the operator creates the Leases; ``create`` cannot be limited by name in RBAC);
- Secret ``NAME-control-token`` (key ``token``): created once, never overwritten
  (see :func:`control_token_secret`; the caller supplies the random token);
- CronJob ``NAME-snapshot`` (batch/v1), only when ``spec.state.enabled`` and
  ``spec.state.snapshot.schedule`` and ``.uri`` are set: rendered by
  :func:`multilane.pipeline.k8s.render_snapshot_cronjob` in the workload image (which must include
  ``multilane[pipeline]`` and a JRE; the CRD has no separate snapshot image). When the schedule goes,
  the operator suspends it (``spec.suspend: true``) rather than deleting it: see
  :func:`snapshot_cronjob`.

Worker pods run non-root with a read-only root filesystem; Kafka credentials reach them only by
reference (``envFrom`` the referenced Secret, prefixed ``MULTILANE_KAFKA_``), never copied. With state,
each worker gets the ParallelConsumer's uid (``MULTILANE_STATE_OWNER``): a state directory stamped
with another uid (a volume retained from a deleted ParallelConsumer of the same name) is wiped, never
used (:mod:`multilane.worker.state.owner`).

A StatefulSet's ``selector``, ``serviceName``, ``volumeClaimTemplates`` and ``podManagementPolicy``
cannot change (kube-apiserver refuses the update): :func:`statefulset_immutable_changes` names the
ones a new spec would change, and :func:`statefulset_update` is the patch of the fields that may.

This module renders the StatefulSet (the worker pod template) and lists the children; the identity
every child carries lives in :mod:`multilane.operator.spec.child_meta`, the other children in
:mod:`multilane.operator.spec.small_children` (both re-exported here).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from multilane.operator.spec.child_meta import (
    API_GROUP,
    API_VERSION,
    CONSUMER_LABEL,
    CONTROL_PORT,
    KIND,
    LEASE_DURATION_S,
    METRICS_PORT,
    SECURITY_ID_FIELDS,
    WORKER_ID,
    ConsumerRef,
    _labels,
    _meta,
    owner_reference,
    pod_security_context,
    selector_labels,
)
from multilane.operator.spec.small_children import (
    control_token_secret,
    lease_manifest,
    pod_disruption_budget,
    role,
    role_binding,
    service,
    service_account,
    snapshot_cronjob,
    snapshot_cronjob_name,
)

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "CONSUMER_LABEL",
    "CONTROL_PORT",
    "DEFAULT_RESOURCES",
    "KAFKA_ENV_PREFIX",
    "KIND",
    "METRICS_PORT",
    "SECURITY_ID_FIELDS",
    "TEMPLATE_HASH_ANNOTATION",
    "TOKEN_DIR",
    "WORKER_ID",
    "ConsumerRef",
    "children",
    "control_token_secret",
    "fit_pod_template",
    "lease_manifest",
    "owner_reference",
    "patch_body",
    "pod_disruption_budget",
    "pod_security_context",
    "role",
    "role_binding",
    "selector_labels",
    "service",
    "service_account",
    "snapshot_cronjob",
    "snapshot_cronjob_name",
    "stateful_set",
    "statefulset_immutable_changes",
    "statefulset_update",
    "template_hash",
    "worker_args",
]

TOKEN_DIR = "/var/run/multilane"
TOKEN_FILE = f"{TOKEN_DIR}/token"
STATE_DIR = "/var/lib/multilane/state"
KAFKA_ENV_PREFIX = "MULTILANE_KAFKA_"
STATE_OWNER_ENV = "MULTILANE_STATE_OWNER"
#: StatefulSet spec fields an update may change (kube-apiserver refuses changes to any other).
STATEFULSET_MUTABLE = (
    "replicas",
    "template",
    "updateStrategy",
    "persistentVolumeClaimRetentionPolicy",
    "minReadySeconds",
    "ordinals",
    "revisionHistoryLimit",
)
# Requests of a worker container whose spec.workload.resources names neither requests nor limits (a
# namespace with a compute quota refuses pods without requests).
DEFAULT_RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}}
# spec.podTemplate fields copied into the pod spec as they are (core/v1 shapes, schema-checked).
POD_SPEC_FIELDS = ("imagePullSecrets", "nodeSelector", "tolerations", "affinity", "priorityClassName")
# On the pod template (so on every pod): the hash of the rendered template without this annotation. A
# pod whose value differs from its StatefulSet's runs an outdated template (an image change, or an
# operator upgrade that renders differently) and is replaced by the operator (OnDelete strategy).
TEMPLATE_HASH_ANNOTATION = "multilane.dev/template-hash"


def worker_args(spec: Mapping[str, Any]) -> list[str]:
    """Arguments of ``multilane worker`` in a pod: operator mode, control endpoint, engine settings.

    The assignment and the factor arrive later through the control endpoint (``--assign ""``:
    operator mode with no partitions yet; the operator pushes them). ``$(MULTILANE_POD_NAME)`` is
    expanded by the kubelet from the container's env.
    """
    kafka = spec["kafka"]
    workload = spec["workload"]
    args = [
        "worker",
        "--assign",
        "",
        "--worker-id",
        "$(MULTILANE_POD_NAME)",
        "--control-port",
        str(CONTROL_PORT),
        "--metrics-port",
        str(METRICS_PORT),
        "--control-token-file",
        TOKEN_FILE,
        "--bootstrap-servers",
        kafka["bootstrapServers"],
        "--group",
        kafka["consumerGroup"],
        "--processor",
        workload["processor"],
        "--ordering",
        workload.get("ordering", "key"),
        "--max-in-flight",
        str(workload.get("maxInFlightRecords", 10000)),
        "--max-in-flight-bytes",
        str(workload.get("maxInFlightBytes", 67108864)),
        "--max-retries",
        str(workload.get("maxRetries", 3)),
        "--factor",
        str((spec.get("scaling") or {}).get("minFactor", 1)),
    ]
    if workload.get("deadLetterTopic"):
        args += ["--dead-letter-topic", workload["deadLetterTopic"]]
    for key, value in sorted((kafka.get("config") or {}).items()):
        args += ["--consumer-config", f"{key}={value}"]
    state = spec.get("state") or {}
    if state.get("enabled"):
        # The state flags need --state-dir (the worker refuses them without it): only when enabled.
        args += ["--state-dir", STATE_DIR]
        uri = str((state.get("snapshot") or {}).get("uri") or "")
        if uri:
            args += ["--snapshot-uri", uri]
        for key, value in sorted((state.get("changelogConfig") or {}).items()):
            args += ["--changelog-config", f"{key}={value}"]
    return args


def _container(ref: ConsumerRef, spec: Mapping[str, Any]) -> dict[str, Any]:
    workload = spec["workload"]
    env: list[dict[str, Any]] = [
        {"name": "MULTILANE_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MULTILANE_POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        # the control and metrics endpoints listen on the pod IP only (multilane worker --bind-host)
        {"name": "MULTILANE_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MULTILANE_LEASE_DURATION_SECONDS", "value": str(lease_duration_s(spec))},
        *copy.deepcopy(list(workload.get("env") or [])),
    ]
    if (spec.get("state") or {}).get("enabled"):
        env.insert(3, {"name": STATE_OWNER_ENV, "value": ref.uid})
    container: dict[str, Any] = {
        "name": "worker",
        "image": workload["image"],
        "imagePullPolicy": workload.get("imagePullPolicy", "IfNotPresent"),
        "command": ["multilane"],
        "args": worker_args(spec),
        "env": env,
        "ports": [
            {"name": "control", "containerPort": CONTROL_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": copy.deepcopy(dict(workload.get("resources") or DEFAULT_RESOURCES)),
        # Ready (/readyz): the engine started, its assigned partitions are restored, the broker is
        # reachable and the circuit breaker is closed (docs/worker-health.md)
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "control"}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "control"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "control-token", "mountPath": TOKEN_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    secret_ref = (spec["kafka"].get("credentialsSecretRef") or {}).get("name")
    if secret_ref:
        # By reference only: the kubelet resolves the keys; the operator never reads their values.
        container["envFrom"] = [{"prefix": KAFKA_ENV_PREFIX, "secretRef": {"name": secret_ref}}]
    if (spec.get("state") or {}).get("enabled"):
        container["volumeMounts"].append({"name": "state", "mountPath": STATE_DIR})
    return container


def lease_duration_s(spec: Mapping[str, Any]) -> int:
    """The workers' Lease duration: ``spec.workload.leaseDurationSeconds`` (trade-off in
    ``multilane/worker/lease.py``), :data:`LEASE_DURATION_S` by default."""
    return int((spec.get("workload") or {}).get("leaseDurationSeconds") or LEASE_DURATION_S)


def stateful_set(ref: ConsumerRef, spec: Mapping[str, Any], replicas: int) -> dict[str, Any]:
    """The worker StatefulSet. ``replicas`` is the operator's decision, not necessarily the spec's."""
    pod_labels = _labels(ref, "worker")
    sts: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(ref, ref.name, "worker"),
        "spec": {
            "serviceName": ref.workers_service,
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            # The operator replaces pods itself (restore before handoff); see the module docstring.
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": selector_labels(ref)},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": ref.service_account,
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": pod_security_context(spec.get("podTemplate") or {}),
                    "containers": [_container(ref, spec)],
                    "volumes": [
                        {
                            "name": "control-token",
                            "secret": {
                                "secretName": ref.token_secret,
                                "defaultMode": 0o440,
                                "items": [{"key": "token", "path": "token"}],
                            },
                        },
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }
    state = spec.get("state") or {}
    if state.get("enabled"):
        storage = state.get("storage") or {}
        pvc_spec: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": storage.get("size", "10Gi")}},
        }
        if storage.get("storageClassName"):
            pvc_spec["storageClassName"] = storage["storageClassName"]
        sts["spec"]["volumeClaimTemplates"] = [
            {"metadata": {"name": "state", "labels": selector_labels(ref)}, "spec": pvc_spec}
        ]
        retention = state.get("pvcRetention") or {}
        sts["spec"]["persistentVolumeClaimRetentionPolicy"] = {
            "whenDeleted": retention.get("whenDeleted", "Delete"),
            "whenScaled": retention.get("whenScaled", "Retain"),
        }
    fit_pod_template(sts["spec"]["template"], spec.get("podTemplate") or {}, selector_labels(ref))
    stamp_template_hash(sts["spec"]["template"])
    return sts


def _claims(spec: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
    """volumeClaimTemplates by name, as the fields multilane sets (the API server adds defaults such
    as volumeMode and status.phase to the stored copy, which must not count as a change)."""
    out = {}
    for claim in spec.get("volumeClaimTemplates") or []:
        claim_spec = claim.get("spec") or {}
        out[str((claim.get("metadata") or {}).get("name"))] = (
            str(((claim_spec.get("resources") or {}).get("requests") or {}).get("storage")),
            claim_spec.get("storageClassName") or "",
            tuple(claim_spec.get("accessModes") or ()),
        )
    return out


def statefulset_immutable_changes(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> list[str]:
    """The immutable StatefulSet spec fields (``spec.selector``, ...) whose desired value differs from
    the existing StatefulSet's, in a fixed order; empty when an update can apply."""
    old = existing.get("spec") or {}
    new = desired.get("spec") or {}
    changed = []
    if (old.get("selector") or {}).get("matchLabels") != (new.get("selector") or {}).get("matchLabels"):
        changed.append("spec.selector")
    if old.get("serviceName") != new.get("serviceName"):
        changed.append("spec.serviceName")
    if _claims(old) != _claims(new):
        changed.append("spec.volumeClaimTemplates")
    if (old.get("podManagementPolicy") or "OrderedReady") != (
        new.get("podManagementPolicy") or "OrderedReady"
    ):
        changed.append("spec.podManagementPolicy")
    return changed


def statefulset_update(desired: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch bringing an existing StatefulSet to ``desired``: metadata and the spec fields an
    update may change, never the immutable ones (whose changes :func:`statefulset_immutable_changes`
    reports)."""
    spec = desired.get("spec") or {}
    update = {
        "kind": "StatefulSet",
        "metadata": {
            k: v for k, v in (desired.get("metadata") or {}).items() if k in ("labels", "ownerReferences")
        },
        "spec": {k: copy.deepcopy(v) for k, v in spec.items() if k in STATEFULSET_MUTABLE},
    }
    body = patch_body(update)  # OnDelete: the API server's default rollingUpdate block removed
    del body["kind"]
    return body


def fit_pod_template(template: dict[str, Any], fit: Mapping[str, Any], selector: Mapping[str, str]) -> None:
    """Apply ``spec.podTemplate`` to the rendered pod template (in place): extra labels and
    annotations (the operator's own win), the scheduling and pull fields of :data:`POD_SPEC_FIELDS`,
    topology spread constraints (selecting this consumer's workers unless they say otherwise), and
    extra volumes with their mounts in the worker container."""
    meta = template.setdefault("metadata", {})
    meta["labels"] = {**dict(fit.get("labels") or {}), **(meta.get("labels") or {})}
    if fit.get("annotations"):
        meta["annotations"] = {**dict(fit["annotations"]), **(meta.get("annotations") or {})}
    pod = template["spec"]
    for key in POD_SPEC_FIELDS:
        if fit.get(key):
            pod[key] = copy.deepcopy(fit[key])
    spread = [dict(c) for c in copy.deepcopy(list(fit.get("topologySpreadConstraints") or []))]
    for constraint in spread:
        constraint.setdefault("labelSelector", {"matchLabels": dict(selector)})
    if spread:
        pod["topologySpreadConstraints"] = spread
    pod["volumes"] = [*pod.get("volumes", []), *copy.deepcopy(list(fit.get("volumes") or []))]
    container = pod["containers"][0]
    mounts = copy.deepcopy(list(fit.get("volumeMounts") or []))
    container["volumeMounts"] = [*container.get("volumeMounts", []), *mounts]


def template_hash(template: Mapping[str, Any]) -> str:
    """A short stable hash of a pod template, ignoring :data:`TEMPLATE_HASH_ANNOTATION` itself."""
    plain = copy.deepcopy(dict(template))
    annotations = dict((plain.get("metadata") or {}).get("annotations") or {})
    annotations.pop(TEMPLATE_HASH_ANNOTATION, None)
    plain.setdefault("metadata", {})["annotations"] = annotations
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stamp_template_hash(template: dict[str, Any]) -> None:
    """Set :data:`TEMPLATE_HASH_ANNOTATION` on ``template`` (in place); call it last."""
    meta = template.setdefault("metadata", {})
    digest = template_hash(template)
    meta["annotations"] = {**(meta.get("annotations") or {}), TEMPLATE_HASH_ANNOTATION: digest}


def patch_body(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The merge-patch that brings an existing child to ``manifest``. A StatefulSet created before
    ``OnDelete`` carries the API server's default ``rollingUpdate`` block, which is refused beside
    ``type: OnDelete``: the patch removes it (``null``)."""
    body = copy.deepcopy(dict(manifest))
    strategy = (body.get("spec") or {}).get("updateStrategy")
    on_delete = isinstance(strategy, dict) and strategy.get("type") == "OnDelete"
    if body.get("kind") == "StatefulSet" and on_delete:
        strategy["rollingUpdate"] = None  # type: ignore[index]
    return body


def children(ref: ConsumerRef, spec: Mapping[str, Any], replicas: int) -> list[dict[str, Any]]:
    """Every child except the token Secret and the Leases, in creation order (dependencies first)."""
    max_replicas = int((spec.get("scaling") or {}).get("maxReplicas", 10))
    built = [
        service_account(ref),
        role(ref, max_replicas),
        role_binding(ref),
        service(ref),
        pod_disruption_budget(ref),
        stateful_set(ref, spec, replicas),
    ]
    cronjob = snapshot_cronjob(ref, spec)
    if cronjob is not None:
        built.append(cronjob)
    return built
