"""Kubernetes manifests that run the snapshot job for a ParallelConsumer. Pure: no I/O.

The operator renders a ``batch/v1`` CronJob from ``spec.state.snapshot`` (``uri``, ``schedule``,
``retention``) and applies it; a one-off Job (for example right before a scale-out, so that learners
restore from a fresh snapshot) uses the same pod template. The pod runs ``multilane snapshot`` in the
workload image with Spark in local mode (``--master``, default ``local[*]``); the Kafka credentials
Secret, if any, is mounted as files and passed with ``--consumer-config-dir``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CREDENTIALS_MOUNT",
    "SnapshotSpecError",
    "render_snapshot_cronjob",
    "render_snapshot_job",
    "snapshot_command",
]

CREDENTIALS_MOUNT = "/etc/multilane/kafka"
SCRATCH_MOUNT = "/scratch"
TMP_MOUNT = "/tmp"  # the JVM's java.io.tmpdir: writable although the root filesystem is read-only
API_VERSION = "multilane.dev/v1alpha1"
DEFAULT_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "1", "memory": "2Gi"},
    "limits": {"memory": "4Gi"},
}


class SnapshotSpecError(ValueError):
    """The ParallelConsumer does not describe a snapshot that can run (state disabled, no URI, ...)."""


def _spec(pc: Mapping[str, Any]) -> tuple[str, Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]]:
    meta = pc.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise SnapshotSpecError("the ParallelConsumer has no metadata.name")
    spec = pc.get("spec") or {}
    kafka = spec.get("kafka") or {}
    state = spec.get("state") or {}
    snapshot = state.get("snapshot") or {}
    if not state.get("enabled"):
        raise SnapshotSpecError(f"{name}: spec.state.enabled is false; there is no state to snapshot")
    if not snapshot.get("uri"):
        raise SnapshotSpecError(f"{name}: spec.state.snapshot.uri is empty")
    for field in ("bootstrapServers", "consumerGroup"):
        if not kafka.get(field):
            raise SnapshotSpecError(f"{name}: spec.kafka.{field} is required")
    if not kafka.get("topics"):
        raise SnapshotSpecError(f"{name}: spec.kafka.topics is empty")
    return str(name), spec, kafka, snapshot


def snapshot_command(
    pc: Mapping[str, Any], *, factor: int | None = None, master: str = "local[*]", json_summary: bool = True
) -> list[str]:
    """The ``multilane snapshot`` command line (argv, starting with ``multilane``) for ``pc``."""
    _name, _, kafka, snapshot = _spec(pc)
    argv = [
        "multilane",
        "snapshot",
        "--bootstrap-servers",
        str(kafka["bootstrapServers"]),
        "--group",
        str(kafka["consumerGroup"]),
    ]
    for topic in kafka["topics"]:
        argv += ["--topic", str(topic)]
    argv += ["--uri", str(snapshot["uri"]), "--retain", str(int(snapshot.get("retention", 3) or 3))]
    argv += ["--master", master]
    if factor is not None:
        if factor < 1:
            raise SnapshotSpecError(f"factor must be >= 1, got {factor}")
        argv += ["--factor", str(factor)]
    for key, value in sorted((kafka.get("config") or {}).items()):
        argv += ["--consumer-config", f"{key}={value}"]
    if (kafka.get("credentialsSecretRef") or {}).get("name"):
        argv += ["--consumer-config-dir", CREDENTIALS_MOUNT]
    if json_summary:
        argv.append("--json")
    return argv


def _dns_name(base: str, suffix: str, limit: int) -> str:
    """``base-suffix`` cut to ``limit`` characters, keeping it unique with a short hash when cut."""
    full = f"{base}-{suffix}"
    if len(full) <= limit:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:6]
    keep = limit - len(suffix) - len(digest) - 2
    return f"{base[:keep].rstrip('-')}-{digest}-{suffix}"


def _labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "multilane",
        "app.kubernetes.io/component": "snapshot",
        "app.kubernetes.io/managed-by": "multilane-operator",
        "multilane.dev/consumer": name,
    }


def _owner_refs(pc: Mapping[str, Any]) -> list[dict[str, Any]]:
    meta = pc.get("metadata") or {}
    if not meta.get("uid"):
        return []
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ParallelConsumer",
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _metadata(pc: Mapping[str, Any], name: str, consumer: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": _labels(consumer)}
    namespace = (pc.get("metadata") or {}).get("namespace")
    if namespace:
        meta["namespace"] = namespace
    owners = _owner_refs(pc)
    if owners:
        meta["ownerReferences"] = owners
    return meta


def _job_spec(
    pc: Mapping[str, Any],
    image: str | None,
    factor: int | None,
    master: str,
    resources: Mapping[str, Any] | None,
    active_deadline_s: int,
) -> dict[str, Any]:
    name, spec, kafka, _snapshot = _spec(pc)
    workload = spec.get("workload") or {}
    image = image or workload.get("image")
    if not image:
        raise SnapshotSpecError(f"{name}: no image (spec.workload.image is empty)")
    env: list[Mapping[str, Any]] = [
        *list(workload.get("env") or []),
        {"name": "SPARK_LOCAL_DIRS", "value": SCRATCH_MOUNT},
        {"name": "HOME", "value": SCRATCH_MOUNT},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "scratch", "mountPath": SCRATCH_MOUNT},
        {"name": "tmp", "mountPath": TMP_MOUNT},
    ]
    volumes: list[dict[str, Any]] = [{"name": "scratch", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]
    secret = (kafka.get("credentialsSecretRef") or {}).get("name")
    if secret:
        mounts.append({"name": "kafka-credentials", "mountPath": CREDENTIALS_MOUNT, "readOnly": True})
        volumes.append({"name": "kafka-credentials", "secret": {"secretName": secret}})
    container = {
        "name": "snapshot",
        "image": image,
        "imagePullPolicy": workload.get("imagePullPolicy", "IfNotPresent"),
        "command": snapshot_command(pc, factor=factor, master=master),
        "env": env,
        "resources": dict(resources or DEFAULT_RESOURCES),
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return {
        "backoffLimit": 2,
        "activeDeadlineSeconds": active_deadline_s,
        "ttlSecondsAfterFinished": 86400,
        "template": {
            "metadata": {"labels": _labels(name)},
            "spec": {
                "restartPolicy": "Never",
                "serviceAccountName": f"{name}-worker",
                # Same non-root identity as the worker pods (numeric, so runAsNonRoot is verifiable).
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 65532,
                    "runAsGroup": 65532,
                    "fsGroup": 65532,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [container],
                "volumes": volumes,
            },
        },
    }


def render_snapshot_cronjob(
    pc: Mapping[str, Any],
    *,
    image: str | None = None,
    factor: int | None = None,
    master: str = "local[*]",
    resources: Mapping[str, Any] | None = None,
    active_deadline_s: int = 6 * 3600,
) -> dict[str, Any] | None:
    """The ``batch/v1`` CronJob ``<name>-snapshot`` for ``spec.state.snapshot.schedule``.

    None when the schedule is empty (scheduled snapshots off). Raises :class:`SnapshotSpecError`
    when a schedule is set but the spec cannot run a snapshot. Two runs never overlap
    (``concurrencyPolicy: Forbid``; overlapping runs would be safe, only wasteful).
    """
    snapshot = (((pc.get("spec") or {}).get("state") or {}).get("snapshot")) or {}
    schedule = str(snapshot.get("schedule") or "").strip()
    if not schedule:
        return None
    if len(schedule.split()) != 5:
        raise SnapshotSpecError(f"schedule {schedule!r} must have 5 cron fields")
    name = _spec(pc)[0]
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": _metadata(pc, _dns_name(name, "snapshot", 52), name),
        "spec": {
            "schedule": schedule,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 600,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "metadata": {"labels": _labels(name)},
                "spec": _job_spec(pc, image, factor, master, resources, active_deadline_s),
            },
        },
    }


def render_snapshot_job(
    pc: Mapping[str, Any],
    *,
    suffix: str,
    image: str | None = None,
    factor: int | None = None,
    master: str = "local[*]",
    resources: Mapping[str, Any] | None = None,
    active_deadline_s: int = 6 * 3600,
) -> dict[str, Any]:
    """A one-off ``batch/v1`` Job ``<name>-snapshot-<suffix>`` (e.g. suffix = a timestamp or generation)."""
    name = _spec(pc)[0]
    if not suffix or not all(c.isalnum() or c == "-" for c in suffix) or suffix != suffix.lower():
        raise SnapshotSpecError(f"suffix must be lowercase letters, digits and '-', got {suffix!r}")
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(pc, _dns_name(name, f"snapshot-{suffix}", 63), name),
        "spec": _job_spec(pc, image, factor, master, resources, active_deadline_s),
    }


def topics_of(pc: Mapping[str, Any]) -> Sequence[str]:
    """The input topics of ``pc`` (what the job snapshots)."""
    return list(((pc.get("spec") or {}).get("kafka") or {}).get("topics") or [])
