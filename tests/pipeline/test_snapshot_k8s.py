"""Rendering the snapshot CronJob / Job of a ParallelConsumer (pure), checked with Kubernetes schemas."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from multilane.pipeline import cli
from multilane.pipeline.k8s import (
    CREDENTIALS_MOUNT,
    SnapshotSpecError,
    render_snapshot_cronjob,
    render_snapshot_job,
    snapshot_command,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "parallelconsumer-stateful.yaml"
KUBE_VERSION = "1.37.0"


@pytest.fixture
def pc() -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"].update(namespace="apps", uid="1234-abcd")
    return doc


def validate(manifest: dict[str, Any]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)


def test_cronjob_runs_the_snapshot_command_on_the_schedule(pc: dict[str, Any]) -> None:
    cron = render_snapshot_cronjob(pc, factor=8)
    assert cron is not None
    validate(cron)
    assert cron["kind"] == "CronJob" and cron["metadata"]["name"] == "sessions-snapshot"
    assert cron["metadata"]["namespace"] == "apps"
    assert cron["metadata"]["ownerReferences"][0]["uid"] == "1234-abcd"
    assert cron["spec"]["schedule"] == "30 2 * * *"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "ghcr.io/example/sessioniser:0.4.0"
    assert pod["restartPolicy"] == "Never"
    cmd = container["command"]
    assert cmd[:2] == ["multilane", "snapshot"]
    assert cmd[cmd.index("--uri") + 1] == "s3://analytics-snapshots/sessioniser"
    assert cmd[cmd.index("--retain") + 1] == "3"
    assert cmd[cmd.index("--group") + 1] == "sessioniser"
    assert cmd[cmd.index("--factor") + 1] == "8"


def test_command_parses_with_the_cli(pc: dict[str, Any]) -> None:
    pc["spec"]["kafka"]["config"] = {"security.protocol": "SASL_SSL"}
    pc["spec"]["kafka"]["credentialsSecretRef"] = {"name": "kafka-creds"}
    pc["spec"]["kafka"]["topics"] = ["page-views", "clicks"]
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(snapshot_command(pc, master="local[4]")[2:])
    assert args.topic == ["page-views", "clicks"]
    assert args.bootstrap_servers == "kafka.kafka.svc:9092"
    assert args.master == "local[4]" and args.retain == 3 and args.json
    assert cli.parse_kv(args.consumer_config, "x") == {"security.protocol": "SASL_SSL"}
    assert args.consumer_config_dir == CREDENTIALS_MOUNT


def test_credentials_secret_is_mounted_read_only(pc: dict[str, Any]) -> None:
    pc["spec"]["kafka"]["credentialsSecretRef"] = {"name": "kafka-creds"}
    job = render_snapshot_job(pc, suffix="gen-7")
    validate(job)
    assert job["kind"] == "Job" and job["metadata"]["name"] == "sessions-snapshot-gen-7"
    pod = job["spec"]["template"]["spec"]
    assert {"name": "kafka-credentials", "secret": {"secretName": "kafka-creds"}} in pod["volumes"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "kafka-credentials")
    assert mount == {"name": "kafka-credentials", "mountPath": CREDENTIALS_MOUNT, "readOnly": True}


def test_no_schedule_means_no_cronjob_but_a_job_can_still_run(pc: dict[str, Any]) -> None:
    pc["spec"]["state"]["snapshot"]["schedule"] = ""
    assert render_snapshot_cronjob(pc) is None
    validate(render_snapshot_job(pc, suffix="manual"))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda pc: pc["spec"]["state"].update(enabled=False), "state.enabled"),
        (lambda pc: pc["spec"]["state"]["snapshot"].update(uri=""), "snapshot.uri"),
        (lambda pc: pc["spec"]["kafka"].update(topics=[]), "topics"),
        (lambda pc: pc["spec"]["state"]["snapshot"].update(schedule="@daily"), "5 cron fields"),
    ],
)
def test_unrunnable_specs_are_rejected(pc: dict[str, Any], mutate: Any, message: str) -> None:
    bad = copy.deepcopy(pc)
    mutate(bad)
    with pytest.raises(SnapshotSpecError, match=message):
        render_snapshot_cronjob(bad)


def test_long_names_fit_kubernetes_limits(pc: dict[str, Any]) -> None:
    pc["metadata"]["name"] = "a-very-long-parallel-consumer-name-that-goes-on-and-on-x"
    cron = render_snapshot_cronjob(pc)
    assert cron is not None and len(cron["metadata"]["name"]) <= 52
    assert cron["metadata"]["name"].endswith("-snapshot")
    job = render_snapshot_job(pc, suffix="20261122t0600")
    assert len(job["metadata"]["name"]) <= 63
    validate(cron)
    validate(job)
    with pytest.raises(SnapshotSpecError, match="suffix"):
        render_snapshot_job(pc, suffix="Bad_Suffix")


def test_config_dir_reads_a_mounted_secret(tmp_path: Path) -> None:
    (tmp_path / "sasl.username").write_text("svc\n")
    (tmp_path / "sasl.password").write_text("s3cret")
    (tmp_path / "..data").mkdir()  # Kubernetes' symlink folder is skipped
    assert cli.read_config_dir(str(tmp_path)) == {"sasl.password": "s3cret", "sasl.username": "svc"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        cli.parse_kv(["novalue"], "--consumer-config")
