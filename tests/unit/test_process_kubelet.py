"""The process kubelet's decisions that need no API server: probe thresholds, restarts by
``restartPolicy`` with back-off, the pod phase they lead to, the user a container runs as, ``$(VAR)``
expansion. The real-cluster tier (tests/cluster) runs the rest."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from multilane.operator.k8s.kube import KubeClient, KubeSettings
from multilane.testing.kubelet_pods import (
    PodWorker,
    image_repository,
    mount_order,
    shadowed_python,
    unreachable_python,
)
from multilane.testing.kubelet_probes import ProbeState
from multilane.testing.kubelet_volumes import expand, run_as


def _pod(policy: str) -> dict[str, Any]:
    container = {"name": "c", "image": "i", "command": ["x"]}
    meta = {"uid": "u1", "namespace": "ns", "name": "p-0"}
    return {"metadata": meta, "spec": {"restartPolicy": policy, "containers": [container]}}


def _exit(worker: PodWorker, code: int, now: float) -> None:
    run = worker.containers[0]
    run.proc = subprocess.Popen(["sh", "-c", "kill -9 $$" if code == 137 else f"exit {code}"])
    run.proc.wait()
    run.started_mono = now - 1
    worker._exited(run, worker.spec["restartPolicy"], now)


@pytest.mark.parametrize(
    ("policy", "code", "phase", "restarts"),
    [("Always", 0, "Running", 1), ("OnFailure", 0, "Succeeded", 0), ("OnFailure", 3, "Running", 1),
     ("Never", 3, "Failed", 0), ("Never", 137, "Failed", 0)],
)  # fmt: skip
def test_an_exit_restarts_or_ends_the_pod_by_restart_policy(
    tmp_path: Path, policy: str, code: int, phase: str, restarts: int
) -> None:
    kube = KubeClient(KubeSettings(host="http://127.0.0.1:9"))  # never called
    worker = PodWorker(kube, _pod(policy), tmp_path, "127.0.0.9", 1, backoff_s=2.0)
    _exit(worker, code, now=100.0)
    run = worker.containers[0]
    status = worker.status()
    assert (status["phase"], run.restarts) == (phase, restarts)
    assert status["containerStatuses"][0]["restartCount"] == restarts
    terminated = (run.last_state or {}).get("terminated", {})
    assert terminated["exitCode"] == code
    if restarts:
        assert status["containerStatuses"][0]["state"]["waiting"]["reason"] == "CrashLoopBackOff"
        assert run.backoff_until == 102.0  # backoff_s
        _exit(worker, code, now=110.0)
        assert run.backoff_until == 114.0  # doubled
    ready = {c["type"]: c["status"] for c in status["conditions"]}["Ready"]
    assert ready == "False"


def test_probe_result_flips_only_after_its_thresholds() -> None:
    state = ProbeState({"initialDelaySeconds": 5, "periodSeconds": 2, "failureThreshold": 2,
                        "successThreshold": 2}, started=10.0)  # fmt: skip
    assert not state.due(14.9) and state.due(15.0)
    state.record(15.0, True, "")
    assert not state.ok and state.next_at == 17.0
    state.record(17.0, True, "")
    assert state.ok
    state.record(19.0, False, "HTTP probe failed with statuscode: 500")
    assert state.ok and not state.failed
    state.record(21.0, False, "HTTP probe failed with statuscode: 500")
    assert not state.ok and state.failed and state.last_error.endswith("500")


def test_a_container_runs_as_its_user_or_nobody_when_only_non_root_is_asked() -> None:
    spec = {"securityContext": {"runAsUser": 1000, "fsGroup": 2000}}
    assert run_as(spec) == (1000, 1000)
    assert run_as(spec, {"securityContext": {"runAsUser": 7, "runAsGroup": 8}}) == (7, 8)
    assert run_as({}, {"securityContext": {"runAsNonRoot": True}}) == (65534, 65534)
    assert run_as({}) is None


def test_expand_replaces_known_variables_and_keeps_unknown_ones() -> None:
    assert expand("$(A)-$(B)-$(A)", {"A": "x"}) == "x-$(B)-x"


@pytest.mark.parametrize(
    ("image", "repository"),
    [("ghcr.io/multilane/multilane:0.4.0", "ghcr.io/multilane/multilane"),
     ("ghcr.io/multilane/multilane@sha256:" + "a" * 64, "ghcr.io/multilane/multilane"),
     ("registry:5000/team/app:1", "registry:5000/team/app"), ("local:v2", "local"), ("local", "local")],
)  # fmt: skip
def test_image_repository_drops_tag_and_digest_but_not_a_registry_port(image: str, repository: str) -> None:
    assert image_repository(image) == repository


def test_a_mount_covering_another_mounts_source_goes_after_it_with_its_children() -> None:
    binds = [
        ("/tmp/k/pods/u/volumes/tmp", "/tmp", "rw"),
        ("/tmp/k/pods/u/volumes/cache", "/tmp/cache", "rw"),
        ("/tmp/k/pods/u/volumes/token", "/var/run/secrets/kubernetes.io/serviceaccount", "ro"),
        ("/tmp/k/hosts", "/etc/hosts", "ro"),
    ]
    assert [t for _, t, _ in mount_order(binds)] == [
        "/var/run/secrets/kubernetes.io/serviceaccount", "/etc/hosts", "/tmp", "/tmp/cache"
    ]
    plain = [("/srv/a", "/data", "rw"), ("/srv/b", "/data/sub", "ro")]
    assert mount_order(plain) == plain


def test_a_volume_over_this_pythons_environment_is_named_not_left_to_fail_in_the_container() -> None:
    """A checkout under /tmp, and the chart's emptyDir at /tmp: the container could not see the venv
    (``setpriv: failed to execute ...: No such file or directory``); the kubelet names the cause."""
    import sys

    venv = sys.prefix
    parent = str(Path(venv).parent)
    assert shadowed_python([parent]) == (venv, parent)
    assert shadowed_python([parent + "/"]) == (venv, parent + "/")
    assert shadowed_python(["/nonexistent-mount", "/"]) is None  # "/" is the node's root, never a volume


def test_a_python_environment_behind_a_closed_directory_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout in a ``mktemp -d`` directory (mode 0700): a container running as uid 10001 found
    no multilane (``No module named multilane``); the kubelet names the closed directory."""
    import shutil
    import sys
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="multilane-closed-", dir="/var/tmp"))  # /tmp's pytest dirs are 0700
    try:
        root.chmod(0o755)
        closed = root / "trial"
        venv = closed / "checkout" / ".venv"
        venv.mkdir(parents=True)
        closed.chmod(0o700)
        monkeypatch.setattr(sys, "prefix", str(venv))
        assert unreachable_python() == (str(venv.resolve()), str(closed.resolve()))
        closed.chmod(0o711)
        found = unreachable_python()
        assert found is None or found[0] != str(venv.resolve())
    finally:
        shutil.rmtree(root, ignore_errors=True)
